//! An RFC 1928 SOCKS5 server: no authentication, `CONNECT` only.
//!
//! Transparent capture needs root and nftables on the train; SOCKS5 is the
//! explicit alternative for clients configured with a proxy (and lets the
//! whole relay be exercised without privileges). Only what a CONNECT proxy
//! needs is implemented: method `0x00` (no authentication; a client that does
//! not offer it gets `0xFF`), command `CONNECT` (`BIND` and `UDP ASSOCIATE`
//! get reply `0x07`), and IPv4, IPv6 and domain-name addresses.
//!
//! Domain names are resolved by a [`Resolver`]. The default,
//! [`SystemResolver`], uses the train's own resolver (`getaddrinfo` through
//! `tokio::net::lookup_host`), which the train may not have: in production
//! pass your own to [`serve_socks5_with_resolver`], e.g.
//! [`crate::TunnelResolver`], which resolves through the tunnel on behalf of
//! the asking client. Any `Fn(IpAddr, String, u16) -> impl Future<Output =
//! io::Result<Vec<SocketAddr>>>` (client, host, port) that is `Clone + Send +
//! Sync` is a resolver.
//!
//! Dial failures are reported with the closest reply code: connection refused
//! `0x05`, host unreachable `0x04` (also for timeouts and names that resolve
//! to nothing), network unreachable `0x03`, not allowed `0x02`, otherwise
//! general failure `0x01`.

use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::debug;

use crate::relay::{accept_loop, prepare_passenger, relay, reset_on_close, with_timeout};
use crate::{CaptureStats, Dialer, RelayOpts};

const VERSION: u8 = 0x05;
const METHOD_NO_AUTH: u8 = 0x00;
const METHOD_NONE_ACCEPTABLE: u8 = 0xFF;
const CMD_CONNECT: u8 = 0x01;
const ATYP_V4: u8 = 0x01;
const ATYP_DOMAIN: u8 = 0x03;
const ATYP_V6: u8 = 0x04;

/// SOCKS5 reply codes (RFC 1928 §6).
#[allow(missing_docs)]
pub mod reply {
    pub const SUCCEEDED: u8 = 0x00;
    pub const GENERAL_FAILURE: u8 = 0x01;
    pub const NOT_ALLOWED: u8 = 0x02;
    pub const NETWORK_UNREACHABLE: u8 = 0x03;
    pub const HOST_UNREACHABLE: u8 = 0x04;
    pub const CONNECTION_REFUSED: u8 = 0x05;
    pub const TTL_EXPIRED: u8 = 0x06;
    pub const COMMAND_NOT_SUPPORTED: u8 = 0x07;
    pub const ADDRESS_TYPE_NOT_SUPPORTED: u8 = 0x08;
}

/// Resolves a SOCKS5 domain-name destination to addresses to try in order.
pub trait Resolver: Clone + Send + Sync + 'static {
    /// Addresses for `host` with `port` filled in, looked up on behalf of
    /// `user`, the asking client (as given to the [`Dialer`]), so that a
    /// resolver using the tunnel charges the lookup to that passenger. An
    /// empty list counts as "host unreachable".
    fn resolve(&self, user: IpAddr, host: &str, port: u16) -> impl Future<Output = io::Result<Vec<SocketAddr>>> + Send;
}

/// Resolves with the system resolver (`tokio::net::lookup_host`).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolver for SystemResolver {
    async fn resolve(&self, _user: IpAddr, host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        Ok(tokio::net::lookup_host((host, port)).await?.collect())
    }
}

impl<F, Fut> Resolver for F
where
    F: Fn(IpAddr, String, u16) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = io::Result<Vec<SocketAddr>>> + Send,
{
    fn resolve(&self, user: IpAddr, host: &str, port: u16) -> impl Future<Output = io::Result<Vec<SocketAddr>>> + Send {
        self(user, host.to_owned(), port)
    }
}

