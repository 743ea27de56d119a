//! QUIC subflows: one QUIC connection per carrier (quinn), carrying the
//! session's frames on one bidirectional stream, with a congestion
//! controller chosen per run (`--quic-cc`).
//!
//! Why QUIC under the same framing: the frames, reassembly and
//! schedulerlets do not change; what changes is who decides the subflow's
//! rate. Over TCP that is the kernel, which reads a handover's silence and
//! the carrier's radio loss as congestion. Over QUIC it is
//! [`polycorn_core::cc::Railway`] (or a stock controller, for comparison),
//! fed with the relay's radio events through a [`HintBoard`].
//!
//! Mutual TLS is the same rustls configuration as the TLS subflows' (TLS 1.3
//! only, the same ALPN, the same CA, CRL and one-train rule): QUIC's
//! handshake is TLS 1.3.

use std::future::Future as _;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use polycorn_core::cc::{Hint, Railway, RailwayConfig, RailwayStats};
use polycorn_core::wire::LinkState;
use polycorn_core::{PathId, MAX_PATHS};
use quinn::congestion::{Controller, ControllerFactory};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes quinn may hold for a subflow beyond its congestion window
/// (unsent): as `TCP_NOTSENT_LOWAT` for the TLS subflows, the scheduler
/// decides late, so a frame waits in the endpoint (where it can still go
/// to another path) rather than behind a stalled carrier.
pub const UNSENT_ALLOWANCE: u64 = 128 * 1024;
/// A subflow's receive windows: the session reads everything at once, so
/// this bounds only what arrives out of order behind a loss (about two
/// bandwidth-delay products of the fastest carrier).
pub const RECEIVE_WINDOW: u32 = 8 << 20;
/// Keep-alive: carriers' NATs drop idle UDP mappings in tens of seconds,
/// and a quiet path must still notice its carrier died.
pub const KEEP_ALIVE: Duration = Duration::from_secs(1);
/// A subflow silent this long is closed. Longer than the railway's longest
/// outages (a failed handover's re-attach takes seconds), since the
/// session's own dead-path detection already stops using a silent path.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The congestion controller of the QUIC subflows (`--quic-cc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuicCc {
    /// [`Railway`], with the radio hints or without them (what the hints
    /// are worth), and the standing queue it keeps for a swinging
    /// carrier's surges if not its default (`railway-q<ms>`,
    /// `surge_queue_delay`): more of a fading carrier used, for more delay.
    Railway { hints: bool, queue_ms: Option<u16> },
    /// quinn's BBR.
    Bbr,
    /// quinn's CUBIC.
    Cubic,
    /// quinn's NewReno.
    NewReno,
}

impl QuicCc {
    pub const DEFAULT: QuicCc = QuicCc::Railway { hints: true, queue_ms: None };
    /// Every controller, each with its default parameters.
    pub const ALL: [QuicCc; 5] = [
        QuicCc::DEFAULT,
        QuicCc::Railway { hints: false, queue_ms: None },
        QuicCc::Bbr,
        QuicCc::Cubic,
        QuicCc::NewReno,
    ];
    /// Most standing queue `railway-q<ms>` takes.
    pub const MAX_QUEUE_MS: u16 = 2000;

    fn base_name(self) -> &'static str {
        match self {
            QuicCc::Railway { hints: true, .. } => "railway",
            QuicCc::Railway { hints: false, .. } => "railway-nohints",
            QuicCc::Bbr => "bbr",
            QuicCc::Cubic => "cubic",
            QuicCc::NewReno => "newreno",
        }
    }
}

impl std::fmt::Display for QuicCc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.base_name())?;
        match self {
            QuicCc::Railway { queue_ms: Some(q), .. } => write!(f, "-q{q}"),
            _ => Ok(()),
        }
    }
}

