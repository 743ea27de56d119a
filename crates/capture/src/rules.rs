//! The nftables rules that steer passenger traffic into the relay.
//!
//! Everything lives in one table, `inet polycorn_relay`, so installing is a
//! single atomic `nft -f` transaction that replaces any earlier version and
//! removing is deleting the table; other rules on the train are not touched.
//! The `inet` family covers IPv4 and IPv6 alike.
//!
//! For packets arriving on the passenger interface (`iifname`):
//! - **nat prerouting** (priority `dstnat`): UDP/53 to any address is
//!   REDIRECTed to the DNS forwarder, so passengers with hard-coded
//!   resolvers are served too; TCP to any address that is not the train's
//!   own is REDIRECTed to the transparent listener. REDIRECT happens before
//!   routing, so the train needs neither a route to the destination nor IP
//!   forwarding, and conntrack keeps the original destination for
//!   `SO_ORIGINAL_DST`. TCP to the train's own addresses is not redirected:
//!   the filter input chain below decides about it.
//! - **filter prerouting** (priority `mangle`, i.e. before the nat chain so
//!   DNS still has port 53): UDP other than DNS is handled per
//!   [`UdpPolicy`]. The tunnel carries no UDP, so QUIC (UDP/443) is
//!   *rejected* with ICMP port unreachable by default: browsers then fall
//!   back to TCP at once instead of after a QUIC timeout. iptables' `REJECT`
//!   is refused in PREROUTING; nftables' `reject` is accepted there, and
//!   without forwarding the packet would never reach INPUT or FORWARD.
//!   UDP to the train's own, broadcast and multicast addresses is left to
//!   the filter input chain below.
//! - **filter input** (the gateway itself): the passenger interface
//!   reaches only what the relay serves passengers. Accepted: what the
//!   nat chain redirected (`ct status dnat`: the transparent listener, the
//!   DNS forwarder), replies of the gateway's own connections, ICMP and
//!   ICMPv6 (echo, errors and path MTU, neighbour and router discovery),
//!   DHCP and DHCPv6 to the gateway's server ports, the relay's own
//!   passenger ports ([`InterceptRules::passenger_tcp_ports`], SOCKS5;
//!   [`InterceptRules::dns_port`]), and the operator's
//!   [`InterceptRules::gateway_allow`]. Every other TCP connection to any
//!   of the gateway's addresses (the LAN's, a carrier's, any other: ssh,
//!   gpsd, a modem's web UI, the relay's metrics) is reset, other UDP to
//!   its own addresses gets ICMP port unreachable, and the rest is dropped.
//!   Traffic of the other interfaces is not touched.
//! - **filter prerouting** (priority `raw`, before conntrack): a strict
//!   reverse-path check on the passenger interface: a source address the
//!   gateway would not route back out of that interface, or one of its own,
//!   is dropped. A passenger can then not make the DNS forwarder (or any
//!   other service) answer to an address off the LAN, such as a carrier's
//!   network. The unspecified source (DHCP discovery, duplicate address
//!   detection) is let through. Spoofing another passenger of the same LAN
//!   passes this check; only the access network's client isolation with
//!   source guard can tell those apart.

use std::fmt::Write as _;
use std::io::{self, Write as _};
use std::process::{Command, Stdio};

/// Name of the nftables table (family `inet`) holding all the rules.
pub const TABLE: &str = "polycorn_relay";

/// What happens to passenger UDP that is not DNS.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum UdpPolicy {
    /// Reject UDP/443 (QUIC) with ICMP port unreachable so applications fall
    /// back to TCP at once; silently drop other non-DNS UDP.
    #[default]
    RejectQuic,
    /// Silently drop all non-DNS UDP, QUIC included.
    DropAll,
    /// Leave non-DNS UDP alone (the kernel routes or drops it as usual; on a
    /// train without forwarding it is dropped).
    Allow,
}

