//! Passenger-facing side of the Polycorn relay.
//!
//! The relay-agent on the train has to meet passengers where they are: their
//! phones and laptops know nothing about Polycorn, so their traffic is caught
//! on the train's LAN interface and handed to the tunnel one TCP connection
//! (or DNS query) at a time. This crate holds those pieces, kept apart from
//! the tunnel so they can be tested on loopback and in network namespaces
//! without a proxy:
//!
//! - [`transparent`]: the listener that nftables REDIRECTs passenger TCP to;
//!   it recovers each connection's intended destination (`SO_ORIGINAL_DST`)
//!   and relays it through a [`Dialer`].
//! - [`socks5`]: an explicit RFC 1928 SOCKS5 server (no-auth, CONNECT), for
//!   clients configured to use a proxy and for testing without root.
//! - [`dns`]: answers passengers' UDP DNS queries by forwarding them as
//!   DNS-over-TCP through the tunnel, because the tunnel carries only streams
//!   and the train itself has no resolver it may use.
//! - [`rules`]: the nftables ruleset that does the catching (TCP REDIRECT,
//!   UDP/53 REDIRECT, QUIC reject), closes the gateway's own services to
//!   passengers and checks their source addresses, and its installation.
//!
//! The tunnel is abstracted as a [`Dialer`]: "open a byte stream to `dst` on
//! behalf of passenger `user`". The relay-agent implements it on top of
//! `polycorn-net`'s session; tests implement it with plain TCP to 127.0.0.1.
//!
//! Counters live in [`CaptureStats`] (plain atomics, shared through
//! [`RelayOpts::stats`]) so the binary can export them however it likes.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub mod copy;
pub mod dns;
mod relay;
pub mod rules;
pub mod socks5;
pub mod transparent;

pub use copy::copy_bidirectional_bursts;
pub use dns::{serve_dns, TunnelResolver};
pub use relay::relay;
pub use rules::{GatewayAllow, InterceptRules, UdpPolicy};
pub use socks5::{handle_socks5, serve_socks5, serve_socks5_with_resolver, Resolver, Socks5Error, SystemResolver};
pub use transparent::{original_dst, serve_transparent, tproxy_dst};

/// Opens a stream through the tunnel on behalf of passenger `user` (its source IP) to `dst`.
///
/// Errors should carry a meaningful [`std::io::ErrorKind`]: the SOCKS5 server
/// maps `ConnectionRefused`, `HostUnreachable`, `NetworkUnreachable`,
/// `TimedOut` and `PermissionDenied` to the matching reply codes, and
/// everything else to "general failure".
pub trait Dialer: Clone + Send + Sync + 'static {
    /// The tunnel stream handed back for one passenger connection.
    type Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static;

    /// Opens the stream. Called once per passenger connection or DNS query.
    fn dial(&self, user: IpAddr, dst: SocketAddr) -> impl Future<Output = std::io::Result<Self::Stream>> + Send;

    /// Writes passenger bytes to the tunnel stream, saying whether `buf` ends
    /// one of the passenger's bursts (it came from a read shorter than the
    /// relay's buffer: the passenger has nothing more for now; see
    /// [`copy`]). A tunnel that can use the mark (the multipath session's
    /// scheduler) overrides this; the default is a plain write.
    fn poll_write_burst(
        stream: &mut Self::Stream,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
        _end: bool,
    ) -> std::task::Poll<std::io::Result<usize>> {
        tokio::io::AsyncWrite::poll_write(std::pin::Pin::new(stream), cx, buf)
    }
}

/// Knobs shared by all the passenger-facing servers.
///
/// Built with `RelayOpts { max_conns: 512, ..Default::default() }`.
#[derive(Debug, Clone)]
pub struct RelayOpts {
    /// Passenger connections relayed at once per listener. When reached the
    /// listener stops accepting, so new connections wait in the kernel's
    /// backlog rather than being refused. Default 4096.
    pub max_conns: usize,
    /// Time a SOCKS5 client has for its greeting and request. Default 10 s.
    pub handshake_timeout: Duration,
    /// Time a [`Dialer::dial`] (including SOCKS5 name resolution) may take.
    /// Default 30 s.
    pub dial_timeout: Duration,
    /// Buffer size of each direction of a relay. Default 64 KiB.
    pub buf_size: usize,
    /// TCP keepalive idle time on passenger sockets, so connections of
    /// passengers who left the train (no FIN, no RST) are eventually reaped.
    /// `None` leaves keepalive off. Default 60 s (then 6 probes 10 s apart).
    pub keepalive: Option<Duration>,
    /// On shutdown, how long open relays may go on before they are aborted
    /// (their passengers get a TCP reset). Default zero: they are aborted
    /// as soon as the listener stops.
    pub drain_timeout: Duration,
    /// DNS queries forwarded at once by [`serve_dns`]; queries beyond are
    /// dropped (and counted), so a flood cannot exhaust the tunnel. Default 256.
    pub dns_max_inflight: usize,
    /// Time for one DNS query, dial included; on expiry the passenger gets
    /// SERVFAIL. Default 5 s.
    pub dns_timeout: Duration,
    /// Bytes of DNS answers a second each source (IPv4 address, IPv6 /64)
    /// may receive, with 4 s of it as a burst ([`dns::AnswerBudget`]);
    /// beyond, its queries are dropped. Default 32 KiB: a browser's lookups
    /// are a few kB a second.
    pub dns_answer_rate: u64,
    /// Where the counters go. Clone the `Arc` before handing the options over
    /// to read them while the server runs; give each server its own to tell
    /// them apart.
    pub stats: Arc<CaptureStats>,
}

