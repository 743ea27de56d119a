//! The `kernel-mptcp-conn` transport: every passenger connection gets its own
//! Linux MPTCP connection from the relay to the proxy, the way OpenMPTCProuter
//! deployments carry their users' traffic (a per-connection proxy over
//! upstream kernel MPTCP, the kernel's default scheduler, kernel-autotuned
//! buffers). It is the fair kernel anchor of the benchmarks; Polycorn's own
//! scheduling plays no part in it.
//!
//! On each connection the relay does TLS 1.3 (the train's certificate and the
//! proxy's, as on the subflows, but ALPN [`ALPN`] so a relay and a proxy that
//! disagree on the transport fail the handshake with a clear error), then
//! sends one [`ConnHeader`] naming the passenger and the destination, then
//! the passenger's bytes. The proxy validates the header, applies its
//! destination policy, connects upstream and copies both ways; there is no
//! answer before the data (as in the tunnel, where OPEN is not acknowledged
//! either): a refused or failed destination is a reset of the MPTCP
//! connection, which the relay turns into a reset of the passenger's.
//! The relay names the passenger as the tunnel does (an IPv6 source by its
//! prefix) and caps each passenger's open connections itself
//! ([`ConnDialer::with_passengers`]), since no session counts them.
//!
//! Wire format of the header (all integers big-endian):
//!
//! ```text
//! "PCMC" | version u8 (1) | body length u16 (35 or 23, at most MAX_BODY_LEN)
//! body:  passenger id [16] (UserId: IPv6, IPv4 as ::ffff:a.b.c.d)
//!        | family u8 (4 or 6) | address [4 or 16] | port u16 (not 0)
//! ```

use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use polycorn_core::UserId;
use rustls::pki_types::ServerName;
use socket2::{Domain, Protocol, SockRef, Socket, TcpKeepalive, Type};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use crate::metrics::Writer;
use crate::subflow::{ClientTls, Congestion, ServerTls};

/// The header's first bytes.
pub const MAGIC: [u8; 4] = *b"PCMC";
/// The header version this build speaks.
pub const VERSION: u8 = 1;
/// Magic, version and body length.
pub const PREFIX_LEN: usize = 7;
/// Largest body length a reader accepts (version 1 needs at most 35).
pub const MAX_BODY_LEN: usize = 64;
/// ALPN of this transport (the subflows use `polycorn/1`).
pub const ALPN: &[u8] = b"polycorn-conn/1";
/// Time the relay has, after the TCP accept, for the TLS handshake; and
/// then again for the header.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

const BODY_V4: usize = 16 + 1 + 4 + 2;
const BODY_V6: usize = 16 + 1 + 16 + 2;

/// What a relay asks for on one MPTCP connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnHeader {
    /// The passenger, as the tunnel's OPEN frame carries it.
    pub user: UserId,
    /// Where the passenger connected to.
    pub dst: SocketAddr,
}

/// Why a header was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeaderError {
    /// Fewer bytes than the header needs (`need` in all).
    Truncated { need: usize, got: usize },
    /// Not a header of this transport (a subflow's HELLO, or garbage).
    BadMagic([u8; 4]),
    /// A version this build does not speak.
    Version(u8),
    /// A body length above [`MAX_BODY_LEN`] or not the one its family needs.
    BodyLength(usize),
    /// An address family other than 4 or 6.
    Family(u8),
    /// Port 0 or an unspecified address: never a destination.
    Destination(SocketAddr),
}

impl fmt::Display for HeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeaderError::Truncated { need, got } => write!(f, "truncated header: {got} of {need} bytes"),
            HeaderError::BadMagic(m) => write!(f, "not a kernel-mptcp-conn header (starts {m:02x?})"),
            HeaderError::Version(v) => {
                write!(f, "relay speaks kernel-mptcp-conn header version {v}, this build speaks {VERSION}")
            }
            HeaderError::BodyLength(n) => write!(f, "bad header body length {n}"),
            HeaderError::Family(x) => write!(f, "bad address family {x} (expected 4 or 6)"),
            HeaderError::Destination(d) => write!(f, "destination {d} is not connectable"),
        }
    }
}

impl std::error::Error for HeaderError {}

