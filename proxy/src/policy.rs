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

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use ipnet::IpNet;

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

/// `--deny` and `--allow`.
#[derive(Debug, Clone)]
pub struct Policy {
    deny: Vec<IpNet>,
    allow: Vec<IpNet>,
}

impl Policy {
    /// `deny`: None for [`DEFAULT_DENY`].
    pub fn new(deny: Option<Vec<IpNet>>, allow: Option<Vec<IpNet>>) -> Self {
        let deny =
            deny.unwrap_or_else(|| DEFAULT_DENY.iter().map(|s| s.parse().expect("valid default CIDR")).collect());
        Self { deny, allow: allow.unwrap_or_default() }
    }

    /// Whether the proxy may connect to `dst`.
    pub fn allows(&self, dst: SocketAddr) -> bool {
        let ip = dst.ip();
        self.admits(ip) && embedded_v4(ip).iter().all(|v4| self.admits(IpAddr::V4(*v4)))
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
}
