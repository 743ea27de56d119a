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
//!   `SO_ORIGINAL_DST`. TCP to the train's own addresses (its DHCP/SSH/
//!   metrics services, or the relay port itself) is left alone.
//! - **filter prerouting** (priority `mangle`, i.e. before the nat chain so
//!   DNS still has port 53): UDP other than DNS is handled per
//!   [`UdpPolicy`]. The tunnel carries no UDP, so QUIC (UDP/443) is
//!   *rejected* with ICMP port unreachable by default: browsers then fall
//!   back to TCP at once instead of after a QUIC timeout. iptables' `REJECT`
//!   is refused in PREROUTING; nftables' `reject` is accepted there, and
//!   without forwarding the packet would never reach INPUT or FORWARD.
//!   UDP to the train's own, broadcast and multicast addresses (DHCP, mDNS,
//!   NTP to the train) is left to the train's input policy.
//! - **filter input**: TCP to [`InterceptRules::guard_tcp_ports`] on the
//!   train itself (the relay's metrics and health endpoint) is reset, so
//!   passengers cannot read the relay's metrics.

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
    /// none: passenger DNS is then not redirected (nor dropped) at all.
    pub dns_port: u16,
    /// Non-DNS UDP handling.
    pub udp_policy: UdpPolicy,
    /// TCP ports of the train's own services that passengers must not
    /// reach (the relay's metrics and health endpoint): connections to them
    /// from the passenger interface are reset.
    pub guard_tcp_ports: Vec<u16>,
}

impl InterceptRules {
    /// Rules for `lan_if` with the default [`UdpPolicy::RejectQuic`].
    pub fn new(lan_if: impl Into<String>, tcp_redirect_port: u16, dns_port: u16) -> Self {
        Self {
            lan_if: lan_if.into(),
            tcp_redirect_port,
            dns_port,
            udp_policy: UdpPolicy::default(),
            guard_tcp_ports: Vec::new(),
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
        if !self.guard_tcp_ports.is_empty() {
            let ports: Vec<String> = self.guard_tcp_ports.iter().map(u16::to_string).collect();
            let _ = writeln!(s, "    chain guard {{");
            let _ = writeln!(s, "        type filter hook input priority filter; policy accept;");
            let _ = writeln!(s, "        iifname != \"{lan}\" return");
            let _ = writeln!(s, "        tcp dport {{ {} }} reject with tcp reset", ports.join(", "));
            let _ = writeln!(s, "    }}");
        }
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
}
"#;
        assert_eq!(r.nft_script(), expected);
    }

    #[test]
    fn guarded_ports_are_reset_for_passengers_only() {
        let r = InterceptRules { guard_tcp_ports: vec![9465, 8080], ..InterceptRules::new("lan0", 15001, 0) };
        let s = r.nft_script();
        let guard = "    chain guard {
        type filter hook input priority filter; policy accept;
        iifname != \"lan0\" return
        tcp dport { 9465, 8080 } reject with tcp reset
    }
";
        assert!(s.contains(guard), "{s}");
        assert!(!InterceptRules::new("lan0", 15001, 0).nft_script().contains("chain guard"));
    }

    #[test]
    fn nft_script_drop_all_has_no_reject() {
        let r = InterceptRules { udp_policy: UdpPolicy::DropAll, ..InterceptRules::new("wlan1", 1, 2) };
        let s = r.nft_script();
        assert!(!s.contains("reject"));
        assert!(s.contains("chain udp_filter"));
        assert!(s.contains("        drop\n"));
        assert!(s.contains("iifname != \"wlan1\" return"));
    }

    #[test]
    fn nft_script_allow_has_no_udp_filter() {
        let r = InterceptRules { udp_policy: UdpPolicy::Allow, ..InterceptRules::new("lan0", 1, 2) };
        let s = r.nft_script();
        assert!(!s.contains("udp_filter") && !s.contains("drop") && !s.contains("reject"));
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
