//! The destination policy: where the proxy agrees to open a passenger's
//! upstream connection, so that it is never an open relay into its own host
//! or the network it runs in.
//!
//! Two lists of CIDRs, `--deny` (default [`DEFAULT_DENY`]) and `--allow`
//! (default empty). The most specific entry that contains the destination
//! decides: a deny entry refuses, an allow entry admits, and an allow entry
//! as specific as the deny entry wins the tie. A destination no entry
//! contains is admitted. So `--allow 10.99.0.0/24` re-opens that network
//! inside the denied `10.0.0.0/8` without restating the deny list, and
//! `--allow 0.0.0.0/0` re-opens nothing (every deny entry is more specific).
//! An operator who wants only some networks reachable writes
//! `--deny 0.0.0.0/0,::/0 --allow <networks>`.
//!
//! IPv6 addresses that carry an IPv4 address are checked as that IPv4
//! address too, and must pass in every form: IPv4-mapped `::ffff:a.b.c.d`,
//! IPv4-compatible `::a.b.c.d`, NAT64 `64:ff9b::/96` (RFC 6052) and the
//! local-use `64:ff9b:1::/48` (RFC 8215; every prefix length of RFC 6052's
//! table is tried, as the translator's is unknown), and 6to4 `2002::/16`.
//!
//! Whatever the lists say, the proxy host itself is refused: its interface
//! addresses (and their IPv4 broadcast addresses), loopback and the
//! unspecified addresses, in every form above. An `--allow` entry that
//! re-opens an origin network the host also sits on (the host's own
//! `10.99.0.1` inside an allowed `10.99.0.0/24`) must not open the host's
//! own services bound to all interfaces. Only `--allow-own-address` names
//! addresses of the host passengers may reach nonetheless, one by one: for
//! a benchmark whose origin servers share the proxy's host or listen on a
//! loopback address. The interface addresses are read at start and again
//! when a check finds them older than [`OWN_REFRESH`], so an address added
//! later is refused within that time.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ipnet::IpNet;

/// How old the list of the host's own addresses may get before a check
/// reads it again (one `getifaddrs`, a netlink dump: microseconds).
pub const OWN_REFRESH: Duration = Duration::from_secs(5);

/// The binary's default `--deny`: the proxy's own host, the networks it may
/// run in and everything not routed on the Internet.
pub const DEFAULT_DENY: &[&str] = &[
    "0.0.0.0/8",       // "this network", with 0.0.0.0 (unspecified: the proxy's host)
    "10.0.0.0/8",      // private
    "100.64.0.0/10",   // carrier-grade NAT
    "127.0.0.0/8",     // loopback
    "169.254.0.0/16",  // link-local, with cloud metadata services
    "172.16.0.0/12",   // private
    "192.0.0.0/24",    // IETF protocol assignments
    "192.0.2.0/24",    // documentation
    "192.168.0.0/16",  // private
    "198.18.0.0/15",   // benchmarking
    "198.51.100.0/24", // documentation
    "203.0.113.0/24",  // documentation
    "224.0.0.0/4",     // multicast
    "240.0.0.0/4",     // reserved, with 255.255.255.255 (broadcast)
    "::/128",          // unspecified (the proxy's host)
    "::1/128",         // loopback
    "2001:db8::/32",   // documentation
    "fc00::/7",        // unique local
    "fe80::/10",       // link-local
    "fec0::/10",       // site-local (deprecated)
    "ff00::/8",        // multicast
];

/// `--deny` and `--allow`, and the host's own addresses.
#[derive(Debug, Clone)]
pub struct Policy {
    deny: Vec<IpNet>,
    allow: Vec<IpNet>,
    own: Arc<OwnAddrs>,
    /// `--allow-own-address`.
    own_open: HashSet<IpAddr>,
}

/// The host's own addresses, read by `read` and cached for [`OWN_REFRESH`].
struct OwnAddrs {
    read: fn() -> std::io::Result<HashSet<IpAddr>>,
    cache: Mutex<Option<(Instant, Arc<HashSet<IpAddr>>)>>,
}