impl From<HeaderError> for io::Error {
    fn from(e: HeaderError) -> Self {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

impl ConnHeader {
    /// The header's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(BODY_V6);
        body.extend_from_slice(&self.user.0);
        match self.dst.ip() {
            IpAddr::V4(a) => {
                body.push(4);
                body.extend_from_slice(&a.octets());
            }
            IpAddr::V6(a) => {
                body.push(6);
                body.extend_from_slice(&a.octets());
            }
        }
        body.extend_from_slice(&self.dst.port().to_be_bytes());
        let mut out = Vec::with_capacity(PREFIX_LEN + body.len());
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        out.extend_from_slice(&(body.len() as u16).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Checks the fixed prefix; returns the body length that follows.
    pub fn decode_prefix(p: &[u8; PREFIX_LEN]) -> Result<usize, HeaderError> {
        let magic = [p[0], p[1], p[2], p[3]];
        if magic != MAGIC {
            return Err(HeaderError::BadMagic(magic));
        }
        if p[4] != VERSION {
            return Err(HeaderError::Version(p[4]));
        }
        let len = usize::from(u16::from_be_bytes([p[5], p[6]]));
        if len > MAX_BODY_LEN || (len != BODY_V4 && len != BODY_V6) {
            return Err(HeaderError::BodyLength(len));
        }
        Ok(len)
    }

    /// Decodes a body of the length the prefix gave.
    pub fn decode_body(b: &[u8]) -> Result<ConnHeader, HeaderError> {
        if b.len() < 17 {
            return Err(HeaderError::Truncated { need: 17, got: b.len() });
        }
        let mut user = [0u8; 16];
        user.copy_from_slice(&b[..16]);
        let (ip, need) = match b[16] {
            4 => (None, BODY_V4),
            6 => (Some(()), BODY_V6),
            x => return Err(HeaderError::Family(x)),
        };
        if b.len() != need {
            return Err(HeaderError::BodyLength(b.len()));
        }
        let ip = match ip {
            None => IpAddr::V4(Ipv4Addr::new(b[17], b[18], b[19], b[20])),
            Some(()) => {
                let mut a = [0u8; 16];
                a.copy_from_slice(&b[17..33]);
                IpAddr::V6(Ipv6Addr::from(a))
            }
        };
        let port = u16::from_be_bytes([b[need - 2], b[need - 1]]);
        let dst = SocketAddr::new(ip, port);
        if port == 0 || ip.is_unspecified() {
            return Err(HeaderError::Destination(dst));
        }
        Ok(ConnHeader { user: UserId(user), dst })
    }

    /// Decodes a whole header from the front of `buf`; returns it and the
    /// bytes it took.
    pub fn decode(buf: &[u8]) -> Result<(ConnHeader, usize), HeaderError> {
        let prefix: &[u8; PREFIX_LEN] = buf
            .get(..PREFIX_LEN)
            .and_then(|p| p.try_into().ok())
            .ok_or(HeaderError::Truncated { need: PREFIX_LEN, got: buf.len() })?;
        let len = Self::decode_prefix(prefix)?;
        let body = buf
            .get(PREFIX_LEN..PREFIX_LEN + len)
            .ok_or(HeaderError::Truncated { need: PREFIX_LEN + len, got: buf.len() })?;
        Ok((Self::decode_body(body)?, PREFIX_LEN + len))
    }
}

/// Reads one header from `s` within `timeout`, and not a byte more.
pub async fn read_header<S: AsyncRead + Unpin>(s: &mut S, timeout: Duration) -> io::Result<ConnHeader> {
    let read = async {
        let mut prefix = [0u8; PREFIX_LEN];
        s.read_exact(&mut prefix).await?;
        let len = ConnHeader::decode_prefix(&prefix)?;
        let mut body = [0u8; MAX_BODY_LEN];
        s.read_exact(&mut body[..len]).await?;
        Ok::<_, io::Error>(ConnHeader::decode_body(&body[..len])?)
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(h)) => Ok(h),
        Ok(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
            Err(io::Error::new(io::ErrorKind::UnexpectedEof, "relay closed before the end of the connection header"))
        }
        Ok(Err(e)) => Err(e),
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, format!("no connection header within {timeout:?}"))),
    }
}

/// Whether this kernel (in this network namespace) creates MPTCP sockets.
pub fn mptcp_available() -> bool {
    Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::MPTCP)).is_ok()
}

/// `tls` with this transport's ALPN instead of the subflows'.
pub fn client_tls(tls: &ClientTls) -> ClientTls {
    let mut c = (**tls).clone();
    c.alpn_protocols = vec![ALPN.to_vec()];
    Arc::new(c)
}

/// `tls` with this transport's ALPN instead of the subflows'.
pub fn server_tls(tls: &ServerTls) -> ServerTls {
    let mut c = (**tls).clone();
    c.alpn_protocols = vec![ALPN.to_vec()];
    Arc::new(c)
}

/// Socket options of both ends of a connection: no Nagle (the bytes were
/// batched by the passenger's or the origin's stack already), and keepalive
/// so that connections whose far end vanished are reaped. The send and
/// receive buffers are left to the kernel's autotuning.
fn tune(stream: &TcpStream) {
    if let Err(e) = stream.set_nodelay(true) {
        debug!(error = %e, "TCP_NODELAY on an MPTCP connection");
    }
    let ka =
        TcpKeepalive::new().with_time(Duration::from_secs(60)).with_interval(Duration::from_secs(10)).with_retries(6);
    if let Err(e) = SockRef::from(stream).set_tcp_keepalive(&ka) {
        debug!(error = %e, "keepalive on an MPTCP connection");
    }
}

/// Makes the coming close of `stream` a reset (MPTCP: a fast close).
fn reset_on_close(stream: &TcpStream) {
    if let Err(e) = SockRef::from(stream).set_linger(Some(Duration::ZERO)) {
        debug!(error = %e, "SO_LINGER 0 on an MPTCP connection");
    }
}

/// Connects a `protocol` socket (MPTCP, or TCP in tests without MPTCP) to
/// `addr`, optionally bound to `device`.
pub async fn connect(
    addr: SocketAddr,
    device: Option<&str>,
    protocol: Protocol,
    cc: &Congestion,
) -> io::Result<TcpStream> {
    let what = if protocol == Protocol::MPTCP { "MPTCP" } else { "TCP" };
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(protocol)).map_err(|e| {
        io::Error::new(e.kind(), format!("creating an {what} socket: {e} (is net.mptcp.enabled 1 in this namespace?)"))
    })?;
    cc.apply(&sock);
    if let Some(dev) = device {
        sock.bind_device(Some(dev.as_bytes()))
            .map_err(|e| io::Error::new(e.kind(), format!("binding to interface {dev}: {e}")))?;
    }
    sock.set_nonblocking(true)?;
    let std: std::net::TcpStream = sock.into();
    let stream = tokio::net::TcpSocket::from_std_stream(std)
        .connect(addr)
        .await
        .map_err(|e| io::Error::new(e.kind(), format!("connecting to the proxy {addr}: {e}")))?;
    tune(&stream);
    Ok(stream)
}