impl std::str::FromStr for QuicCc {
    type Err = crate::Error;
    fn from_str(s: &str) -> Result<Self, crate::Error> {
        let unknown = || {
            let names: Vec<_> = QuicCc::ALL.iter().map(|c| c.to_string()).collect();
            crate::Error::option(
                format!("--quic-cc {s:?}"),
                format!(
                    "unknown; use one of {}, or railway[-nohints]-q<ms> (0 to {} ms)",
                    names.join(", "),
                    QuicCc::MAX_QUEUE_MS
                ),
            )
        };
        if let Some(c) = QuicCc::ALL.into_iter().find(|c| c.to_string() == s) {
            return Ok(c);
        }
        let (base, q) = s.rsplit_once("-q").ok_or_else(unknown)?;
        let hints = match base {
            "railway" => true,
            "railway-nohints" => false,
            _ => return Err(unknown()),
        };
        let digits = !q.is_empty() && q.bytes().all(|b| b.is_ascii_digit()) && (q == "0" || !q.starts_with('0'));
        let q: u16 = q.parse().ok().filter(|q| digits && *q <= QuicCc::MAX_QUEUE_MS).ok_or_else(unknown)?;
        Ok(QuicCc::Railway { hints, queue_ms: Some(q) })
    }
}

/// One path's radio state as the controllers read it: a generation counter
/// and whether the carrier is in a handover or without service.
#[derive(Debug, Default)]
pub struct PathHints {
    /// `generation << 1 | interrupted`.
    state: AtomicU64,
}

impl PathHints {
    fn set(&self, interrupted: bool) {
        let cur = self.state.load(Ordering::Relaxed);
        if (cur & 1 == 1) != interrupted {
            self.state.store(((cur >> 1) + 1) << 1 | u64::from(interrupted), Ordering::Relaxed);
        }
    }
}

/// Every path's [`PathHints`]: the relay writes it from its radio sources,
/// the proxy from the relay's path-status frames; each subflow's controller
/// reads its path's entry.
#[derive(Debug)]
pub struct HintBoard {
    paths: Vec<Arc<PathHints>>,
}

impl Default for HintBoard {
    fn default() -> Self {
        HintBoard { paths: (0..MAX_PATHS).map(|_| Arc::default()).collect() }
    }
}

impl HintBoard {
    /// A path's radio state changed (`NoService` and `HandoverStarted`
    /// interrupt it, `Connected` ends that).
    pub fn report(&self, path: PathId, state: LinkState) {
        if let Some(h) = self.paths.get(path.index()) {
            h.set(state != LinkState::Connected);
        }
    }

    pub fn path(&self, path: PathId) -> Arc<PathHints> {
        self.paths.get(path.index()).cloned().unwrap_or_default()
    }
}

/// What one connection's controller shares with its shell: where a
/// controller built before its path is known (a proxy accepts the
/// connection before the HELLO names the path) finds its hints later, and
/// the rate the controller wants the shell to pace writes at.
#[derive(Debug, Default)]
pub struct HintSlot {
    hints: std::sync::OnceLock<Arc<PathHints>>,
    /// Bytes per second; 0: the controller does not pace.
    pacing: AtomicU64,
}

impl HintSlot {
    pub fn bind(&self, hints: Arc<PathHints>) {
        let _ = self.hints.set(hints);
    }
}

/// Counters of every [`Railway`] controller of a process, for metrics.
#[derive(Debug, Default)]
pub struct CcStats {
    pub outages_held: AtomicU64,
    pub outages_congested: AtomicU64,
    pub loss_backoffs: AtomicU64,
    pub handovers_held: AtomicU64,
}

impl CcStats {
    fn add(&self, before: RailwayStats, after: RailwayStats) {
        let d = |a: u64, b: u64| b.saturating_sub(a);
        self.outages_held.fetch_add(d(before.outages_held, after.outages_held), Ordering::Relaxed);
        self.outages_congested.fetch_add(d(before.outages_congested, after.outages_congested), Ordering::Relaxed);
        self.loss_backoffs.fetch_add(d(before.loss_backoffs, after.loss_backoffs), Ordering::Relaxed);
        self.handovers_held.fetch_add(d(before.handovers_held, after.handovers_held), Ordering::Relaxed);
    }
}

/// [`Railway`] as a quinn controller.
struct RailController {
    core: Railway,
    /// Shared with the shell: the hints come from it (when `use_hints`),
    /// the pacing rate goes to it.
    slot: Arc<HintSlot>,
    use_hints: bool,
    seen: u64,
    in_flight: u64,
    stats: Arc<CcStats>,
}

impl RailController {
    fn hints(&mut self, now: Instant) {
        let Some(h) = self.slot.hints.get().filter(|_| self.use_hints) else { return };
        let st = h.state.load(Ordering::Relaxed);
        if st != self.seen {
            self.seen = st;
            let hint = if st & 1 == 1 { Hint::HandoverStart } else { Hint::HandoverEnd };
            self.record(|c| c.on_hint(now, hint));
        }
    }