impl std::fmt::Debug for OwnAddrs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnAddrs").finish_non_exhaustive()
    }
}

impl OwnAddrs {
    /// The addresses, read again when older than [`OWN_REFRESH`]. A failed
    /// read keeps the previous list (and is tried again at the next check);
    /// with no list at all, only loopback and unspecified are known to be
    /// the host's own.
    fn get(&self, now: Instant) -> Arc<HashSet<IpAddr>> {
        let mut c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        match &*c {
            Some((at, set)) if now.saturating_duration_since(*at) < OWN_REFRESH => set.clone(),
            old => match (self.read)() {
                Ok(set) => {
                    let set = Arc::new(set);
                    *c = Some((now, set.clone()));
                    set
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list this host's addresses; the previous list stays in use");
                    old.as_ref().map(|(_, s)| s.clone()).unwrap_or_default()
                }
            },
        }
    }
}

impl Policy {
    /// `deny`: None for [`DEFAULT_DENY`].
    pub fn new(deny: Option<Vec<IpNet>>, allow: Option<Vec<IpNet>>) -> Self {
        Self::with_own_addrs(deny, allow, host_addrs)
    }

    /// Addresses of this host passengers may reach although they are the
    /// host's own (an interface or loopback address named exactly; the
    /// lists still apply to them).
    pub fn open_own_addresses(mut self, addrs: impl IntoIterator<Item = IpAddr>) -> Self {
        self.own_open.extend(addrs);
        self
    }

    /// The policy with `read` listing the host's own addresses.
    fn with_own_addrs(
        deny: Option<Vec<IpNet>>,
        allow: Option<Vec<IpNet>>,
        read: fn() -> std::io::Result<HashSet<IpAddr>>,
    ) -> Self {
        let deny =
            deny.unwrap_or_else(|| DEFAULT_DENY.iter().map(|s| s.parse().expect("valid default CIDR")).collect());
        let own = Arc::new(OwnAddrs { read, cache: Mutex::new(None) });
        own.get(Instant::now()); // read at start: a failure is logged now
        Self { deny, allow: allow.unwrap_or_default(), own, own_open: HashSet::new() }
    }

    /// The addresses `open_own_addresses` opened.
    pub fn opened_own_addresses(&self) -> Vec<IpAddr> {
        self.own_open.iter().copied().collect()
    }

    /// Whether the proxy may connect to `dst`.
    pub fn allows(&self, dst: SocketAddr) -> bool {
        let ip = dst.ip();
        let v4s = embedded_v4(ip);
        let host = |a: IpAddr| is_host(a) && !self.own_open.contains(&a);
        if host(ip) || v4s.iter().any(|v4| host(IpAddr::V4(*v4))) {
            return false;
        }
        if !(self.admits(ip) && v4s.iter().all(|v4| self.admits(IpAddr::V4(*v4)))) {
            return false;
        }
        let own = self.own.get(Instant::now());
        let is_own = |a: IpAddr| own.contains(&a) && !self.own_open.contains(&a);
        !(is_own(ip) || v4s.iter().any(|v4| is_own(IpAddr::V4(*v4))))
    }

    /// The most specific entry containing `ip` decides; allow wins a tie.
    fn admits(&self, ip: IpAddr) -> bool {
        let most_specific = |l: &[IpNet]| l.iter().filter(|n| n.contains(&ip)).map(IpNet::prefix_len).max();
        match (most_specific(&self.deny), most_specific(&self.allow)) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(d), Some(a)) => a >= d,
        }
    }
}

/// Loopback and unspecified: the host itself on every host.
fn is_host(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback() || v4.is_unspecified(),
        IpAddr::V6(v6) => v6.is_loopback() || v6.is_unspecified(),
    }
}