/// Interception of one passenger-facing interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterceptRules {
    /// The passenger LAN interface, e.g. `lan0` (nftables `iifname`; a
    /// trailing `*` matches a prefix).
    pub lan_if: String,
    /// Port of the transparent TCP listener ([`crate::serve_transparent`]).
    pub tcp_redirect_port: u16,
    /// Port of the UDP DNS forwarder ([`crate::serve_dns`]); 0 when there is
    /// none: passenger DNS is then not redirected, so queries to other hosts
    /// go wherever the train routes them and queries to the gateway itself
    /// are closed like its other services (unless allowed, `udp:53`).
    pub dns_port: u16,
    /// Non-DNS UDP handling.
    pub udp_policy: UdpPolicy,
    /// TCP ports on the gateway's own addresses that the relay serves
    /// passengers directly (its SOCKS5 listener): open to the passenger
    /// interface.
    pub passenger_tcp_ports: Vec<u16>,
    /// The operator's exceptions: gateway services passengers may reach
    /// (`--gateway-allow`). Everything else on the gateway is closed to the
    /// passenger interface.
    pub gateway_allow: Vec<GatewayAllow>,
}

/// Transport protocol of a [`GatewayAllow`] entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

/// One gateway service open to passengers: a protocol and a port range,
/// written `tcp:22`, `udp:123` or `tcp:8000-8010`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatewayAllow {
    /// TCP or UDP.
    pub proto: Proto,
    /// First port of the range (nonzero).
    pub first: u16,
    /// Last port of the range (at least `first`).
    pub last: u16,
}

impl std::str::FromStr for GatewayAllow {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let err = || format!("{s:?}: expected PROTO:PORT or PROTO:FIRST-LAST with PROTO tcp or udp, e.g. tcp:22");
        let (proto, ports) = s.trim().split_once(':').ok_or_else(err)?;
        let proto = match proto.to_ascii_lowercase().as_str() {
            "tcp" => Proto::Tcp,
            "udp" => Proto::Udp,
            _ => return Err(err()),
        };
        let (first, last) = ports.split_once('-').unwrap_or((ports, ports));
        let port = |p: &str| p.parse::<u16>().ok().filter(|p| *p != 0);
        match (port(first), port(last)) {
            (Some(first), Some(last)) if first <= last => Ok(GatewayAllow { proto, first, last }),
            _ => Err(err()),
        }
    }
}

impl std::fmt::Display for GatewayAllow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let proto = match self.proto {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        };
        if self.first == self.last {
            write!(f, "{proto}:{}", self.first)
        } else {
            write!(f, "{proto}:{}-{}", self.first, self.last)
        }
    }
}

impl GatewayAllow {
    /// The nftables match, e.g. `tcp dport 8000-8010`.
    fn nft_match(&self) -> String {
        let proto = match self.proto {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        };
        if self.first == self.last {
            format!("{proto} dport {}", self.first)
        } else {
            format!("{proto} dport {}-{}", self.first, self.last)
        }
    }
}

/// UDP ports of the gateway's DHCP (67) and DHCPv6 (547) servers: a LAN
/// gateway hands out its passengers' addresses, so these stay open.
pub const DHCP_SERVER_PORTS: [u16; 2] = [67, 547];

impl InterceptRules {
    /// Rules for `lan_if` with the default [`UdpPolicy::RejectQuic`].
    pub fn new(lan_if: impl Into<String>, tcp_redirect_port: u16, dns_port: u16) -> Self {
        Self {
            lan_if: lan_if.into(),
            tcp_redirect_port,
            dns_port,
            udp_policy: UdpPolicy::default(),
            passenger_tcp_ports: Vec::new(),
            gateway_allow: Vec::new(),
        }
    }