/// Why a SOCKS5 session ended early.
#[derive(Debug, thiserror::Error)]
pub enum Socks5Error {
    /// The client closed or broke the connection during the handshake
    /// (including a truncated greeting or request).
    #[error("handshake I/O: {0}")]
    Io(#[source] io::Error),
    /// Greeting and request were not complete within the handshake timeout.
    #[error("handshake timed out")]
    Timeout,
    /// Not SOCKS version 5.
    #[error("unsupported SOCKS version {0:#04x}")]
    Version(u8),
    /// A request that cannot be parsed (reserved byte, empty domain name).
    #[error("malformed request: {0}")]
    Malformed(&'static str),
    /// The client offers no "no authentication" method; it got `0xFF`.
    #[error("client offers no acceptable authentication method")]
    NoAcceptableMethod,
    /// A command other than CONNECT; the client got reply `0x07`.
    #[error("unsupported command {0:#04x}")]
    Command(u8),
    /// An unknown address type; the client got reply `0x08`.
    #[error("unsupported address type {0:#04x}")]
    AddressType(u8),
    /// Resolving or dialing the destination failed; the client got the
    /// matching reply code.
    #[error("connect to {target}: {source}")]
    Dial {
        /// The requested destination.
        target: String,
        /// The resolver's or dialer's error.
        #[source]
        source: io::Error,
    },
    /// The relay after a successful CONNECT ended with an error.
    #[error("relay: {0}")]
    Relay(#[source] io::Error),
}

/// A CONNECT destination as requested.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A literal IPv4 or IPv6 address.
    Addr(SocketAddr),
    /// A domain name (as sent, not validated beyond UTF-8) and port.
    Domain(String, u16),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Addr(a) => a.fmt(f),
            Target::Domain(h, p) => write!(f, "{h}:{p}"),
        }
    }
}

/// Serves SOCKS5 clients until `shutdown` resolves, resolving domain names
/// with [`SystemResolver`]. See [`serve_socks5_with_resolver`].
pub async fn serve_socks5<D: Dialer>(listener: TcpListener, dialer: D, opts: RelayOpts, shutdown: impl Future) {
    serve_socks5_with_resolver(listener, dialer, SystemResolver, opts, shutdown).await;
}

/// Serves SOCKS5 clients until `shutdown` resolves: handshake (within
/// [`RelayOpts::handshake_timeout`]), resolve, dial on behalf of the client's
/// source IP, reply, then [`relay`] as the transparent server does. Bad
/// clients are closed and counted, never a panic.
pub async fn serve_socks5_with_resolver<D: Dialer, R: Resolver>(
    listener: TcpListener,
    dialer: D,
    resolver: R,
    opts: RelayOpts,
    shutdown: impl Future,
) {
    let task_opts = opts.clone();
    accept_loop(listener, &opts, shutdown, "socks5", move |stream, peer| {
        let (dialer, resolver, opts) = (dialer.clone(), resolver.clone(), task_opts.clone());
        async move {
            let mut stream: TcpStream = stream;
            prepare_passenger(&stream, &opts);
            let user = peer.ip().to_canonical();
            match handle_socks5(&mut stream, user, &dialer, &resolver, &opts).await {
                Ok(()) => {}
                Err(e @ Socks5Error::Relay(_)) => {
                    debug!(%peer, error = %e, "socks5 session ended with error");
                    reset_on_close(&stream);
                }
                Err(e) => debug!(%peer, error = %e, "socks5 session refused"),
            }
        }
    })
    .await;
}

/// One SOCKS5 session on an already accepted stream, from greeting to the end
/// of the relay; `user` is the client's address as given to the dialer.
/// Updates the counters in `opts.stats` (but not `accepted`/`active`, which
/// belong to the accept loop).
pub async fn handle_socks5<S, D, R>(
    stream: &mut S,
    user: IpAddr,
    dialer: &D,
    resolver: &R,
    opts: &RelayOpts,
) -> Result<(), Socks5Error>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + ?Sized,
    D: Dialer,
    R: Resolver,
{
    let stats = &opts.stats;
    let target = match tokio::time::timeout(opts.handshake_timeout, handshake(stream)).await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => {
            let counter = match e {
                Socks5Error::NoAcceptableMethod | Socks5Error::Command(_) | Socks5Error::AddressType(_) => {
                    &stats.refused
                }
                _ => &stats.handshake_failed,
            };
            CaptureStats::inc(counter);
            return Err(e);
        }
        Err(_) => {
            CaptureStats::inc(&stats.handshake_failed);
            return Err(Socks5Error::Timeout);
        }
    };

    let mut tunnel = match with_timeout(opts.dial_timeout, "connect", connect(&target, user, dialer, resolver)).await {
        Ok(t) => t,
        Err(e) => {
            CaptureStats::inc(&stats.dial_failed);
            let _ = send_reply(stream, reply_code(&e)).await;
            return Err(Socks5Error::Dial { target: target.to_string(), source: e });
        }
    };
    send_reply(stream, reply::SUCCEEDED).await.map_err(Socks5Error::Relay)?;
    debug!(%user, %target, "socks5 connected");
    relay(stream, &mut tunnel, opts, D::poll_write_burst).await.map_err(Socks5Error::Relay)?;
    Ok(())
}