    fn record(&mut self, f: impl FnOnce(&mut Railway)) {
        let before = self.core.stats();
        f(&mut self.core);
        let after = self.core.stats();
        if after != before {
            self.stats.add(before, after);
        }
        self.slot.pacing.store(self.core.pacing_rate().map_or(0, |r| r.max(1.0) as u64), Ordering::Relaxed);
    }
}

impl Controller for RailController {
    fn on_sent(&mut self, now: Instant, bytes: u64, _last_packet_number: u64) {
        self.hints(now);
        self.core.on_sent(now, bytes, self.in_flight);
        self.in_flight += bytes;
    }

    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        _app_limited: bool,
        _rtt: &quinn_proto::RttEstimator,
    ) {
        self.hints(now);
        self.record(|c| c.on_ack(now, sent, bytes));
    }

    fn on_end_acks(&mut self, _now: Instant, in_flight: u64, _app_limited: bool, _largest: Option<u64>) {
        self.in_flight = in_flight;
    }

    fn on_congestion_event(&mut self, now: Instant, sent: Instant, persistent: bool, lost_bytes: u64) {
        self.hints(now);
        self.in_flight = self.in_flight.saturating_sub(lost_bytes);
        self.record(|c| c.on_loss(now, sent, persistent, lost_bytes));
    }

    fn on_mtu_update(&mut self, new_mtu: u16) {
        self.core.set_mtu(new_mtu);
    }

    fn window(&self) -> u64 {
        self.core.window()
    }

    fn clone_box(&self) -> Box<dyn Controller> {
        Box::new(RailController {
            core: self.core.clone(),
            slot: self.slot.clone(),
            use_hints: self.use_hints,
            seen: self.seen,
            in_flight: self.in_flight,
            stats: self.stats.clone(),
        })
    }

    fn initial_window(&self) -> u64 {
        self.core.config().initial_window
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

struct RailFactory {
    slot: Arc<HintSlot>,
    use_hints: bool,
    queue: Option<Duration>,
    stats: Arc<CcStats>,
}

impl ControllerFactory for RailFactory {
    fn build(self: Arc<Self>, now: Instant, current_mtu: u16) -> Box<dyn Controller> {
        let mut cfg = RailwayConfig::default();
        if let Some(q) = self.queue {
            cfg.surge_queue_delay = q;
        }
        let mut core = Railway::new(cfg, now);
        core.set_mtu(current_mtu);
        Box::new(RailController {
            core,
            slot: self.slot.clone(),
            use_hints: self.use_hints,
            seen: 0,
            in_flight: 0,
            stats: self.stats.clone(),
        })
    }
}

/// The transport parameters of a subflow whose controller reads `slot`.
pub fn transport_config(cc: QuicCc, slot: Arc<HintSlot>, stats: Arc<CcStats>) -> quinn::TransportConfig {
    let mut t = quinn::TransportConfig::default();
    t.max_concurrent_bidi_streams(1u8.into())
        .max_concurrent_uni_streams(0u8.into())
        .stream_receive_window(RECEIVE_WINDOW.into())
        .receive_window(RECEIVE_WINDOW.into())
        .send_window(u64::from(RECEIVE_WINDOW))
        .keep_alive_interval(Some(KEEP_ALIVE))
        .max_idle_timeout(Some(IDLE_TIMEOUT.try_into().expect("30 s is a valid idle timeout")));
    match cc {
        QuicCc::Railway { hints, queue_ms } => t.congestion_controller_factory(Arc::new(RailFactory {
            slot,
            use_hints: hints,
            queue: queue_ms.map(|q| Duration::from_millis(q.into())),
            stats,
        })),
        QuicCc::Bbr => t.congestion_controller_factory(Arc::new(quinn::congestion::BbrConfig::default())),
        QuicCc::Cubic => t.congestion_controller_factory(Arc::new(quinn::congestion::CubicConfig::default())),
        QuicCc::NewReno => t.congestion_controller_factory(Arc::new(quinn::congestion::NewRenoConfig::default())),
    };
    t
}

fn quic_error(what: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("{what}: {e}"))
}