    /// Checks what goes into the script: an interface name the kernel would
    /// accept (and that cannot break out of the nft string), a nonzero TCP
    /// port.
    pub fn validate(&self) -> io::Result<()> {
        let name = self.lan_if.strip_suffix('*').unwrap_or(&self.lan_if);
        let bad_name = name.is_empty()
            || self.lan_if.len() >= 16
            || name == "."
            || name == ".."
            || !name.bytes().all(|b| b.is_ascii_graphic() && !matches!(b, b'/' | b':' | b'"' | b'\\' | b'*'));
        if bad_name {
            return Err(invalid(format!("invalid interface name {:?}", self.lan_if)));
        }
        if self.tcp_redirect_port == 0 {
            return Err(invalid("TCP redirect port must be nonzero".into()));
        }
        Ok(())
    }

    /// The complete ruleset as an `nft -f` script. It first creates and
    /// deletes the table, so applying it replaces any earlier version in one
    /// transaction. Call [`validate`](Self::validate) first if the fields
    /// come from outside ([`install`](Self::install) does).
    pub fn nft_script(&self) -> String {
        let lan = &self.lan_if;
        let mut s = String::new();
        let _ = writeln!(s, "table inet {TABLE}");
        let _ = writeln!(s, "delete table inet {TABLE}");
        let _ = writeln!(s, "table inet {TABLE} {{");
        let _ = writeln!(s, "    chain intercept_nat {{");
        let _ = writeln!(s, "        type nat hook prerouting priority dstnat; policy accept;");
        let _ = writeln!(s, "        iifname != \"{lan}\" return");
        if self.dns_port != 0 {
            let _ = writeln!(s, "        udp dport 53 redirect to :{}", self.dns_port);
        }
        let _ = writeln!(s, "        fib daddr type local return");
        let _ = writeln!(s, "        meta l4proto tcp redirect to :{}", self.tcp_redirect_port);
        let _ = writeln!(s, "    }}");
        if self.udp_policy != UdpPolicy::Allow {
            let _ = writeln!(s, "    chain udp_filter {{");
            let _ = writeln!(s, "        type filter hook prerouting priority mangle; policy accept;");
            let _ = writeln!(s, "        iifname != \"{lan}\" return");
            let _ = writeln!(s, "        meta l4proto != udp return");
            let _ = writeln!(s, "        udp dport 53 return");
            let _ = writeln!(s, "        fib daddr type {{ local, broadcast, multicast }} return");
            if self.udp_policy == UdpPolicy::RejectQuic {
                let _ = writeln!(s, "        udp dport 443 reject with icmpx type port-unreachable");
            }
            let _ = writeln!(s, "        drop");
            let _ = writeln!(s, "    }}");
        }
        let _ = writeln!(s, "    chain source_check {{");
        let _ = writeln!(s, "        type filter hook prerouting priority raw; policy accept;");
        let _ = writeln!(s, "        iifname != \"{lan}\" return");
        let _ = writeln!(s, "        ip saddr 0.0.0.0 return");
        let _ = writeln!(s, "        ip6 saddr :: return");
        let _ = writeln!(s, "        fib saddr type local drop");
        let _ = writeln!(s, "        fib saddr . iif oif missing drop");
        let _ = writeln!(s, "    }}");
        let _ = writeln!(s, "    chain gateway {{");
        let _ = writeln!(s, "        type filter hook input priority filter; policy accept;");
        let _ = writeln!(s, "        iifname != \"{lan}\" return");
        let _ = writeln!(s, "        ct state established,related accept");
        let _ = writeln!(s, "        ct status dnat accept");
        let _ = writeln!(s, "        meta l4proto {{ icmp, ipv6-icmp }} accept");
        let mut udp: Vec<String> = DHCP_SERVER_PORTS.iter().map(u16::to_string).collect();
        if self.dns_port != 0 {
            udp.push(self.dns_port.to_string());
        }
        let _ = writeln!(s, "        udp dport {{ {} }} accept", udp.join(", "));
        if !self.passenger_tcp_ports.is_empty() {
            let ports: Vec<String> = self.passenger_tcp_ports.iter().map(u16::to_string).collect();
            let _ = writeln!(s, "        tcp dport {{ {} }} accept", ports.join(", "));
        }
        for allow in &self.gateway_allow {
            let _ = writeln!(s, "        {} accept", allow.nft_match());
        }
        let _ = writeln!(s, "        meta l4proto tcp reject with tcp reset");
        let _ = writeln!(s, "        fib daddr type local meta l4proto udp reject with icmpx type port-unreachable");
        let _ = writeln!(s, "        drop");
        let _ = writeln!(s, "    }}");
        let _ = writeln!(s, "}}");
        s
    }