/// A listener for this transport: MPTCP (which accepts plain TCP too), or
/// `protocol` TCP in tests without MPTCP.
pub fn listen(addr: SocketAddr, protocol: Protocol) -> io::Result<TcpListener> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(protocol))?;
    sock.set_reuse_address(true)?;
    sock.bind(&addr.into()).map_err(|e| io::Error::new(e.kind(), format!("binding {addr}: {e}")))?;
    sock.listen(1024)?;
    sock.set_nonblocking(true)?;
    TcpListener::from_std(sock.into())
}

/// Counters of either end. The relay uses `opened`, `failed` and `last_ok`;
/// its passengers' bytes are in the capture counters. All monotonic except
/// `active`.
#[derive(Debug)]
pub struct ConnStats {
    /// Relay: connections dialled (MPTCP, TLS and header sent). Proxy:
    /// connections relayed (header valid, destination allowed, upstream
    /// connected).
    pub opened: AtomicU64,
    /// Relay: dials that failed (connect, TLS or header). Proxy: upstream
    /// connects that failed or timed out.
    pub failed: AtomicU64,
    /// Proxy: connections refused in the TLS handshake (wrong train, not
    /// this transport, timeout).
    pub refused_tls: AtomicU64,
    /// Proxy: connections refused for their header (malformed, truncated,
    /// wrong version, timeout).
    pub refused_header: AtomicU64,
    /// Proxy: connections refused by the destination policy.
    pub refused_policy: AtomicU64,
    /// Proxy: connections being relayed (gauge).
    pub active: AtomicU64,
    /// Proxy: relays that ended with an I/O error (both sides reset).
    pub errors: AtomicU64,
    /// Proxy: bytes from the relay sent upstream.
    pub bytes_up: AtomicU64,
    /// Proxy: bytes from upstream sent to the relay.
    pub bytes_down: AtomicU64,
    /// Relay: whether the latest dial reached the proxy (true before any).
    pub last_ok: AtomicBool,
}

impl Default for ConnStats {
    fn default() -> Self {
        Self {
            opened: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            refused_tls: AtomicU64::new(0),
            refused_header: AtomicU64::new(0),
            refused_policy: AtomicU64::new(0),
            active: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            bytes_up: AtomicU64::new(0),
            bytes_down: AtomicU64::new(0),
            last_ok: AtomicBool::new(true),
        }
    }
}

impl ConnStats {
    /// The relay's families.
    pub fn write_relay(&self, w: &mut Writer) {
        let v = |c: &AtomicU64| c.load(Relaxed) as f64;
        w.counter(
            "polycorn_mptcp_conn_opened",
            "kernel-mptcp-conn: MPTCP connections opened to the proxy (TLS done, header sent).",
            vec![],
            v(&self.opened),
        );
        w.counter(
            "polycorn_mptcp_conn_failed",
            "kernel-mptcp-conn: MPTCP connections to the proxy that failed (connect, TLS or header).",
            vec![],
            v(&self.failed),
        );
    }

    /// The proxy's families.
    pub fn write_proxy(&self, w: &mut Writer) {
        let v = |c: &AtomicU64| c.load(Relaxed) as f64;
        w.counter(
            "polycorn_mptcp_conn_opened",
            "kernel-mptcp-conn: connections relayed (header valid, destination allowed, upstream connected).",
            vec![],
            v(&self.opened),
        );
        w.counter(
            "polycorn_mptcp_conn_failed",
            "kernel-mptcp-conn: upstream connects that failed or timed out.",
            vec![],
            v(&self.failed),
        );
        for (reason, c) in
            [("tls", &self.refused_tls), ("header", &self.refused_header), ("policy", &self.refused_policy)]
        {
            w.counter(
                "polycorn_mptcp_conn_refused",
                "kernel-mptcp-conn: connections refused, by reason (tls, header, policy).",
                vec![("reason".to_string(), reason.to_string())],
                v(c),
            );
        }
        w.gauge("polycorn_mptcp_conn_active", "kernel-mptcp-conn: connections being relayed.", vec![], v(&self.active));
        w.counter(
            "polycorn_mptcp_conn_errors",
            "kernel-mptcp-conn: relays that ended with an I/O error.",
            vec![],
            v(&self.errors),
        );
        w.counter(
            "polycorn_mptcp_conn_up_bytes",
            "kernel-mptcp-conn: bytes from the relay sent upstream.",
            vec![],
            v(&self.bytes_up),
        );
        w.counter(
            "polycorn_mptcp_conn_down_bytes",
            "kernel-mptcp-conn: bytes from upstream sent to the relay.",
            vec![],
            v(&self.bytes_down),
        );
    }
}

/// The relay's stream of one passenger connection. It holds one of its
/// passenger's connection slots ([`ConnDialer::with_passengers`]) until it
/// is dropped.
pub struct ClientStream {
    tls: tokio_rustls::client::TlsStream<TcpStream>,
    _slot: PassengerSlot,
}