/// Reads the greeting, answers it, and reads the request. Never reads past
/// the request, so data a client sends optimistically stays in the stream
/// for the relay.
async fn handshake<S: AsyncRead + AsyncWrite + Unpin + ?Sized>(s: &mut S) -> Result<Target, Socks5Error> {
    let io = Socks5Error::Io;
    let mut head = [0u8; 2];
    s.read_exact(&mut head).await.map_err(io)?;
    if head[0] != VERSION {
        return Err(Socks5Error::Version(head[0]));
    }
    let mut methods = vec![0u8; head[1] as usize];
    s.read_exact(&mut methods).await.map_err(io)?;
    if !methods.contains(&METHOD_NO_AUTH) {
        let _ = s.write_all(&[VERSION, METHOD_NONE_ACCEPTABLE]).await;
        let _ = s.shutdown().await;
        return Err(Socks5Error::NoAcceptableMethod);
    }
    s.write_all(&[VERSION, METHOD_NO_AUTH]).await.map_err(io)?;

    let mut req = [0u8; 4];
    s.read_exact(&mut req).await.map_err(io)?;
    let [ver, cmd, rsv, atyp] = req;
    if ver != VERSION {
        return Err(Socks5Error::Version(ver));
    }
    if rsv != 0 {
        let _ = send_reply(s, reply::GENERAL_FAILURE).await;
        return Err(Socks5Error::Malformed("reserved byte is not zero"));
    }
    if cmd != CMD_CONNECT {
        let _ = send_reply(s, reply::COMMAND_NOT_SUPPORTED).await;
        return Err(Socks5Error::Command(cmd));
    }
    let target = match atyp {
        ATYP_V4 => {
            let mut b = [0u8; 6];
            s.read_exact(&mut b).await.map_err(io)?;
            let ip = Ipv4Addr::new(b[0], b[1], b[2], b[3]);
            Target::Addr(SocketAddr::new(ip.into(), u16::from_be_bytes([b[4], b[5]])))
        }
        ATYP_V6 => {
            let mut b = [0u8; 18];
            s.read_exact(&mut b).await.map_err(io)?;
            let mut ip = [0u8; 16];
            ip.copy_from_slice(&b[..16]);
            let ip = Ipv6Addr::from(ip).to_canonical();
            Target::Addr(SocketAddr::new(ip, u16::from_be_bytes([b[16], b[17]])))
        }
        ATYP_DOMAIN => {
            let mut len = [0u8; 1];
            s.read_exact(&mut len).await.map_err(io)?;
            let mut b = vec![0u8; len[0] as usize + 2];
            s.read_exact(&mut b).await.map_err(io)?;
            let port = u16::from_be_bytes([b[b.len() - 2], b[b.len() - 1]]);
            b.truncate(b.len() - 2);
            let host = match String::from_utf8(b) {
                Ok(h) if !h.is_empty() => h,
                _ => {
                    let _ = send_reply(s, reply::GENERAL_FAILURE).await;
                    return Err(Socks5Error::Malformed("empty or non-UTF-8 domain name"));
                }
            };
            // Some clients send literal addresses as "domain names".
            match host.parse::<IpAddr>() {
                Ok(ip) => Target::Addr(SocketAddr::new(ip.to_canonical(), port)),
                Err(_) => Target::Domain(host, port),
            }
        }
        other => {
            let _ = send_reply(s, reply::ADDRESS_TYPE_NOT_SUPPORTED).await;
            return Err(Socks5Error::AddressType(other));
        }
    };
    Ok(target)
}