/// A UDP socket for one carrier: bound to its interface when given (as the
/// TLS subflows are), on an ephemeral port.
fn carrier_socket(peer: SocketAddr, device: Option<&str>) -> io::Result<std::net::UdpSocket> {
    let sock = Socket::new(Domain::for_address(peer), Type::DGRAM, Some(Protocol::UDP))?;
    if let Some(dev) = device {
        sock.bind_device(Some(dev.as_bytes()))
            .map_err(|e| io::Error::new(e.kind(), format!("binding the QUIC subflow to interface {dev}: {e}")))?;
    }
    let any: SocketAddr = match peer {
        SocketAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    sock.bind(&any.into())?;
    sock.set_nonblocking(true)?;
    Ok(sock.into())
}

/// The relay's side: a QUIC connection to `peer` over `device`, and its
/// stream. The connection's endpoint (and so its socket) lives as long as
/// the returned subflow.
pub async fn connect(
    peer: SocketAddr,
    device: Option<&str>,
    server_name: &str,
    tls: &crate::subflow::ClientTls,
    cc: QuicCc,
    hints: Arc<PathHints>,
    stats: Arc<CcStats>,
) -> io::Result<QuicSubflow> {
    let socket = carrier_socket(peer, device)?;
    let endpoint = quinn::Endpoint::new(quinn::EndpointConfig::default(), None, socket, Arc::new(quinn::TokioRuntime))?;
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls.clone())
        .map_err(|e| quic_error("QUIC client TLS configuration", e))?;
    let mut config = quinn::ClientConfig::new(Arc::new(crypto));
    let slot = Arc::new(HintSlot::default());
    slot.bind(hints);
    config.transport_config(Arc::new(transport_config(cc, slot.clone(), stats)));
    let conn = endpoint
        .connect_with(config, peer, server_name)
        .map_err(|e| quic_error("QUIC connect", e))?
        .await
        .map_err(|e| quic_error("QUIC handshake", e))?;
    let (send, recv) = conn.open_bi().await.map_err(|e| quic_error("opening the QUIC stream", e))?;
    Ok(QuicSubflow { send, recv, conn, pacer: Pacer::new(slot), _endpoint: Some(endpoint) })
}

/// The proxy's QUIC listener: one UDP socket for every train subflow.
pub fn listen(addr: SocketAddr, tls: &crate::subflow::ServerTls) -> io::Result<(quinn::Endpoint, ServerCrypto)> {
    let crypto = Arc::new(
        quinn::crypto::rustls::QuicServerConfig::try_from(tls.clone())
            .map_err(|e| quic_error("QUIC server TLS configuration", e))?,
    );
    let sock = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    sock.set_reuse_address(true)?;
    sock.bind(&addr.into()).map_err(|e| io::Error::new(e.kind(), format!("binding UDP {addr}: {e}")))?;
    sock.set_nonblocking(true)?;
    let mut cfg = quinn::EndpointConfig::default();
    // Connections are few (a train's carriers): no stateless retry needed,
    // but no amplification either, which quinn enforces before validation.
    cfg.max_udp_payload_size(1452).map_err(|e| quic_error("QUIC endpoint configuration", e))?;
    // Without a server configuration quinn drops every Initial; each
    // connection is then accepted with its own ([`accept`]).
    let default = quinn::ServerConfig::with_crypto(crypto.clone());
    let endpoint = quinn::Endpoint::new(cfg, Some(default), sock.into(), Arc::new(quinn::TokioRuntime))?;
    Ok((endpoint, ServerCrypto(crypto)))
}

/// The proxy's TLS for QUIC, shared by every accepted connection.
#[derive(Clone)]
pub struct ServerCrypto(Arc<quinn::crypto::rustls::QuicServerConfig>);

/// Accept one incoming connection with its own controller, whose hints the
/// returned slot binds once the HELLO names the path.
pub async fn accept(
    incoming: quinn::Incoming,
    crypto: &ServerCrypto,
    cc: QuicCc,
    stats: Arc<CcStats>,
) -> io::Result<(QuicSubflow, Arc<HintSlot>)> {
    let slot = Arc::new(HintSlot::default());
    let mut config = quinn::ServerConfig::with_crypto(crypto.0.clone());
    config.transport_config(Arc::new(transport_config(cc, slot.clone(), stats)));
    let conn = incoming
        .accept_with(Arc::new(config))
        .map_err(|e| quic_error("QUIC accept", e))?
        .await
        .map_err(|e| quic_error("QUIC handshake", e))?;
    let (send, recv) = conn.accept_bi().await.map_err(|e| quic_error("accepting the QUIC stream", e))?;
    Ok((QuicSubflow { send, recv, conn, pacer: Pacer::new(slot.clone()), _endpoint: None }, slot))
}