impl fmt::Debug for ClientStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientStream").field("passenger", &format_args!("{}", self._slot.user)).finish()
    }
}

impl AsyncRead for ClientStream {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.tls).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for ClientStream {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.tls).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.tls).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.tls).poll_shutdown(cx)
    }
}

/// Open connections per passenger.
type PassengerCounts = Arc<std::sync::Mutex<std::collections::HashMap<UserId, usize>>>;

/// One open connection of `user`, counted in `counts` while it lives.
struct PassengerSlot {
    counts: PassengerCounts,
    user: UserId,
}

impl PassengerSlot {
    /// A slot of `user`, unless it already has `max`.
    fn take(counts: &PassengerCounts, user: UserId, max: usize) -> Option<Self> {
        let mut c = counts.lock().unwrap_or_else(|e| e.into_inner());
        let n = c.entry(user).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(PassengerSlot { counts: counts.clone(), user })
    }
}

impl Drop for PassengerSlot {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = c.get_mut(&self.user) {
            *n -= 1;
            if *n == 0 {
                c.remove(&self.user);
            }
        }
    }
}

/// The relay side: opens one MPTCP connection per passenger connection.
#[derive(Clone)]
pub struct ConnDialer {
    proxy: SocketAddr,
    server_name: ServerName<'static>,
    connector: tokio_rustls::TlsConnector,
    protocol: Protocol,
    congestion: Congestion,
    stats: Arc<ConnStats>,
    /// Leading bits of an IPv6 source that name one passenger.
    v6_prefix: u8,
    /// Most open connections of one passenger.
    max_per_passenger: usize,
    passengers: PassengerCounts,
}

impl fmt::Debug for ConnDialer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnDialer").field("proxy", &self.proxy).field("protocol", &self.protocol).finish()
    }
}

impl ConnDialer {
    /// Dials `proxy` over MPTCP, not bound to any interface (the kernel's
    /// path manager adds subflows on its endpoints; a binding would pin them
    /// all to one interface), verifying the proxy as `server_name` with the
    /// train's `tls` (its ALPN is replaced by [`ALPN`]).
    pub fn new(proxy: SocketAddr, server_name: ServerName<'static>, tls: &ClientTls, stats: Arc<ConnStats>) -> Self {
        ConnDialer {
            proxy,
            server_name,
            connector: tokio_rustls::TlsConnector::from(client_tls(tls)),
            protocol: Protocol::MPTCP,
            congestion: Congestion::default(),
            stats,
            v6_prefix: polycorn_core::PASSENGER_V6_PREFIX,
            max_per_passenger: usize::MAX,
            passengers: PassengerCounts::default(),
        }
    }

    /// Who a passenger is and how many connections it may have open: an
    /// IPv6 source counts by its first `v6_prefix` bits (as the tunnel's
    /// [`UserId::passenger`]), and beyond `max` open connections a dial is
    /// refused (`ConnectionRefused`). The header names the passenger so.
    /// Default: a /64, no cap.
    pub fn with_passengers(mut self, v6_prefix: u8, max: usize) -> Self {
        self.v6_prefix = v6_prefix;
        self.max_per_passenger = max;
        self
    }

    /// The congestion control its MPTCP connections ask for (passed on to
    /// their subflows).
    pub fn with_congestion(mut self, cc: Congestion) -> Self {
        self.congestion = cc;
        self
    }

    /// Uses plain TCP instead of MPTCP (tests on kernels without MPTCP).
    pub fn with_protocol(mut self, protocol: Protocol) -> Self {
        self.protocol = protocol;
        self
    }

    /// The counters.
    pub fn stats(&self) -> &Arc<ConnStats> {
        &self.stats
    }

    /// Opens the connection for passenger `user` to `dst`: connect, TLS,
    /// header. The stream then carries the passenger's bytes both ways;
    /// shutting it down sends TLS close_notify and a FIN (a half-close).
    pub async fn dial(&self, user: IpAddr, dst: SocketAddr) -> io::Result<ClientStream> {
        let passenger = UserId::passenger(user, self.v6_prefix);
        let Some(slot) = PassengerSlot::take(&self.passengers, passenger, self.max_per_passenger) else {
            debug!(%passenger, %dst, "kernel-mptcp-conn: the passenger's connection cap is reached");
            return Err(io::Error::new(io::ErrorKind::ConnectionRefused, "the passenger's connection cap is reached"));
        };
        let attempt = async {
            let tcp = connect(self.proxy, None, self.protocol, &self.congestion).await?;
            let mut tls =
                tokio::time::timeout(HANDSHAKE_TIMEOUT, self.connector.connect(self.server_name.clone(), tcp))
                    .await
                    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake with the proxy timed out"))?
                    .map_err(|e| io::Error::new(e.kind(), format!("TLS handshake with the proxy: {e}")))?;
            tls.write_all(&ConnHeader { user: passenger, dst }.encode()).await?;
            tls.flush().await?;
            Ok(ClientStream { tls, _slot: slot })
        };
        let r = attempt.await;
        match &r {
            Ok(_) => {
                self.stats.opened.fetch_add(1, Relaxed);
                self.stats.last_ok.store(true, Relaxed);
            }
            Err(e) => {
                self.stats.failed.fetch_add(1, Relaxed);
                self.stats.last_ok.store(false, Relaxed);
                debug!(proxy = %self.proxy, %dst, error = %e, "kernel-mptcp-conn dial failed");
            }
        }
        r
    }
}

