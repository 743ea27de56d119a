//! The client's address behind the edge (`--proxy-protocol-from`).
//!
//! In the chart every relay reaches its proxy through Envoy, so the proxy
//! sees each connection come from an Envoy pod: the limits per source
//! before authentication ([`crate::preauth`]) would be one limit for every
//! relay and every stranger at once. Envoy therefore starts each connection
//! it forwards with a PROXY protocol v2 header (HAProxy's binary form,
//! Envoy's `upstream_proxy_protocol` transport socket) that names the
//! client, and the proxy takes that address as the connection's source. The
//! header is believed only from the networks listed: a connection from one
//! of them without a valid header is closed, and a connection from
//! anywhere else is taken as it comes (a header there would be the
//! client's own claim, and is not looked for).
//!
//! Parsing is `ppp`'s; this module reads exactly the header's bytes (its
//! fixed 16 bytes give the length of the rest, at most [`MAX_PAYLOAD`]), so
//! the TLS handshake that follows starts on the same stream untouched.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use ppp::v2::{Addresses, Command, Header, PROTOCOL_PREFIX};
use tokio::io::AsyncReadExt;

/// The fixed part of a v2 header: the 12-byte signature, version and
/// command, family and protocol, and the length of the rest.
const MINIMUM_LENGTH: usize = 16;

/// Longest header payload (addresses and TLVs) read: IPv6 addresses take
/// 36 bytes, and Envoy adds no TLVs unless told to.
pub const MAX_PAYLOAD: usize = 512;

/// The networks whose connections carry a PROXY protocol v2 header.
#[derive(Clone, Debug, Default)]
pub struct Edge {
    from: Vec<IpNet>,
}

impl Edge {
    pub fn new(from: Vec<IpNet>) -> Edge {
        Edge { from }
    }

    /// Whether a connection from `peer` must start with a header.
    pub fn fronts(&self, peer: IpAddr) -> bool {
        let peer = peer.to_canonical();
        self.from.iter().any(|n| n.contains(&peer))
    }

    /// The client of a connection from `peer` that reads from `r`: `peer`
    /// itself unless the edge fronts it; else the header's source (`peer`
    /// for a LOCAL header: a health check of the edge's own). An edge
    /// connection without a valid header is an error.
    pub async fn client<R: AsyncReadExt + Unpin>(&self, r: &mut R, peer: SocketAddr) -> anyhow::Result<SocketAddr> {
        if !self.fronts(peer.ip()) {
            return Ok(peer);
        }
        let mut head = [0u8; MINIMUM_LENGTH];
        r.read_exact(&mut head).await?;
        if &head[..PROTOCOL_PREFIX.len()] != PROTOCOL_PREFIX {
            anyhow::bail!("no PROXY protocol v2 header from the edge at {peer}");
        }
        let len = usize::from(u16::from_be_bytes([head[14], head[15]]));
        if len > MAX_PAYLOAD {
            anyhow::bail!("a PROXY protocol header of {len} bytes from {peer} (at most {MAX_PAYLOAD})");
        }
        let mut whole = Vec::with_capacity(MINIMUM_LENGTH + len);
        whole.extend_from_slice(&head);
        whole.resize(MINIMUM_LENGTH + len, 0);
        r.read_exact(&mut whole[MINIMUM_LENGTH..]).await?;
        client_of(&whole, peer)
    }
}

/// The client a whole header names (see [`Edge::client`]).
pub fn client_of(header: &[u8], peer: SocketAddr) -> anyhow::Result<SocketAddr> {
    let h = Header::try_from(header).map_err(|e| anyhow::anyhow!("a bad PROXY protocol header from {peer}: {e}"))?;
    match (h.command, h.addresses) {
        (Command::Local, _) => Ok(peer),
        (Command::Proxy, Addresses::IPv4(a)) => Ok(SocketAddr::new(a.source_address.into(), a.source_port)),
        (Command::Proxy, Addresses::IPv6(a)) => Ok(SocketAddr::new(a.source_address.into(), a.source_port)),
        (Command::Proxy, other) => {
            anyhow::bail!("a PROXY protocol header from {peer} without an IP source ({:?})", other.address_family())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ppp::v2::{Builder, Command, IPv4, IPv6, Protocol, Version};

    fn header(addresses: impl Into<Addresses>, command: Command) -> Vec<u8> {
        let a: Addresses = addresses.into();
        Builder::with_addresses(Version::Two | command, Protocol::Stream, a).build().unwrap()
    }

    const EDGE: &str = "10.42.0.7:40000";

    fn edge() -> Edge {
        Edge::new(vec!["10.42.0.0/16".parse().unwrap()])
    }

    async fn client(bytes: &[u8], peer: &str) -> anyhow::Result<(SocketAddr, Vec<u8>)> {
        let mut r = bytes;
        let c = edge().client(&mut r, peer.parse().unwrap()).await?;
        Ok((c, r.to_vec()))
    }

    #[tokio::test]
    async fn the_edges_header_names_the_client_and_the_stream_goes_on_after_it() {
        let v4 = header(IPv4::new([203, 0, 113, 9], [10, 42, 1, 2], 51000, 4433), Command::Proxy);
        let (c, rest) = client(&[v4.as_slice(), b"\x16\x03\x01TLS"].concat(), EDGE).await.unwrap();
        assert_eq!((c, rest.as_slice()), ("203.0.113.9:51000".parse().unwrap(), b"\x16\x03\x01TLS".as_slice()));

        let six: std::net::Ipv6Addr = "2001:db8::9".parse().unwrap();
        let v6 = header(IPv6::new(six, six, 443, 4433), Command::Proxy);
        assert_eq!(client(&v6, EDGE).await.unwrap().0, SocketAddr::new(six.into(), 443));

        let local = header(Addresses::Unspecified, Command::Local);
        assert_eq!(client(&local, EDGE).await.unwrap().0, EDGE.parse().unwrap(), "LOCAL: the edge itself");
    }

    #[tokio::test]
    async fn only_the_listed_networks_are_read_for_a_header() {
        // A client elsewhere is taken as it comes, its bytes untouched,
        // even one that sends a header of its own (a forged source).
        let forged = header(IPv4::new([198, 51, 100, 1], [10, 42, 1, 2], 1, 4433), Command::Proxy);
        let (c, rest) = client(&forged, "192.0.2.1:5000").await.unwrap();
        assert_eq!((c, rest), ("192.0.2.1:5000".parse().unwrap(), forged));
        let mapped: SocketAddr = "[::ffff:10.42.9.9]:1".parse().unwrap();
        assert!(edge().fronts(mapped.ip()), "an IPv4-mapped edge address is the edge");
    }

    #[tokio::test]
    async fn an_edge_connection_without_a_valid_header_is_refused() {
        for (what, bytes) in [
            ("TLS at once", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03abcdefgh".to_vec()),
            ("version 1 text", b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n".to_vec()),
            ("cut short", header(IPv4::new([1, 2, 3, 4], [5, 6, 7, 8], 1, 2), Command::Proxy)[..20].to_vec()),
            ("too long", [PROTOCOL_PREFIX, &[0x21, 0x11, 0xff, 0xff]].concat()),
            ("no address", header(Addresses::Unspecified, Command::Proxy)),
            ("bad family", [PROTOCOL_PREFIX, &[0x21, 0x71, 0, 0]].concat()),
        ] {
            assert!(client(&bytes, EDGE).await.is_err(), "{what}");
        }
    }
}