/// The host's interface addresses, with the IPv4 broadcast address of
/// each interface that has one (`getifaddrs`).
pub fn host_addrs() -> std::io::Result<HashSet<IpAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head into `head` on success; the
    // list is freed below with freeifaddrs, once, after the last read.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out = HashSet::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        // SAFETY: each pointer is null or points at a sockaddr of its
        // family's size, as getifaddrs fills them.
        out.extend(unsafe { sockaddr_ip(ifa.ifa_addr) });
        if ifa.ifa_flags & libc::IFF_BROADCAST as libc::c_uint != 0 {
            // SAFETY: as above (the broadcast address, with IFF_BROADCAST).
            out.extend(unsafe { sockaddr_ip(ifa.ifa_ifu) });
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: the head getifaddrs returned, freed once; nothing reads it after.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// The IP address of an AF_INET or AF_INET6 `sockaddr`; None for a null
/// pointer or another family.
///
/// # Safety
/// `sa` is null or points at a valid sockaddr of its family's size.
unsafe fn sockaddr_ip(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller's contract; the family says which struct it is.
    unsafe {
        match i32::from((*sa).sa_family) {
            libc::AF_INET => {
                let a = &*sa.cast::<libc::sockaddr_in>();
                Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr))))
            }
            libc::AF_INET6 => {
                let a = &*sa.cast::<libc::sockaddr_in6>();
                Some(IpAddr::V6(Ipv6Addr::from(a.sin6_addr.s6_addr)))
            }
            _ => None,
        }
    }
}