/// The proxy side's settings.
#[derive(Clone)]
pub struct ServeOpts {
    /// The train this proxy serves (the TLS configuration already refuses
    /// every other; checked again on the certificate).
    pub train_id: String,
    /// Connections served at once; at the cap the listener stops accepting
    /// and new connections wait in the kernel's backlog.
    pub max_conns: usize,
    /// Upstream connect timeout.
    pub connect_timeout: Duration,
    /// Time for the TLS handshake, and again for the header.
    pub handshake_timeout: Duration,
    /// Destination policy: true when `dst` may be connected to.
    pub allowed: Arc<dyn Fn(SocketAddr) -> bool + Send + Sync>,
    /// Counters.
    pub stats: Arc<ConnStats>,
}

impl fmt::Debug for ServeOpts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServeOpts")
            .field("train_id", &self.train_id)
            .field("max_conns", &self.max_conns)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

/// Serves relays' connections on `listener` until `shutdown` resolves, with
/// `tls` (its ALPN is replaced by [`ALPN`]); then aborts those still open.
pub async fn serve(listener: TcpListener, tls: &ServerTls, opts: ServeOpts, shutdown: impl Future) {
    let acceptor = tokio_rustls::TlsAcceptor::from(server_tls(tls));
    let sem = Arc::new(Semaphore::new(opts.max_conns.clamp(1, Semaphore::MAX_PERMITS)));
    let mut tasks = JoinSet::new();
    let mut shutdown = pin!(shutdown);
    loop {
        while tasks.try_join_next().is_some() {}
        let accepted = tokio::select! {
            biased;
            _ = &mut shutdown => break,
            r = async {
                let permit = sem.clone().acquire_owned().await.map_err(io::Error::other)?;
                let (s, peer) = listener.accept().await?;
                Ok::<_, io::Error>((s, peer, permit))
            } => r,
        };
        match accepted {
            Ok((tcp, peer, permit)) => {
                let (acceptor, opts) = (acceptor.clone(), opts.clone());
                tasks.spawn(async move {
                    let _permit = permit;
                    handle(tcp, peer, acceptor, opts).await;
                });
            }
            Err(e) => {
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    tasks.shutdown().await;
}

/// Keeps [`ConnStats::active`] up while a connection is relayed.
struct Active(Arc<ConnStats>);

impl Active {
    fn new(stats: &Arc<ConnStats>) -> Self {
        stats.active.fetch_add(1, Relaxed);
        Active(stats.clone())
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Relaxed);
    }
}

/// Failed TLS handshakes (anyone on the Internet can cause one) and
/// destinations refused by policy (a passenger's scanner causes one per
/// address it tries): each counted, logged at warn once a minute at most.
static PREAUTH_LOG: crate::lograte::Every = crate::lograte::Every::new(Duration::from_secs(60));
static POLICY_LOG: crate::lograte::Every = crate::lograte::Every::new(Duration::from_secs(60));

/// One connection: TLS, header, policy, upstream, copy. Every refusal is
/// counted and logged (the two kinds above at most once a minute) and ends
/// in a reset; nothing here panics on what a relay sends.
async fn handle(tcp: TcpStream, peer: SocketAddr, acceptor: tokio_rustls::TlsAcceptor, o: ServeOpts) {
    let st = &o.stats;
    tune(&tcp);
    let mut tls = match tokio::time::timeout(o.handshake_timeout, acceptor.accept(tcp)).await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => {
            st.refused_tls.fetch_add(1, Relaxed);
            match PREAUTH_LOG.check(std::time::Instant::now()) {
                Some(left_out) => {
                    warn!(%peer, error = %e, left_out, "kernel-mptcp-conn: TLS handshake failed (logged once a minute at most; left_out: since the last line)")
                }
                None => debug!(%peer, error = %e, "kernel-mptcp-conn: TLS handshake failed"),
            }
            return;
        }
        Err(_) => {
            st.refused_tls.fetch_add(1, Relaxed);
            match PREAUTH_LOG.check(std::time::Instant::now()) {
                Some(left_out) => {
                    warn!(%peer, left_out, "kernel-mptcp-conn: TLS handshake timed out (logged once a minute at most; left_out: since the last line)")
                }
                None => debug!(%peer, "kernel-mptcp-conn: TLS handshake timed out"),
            }
            return;
        }
    };
    let train = {
        let (_, conn) = tls.get_ref();
        conn.peer_certificates().and_then(|c| c.first()).map(polycorn_pki::train_id_of)
    };
    match train {
        Some(Ok(t)) if t == o.train_id => {}
        other => {
            st.refused_tls.fetch_add(1, Relaxed);
            warn!(%peer, certificate = ?other, serves = %o.train_id, "kernel-mptcp-conn: not this proxy's train");
            reset_on_close(tls.get_ref().0);
            return;
        }
    }
    let header = match read_header(&mut tls, o.handshake_timeout).await {
        Ok(h) => h,
        Err(e) => {
            st.refused_header.fetch_add(1, Relaxed);
            warn!(%peer, error = %e, "kernel-mptcp-conn: connection header refused");
            reset_on_close(tls.get_ref().0);
            return;
        }
    };
    let (user, dst) = (header.user.ip(), header.dst);
    if !(o.allowed)(dst) {
        st.refused_policy.fetch_add(1, Relaxed);
        match POLICY_LOG.check(std::time::Instant::now()) {
            Some(left_out) => {
                warn!(%peer, %user, %dst, left_out, "destination refused by policy (logged once a minute at most; left_out: since the last line)")
            }
            None => debug!(%peer, %user, %dst, "destination refused by policy"),
        }
        reset_on_close(tls.get_ref().0);
        return;
    }
    let mut up = match tokio::time::timeout(o.connect_timeout, TcpStream::connect(dst)).await {
        Ok(Ok(up)) => up,
        Ok(Err(e)) => {
            st.failed.fetch_add(1, Relaxed);
            info!(%user, %dst, error = %e, "upstream connect failed");
            reset_on_close(tls.get_ref().0);
            return;
        }
        Err(_) => {
            st.failed.fetch_add(1, Relaxed);
            info!(%user, %dst, "upstream connect timed out");
            reset_on_close(tls.get_ref().0);
            return;
        }
    };
    let _ = up.set_nodelay(true);
    st.opened.fetch_add(1, Relaxed);
    let _active = Active::new(st);
    match tokio::io::copy_bidirectional_with_sizes(&mut tls, &mut up, 64 * 1024, 64 * 1024).await {
        Ok((to_up, to_relay)) => {
            st.bytes_up.fetch_add(to_up, Relaxed);
            st.bytes_down.fetch_add(to_relay, Relaxed);
            debug!(%user, %dst, up = to_up, down = to_relay, "kernel-mptcp-conn: done");
        }
        Err(e) => {
            // Counted bytes are lost with the error; the error itself is
            // counted, and each side sees a reset.
            st.errors.fetch_add(1, Relaxed);
            debug!(%user, %dst, error = %e, "kernel-mptcp-conn: ended with an error");
            reset_on_close(tls.get_ref().0);
            reset_on_close(&up);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(user: &str, dst: &str) -> ConnHeader {
        ConnHeader { user: UserId::from(user.parse::<IpAddr>().unwrap()), dst: dst.parse().unwrap() }
    }

    #[test]
    fn headers_round_trip() {
        for h in [header("10.66.0.2", "10.99.0.10:80"), header("2001:db8::1", "[2001:db8::2]:443")] {
            let mut b = h.encode();
            assert!(b.len() <= PREFIX_LEN + MAX_BODY_LEN);
            b.extend_from_slice(b"passenger bytes");
            let (back, used) = ConnHeader::decode(&b).unwrap();
            assert_eq!(back, h);
            assert_eq!(&b[used..], b"passenger bytes", "the header ends where it says");
        }
        assert_eq!(header("10.66.0.2", "10.99.0.10:80").user.ip(), "10.66.0.2".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn every_truncation_is_an_error() {
        for h in [header("10.66.0.2", "10.99.0.10:80"), header("2001:db8::1", "[2001:db8::2]:443")] {
            let b = h.encode();
            for n in 0..b.len() {
                let e = ConnHeader::decode(&b[..n]).unwrap_err();
                assert!(matches!(e, HeaderError::Truncated { .. }), "{n} bytes: {e}");
            }
        }
    }

    #[test]
    fn bad_headers_are_errors_not_panics() {
        let good = header("10.66.0.2", "10.99.0.10:80").encode();
        let with = |i: usize, v: u8| {
            let mut b = good.clone();
            b[i] = v;
            ConnHeader::decode(&b)
        };
        assert_eq!(with(0, b'X').unwrap_err(), HeaderError::BadMagic(*b"XCMC"));
        assert_eq!(with(4, 2).unwrap_err(), HeaderError::Version(2));
        assert_eq!(with(PREFIX_LEN + 16, 5).unwrap_err(), HeaderError::Family(5));
        // A v4 body claiming to be v6.
        assert_eq!(with(PREFIX_LEN + 16, 6).unwrap_err(), HeaderError::BodyLength(BODY_V4));
        // Oversized: never read, whatever follows.
        let mut big = good.clone();
        big[5..7].copy_from_slice(&60000u16.to_be_bytes());
        big.resize(70000, 0);
        assert_eq!(ConnHeader::decode(&big).unwrap_err(), HeaderError::BodyLength(60000));
        // Port 0 and the unspecified address are not destinations.
        let zero_port = header("10.66.0.2", "10.99.0.10:0").encode();
        assert!(matches!(ConnHeader::decode(&zero_port), Err(HeaderError::Destination(_))));
        let unspecified = header("10.66.0.2", "0.0.0.0:80").encode();
        assert!(matches!(ConnHeader::decode(&unspecified), Err(HeaderError::Destination(_))));
        // A subflow's HELLO is not a header.
        let mut hello = Vec::new();
        polycorn_core::wire::Frame::Hello {
            version: polycorn_core::wire::VERSION,
            session: 1,
            path: polycorn_core::PathId(0),
            train_id: "train-0001".into(),
            path_name: "a".into(),
        }
        .encode(&mut hello);
        assert!(matches!(ConnHeader::decode(&hello), Err(HeaderError::BadMagic(_))));
        // Pseudo-random garbage of every length: errors or headers, no panic.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for n in 0..2000 {
            let mut g: Vec<u8> = (0..n % 80)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            if n % 3 == 0 && g.len() >= PREFIX_LEN {
                g[..5].copy_from_slice(&good[..5]);
            }
            let _ = ConnHeader::decode(&g);
        }
    }

    #[tokio::test]
    async fn read_header_reads_no_further_and_bounds_its_wait() {
        let h = header("10.66.0.2", "10.99.0.10:80");
        let (mut a, mut b) = tokio::io::duplex(1024);
        a.write_all(&h.encode()).await.unwrap();
        a.write_all(b"rest").await.unwrap();
        assert_eq!(read_header(&mut b, Duration::from_secs(1)).await.unwrap(), h);
        let mut rest = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(1), b.read_exact(&mut rest))
            .await
            .expect("the bytes after the header are still there")
            .unwrap();
        assert_eq!(&rest, b"rest");
        // Half a header, then silence: a timeout.
        a.write_all(&h.encode()[..10]).await.unwrap();
        let e = read_header(&mut b, Duration::from_millis(50)).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        // Half a header, then EOF.
        let (mut a, mut b) = tokio::io::duplex(1024);
        a.write_all(&h.encode()[..10]).await.unwrap();
        drop(a);
        let e = read_header(&mut b, Duration::from_secs(1)).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        // An oversized length: refused before any body is read.
        let (mut a, mut b) = tokio::io::duplex(1024);
        let mut bad = h.encode();
        bad[5..7].copy_from_slice(&u16::MAX.to_be_bytes());
        a.write_all(&bad).await.unwrap();
        let e = read_header(&mut b, Duration::from_secs(1)).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("length 65535"), "{e}");
    }

    struct Pair {
        _dir: tempfile::TempDir,
        client: ClientTls,
        other_train: ClientTls,
        server: ServerTls,
    }

    fn pki() -> Pair {
        let dir = tempfile::tempdir().unwrap();
        let b = polycorn_pki::write_dev_bundle(dir.path(), &["train-0001".into(), "train-0099".into()]).unwrap();
        let client_of = |t: &str| {
            let (cert, key) = &b.trains[t];
            polycorn_pki::client_config(&b.ca_cert, cert, key).unwrap()
        };
        let server =
            polycorn_pki::server_config(&b.ca_cert, &b.proxy_cert, &b.proxy_key, &["train-0001".to_string()]).unwrap();
        Pair { client: client_of("train-0001"), other_train: client_of("train-0099"), server, _dir: dir }
    }

    /// MPTCP where the kernel has it, TCP otherwise: the code is the same.
    fn protocol() -> Protocol {
        if mptcp_available() {
            Protocol::MPTCP
        } else {
            eprintln!("no MPTCP sockets here: testing over plain TCP");
            Protocol::TCP
        }
    }

    /// A proxy on loopback whose policy refuses port 9 of any address.
    async fn proxy(server: &ServerTls) -> (SocketAddr, Arc<ConnStats>, tokio::sync::oneshot::Sender<()>) {
        let l = listen("127.0.0.1:0".parse().unwrap(), protocol()).unwrap();
        let addr = l.local_addr().unwrap();
        let stats = Arc::new(ConnStats::default());
        let opts = ServeOpts {
            train_id: "train-0001".into(),
            max_conns: 16,
            connect_timeout: Duration::from_secs(2),
            handshake_timeout: Duration::from_secs(2),
            allowed: Arc::new(|d: SocketAddr| d.port() != 9),
            stats: stats.clone(),
        };
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = server.clone();
        tokio::spawn(async move { serve(l, &server, opts, rx).await });
        (addr, stats, tx)
    }

    fn dialer(proxy: SocketAddr, tls: &ClientTls) -> ConnDialer {
        let name = ServerName::try_from("proxy.polycorn").unwrap();
        ConnDialer::new(proxy, name, tls, Arc::default()).with_protocol(protocol())
    }

    async fn wait_for(what: &str, f: impl Fn() -> bool) {
        for _ in 0..200 {
            if f() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("timed out waiting for {what}");
    }

    /// Relay-side dial and proxy-side accept carry bytes both ways, with
    /// half-close: the request ends with a FIN, the answer still arrives.
    #[tokio::test]
    async fn a_connection_carries_bytes_both_ways_with_half_close() {
        let p = pki();
        // Origin: reads the request to EOF, answers with it reversed, closes.
        let origin = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin_addr = origin.local_addr().unwrap();
        let origin_task = tokio::spawn(async move {
            let (mut s, _) = origin.accept().await.unwrap();
            let mut req = Vec::new();
            s.read_to_end(&mut req).await.unwrap();
            req.reverse();
            s.write_all(&req).await.unwrap();
            req.len()
        });
        let (proxy_addr, stats, _stop) = proxy(&p.server).await;
        let d = dialer(proxy_addr, &p.client);
        let mut s = d.dial("10.66.0.2".parse().unwrap(), origin_addr).await.unwrap();
        let req: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        s.write_all(&req).await.unwrap();
        s.shutdown().await.unwrap();
        let mut resp = Vec::new();
        s.read_to_end(&mut resp).await.unwrap();
        let mut want = req.clone();
        want.reverse();
        assert_eq!(resp.len(), want.len());
        assert!(resp == want, "the answer is the request reversed");
        assert_eq!(origin_task.await.unwrap(), req.len());
        assert_eq!(d.stats().opened.load(Relaxed), 1);
        wait_for("the proxy's byte counts", || stats.bytes_down.load(Relaxed) == req.len() as u64).await;
        assert_eq!(stats.bytes_up.load(Relaxed), req.len() as u64);
        assert_eq!((stats.opened.load(Relaxed), stats.errors.load(Relaxed)), (1, 0));
        wait_for("the connection to end", || stats.active.load(Relaxed) == 0).await;
    }

    /// A denied destination, a dead one, another train and garbage are
    /// refused, counted and reset; the proxy keeps serving.
    #[tokio::test]
    async fn refusals_are_counted_and_reset() {
        let p = pki();
        let (proxy_addr, stats, _stop) = proxy(&p.server).await;
        let d = dialer(proxy_addr, &p.client);
        // Denied by policy: the relay's dial succeeds (no answer is awaited),
        // then the stream is reset.
        let mut s = d.dial("10.66.0.2".parse().unwrap(), "127.0.0.1:9".parse().unwrap()).await.unwrap();
        let mut buf = [0u8; 16];
        assert!(s.read(&mut buf).await.is_err(), "a refused destination is a reset, not an EOF");
        assert_eq!(stats.refused_policy.load(Relaxed), 1);
        // Nothing listens there: upstream connect fails.
        let dead = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        let mut s = d.dial("10.66.0.2".parse().unwrap(), dead).await.unwrap();
        assert!(s.read(&mut buf).await.is_err());
        assert_eq!(stats.failed.load(Relaxed), 1);
        // Another train's certificate: the handshake fails.
        let other = dialer(proxy_addr, &p.other_train);
        // TLS 1.3: the client may finish before the server's verdict.
        let mut s = other.dial("10.66.0.2".parse().unwrap(), dead).await.ok();
        if let Some(s) = s.as_mut() {
            assert!(s.read(&mut buf).await.is_err());
        }
        wait_for("the TLS refusal", || stats.refused_tls.load(Relaxed) == 1).await;
        // A subflow's ALPN: no common protocol.
        let tcp = connect(proxy_addr, None, protocol(), &Congestion::Kernel).await.unwrap();
        let plain = tokio_rustls::TlsConnector::from(p.client.clone());
        let r = plain.connect(ServerName::try_from("proxy.polycorn").unwrap(), tcp).await;
        assert!(r.is_err(), "a subflow client is refused in the handshake");
        wait_for("the ALPN refusal", || stats.refused_tls.load(Relaxed) == 2).await;
        // Garbage after a good handshake.
        let tcp = connect(proxy_addr, None, protocol(), &Congestion::Kernel).await.unwrap();
        let conn = tokio_rustls::TlsConnector::from(client_tls(&p.client));
        let mut tls = conn.connect(ServerName::try_from("proxy.polycorn").unwrap(), tcp).await.unwrap();
        tls.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        assert!(tls.read(&mut buf).await.is_err());
        assert_eq!(stats.refused_header.load(Relaxed), 1);
        assert_eq!(stats.opened.load(Relaxed), 0);
        // And it still serves.
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let echo_addr = echo.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = echo.accept().await.unwrap();
            let (mut r, mut w) = s.split();
            tokio::io::copy(&mut r, &mut w).await.unwrap();
        });
        let mut s = d.dial("10.66.0.2".parse().unwrap(), echo_addr).await.unwrap();
        s.write_all(b"still here").await.unwrap();
        let mut got = [0u8; 10];
        s.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"still here");
    }

    /// An IPv6 passenger is its /64: its addresses share one cap, which a
    /// closed connection frees again; another /64 and an IPv4 passenger
    /// have their own.
    #[tokio::test]
    async fn passengers_are_keyed_by_their_prefix_and_capped() {
        let p = pki();
        let (proxy_addr, _stats, _stop) = proxy(&p.server).await;
        let d = dialer(proxy_addr, &p.client).with_passengers(64, 2);
        let dst: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let a = d.dial(ip("2001:db8:1:2::10"), dst).await.unwrap();
        let _b = d.dial(ip("2001:db8:1:2:aaaa::11"), dst).await.unwrap();
        let e = d.dial(ip("2001:db8:1:2::99"), dst).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "a third address of the same /64: {e}");
        let _c = d.dial(ip("2001:db8:1:3::10"), dst).await.unwrap();
        let _v4 = d.dial(ip("10.66.0.2"), dst).await.unwrap();
        drop(a);
        let _d = d.dial(ip("2001:db8:1:2::99"), dst).await.unwrap();
    }

    #[tokio::test]
    async fn a_dial_to_no_proxy_fails_and_is_counted() {
        let p = pki();
        let nobody = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        let d = dialer(nobody, &p.client);
        let e = d.dial("10.66.0.2".parse().unwrap(), "10.99.0.10:80".parse().unwrap()).await.unwrap_err();
        assert!(e.to_string().contains("connecting to the proxy"), "{e}");
        assert_eq!(d.stats().failed.load(Relaxed), 1);
        assert!(!d.stats().last_ok.load(Relaxed));
    }

    #[test]
    fn metrics_name_the_refusal_reasons() {
        let s = ConnStats::default();
        s.refused_policy.fetch_add(2, Relaxed);
        let st = Arc::new(s);
        let src: crate::metrics::Source = Arc::new(move |w| st.write_proxy(w));
        let text = crate::metrics::tests::encode(vec![src]);
        assert!(text.lines().any(|l| l == "polycorn_mptcp_conn_refused_total{reason=\"policy\"} 2.0"), "{text}");
    }
}