    /// Installs (or replaces) the rules in the current network namespace by
    /// running `nft -f -` with [`nft_script`](Self::nft_script). Needs
    /// CAP_NET_ADMIN and the `nft` binary.
    pub fn install(&self) -> io::Result<()> {
        self.validate()?;
        run_nft(&self.nft_script())
    }

    /// Deletes the table if present. Idempotent.
    pub fn remove(&self) -> io::Result<()> {
        remove_table()
    }
}

/// Deletes table `inet polycorn_relay` if present, whatever created it.
pub fn remove_table() -> io::Result<()> {
    run_nft(&format!("table inet {TABLE}\ndelete table inet {TABLE}\n"))
}

fn run_nft(script: &str) -> io::Result<()> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("running nft: {e}")))?;
    let written = child.stdin.take().map(|mut stdin| stdin.write_all(script.as_bytes()));
    let out = child.wait_with_output()?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(io::Error::other(format!("nft -f - failed ({}): {}", out.status, stderr.trim())));
    }
    if let Some(Err(e)) = written {
        return Err(io::Error::new(e.kind(), format!("writing to nft: {e}")));
    }
    Ok(())
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nft_script_reject_quic_default() {
        let r = InterceptRules::new("lan0", 15001, 15053);
        assert_eq!(r.udp_policy, UdpPolicy::RejectQuic);
        let expected = r#"table inet polycorn_relay
delete table inet polycorn_relay
table inet polycorn_relay {
    chain intercept_nat {
        type nat hook prerouting priority dstnat; policy accept;
        iifname != "lan0" return
        udp dport 53 redirect to :15053
        fib daddr type local return
        meta l4proto tcp redirect to :15001
    }
    chain udp_filter {
        type filter hook prerouting priority mangle; policy accept;
        iifname != "lan0" return
        meta l4proto != udp return
        udp dport 53 return
        fib daddr type { local, broadcast, multicast } return
        udp dport 443 reject with icmpx type port-unreachable
        drop
    }
    chain source_check {
        type filter hook prerouting priority raw; policy accept;
        iifname != "lan0" return
        ip saddr 0.0.0.0 return
        ip6 saddr :: return
        fib saddr type local drop
        fib saddr . iif oif missing drop
    }
    chain gateway {
        type filter hook input priority filter; policy accept;
        iifname != "lan0" return
        ct state established,related accept
        ct status dnat accept
        meta l4proto { icmp, ipv6-icmp } accept
        udp dport { 67, 547, 15053 } accept
        meta l4proto tcp reject with tcp reset
        fib daddr type local meta l4proto udp reject with icmpx type port-unreachable
        drop
    }
}
"#;
        assert_eq!(r.nft_script(), expected);
    }

    #[test]
    fn the_gateway_is_closed_to_passengers_but_for_what_the_relay_serves() {
        let allow = ["tcp:22", "udp:123", "tcp:8000-8010"].map(|a| a.parse().unwrap()).to_vec();
        let r = InterceptRules {
            passenger_tcp_ports: vec![1080],
            gateway_allow: allow,
            ..InterceptRules::new("lan0", 15001, 15053)
        };
        let s = r.nft_script();
        let gateway = "    chain gateway {
        type filter hook input priority filter; policy accept;
        iifname != \"lan0\" return
        ct state established,related accept
        ct status dnat accept
        meta l4proto { icmp, ipv6-icmp } accept
        udp dport { 67, 547, 15053 } accept
        tcp dport { 1080 } accept
        tcp dport 22 accept
        udp dport 123 accept
        tcp dport 8000-8010 accept
        meta l4proto tcp reject with tcp reset
        fib daddr type local meta l4proto udp reject with icmpx type port-unreachable
        drop
    }