/// The IPv4 addresses an IPv6 address carries (none for an IPv4 address).
fn embedded_v4(ip: IpAddr) -> Vec<Ipv4Addr> {
    let IpAddr::V6(v6) = ip else { return Vec::new() };
    let b = v6.octets();
    let s = v6.segments();
    let v4 = |i: [usize; 4]| Ipv4Addr::new(b[i[0]], b[i[1]], b[i[2]], b[i[3]]);
    let last32 = v4([12, 13, 14, 15]);
    match s {
        // IPv4-mapped ::ffff:a.b.c.d and IPv4-compatible ::a.b.c.d (with
        // :: and ::1, which become 0.0.0.0 and 0.0.0.1).
        [0, 0, 0, 0, 0, 0xffff | 0, _, _] => vec![last32],
        // NAT64, the well-known prefix 64:ff9b::/96.
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => vec![last32],
        // NAT64, the local-use prefix 64:ff9b:1::/48 with any prefix length
        // of RFC 6052 from /48 on (byte 8, "u", is never part of it).
        [0x64, 0xff9b, 1, ..] => vec![
            v4([6, 7, 9, 10]),   // /48
            v4([7, 9, 10, 11]),  // /56
            v4([9, 10, 11, 12]), // /64
            last32,              // /96
        ],
        // 6to4: 2002:aabb:ccdd::/48 carries aa.bb.cc.dd.
        [0x2002, ..] => vec![v4([2, 3, 4, 5])],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The policy's verdict on an address written as text (`[::]` or `::`).
    fn verdict(p: &Policy, dst: &str) -> bool {
        let ip: IpAddr = dst.trim_start_matches('[').trim_end_matches(']').parse().expect("address");
        p.allows(SocketAddr::new(ip, 80))
    }

    fn nets(l: &[&str]) -> Vec<IpNet> {
        l.iter().map(|s| s.parse().expect("CIDR")).collect()
    }

    fn default_with(allow: &[&str]) -> Policy {
        Policy::new(None, Some(nets(allow)))
    }

    #[test]
    fn the_default_list_parses() {
        assert_eq!(Policy::new(None, None).deny.len(), DEFAULT_DENY.len());
    }

    #[test]
    fn unspecified_addresses_are_refused() {
        let p = Policy::new(None, None);
        assert!(!verdict(&p, "0.0.0.0"), "0.0.0.0 is the proxy's own host");
        assert!(!verdict(&p, "[::]"), ":: is the proxy's own host");
    }

    #[test]
    fn loopback_is_refused_in_every_spelling() {
        let p = Policy::new(None, None);
        for a in
            ["127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1", "::127.0.0.1", "64:ff9b::7f00:1", "2002:7f00:1::1"]
        {
            assert!(!verdict(&p, a), "{a} is loopback");
        }
    }

    #[test]
    fn nat64_and_mapped_forms_are_checked_as_their_ipv4() {
        let p = Policy::new(None, None);
        // 64:ff9b::a00:1 is 10.0.0.1; 64:ff9b::a9fe:a9fe is 169.254.169.254.
        for a in ["64:ff9b::a00:1", "64:ff9b::a9fe:a9fe", "::ffff:10.0.0.1", "::ffff:192.168.1.1", "2002:a00:1::1"] {
            assert!(!verdict(&p, a), "{a} hides a denied IPv4 address");
        }
        // 64:ff9b:1::/48 with a /48 prefix: 10.0.0.1 in bytes 6-7 and 9-10.
        assert!(!verdict(&p, "64:ff9b:1:a00:1:100::"), "RFC 8215 /48 embedding of 10.0.0.1");
        // ... and with a /96 prefix.
        assert!(!verdict(&p, "64:ff9b:1::a00:1"), "RFC 8215 /96 embedding of 10.0.0.1");
        // Public IPv4 addresses behind NAT64 or mapped stay reachable.
        for a in ["64:ff9b::808:808", "::ffff:8.8.8.8", "2002:808:808::1"] {
            assert!(verdict(&p, a), "{a} carries a public IPv4 address");
        }
    }

    #[test]
    fn private_and_special_ranges_are_refused_by_default() {
        let p = Policy::new(None, None);
        for a in [
            "10.99.0.10",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "169.254.169.254",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
            "0.1.2.3",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "fec0::1",
            "ff02::1",
        ] {
            assert!(!verdict(&p, a), "{a} must be refused by default");
        }
    }

    #[test]
    fn public_addresses_pass() {
        let p = Policy::new(None, None);
        for a in ["1.1.1.1", "93.184.216.34", "172.32.0.1", "2606:4700:4700::1111", "2a00:1450:4001::200e"] {
            assert!(verdict(&p, a), "{a} is public");
        }
    }

    #[test]
    fn an_allow_entry_punches_a_hole_in_the_default_list() {
        let p = default_with(&["10.99.0.0/24"]);
        assert!(verdict(&p, "10.99.0.10"), "the testbed's origin is re-opened");
        assert!(verdict(&p, "::ffff:10.99.0.10"), "in its mapped form too");
        assert!(verdict(&p, "64:ff9b::a63:a"), "and behind NAT64");
        assert!(!verdict(&p, "10.98.0.10"), "the rest of 10/8 stays refused");
        assert!(!verdict(&p, "127.0.0.1"));
        assert!(verdict(&p, "1.1.1.1"), "public addresses still pass");
        // A tie goes to the allow entry: the operator named that network.
        assert!(verdict(&default_with(&["10.0.0.0/8"]), "10.1.2.3"));
    }

    #[test]
    fn a_broad_allow_entry_does_not_reopen_narrower_denied_ranges() {
        let p = default_with(&["0.0.0.0/0", "::/0"]);
        for a in ["127.0.0.1", "10.0.0.1", "::1", "::", "64:ff9b::7f00:1"] {
            assert!(!verdict(&p, a), "{a}");
        }
    }

    #[test]
    fn a_hole_does_not_open_other_forms_denied_on_their_own() {
        // The IPv6 form must pass too: an operator's deny of the NAT64
        // prefix holds even for an allowed IPv4 address inside it.
        let p = Policy::new(Some(nets(&["64:ff9b::/96", "10.0.0.0/8"])), Some(nets(&["10.99.0.0/24"])));
        assert!(verdict(&p, "10.99.0.10"));
        assert!(!verdict(&p, "64:ff9b::a63:a"));
    }

    #[test]
    fn only_some_networks_deny_everything_else() {
        let p = Policy::new(Some(nets(&["0.0.0.0/0", "::/0"])), Some(nets(&["10.99.0.0/24"])));
        assert!(verdict(&p, "10.99.0.10"));
        assert!(!verdict(&p, "10.98.0.10"));
        assert!(!verdict(&p, "1.1.1.1"));
        assert!(!verdict(&p, "2606:4700:4700::1111"));
    }

    /// A host with 10.99.0.1/24 (broadcast 10.99.0.255) and fd00::1.
    fn testbed_host() -> std::io::Result<HashSet<IpAddr>> {
        Ok(["10.99.0.1", "10.99.0.255", "fd00::1"].iter().map(|a| a.parse().expect("address")).collect())
    }

    #[test]
    fn the_hosts_own_addresses_are_refused_whatever_allow_says() {
        let p = Policy::with_own_addrs(None, Some(nets(&["10.99.0.0/24", "fd00::/64"])), testbed_host);
        assert!(verdict(&p, "10.99.0.10"), "the origin network stays open");
        assert!(verdict(&p, "fd00::10"));
        for a in ["10.99.0.1", "10.99.0.255", "::ffff:10.99.0.1", "64:ff9b::a63:1", "2002:a63:1::1", "fd00::1"] {
            assert!(!verdict(&p, a), "{a} is the proxy's own host");
        }
        // Only an address named by --allow-own-address is opened.
        let testbed = Policy::with_own_addrs(None, Some(nets(&["10.99.0.0/24"])), testbed_host)
            .open_own_addresses(["10.99.0.255".parse().unwrap()]);
        assert!(verdict(&testbed, "10.99.0.255"));
        assert!(verdict(&testbed, "::ffff:10.99.0.255"));
        assert!(!verdict(&testbed, "10.99.0.1"));
        // A loopback origin needs both the exact address and an allow entry.
        let lo = Policy::with_own_addrs(None, Some(nets(&["127.0.0.2/32"])), testbed_host)
            .open_own_addresses(["127.0.0.2".parse().unwrap()]);
        assert!(verdict(&lo, "127.0.0.2"));
        assert!(!verdict(&lo, "127.0.0.1"));
        let no_allow =
            Policy::with_own_addrs(None, None, testbed_host).open_own_addresses(["127.0.0.2".parse().unwrap()]);
        assert!(!verdict(&no_allow, "127.0.0.2"), "the deny list still applies");
        // Even with no deny list at all.
        let open = Policy::with_own_addrs(Some(Vec::new()), None, testbed_host);
        assert!(verdict(&open, "10.99.0.10"));
        assert!(!verdict(&open, "10.99.0.1"));
    }

    #[test]
    fn loopback_and_unspecified_are_refused_whatever_allow_says() {
        let p = Policy::with_own_addrs(Some(Vec::new()), Some(nets(&["0.0.0.0/0", "::/0", "127.0.0.0/8"])), || {
            Ok(HashSet::new())
        });
        for a in ["127.0.0.1", "127.0.0.2", "0.0.0.0", "::1", "::", "::ffff:127.0.0.2", "64:ff9b::7f00:2"] {
            assert!(!verdict(&p, a), "{a} is the proxy's own host");
        }
        assert!(verdict(&p, "10.0.0.1"), "nothing else is denied");
    }

    #[test]
    fn the_hosts_addresses_come_from_the_kernel_and_are_read_again() {
        let got = host_addrs().expect("getifaddrs");
        assert!(got.contains(&IpAddr::V4(Ipv4Addr::LOCALHOST)), "{got:?}");
        static READS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let own = OwnAddrs {
            read: || {
                READS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                testbed_host()
            },
            cache: Mutex::new(None),
        };
        let t0 = Instant::now();
        assert_eq!(own.get(t0).len(), 3);
        own.get(t0 + OWN_REFRESH / 2);
        assert_eq!(READS.load(std::sync::atomic::Ordering::Relaxed), 1, "cached");
        own.get(t0 + OWN_REFRESH);
        assert_eq!(READS.load(std::sync::atomic::Ordering::Relaxed), 2, "read again once stale");
    }
}