/// One QUIC subflow as a byte stream for [`crate::Session::run_path`].
///
/// Writing keeps quinn's send buffer at the congestion window plus
/// [`UNSENT_ALLOWANCE`], so that bytes the carrier cannot take yet stay
/// with the scheduler.
pub struct QuicSubflow {
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    conn: quinn::Connection,
    pacer: Pacer,
    /// The relay's per-carrier endpoint (its socket), kept alive with it.
    _endpoint: Option<quinn::Endpoint>,
}

impl QuicSubflow {
    pub fn connection(&self) -> &quinn::Connection {
        &self.conn
    }

    /// What the session's writer reads of this subflow's pacer.
    pub fn send_gauge(&self) -> QuicSendGauge {
        QuicSendGauge { slot: self.pacer.slot.clone() }
    }

    /// The train named by the peer's certificate (proxy side).
    pub fn peer_train(&self) -> io::Result<String> {
        let id = self.conn.peer_identity().ok_or_else(|| io::Error::other("no client certificate"))?;
        let certs = id
            .downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
            .map_err(|_| io::Error::other("unexpected QUIC peer identity"))?;
        let first = certs.first().ok_or_else(|| io::Error::other("no client certificate"))?;
        polycorn_pki::train_id_of(first).map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e.to_string()))
    }
}

impl QuicSubflow {
    /// Log the connection's transport state every `every` at debug level
    /// (`RUST_LOG=polycorn_net::quic=debug`) until it closes: what a slow
    /// subflow's controller believed (window, rate, minimum RTT, mode) next
    /// to what quinn measured (RTT, losses, congestion events).
    pub fn log_stats(
        &self,
        subflow: String,
        every: Duration,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let conn = self.conn.clone();
        async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = conn.closed() => return,
                }
                if !tracing::enabled!(tracing::Level::DEBUG) {
                    continue;
                }
                let st = conn.stats();
                let cc = conn.congestion_state();
                let model = cc.into_any().downcast::<RailController>().ok().map(|c| {
                    format!(
                        "mode={:?} rate_mbps={:.2} rtprop_ms={:?} queue_ms={:?} held={} backoffs={}",
                        c.core.mode(),
                        c.core.rate().unwrap_or(0.0) * 8.0 / 1e6,
                        c.core.rtprop().map(|d| d.as_millis()),
                        c.core.queue_delay().map(|d| d.as_millis()),
                        c.core.stats().outages_held,
                        c.core.stats().loss_backoffs,
                    )
                });
                tracing::debug!(
                    %subflow,
                    cwnd = st.path.cwnd,
                    rtt_ms = st.path.rtt.as_millis() as u64,
                    sent_packets = st.path.sent_packets,
                    lost_packets = st.path.lost_packets,
                    congestion_events = st.path.congestion_events,
                    tx_bytes = st.udp_tx.bytes,
                    rx_bytes = st.udp_rx.bytes,
                    model = model.as_deref().unwrap_or("-"),
                    "QUIC subflow"
                );
            }
        }
    }
}

/// A QUIC subflow's pacer as the session's writer sees it
/// ([`crate::session::SendProbe::Quic`]).
#[derive(Clone, Debug)]
pub struct QuicSendGauge {
    slot: Arc<HintSlot>,
}

impl QuicSendGauge {
    /// One pacer burst ([`pacer_burst`], at most the session's largest
    /// write); [`UNPACED_WRITE`] when the controller does not pace. On a
    /// carrier of a few Mbit/s a write of the session's usual quarter
    /// mebibyte waits a second behind the pacer.
    pub fn write_quantum(&self) -> usize {
        let rate = self.slot.pacing.load(Ordering::Relaxed) as f64;
        if rate <= 0.0 {
            return UNPACED_WRITE;
        }
        pacer_burst(rate).min(crate::subflow::MAX_WRITE as f64) as usize
    }
}