impl Default for RelayOpts {
    fn default() -> Self {
        Self {
            max_conns: 4096,
            handshake_timeout: Duration::from_secs(10),
            dial_timeout: Duration::from_secs(30),
            buf_size: 64 * 1024,
            keepalive: Some(Duration::from_secs(60)),
            drain_timeout: Duration::ZERO,
            dns_max_inflight: 256,
            dns_timeout: Duration::from_secs(5),
            dns_answer_rate: 32 * 1024,
            stats: Arc::default(),
        }
    }
}

/// Counters of the passenger-facing servers. All monotonic except `active`.
#[derive(Debug, Default)]
pub struct CaptureStats {
    /// TCP connections accepted (transparent or SOCKS5).
    pub accepted: AtomicU64,
    /// Connections turned away on purpose: loop protection, no original
    /// destination, SOCKS5 client without an acceptable method, unsupported
    /// command or address type.
    pub refused: AtomicU64,
    /// SOCKS5 clients that sent garbage, closed early or timed out.
    pub handshake_failed: AtomicU64,
    /// Dials (or SOCKS5 name resolutions) that failed or timed out.
    pub dial_failed: AtomicU64,
    /// Passenger connections open right now (gauge).
    pub active: AtomicU64,
    /// Relays that ended with an I/O error rather than two clean FINs.
    pub relay_errors: AtomicU64,
    /// Bytes read from passengers and sent into the tunnel.
    pub bytes_up: AtomicU64,
    /// Bytes received from the tunnel and written to passengers.
    pub bytes_down: AtomicU64,
    /// DNS datagrams received that looked like queries.
    pub dns_queries: AtomicU64,
    /// DNS queries answered with the upstream's response.
    pub dns_answered: AtomicU64,
    /// DNS queries whose forwarding failed (dial, timeout, bad response);
    /// the passenger got SERVFAIL where the query allowed it.
    pub dns_failed: AtomicU64,
    /// DNS datagrams dropped: not a query (garbage, too short, a response) or
    /// over [`RelayOpts::dns_max_inflight`].
    pub dns_dropped: AtomicU64,
    /// DNS queries dropped because the answers to their source were over
    /// [`RelayOpts::dns_answer_rate`].
    pub dns_limited: AtomicU64,
}

/// A plain copy of [`CaptureStats`] at one instant.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct StatsSnapshot {
    pub accepted: u64,
    pub refused: u64,
    pub handshake_failed: u64,
    pub dial_failed: u64,
    pub active: u64,
    pub relay_errors: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub dns_queries: u64,
    pub dns_answered: u64,
    pub dns_failed: u64,
    pub dns_dropped: u64,
    pub dns_limited: u64,
}

impl CaptureStats {
    /// Reads every counter (each atomically, not all together).
    pub fn snapshot(&self) -> StatsSnapshot {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            accepted: r(&self.accepted),
            refused: r(&self.refused),
            handshake_failed: r(&self.handshake_failed),
            dial_failed: r(&self.dial_failed),
            active: r(&self.active),
            relay_errors: r(&self.relay_errors),
            bytes_up: r(&self.bytes_up),
            bytes_down: r(&self.bytes_down),
            dns_queries: r(&self.dns_queries),
            dns_answered: r(&self.dns_answered),
            dns_failed: r(&self.dns_failed),
            dns_dropped: r(&self.dns_dropped),
            dns_limited: r(&self.dns_limited),
        }
    }

    pub(crate) fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// `::ffff:a.b.c.d` → `a.b.c.d`, so a dual-stack listener reports IPv4
/// passengers and destinations as IPv4.
pub(crate) fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}