async fn connect<D: Dialer, R: Resolver>(
    target: &Target,
    user: IpAddr,
    dialer: &D,
    resolver: &R,
) -> io::Result<D::Stream> {
    let addrs = match target {
        Target::Addr(a) => vec![*a],
        Target::Domain(host, port) => resolver.resolve(user, host, *port).await?,
    };
    let mut last = io::Error::new(io::ErrorKind::HostUnreachable, "name resolved to no address");
    for addr in addrs {
        match dialer.dial(user, addr).await {
            Ok(s) => return Ok(s),
            Err(e) => {
                debug!(%user, %target, %addr, error = %e, "dial failed");
                last = e;
            }
        }
    }
    Err(last)
}

/// The SOCKS5 reply code closest to a dial error.
pub fn reply_code(e: &io::Error) -> u8 {
    use io::ErrorKind as K;
    match e.kind() {
        K::ConnectionRefused => reply::CONNECTION_REFUSED,
        K::HostUnreachable | K::TimedOut => reply::HOST_UNREACHABLE,
        K::NetworkUnreachable => reply::NETWORK_UNREACHABLE,
        K::PermissionDenied => reply::NOT_ALLOWED,
        _ => reply::GENERAL_FAILURE,
    }
}

/// A reply with BND.ADDR 0.0.0.0:0: the tunnel's far-side address is not
/// known here, and CONNECT clients ignore it.
async fn send_reply<S: AsyncWrite + Unpin + ?Sized>(s: &mut S, code: u8) -> io::Result<()> {
    s.write_all(&[VERSION, code, 0, ATYP_V4, 0, 0, 0, 0, 0, 0]).await?;
    s.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;
    use tokio::io::{duplex, DuplexStream};

    /// Stands in for the tunnel: every dial goes to a local echo server, and
    /// the requested destinations are recorded. Destinations on port 1 are
    /// refused, port 2 unreachable.
    #[derive(Clone)]
    struct EchoDialer {
        echo: SocketAddr,
        dialed: Arc<Mutex<Vec<(IpAddr, SocketAddr)>>>,
    }

    impl Dialer for EchoDialer {
        type Stream = TcpStream;
        async fn dial(&self, user: IpAddr, dst: SocketAddr) -> io::Result<TcpStream> {
            self.dialed.lock().unwrap().push((user, dst));
            match dst.port() {
                1 => Err(io::ErrorKind::ConnectionRefused.into()),
                2 => Err(io::ErrorKind::HostUnreachable.into()),
                _ => TcpStream::connect(self.echo).await,
            }
        }

        fn poll_write_burst(
            stream: &mut TcpStream,
            cx: &mut std::task::Context<'_>,
            buf: &[u8],
            end: bool,
        ) -> std::task::Poll<io::Result<usize>> {
            let n = std::task::ready!(std::pin::Pin::new(stream).poll_write(cx, buf))?;
            MARKS.with(|m| m.borrow_mut().push((n, end)));
            std::task::Poll::Ready(Ok(n))
        }
    }

    thread_local! {
        /// What [`EchoDialer::poll_write_burst`] wrote, with its burst marks
        /// (each `#[tokio::test]` runs on its own thread).
        static MARKS: std::cell::RefCell<Vec<(usize, bool)>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    async fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    struct Harness {
        client: DuplexStream,
        session: tokio::task::JoinHandle<Result<(), Socks5Error>>,
        dialed: Arc<Mutex<Vec<(IpAddr, SocketAddr)>>>,
        stats: Arc<CaptureStats>,
    }

    const USER: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 66, 0, 2));

    async fn harness_with<R: Resolver>(resolver: R, opts: RelayOpts) -> Harness {
        let dialer = EchoDialer { echo: echo_server().await, dialed: Arc::default() };
        let dialed = dialer.dialed.clone();
        let stats = opts.stats.clone();
        let (client, mut server) = duplex(64 * 1024);
        let session = tokio::spawn(async move { handle_socks5(&mut server, USER, &dialer, &resolver, &opts).await });
        Harness { client, session, dialed, stats }
    }

    async fn harness() -> Harness {
        harness_with(SystemResolver, RelayOpts::default()).await
    }

    async fn read_n(s: &mut DuplexStream, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut b)).await.unwrap().unwrap();
        b
    }

    /// Greeting, method selection, request, and the reply code.
    async fn connect_request(h: &mut Harness, addr: &[u8]) -> u8 {
        h.client.write_all(&[5, 2, 0x02, 0x00]).await.unwrap();
        assert_eq!(read_n(&mut h.client, 2).await, [5, 0]);
        let mut req = vec![5, 1, 0];
        req.extend_from_slice(addr);
        h.client.write_all(&req).await.unwrap();
        let rep = read_n(&mut h.client, 10).await;
        assert_eq!((rep[0], rep[2], rep[3]), (5, 0, ATYP_V4));
        rep[1]
    }

    async fn assert_echoes(h: &mut Harness) {
        h.client.write_all(b"ping").await.unwrap();
        assert_eq!(read_n(&mut h.client, 4).await, b"ping");
    }

    async fn finish(h: Harness) -> (Result<(), Socks5Error>, Vec<(IpAddr, SocketAddr)>, crate::StatsSnapshot) {
        drop(h.client);
        let r = tokio::time::timeout(Duration::from_secs(5), h.session).await.unwrap().unwrap();
        let dialed = h.dialed.lock().unwrap().clone();
        (r, dialed, h.stats.snapshot())
    }

    #[tokio::test]
    async fn socks5_connect_ipv4_relays_through_dialer() {
        let mut h = harness().await;
        assert_eq!(connect_request(&mut h, &[ATYP_V4, 192, 0, 2, 7, 0x1F, 0x90]).await, reply::SUCCEEDED);
        assert_echoes(&mut h).await;
        // The passenger's message went to the tunnel marked as a burst's end.
        assert_eq!(MARKS.with(|m| m.borrow().clone()), [(4, true)]);
        let (r, dialed, s) = finish(h).await;
        r.unwrap();
        assert_eq!(dialed, [(USER, "192.0.2.7:8080".parse().unwrap())]);
        assert_eq!((s.bytes_up, s.bytes_down), (4, 4));
    }

    #[tokio::test]
    async fn socks5_connect_ipv6_relays_through_dialer() {
        let mut h = harness().await;
        let mut addr = vec![ATYP_V6];
        addr.extend_from_slice(&"2001:db8::1".parse::<Ipv6Addr>().unwrap().octets());
        addr.extend_from_slice(&443u16.to_be_bytes());
        assert_eq!(connect_request(&mut h, &addr).await, reply::SUCCEEDED);
        assert_echoes(&mut h).await;
        let (r, dialed, _) = finish(h).await;
        r.unwrap();
        assert_eq!(dialed, [(USER, "[2001:db8::1]:443".parse().unwrap())]);
    }

    #[tokio::test]
    async fn socks5_connect_domain_uses_resolver() {
        let resolver = |user: IpAddr, host: String, port: u16| async move {
            assert_eq!((user, host.as_str()), (USER, "origin.example"), "looked up for the asking client");
            Ok(vec![SocketAddr::new(Ipv4Addr::new(198, 51, 100, 9).into(), port)])
        };
        let mut h = harness_with(resolver, RelayOpts::default()).await;
        let mut addr = vec![ATYP_DOMAIN, 14];
        addr.extend_from_slice(b"origin.example");
        addr.extend_from_slice(&80u16.to_be_bytes());
        assert_eq!(connect_request(&mut h, &addr).await, reply::SUCCEEDED);
        assert_echoes(&mut h).await;
        let (r, dialed, _) = finish(h).await;
        r.unwrap();
        assert_eq!(dialed, [(USER, "198.51.100.9:80".parse().unwrap())]);
    }

    #[tokio::test]
    async fn socks5_default_resolver_resolves_localhost() {
        let mut h = harness().await;
        let mut addr = vec![ATYP_DOMAIN, 9];
        addr.extend_from_slice(b"localhost");
        addr.extend_from_slice(&8080u16.to_be_bytes());
        assert_eq!(connect_request(&mut h, &addr).await, reply::SUCCEEDED);
        assert_echoes(&mut h).await;
        let (r, dialed, _) = finish(h).await;
        r.unwrap();
        assert!(dialed[0].1.ip().is_loopback() && dialed[0].1.port() == 8080, "{dialed:?}");
    }

    #[tokio::test]
    async fn socks5_resolver_failure_tries_all_addresses_then_reports() {
        let resolver = |_user: IpAddr, _host: String, _port: u16| async move {
            Ok(vec!["192.0.2.1:1".parse().unwrap(), "192.0.2.2:2".parse().unwrap()])
        };
        let mut h = harness_with(resolver, RelayOpts::default()).await;
        let mut addr = vec![ATYP_DOMAIN, 1, b'x'];
        addr.extend_from_slice(&80u16.to_be_bytes());
        // The last error wins: unreachable.
        assert_eq!(connect_request(&mut h, &addr).await, reply::HOST_UNREACHABLE);
        let (r, dialed, s) = finish(h).await;
        assert!(matches!(r, Err(Socks5Error::Dial { .. })), "{r:?}");
        assert_eq!(dialed.len(), 2);
        assert_eq!(s.dial_failed, 1);
    }

    #[tokio::test]
    async fn socks5_dial_refused_replies_05() {
        let mut h = harness().await;
        assert_eq!(connect_request(&mut h, &[ATYP_V4, 192, 0, 2, 7, 0, 1]).await, reply::CONNECTION_REFUSED);
        let (r, _, s) = finish(h).await;
        assert!(matches!(r, Err(Socks5Error::Dial { .. })));
        assert_eq!(s.dial_failed, 1);
    }

    #[tokio::test]
    async fn socks5_dial_unreachable_replies_04() {
        let mut h = harness().await;
        assert_eq!(connect_request(&mut h, &[ATYP_V4, 192, 0, 2, 7, 0, 2]).await, reply::HOST_UNREACHABLE);
    }

    #[tokio::test]
    async fn socks5_wrong_version_closes_without_reply() {
        let mut h = harness().await;
        h.client.write_all(&[4, 1, 0, 80, 127, 0, 0, 1, 0]).await.unwrap();
        let mut rest = Vec::new();
        h.client.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
        let (r, dialed, s) = finish(h).await;
        assert!(matches!(r, Err(Socks5Error::Version(4))), "{r:?}");
        assert!(dialed.is_empty());
        assert_eq!(s.handshake_failed, 1);
    }

    #[tokio::test]
    async fn socks5_unsupported_command_replies_07() {
        for cmd in [0x02u8, 0x03] {
            let mut h = harness().await;
            h.client.write_all(&[5, 1, 0]).await.unwrap();
            assert_eq!(read_n(&mut h.client, 2).await, [5, 0]);
            h.client.write_all(&[5, cmd, 0, ATYP_V4, 127, 0, 0, 1, 0, 80]).await.unwrap();
            assert_eq!(read_n(&mut h.client, 2).await, [5, reply::COMMAND_NOT_SUPPORTED]);
            let (r, dialed, s) = finish(h).await;
            assert!(matches!(r, Err(Socks5Error::Command(c)) if c == cmd), "{r:?}");
            assert!(dialed.is_empty());
            assert_eq!(s.refused, 1);
        }
    }

    #[tokio::test]
    async fn socks5_unknown_address_type_replies_08() {
        let mut h = harness().await;
        h.client.write_all(&[5, 1, 0]).await.unwrap();
        assert_eq!(read_n(&mut h.client, 2).await, [5, 0]);
        h.client.write_all(&[5, 1, 0, 0x09]).await.unwrap();
        assert_eq!(read_n(&mut h.client, 2).await, [5, reply::ADDRESS_TYPE_NOT_SUPPORTED]);
        let (r, _, _) = finish(h).await;
        assert!(matches!(r, Err(Socks5Error::AddressType(9))), "{r:?}");
    }

    #[tokio::test]
    async fn socks5_no_acceptable_method_replies_ff() {
        let mut h = harness().await;
        h.client.write_all(&[5, 2, 0x01, 0x02]).await.unwrap();
        assert_eq!(read_n(&mut h.client, 2).await, [5, 0xFF]);
        let mut rest = Vec::new();
        h.client.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
        let (r, _, s) = finish(h).await;
        assert!(matches!(r, Err(Socks5Error::NoAcceptableMethod)), "{r:?}");
        assert_eq!(s.refused, 1);
    }

    #[tokio::test]
    async fn socks5_truncated_greeting_closes_and_counts() {
        let mut h = harness().await;
        // Claims three methods, sends one, then closes.
        h.client.write_all(&[5, 3, 0]).await.unwrap();
        let (r, dialed, s) = finish(h).await;
        assert!(matches!(r, Err(Socks5Error::Io(_))), "{r:?}");
        assert!(dialed.is_empty());
        assert_eq!(s.handshake_failed, 1);
    }

    #[tokio::test]
    async fn socks5_truncated_request_closes_and_counts() {
        let mut h = harness().await;
        h.client.write_all(&[5, 1, 0]).await.unwrap();
        assert_eq!(read_n(&mut h.client, 2).await, [5, 0]);
        h.client.write_all(&[5, 1, 0, ATYP_V6, 0x20, 0x01]).await.unwrap();
        let (r, _, s) = finish(h).await;
        assert!(matches!(r, Err(Socks5Error::Io(_))), "{r:?}");
        assert_eq!(s.handshake_failed, 1);
    }

    #[tokio::test]
    async fn socks5_handshake_timeout() {
        let opts = RelayOpts { handshake_timeout: Duration::from_millis(100), ..Default::default() };
        let mut h = harness_with(SystemResolver, opts).await;
        h.client.write_all(&[5]).await.unwrap();
        let r = tokio::time::timeout(Duration::from_secs(5), &mut h.session).await.unwrap().unwrap();
        assert!(matches!(r, Err(Socks5Error::Timeout)), "{r:?}");
        assert_eq!(h.stats.snapshot().handshake_failed, 1);
    }

    /// Data the client sends right behind the request (before reading the
    /// reply) is relayed, not swallowed by the handshake.
    #[tokio::test]
    async fn socks5_optimistic_data_is_relayed() {
        let mut h = harness().await;
        h.client.write_all(&[5, 1, 0, 5, 1, 0, ATYP_V4, 192, 0, 2, 7, 0, 80, b'h', b'i']).await.unwrap();
        assert_eq!(read_n(&mut h.client, 2).await, [5, 0]);
        assert_eq!(read_n(&mut h.client, 10).await[1], reply::SUCCEEDED);
        assert_eq!(read_n(&mut h.client, 2).await, b"hi");
    }

    /// The whole server over real TCP, with several clients at once.
    #[tokio::test]
    async fn socks5_server_over_tcp_serves_concurrent_clients() {
        let dialer = EchoDialer { echo: echo_server().await, dialed: Arc::default() };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let opts = RelayOpts::default();
        let stats = opts.stats.clone();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_socks5(listener, dialer.clone(), opts, stop_rx));
        let mut clients = Vec::new();
        for i in 0..8u8 {
            clients.push(tokio::spawn(async move {
                let mut c = TcpStream::connect(addr).await.unwrap();
                c.write_all(&[5, 1, 0]).await.unwrap();
                let mut b = [0u8; 2];
                c.read_exact(&mut b).await.unwrap();
                c.write_all(&[5, 1, 0, ATYP_V4, 192, 0, 2, i, 0, 80]).await.unwrap();
                let mut rep = [0u8; 10];
                c.read_exact(&mut rep).await.unwrap();
                assert_eq!(rep[1], 0);
                c.write_all(&[i; 100]).await.unwrap();
                c.shutdown().await.unwrap();
                let mut back = Vec::new();
                c.read_to_end(&mut back).await.unwrap();
                assert_eq!(back, [i; 100]);
            }));
        }
        for c in clients {
            tokio::time::timeout(Duration::from_secs(10), c).await.unwrap().unwrap();
        }
        // A garbage client is closed and counted.
        let mut bad = TcpStream::connect(addr).await.unwrap();
        bad.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), bad.read_to_end(&mut rest)).await.unwrap();
        stop_tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
        let s = stats.snapshot();
        assert_eq!((s.accepted, s.handshake_failed, s.active), (9, 1, 0));
        assert_eq!((s.bytes_up, s.bytes_down), (800, 800));
        let mut users: Vec<_> = dialer.dialed.lock().unwrap().iter().map(|(u, _)| *u).collect();
        users.dedup();
        assert_eq!(users, [IpAddr::from([127, 0, 0, 1])]);
    }
}