";
        assert!(s.contains(gateway), "{s}");
        // Without SOCKS5, DNS forwarder or allow-list: DHCP and ICMP only.
        let s = InterceptRules::new("lan0", 15001, 0).nft_script();
        assert!(s.contains("        udp dport { 67, 547 } accept\n"), "{s}");
        assert!(!s.contains("tcp dport {"), "{s}");
        assert!(s.contains("        meta l4proto tcp reject with tcp reset\n"), "{s}");
    }

    #[test]
    fn passenger_sources_are_checked_against_the_route_back() {
        let s = InterceptRules::new("wlan*", 15001, 0).nft_script();
        let check = "    chain source_check {
        type filter hook prerouting priority raw; policy accept;
        iifname != \"wlan*\" return
        ip saddr 0.0.0.0 return
        ip6 saddr :: return
        fib saddr type local drop
        fib saddr . iif oif missing drop
    }
";
        assert!(s.contains(check), "{s}");
    }

    #[test]
    fn gateway_allow_entries_parse_and_print() {
        for (text, want) in [
            ("tcp:22", GatewayAllow { proto: Proto::Tcp, first: 22, last: 22 }),
            ("UDP:123", GatewayAllow { proto: Proto::Udp, first: 123, last: 123 }),
            ("tcp:8000-8010", GatewayAllow { proto: Proto::Tcp, first: 8000, last: 8010 }),
        ] {
            let got: GatewayAllow = text.parse().unwrap();
            assert_eq!(got, want, "{text}");
            assert_eq!(got.to_string().parse::<GatewayAllow>().unwrap(), want);
        }
        for bad in ["", "22", "tcp", "tcp:", "tcp:0", "tcp:65536", "sctp:22", "tcp:10-5", "tcp:1-", "tcp:a", "tcp:22;x"]
        {
            let e = bad.parse::<GatewayAllow>().unwrap_err();
            assert!(e.contains("PROTO:PORT"), "{bad}: {e}");
        }
    }

    #[test]
    fn nft_script_drop_all_has_no_reject() {
        let r = InterceptRules { udp_policy: UdpPolicy::DropAll, ..InterceptRules::new("wlan1", 1, 2) };
        let s = r.nft_script();
        assert!(!s.contains("udp dport 443 reject"));
        assert!(s.contains("chain udp_filter"));
        assert!(s.contains("        drop\n"));
        assert!(s.contains("iifname != \"wlan1\" return"));
    }

    #[test]
    fn nft_script_allow_has_no_udp_filter() {
        let r = InterceptRules { udp_policy: UdpPolicy::Allow, ..InterceptRules::new("lan0", 1, 2) };
        let s = r.nft_script();
        assert!(!s.contains("udp_filter") && !s.contains("udp dport 443"));
        assert!(s.contains("udp dport 53 redirect to :2") && s.contains("meta l4proto tcp redirect to :1"));
    }

    #[test]
    fn validate_rejects_bad_names_and_ports() {
        for bad in ["", "a b", "x\"y", "eth0/1", "averyveryverylongname", "..", "a*b", "*"] {
            assert!(InterceptRules::new(bad, 1, 2).validate().is_err(), "{bad:?}");
        }
        for good in ["lan0", "br-pax", "wlan*", "eth0.100"] {
            InterceptRules::new(good, 1, 2).validate().unwrap();
        }
        assert!(InterceptRules::new("lan0", 0, 2).validate().is_err());
    }

    #[test]
    fn nft_script_without_dns_port_leaves_dns_alone() {
        let r = InterceptRules::new("lan0", 15001, 0);
        r.validate().unwrap();
        let s = r.nft_script();
        assert!(!s.contains("redirect to :0") && !s.contains("udp dport 53 redirect"));
        assert!(s.contains("udp dport 53 return"), "DNS still exempt from the UDP policy");
    }
}