/// Bytes a writer hands an unpaced subflow (quinn's own controllers) at
/// once: quinn holds no more than the window plus [`UNSENT_ALLOWANCE`]
/// anyway, and what it cannot take yet is better left with the scheduler.
const UNPACED_WRITE: usize = 64 * 1024;

impl AsyncRead for QuicSubflow {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.recv).poll_read(cx, buf)
    }
}

/// Paces a subflow's writes at its controller's rate, where the
/// controller sets one: quinn paces from the window alone, which lets a
/// window sized for bursts of acknowledgements run ahead of the path's rate.
struct Pacer {
    slot: Arc<HintSlot>,
    tokens: f64,
    last: Option<tokio::time::Instant>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// Most a paced subflow sends at once: 10 ms at its rate, at least 16 KiB.
const PACER_BURST_S: f64 = 0.01;
const PACER_MIN_BURST: f64 = 16.0 * 1024.0;
/// Longest a paced writer sleeps before it reads the rate again.
const PACER_MAX_WAIT_S: f64 = 0.05;
/// Fewest bytes a paced write hands quinn (unless the writer has fewer):
/// quinn keeps each write as its own segment of the stream's send buffer
/// and finds a frame's bytes by walking those segments from the oldest
/// unacknowledged one, so writes of a few bytes each, as a token bucket
/// refilled every millisecond would make, cost it time quadratic in the
/// bytes in flight (at 40 Mbit/s the proxy spent whole seconds in it).
const PACER_MIN_WRITE: usize = 16 * 1024;
// The bucket must be able to hold a whole minimal write.
const _: () = assert!(PACER_MIN_BURST as usize >= PACER_MIN_WRITE);

/// The most a subflow paced at `rate` (bytes/s) sends at once.
fn pacer_burst(rate: f64) -> f64 {
    (rate * PACER_BURST_S).max(PACER_MIN_BURST)
}

impl Pacer {
    fn new(slot: Arc<HintSlot>) -> Self {
        Pacer { slot, tokens: PACER_MIN_BURST, last: None, sleep: None }
    }

    /// How many of `want` bytes may go now; Pending (with a timer armed)
    /// when none.
    fn poll_allow(&mut self, cx: &mut Context<'_>, want: usize) -> Poll<usize> {
        let rate = self.slot.pacing.load(Ordering::Relaxed) as f64;
        let now = tokio::time::Instant::now();
        if rate <= 0.0 {
            self.last = Some(now);
            return Poll::Ready(want);
        }
        let burst = pacer_burst(rate);
        let elapsed = self.last.map_or(0.0, |l| now.saturating_duration_since(l).as_secs_f64());
        self.last = Some(now);
        self.tokens = (self.tokens + elapsed * rate).min(burst);
        let floor = want.clamp(1, PACER_MIN_WRITE) as f64;
        if self.tokens >= floor {
            let n = (self.tokens as usize).min(want);
            self.tokens -= n as f64;
            self.sleep = None;
            return Poll::Ready(n);
        }
        // Capped, so that a rate that rises while the writer waits is
        // taken up within one short sleep.
        let wait = Duration::from_secs_f64(((floor - self.tokens) / rate).clamp(0.0005, PACER_MAX_WAIT_S));
        let sleep = self.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep(wait)));
        sleep.as_mut().reset(now + wait);
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncWrite for QuicSubflow {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let cwnd = self.conn.stats().path.cwnd;
        self.conn.set_send_window(cwnd + UNSENT_ALLOWANCE);
        let n = match self.pacer.poll_allow(cx, buf.len()) {
            Poll::Ready(n) => n,
            Poll::Pending => return Poll::Pending,
        };
        let this = &mut *self;
        match AsyncWrite::poll_write(Pin::new(&mut this.send), cx, &buf[..n]) {
            Poll::Ready(Ok(w)) => {
                // Bytes allowed but not taken go back to the bucket.
                this.pacer.tokens += (n - w) as f64;
                Poll::Ready(Ok(w))
            }
            Poll::Pending => {
                this.pacer.tokens += n as f64;
                Poll::Pending
            }
            other => other,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        AsyncWrite::poll_flush(Pin::new(&mut self.send), cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        AsyncWrite::poll_shutdown(Pin::new(&mut self.send), cx)
    }
}

#[cfg(test)]
mod tests;
