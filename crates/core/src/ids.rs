//! Identifiers shared by the wire protocol, the endpoint and the scheduler.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Most subflows one endpoint may have at once. Path sets are bitmasks of
/// this width, which keeps a scheduling decision allocation-free.
pub const MAX_PATHS: usize = 32;

/// A passenger connection, numbered by the relay-agent that opened it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u32);

impl fmt::Display for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "c{}", self.0)
    }
}

/// A subflow: one per cellular interface of the train.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PathId(pub u8);

impl PathId {
    /// Index of the path in arrays of `MAX_PATHS`.
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

impl fmt::Display for PathId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p{}", self.0)
    }
}

/// A passenger: the source address of the passenger's device, stored as an
/// IPv6 address (IPv4 mapped), which is what the proportional-fair user
/// scheduler keys on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UserId(pub [u8; 16]);

impl UserId {
    /// The address this identity was made from.
    pub fn ip(self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }
}

impl From<IpAddr> for UserId {
    fn from(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => UserId(v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => UserId(v6.octets()),
        }
    }
}

/// The IPv6 prefix length that names one passenger by default: a device
/// takes addresses from its LAN's /64 at will (privacy extensions, SLAAC),
/// so one address per passenger would let one device fill every cap.
pub const PASSENGER_V6_PREFIX: u8 = 64;

impl UserId {
    /// A passenger by source address: an IPv4 address as it is, an IPv6
    /// address by its first `v6_prefix` bits (0..=128; 128 keys each address).
    pub fn passenger(ip: IpAddr, v6_prefix: u8) -> Self {
        match ip {
            IpAddr::V6(v6) if v6.to_ipv4_mapped().is_none() => {
                let bits = u32::from(v6_prefix.min(128));
                let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
                UserId((u128::from(v6) & mask).to_be_bytes())
            }
            _ => UserId::from(ip),
        }
    }
}

impl From<Ipv4Addr> for UserId {
    fn from(ip: Ipv4Addr) -> Self {
        UserId::from(IpAddr::V4(ip))
    }
}

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.ip())
    }
}

/// A set of paths as a bitmask over [`PathId`]s.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PathMask(pub u32);

impl PathMask {
    pub const EMPTY: PathMask = PathMask(0);

    pub fn single(p: PathId) -> Self {
        PathMask(1 << p.0)
    }
    pub fn contains(self, p: PathId) -> bool {
        self.0 & (1 << p.0) != 0
    }
    pub fn insert(&mut self, p: PathId) {
        self.0 |= 1 << p.0;
    }
    pub fn remove(&mut self, p: PathId) {
        self.0 &= !(1 << p.0);
    }
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
    pub fn len(self) -> u32 {
        self.0.count_ones()
    }
    pub fn union(self, o: PathMask) -> PathMask {
        PathMask(self.0 | o.0)
    }
    pub fn intersect(self, o: PathMask) -> PathMask {
        PathMask(self.0 & o.0)
    }
    pub fn minus(self, o: PathMask) -> PathMask {
        PathMask(self.0 & !o.0)
    }
    /// Paths in ascending id order.
    pub fn iter(self) -> impl Iterator<Item = PathId> {
        let mut bits = self.0;
        std::iter::from_fn(move || {
            if bits == 0 {
                return None;
            }
            let i = bits.trailing_zeros();
            bits &= bits - 1;
            Some(PathId(i as u8))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_passenger_is_its_prefix_and_an_ipv4_one_its_address() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let a = UserId::passenger(ip("2001:db8:1:2::10"), PASSENGER_V6_PREFIX);
        // Another address of the same /64 (a privacy address): the same passenger.
        assert_eq!(a, UserId::passenger(ip("2001:db8:1:2:aaaa:bbbb:cccc:dddd"), 64));
        assert_eq!(a.ip(), ip("2001:db8:1:2::"));
        assert_ne!(a, UserId::passenger(ip("2001:db8:1:3::10"), 64));
        // 128 keys each address; 0 makes every IPv6 passenger one.
        assert_ne!(UserId::passenger(ip("2001:db8:1:2::10"), 128), UserId::passenger(ip("2001:db8:1:2::11"), 128));
        assert_eq!(UserId::passenger(ip("2001:db8::1"), 0), UserId::passenger(ip("fe80::1"), 0));
        // IPv4 passengers, mapped or not, keep their address whatever the prefix.
        assert_eq!(UserId::passenger(ip("10.66.0.2"), 64), UserId::from(ip("10.66.0.2")));
        assert_eq!(UserId::passenger(ip("::ffff:10.66.0.2"), 64), UserId::from(ip("10.66.0.2")));
    }

    #[test]
    fn user_id_round_trips_v4_and_v6() {
        let v4: IpAddr = "10.66.0.2".parse().unwrap();
        let v6: IpAddr = "2001:db8::7".parse().unwrap();
        assert_eq!(UserId::from(v4).ip(), v4);
        assert_eq!(UserId::from(v6).ip(), v6);
    }

    #[test]
    fn path_mask_iterates_in_order() {
        let mut m = PathMask::EMPTY;
        for p in [5, 0, 31, 2] {
            m.insert(PathId(p));
        }
        let v: Vec<u8> = m.iter().map(|p| p.0).collect();
        assert_eq!(v, vec![0, 2, 5, 31]);
        m.remove(PathId(2));
        assert_eq!(m.len(), 3);
        assert!(!m.contains(PathId(2)));
    }
}
