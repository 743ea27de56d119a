use super::*;
use crate::subflow::{client_hello, server_ack, server_read_hello, Hello};
use crate::{Session, SessionEvent};
use polycorn_core::{Endpoint, EndpointConfig, Registry, Role, UserId};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Pki {
    _dir: tempfile::TempDir,
    client: crate::subflow::ClientTls,
    server: crate::subflow::ServerTls,
}

fn pki() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let b = polycorn_pki::write_dev_bundle(dir.path(), &["train-0001".into()]).unwrap();
    let (cert, key) = &b.trains["train-0001"];
    let client = polycorn_pki::client_config(&b.ca_cert, cert, key).unwrap();
    let server =
        polycorn_pki::server_config(&b.ca_cert, &b.proxy_cert, &b.proxy_key, &["train-0001".to_string()]).unwrap();
    Pki { _dir: dir, client, server }
}

fn session(role: Role) -> (Session, crate::Events) {
    let pipeline = Registry::with_builtins().build("minrtt").unwrap();
    Session::new(Endpoint::new(EndpointConfig::new(role), pipeline, std::time::Instant::now()))
}

#[test]
fn controller_names_parse_and_unknown_ones_list_the_choices() {
    for c in QuicCc::ALL {
        assert_eq!(c.to_string().parse::<QuicCc>().ok(), Some(c));
    }
    let e = "vegas".parse::<QuicCc>().unwrap_err().to_string();
    assert!(e.contains("railway-nohints"), "{e}");
    assert_eq!("railway-q250".parse::<QuicCc>().ok(), Some(QuicCc::Railway { hints: true, queue_ms: Some(250) }));
    let c = "railway-nohints-q0".parse::<QuicCc>().unwrap();
    assert_eq!(c, QuicCc::Railway { hints: false, queue_ms: Some(0) });
    assert_eq!(c.to_string(), "railway-nohints-q0");
    for bad in ["railway-q", "railway-q+5", "railway-q2001", "bbr-q100", "railway-q-1", "railway-q05x"] {
        assert!(bad.parse::<QuicCc>().is_err(), "{bad}");
    }
}

#[test]
fn a_hint_reaches_the_controller_once_per_change() {
    let board = HintBoard::default();
    let h = board.path(PathId(1));
    let read = || h.state.load(Ordering::Relaxed);
    assert_eq!(read(), 0);
    board.report(PathId(1), LinkState::Connected);
    assert_eq!(read(), 0, "no change, no new generation");
    board.report(PathId(1), LinkState::NoService);
    assert_eq!(read() & 1, 1);
    let g = read();
    board.report(PathId(1), LinkState::HandoverStarted);
    assert_eq!(read(), g, "still interrupted");
    board.report(PathId(1), LinkState::Connected);
    assert_eq!(read() & 1, 0);
    assert!(read() > g);
    board.report(PathId(200), LinkState::NoService); // out of range: ignored
}

/// A relay and a proxy session over one QUIC subflow each way: the HELLO
/// exchange, the train's identity from its certificate, and a passenger's
/// bytes intact in both directions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_over_a_quic_subflow_carries_passenger_bytes_intact() {
    let pki = pki();
    let (endpoint, crypto) = listen("127.0.0.1:0".parse().unwrap(), &pki.server).unwrap();
    let addr = endpoint.local_addr().unwrap();
    let stats = Arc::new(CcStats::default());
    let (proxy, mut proxy_events) = session(Role::Proxy);
    let proxy_side = {
        let (proxy, stats) = (proxy.clone(), stats.clone());
        tokio::spawn(async move {
            let incoming = endpoint.accept().await.expect("an incoming connection");
            let (mut sub, slot) = accept(incoming, &crypto, QuicCc::DEFAULT, stats).await.unwrap();
            assert_eq!(sub.peer_train().unwrap(), "train-0001");
            let hello = server_read_hello(&mut sub, Duration::from_secs(5)).await.unwrap();
            slot.bind(HintBoard::default().path(hello.path));
            server_ack(&mut sub, &hello, 77).await.unwrap();
            let _ = proxy.run_path(hello.path, sub, None).await;
            drop(endpoint);
        })
    };
    let (relay, _relay_events) = session(Role::Relay);
    let board = HintBoard::default();
    let mut sub =
        connect(addr, None, "proxy.polycorn", &pki.client, QuicCc::DEFAULT, board.path(PathId(0)), stats.clone())
            .await
            .unwrap();
    let hello = Hello { session: 5, path: PathId(0), train_id: "train-0001".into(), path_name: "c0".into() };
    assert_eq!(client_hello(&mut sub, &hello, Duration::from_secs(5)).await.unwrap(), 77);
    let relay_side = {
        let relay = relay.clone();
        tokio::spawn(async move { relay.run_path(PathId(0), sub, None).await })
    };
    // A passenger connection: 3 MB up, echoed back by the proxy's shell.
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    let mut up = relay.open(UserId([1; 16]), "10.0.0.1:80".parse().unwrap()).unwrap();
    let echo = tokio::spawn({
        let proxy = proxy.clone();
        async move {
            while let Some(ev) = proxy_events.recv().await {
                if let SessionEvent::ConnOpened { conn, .. } = ev {
                    let mut s = proxy.stream(conn);
                    let mut buf = vec![0u8; 1 << 16];
                    loop {
                        let n = s.read(&mut buf).await.unwrap();
                        if n == 0 {
                            break;
                        }
                        s.write_all(&buf[..n]).await.unwrap();
                    }
                    s.shutdown().await.unwrap();
                    // Keep the stream until the relay has read it all.
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    return;
                }
            }
        }
    });
    let (mut rd, mut wr) = tokio::io::split(&mut up);
    let send = async {
        wr.write_all(&data).await.unwrap();
        wr.shutdown().await.unwrap();
    };
    let recv = async {
        let mut back = Vec::new();
        rd.read_to_end(&mut back).await.unwrap();
        back
    };
    let (_, back) = tokio::time::timeout(Duration::from_secs(60), async { tokio::join!(send, recv) })
        .await
        .expect("the echo completes (hang guard)");
    assert!(back == data, "{} bytes back of {}", back.len(), data.len());
    relay.close();
    proxy.close();
    let _ = relay_side.await;
    let _ = proxy_side.await;
    echo.abort();
}

/// A fleet certificate of a train the proxy does not serve fails the QUIC
/// handshake (the proxy's verifier checks the CA and its one train).
#[tokio::test]
async fn a_train_the_proxy_does_not_serve_fails_the_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let b = polycorn_pki::write_dev_bundle(dir.path(), &["train-0001".into(), "train-0099".into()]).unwrap();
    let (cert, key) = &b.trains["train-0099"];
    let other = polycorn_pki::client_config(&b.ca_cert, cert, key).unwrap();
    let server =
        polycorn_pki::server_config(&b.ca_cert, &b.proxy_cert, &b.proxy_key, &["train-0001".to_string()]).unwrap();
    let (endpoint, crypto) = listen("127.0.0.1:0".parse().unwrap(), &server).unwrap();
    let addr = endpoint.local_addr().unwrap();
    let stats = Arc::new(CcStats::default());
    let server_side = {
        let stats = stats.clone();
        tokio::spawn(async move {
            let incoming = endpoint.accept().await.expect("an incoming connection");
            accept(incoming, &crypto, QuicCc::DEFAULT, stats).await.map(|_| ())
        })
    };
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        connect(addr, None, "proxy.polycorn", &other, QuicCc::DEFAULT, Arc::default(), stats),
    )
    .await
    .expect("hang guard");
    assert!(server_side.await.unwrap().is_err(), "the proxy accepted a train it does not serve");
    // TLS 1.3 ends the client's handshake before the server has checked
    // the client's certificate: the refusal reaches the relay at its HELLO.
    if let Ok(mut sub) = r {
        let hello = Hello { session: 1, path: PathId(0), train_id: "train-0099".into(), path_name: "c0".into() };
        assert!(client_hello(&mut sub, &hello, Duration::from_secs(10)).await.is_err());
    }
}

#[tokio::test]
async fn the_pacer_hands_quinn_no_small_writes() {
    // quinn keeps each write as a segment of the stream's send buffer and
    // walks them per frame: the pacer must not slice a long write into
    // the few bytes each millisecond refills.
    let slot = Arc::new(HintSlot::default());
    slot.pacing.store(20 << 20, Ordering::Relaxed);
    let mut pacer = Pacer::new(slot);
    let mut left = 2usize << 20;
    let mut writes = Vec::new();
    while left > 0 {
        let n = std::future::poll_fn(|cx| pacer.poll_allow(cx, left)).await;
        assert!(n > 0 && n <= left);
        writes.push((n, left));
        left -= n;
    }
    // Shorter only when the writer had no more: each write's size follows
    // the clock, so what is left for the last one varies from run to run.
    let small: Vec<_> = writes.iter().filter(|&&(n, had)| n < PACER_MIN_WRITE.min(had)).collect();
    assert!(small.is_empty(), "{} writes under {PACER_MIN_WRITE} bytes (of bytes left): {small:?}", small.len());
    // A short write still goes at once when the bucket holds it.
    assert_eq!(std::future::poll_fn(|cx| pacer.poll_allow(cx, 100)).await, 100);
}

#[test]
fn a_write_into_a_paced_subflow_is_one_pacer_burst() {
    let slot = Arc::new(HintSlot::default());
    let gauge = QuicSendGauge { slot: slot.clone() };
    assert_eq!(gauge.write_quantum(), UNPACED_WRITE, "quinn's own controllers do not pace");
    slot.pacing.store(1_000_000, Ordering::Relaxed);
    assert_eq!(gauge.write_quantum(), PACER_MIN_WRITE, "10 ms of 8 Mbit/s is under the smallest write");
    slot.pacing.store(10_000_000, Ordering::Relaxed);
    assert_eq!(gauge.write_quantum(), 100_000);
    slot.pacing.store(1 << 30, Ordering::Relaxed);
    assert_eq!(gauge.write_quantum(), crate::subflow::MAX_WRITE);
}

/// Counts the largest single write through it.
struct WriteSizes<S> {
    inner: S,
    largest: Arc<std::sync::atomic::AtomicUsize>,
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteSizes<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteSizes<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.largest.fetch_max(buf.len(), Ordering::Relaxed);
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The session's writer takes from its endpoint only what a paced QUIC
/// subflow lets go at once, so a slow carrier's backlog stays where the
/// scheduler can still move it; a TCP subflow's writes stay large.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_takes_one_pacer_burst_at_a_time() {
    async fn largest_write(probe: impl FnOnce() -> Option<crate::session::SendProbe>) -> usize {
        let (relay, _relay_events) = session(Role::Relay);
        let (proxy, mut proxy_events) = session(Role::Proxy);
        let (a, b) = tokio::io::duplex(4 << 20);
        let largest = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let sized = WriteSizes { inner: a, largest: largest.clone() };
        let relay_side = tokio::spawn({
            let (relay, probe) = (relay.clone(), probe());
            async move { relay.run_path(PathId(0), sized, probe).await }
        });
        let proxy_side = tokio::spawn({
            let proxy = proxy.clone();
            async move { proxy.run_path(PathId(0), b, None).await }
        });
        let data = passenger_bytes(0, true, 2 << 20);
        let mut up = relay.open(UserId([1; 16]), "10.0.0.1:80".parse().unwrap()).unwrap();
        let sink = tokio::spawn({
            let proxy = proxy.clone();
            async move {
                while let Some(ev) = proxy_events.recv().await {
                    if let SessionEvent::ConnOpened { conn, .. } = ev {
                        let mut got = Vec::new();
                        proxy.stream(conn).read_to_end(&mut got).await.unwrap();
                        return got;
                    }
                }
                Vec::new()
            }
        });
        up.write_all(&data).await.unwrap();
        up.shutdown().await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(60), sink).await.expect("hang guard").unwrap();
        assert!(got == data, "{} bytes of {}", got.len(), data.len());
        relay.close();
        proxy.close();
        let _ = relay_side.await;
        let _ = proxy_side.await;
        largest.load(Ordering::Relaxed)
    }
    let slot = Arc::new(HintSlot::default());
    slot.pacing.store(1_000_000, Ordering::Relaxed);
    let paced = largest_write(|| Some(crate::session::SendProbe::Quic(QuicSendGauge { slot }))).await;
    assert!(paced <= PACER_MIN_WRITE, "a write of {paced} bytes into a subflow paced at 8 Mbit/s");
    // Without a pacer a write takes what the endpoint has ready: about the
    // path's queue (64 KiB), a little more or less as the tasks interleave,
    // and well above one paced write either way.
    let unpaced = largest_write(|| None).await;
    assert!(unpaced > 2 * PACER_MIN_WRITE, "the largest write without a pacer: {unpaced} bytes");
}

// A relay and a proxy session over two QUIC subflows, one per carrier,
// while a schedule takes subflows away and brings new ones up.

/// How a schedule takes one subflow away.
#[derive(Clone, Copy, Debug)]
enum Kill {
    /// The relay closes its QUIC connection (its modem reset).
    RelayCloses,
    /// The proxy closes its QUIC connection.
    ProxyCloses,
    /// The relay's task carrying the subflow is aborted: its `path_down`
    /// never runs, so the relay's endpoint holds the path up, frames in
    /// flight, until the next subflow for it supersedes it; the proxy sees
    /// the dropped connection close.
    RelayAborts,
    /// The same on the proxy's side.
    ProxyAborts,
    /// The relay stops reading and writing the subflow and neither end
    /// closes it (a carrier gone silent while quinn's keep-alives still
    /// pass): only the next subflow for the path, superseding it at both
    /// ends, takes it down.
    Stalls,
}

#[derive(Clone, Debug)]
struct Fault {
    /// Fires once the passengers at both ends have received this many
    /// thousandths of all their bytes.
    at: u64,
    path: u8,
    how: Kill,
    /// The path then has no subflow for this long.
    down: Duration,
}

fn fault() -> impl proptest::strategy::Strategy<Value = Fault> {
    use proptest::prelude::*;
    let how = prop_oneof![
        Just(Kill::RelayCloses),
        Just(Kill::ProxyCloses),
        Just(Kill::RelayAborts),
        Just(Kill::ProxyAborts),
        Just(Kill::Stalls),
    ];
    (0u64..900, 0u8..2, how, 0u64..400).prop_map(|(at, path, how, down)| Fault {
        at,
        path,
        how,
        down: Duration::from_millis(down),
    })
}

/// Cases of a property test: `ci`, times `POLYCORN_TEST_DEPTH` when set.
fn cases(ci: u32) -> u32 {
    std::env::var("POLYCORN_TEST_DEPTH")
        .map_or(ci, |v| ci * v.parse::<std::num::NonZeroU32>().expect("POLYCORN_TEST_DEPTH: a positive integer").get())
}

/// Threads of the property test's runtimes, and the panics on them: a
/// panic in a task no one joins (the sessions' timers, quinn's drivers)
/// would otherwise go unseen.
const PROP_THREADS: &str = "quic-subflow-faults";
static PROP_PANICS: AtomicU64 = AtomicU64::new(0);

fn count_panics_on_prop_threads() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() == Some(PROP_THREADS) {
                PROP_PANICS.fetch_add(1, Ordering::SeqCst);
            }
            previous(info);
        }));
    });
}

/// What passenger `conn` sends in one direction: no two 16 KiB segments
/// alike, so a lost, repeated or misplaced segment shows.
fn passenger_bytes(conn: usize, up: bool, len: usize) -> Vec<u8> {
    let mut x = (conn as u64) << 1 | u64::from(up);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        // splitmix64
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Read `rd` to its end, checking every byte against `want` as it
/// arrives (so the error names the first wrong one) and counting them in
/// `progress`.
async fn receive_exactly(
    rd: &mut (impl tokio::io::AsyncRead + Unpin),
    want: &[u8],
    progress: &AtomicU64,
    what: &str,
) -> Result<(), String> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut at = 0;
    loop {
        let n = rd
            .read(&mut buf)
            .await
            .map_err(|e| format!("{what}: read failed after {at} of {} bytes: {e}", want.len()))?;
        if n == 0 {
            break;
        }
        let got = &buf[..n];
        let Some(sent) = want.get(at..at + n) else {
            return Err(format!("{what}: {} bytes beyond the {} sent", at + n - want.len(), want.len()));
        };
        if let Some(k) = got.iter().zip(sent).position(|(a, b)| a != b) {
            return Err(format!("{what}: byte {} of {} is {:#04x}, sent {:#04x}", at + k, want.len(), got[k], sent[k]));
        }
        at += n;
        progress.fetch_add(n as u64, Ordering::Relaxed);
    }
    if at == want.len() {
        Ok(())
    } else {
        Err(format!("{what}: the stream ended after {at} of {} bytes", want.len()))
    }
}

/// Passenger `i`'s end of its connection at `end`: sends its bytes (`up`
/// at the relay, `down` at the proxy) and a FIN while checking what
/// arrives against the other direction's. The first
/// failure either way ends it, resetting the connection: a reader that
/// gave up would leave the other end's writer waiting for room forever.
async fn passenger_end(
    stream: crate::ConnStream,
    i: usize,
    end: Role,
    (up, down): (usize, usize),
    progress: &AtomicU64,
) -> Result<(), String> {
    let (up, down) = (passenger_bytes(i, true, up), passenger_bytes(i, false, down));
    let (send, want, here, (sent, received)) = match end {
        Role::Relay => (up, down, "relay", ("up", "down")),
        Role::Proxy => (down, up, "proxy", ("down", "up")),
    };
    let (mut rd, mut wr) = tokio::io::split(stream);
    let write = async {
        let r = async {
            wr.write_all(&send).await?;
            wr.shutdown().await
        };
        r.await.map_err(|e| format!("passenger {i} {sent}, at the {here}: write failed: {e}"))
    };
    let what = format!("passenger {i} {received}, at the {here}");
    tokio::try_join!(write, receive_exactly(&mut rd, &want, progress, &what))?;
    Ok(())
}

/// A relay subflow that can go silent: once `stalled`, reads and writes
/// wait forever (nothing wakes them) while the QUIC connection stays up.
struct Stallable {
    sub: QuicSubflow,
    stalled: Arc<std::sync::atomic::AtomicBool>,
}

impl AsyncRead for Stallable {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.stalled.load(Ordering::Relaxed) {
            return Poll::Pending;
        }
        Pin::new(&mut self.sub).poll_read(cx, buf)
    }
}

impl AsyncWrite for Stallable {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.stalled.load(Ordering::Relaxed) {
            return Poll::Pending;
        }
        Pin::new(&mut self.sub).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.stalled.load(Ordering::Relaxed) {
            return Poll::Pending;
        }
        Pin::new(&mut self.sub).poll_flush(cx)
    }

    // A superseded subflow is still shut down, stalled or not.
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.sub).poll_shutdown(cx)
    }
}

type RunHandle = tokio::task::JoinHandle<io::Result<()>>;

/// The proxy's current subflow of each path (its connection and the task
/// running it), for the faults applied on the proxy's side.
#[derive(Default)]
struct ProxySubflows(
    std::sync::Mutex<std::collections::HashMap<PathId, (quinn::Connection, tokio::task::AbortHandle)>>,
);

impl ProxySubflows {
    fn take(&self, path: PathId) -> Option<(quinn::Connection, tokio::task::AbortHandle)> {
        self.0.lock().unwrap().remove(&path)
    }
}

/// The proxy's listener: every incoming subflow is accepted, HELLOed and
/// run in `proxy`, as the proxy binary does; the run tasks go to `runs`.
async fn proxy_listener(
    endpoint: quinn::Endpoint,
    crypto: ServerCrypto,
    proxy: Session,
    subflows: Arc<ProxySubflows>,
    runs: tokio::sync::mpsc::UnboundedSender<RunHandle>,
) {
    while let Some(incoming) = endpoint.accept().await {
        let (crypto, proxy, subflows, runs) = (crypto.clone(), proxy.clone(), subflows.clone(), runs.clone());
        tokio::spawn(async move {
            let (mut sub, slot) = accept(incoming, &crypto, QuicCc::DEFAULT, Arc::default()).await?;
            let hello = server_read_hello(&mut sub, Duration::from_secs(10)).await?;
            slot.bind(proxy.hints().path(hello.path));
            let (conn, path) = (sub.connection().clone(), hello.path);
            // Listed before the relay hears the HELLO_ACK, so that a fault
            // the relay applies to its new subflow finds this end of it.
            let (listed, go) = tokio::sync::oneshot::channel::<()>();
            let run = tokio::spawn(async move {
                let _ = go.await;
                server_ack(&mut sub, &hello, 77).await?;
                proxy.run_path(hello.path, sub, None).await
            });
            subflows.0.lock().unwrap().insert(path, (conn, run.abort_handle()));
            let _ = listed.send(());
            let _ = runs.send(run);
            io::Result::Ok(())
        });
    }
}

/// One carrier of the relay: keeps a subflow up for `path`, applying the
/// faults it is sent, until the sender is dropped. Returns every run task
/// it started; a subflow that ended with no fault is noted in `unplanned`.
async fn relay_carrier(
    relay: Session,
    path: PathId,
    proxy_addr: std::net::SocketAddr,
    tls: crate::subflow::ClientTls,
    proxy_subflows: Arc<ProxySubflows>,
    mut faults: tokio::sync::mpsc::UnboundedReceiver<Fault>,
    unplanned: Arc<std::sync::Mutex<Vec<String>>>,
) -> Vec<RunHandle> {
    let hello = Hello { session: 5, path, train_id: "train-0001".into(), path_name: format!("c{}", path.0) };
    let mut runs = Vec::new();
    loop {
        let up = async {
            let hints = relay.hints().path(path);
            let mut sub =
                connect(proxy_addr, None, "proxy.polycorn", &tls, QuicCc::DEFAULT, hints, Arc::default()).await?;
            client_hello(&mut sub, &hello, Duration::from_secs(10)).await?;
            io::Result::Ok(sub)
        };
        let sub = match up.await {
            Ok(sub) => sub,
            Err(e) => {
                unplanned.lock().unwrap().push(format!("path {path}: no subflow: {e}"));
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let conn = sub.connection().clone();
        let stalled = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sub = Stallable { sub, stalled: stalled.clone() };
        let mut run = tokio::spawn({
            let relay = relay.clone();
            async move { relay.run_path(path, sub, None).await }
        });
        let fault = tokio::select! {
            biased;
            f = faults.recv() => f,
            r = &mut run => {
                unplanned.lock().unwrap().push(format!("path {path}: the subflow ended with no fault: {r:?}"));
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(fault) = fault else {
            runs.push(run);
            return runs;
        };
        match fault.how {
            Kill::RelayCloses => conn.close(0u32.into(), b"carrier lost"),
            Kill::ProxyCloses => {
                if let Some((c, _)) = proxy_subflows.take(path) {
                    c.close(0u32.into(), b"carrier lost");
                }
            }
            Kill::RelayAborts => run.abort(),
            Kill::ProxyAborts => {
                if let Some((_, task)) = proxy_subflows.take(path) {
                    task.abort();
                }
            }
            Kill::Stalls => stalled.store(true, Ordering::Relaxed),
        }
        // The last handle but the subflow's own: a dropped subflow closes
        // its connection.
        drop(conn);
        runs.push(run);
        tokio::time::sleep(fault.down).await;
    }
}

/// One case: passengers with `sizes` (bytes up, bytes down) each, over two
/// QUIC subflows that `faults` (in the order of their `at`) take down and
/// bring back.
async fn carry_through_faults(sizes: &[(usize, usize)], faults: &[Fault]) -> Result<(), String> {
    use tokio::sync::mpsc;
    let pki = pki();
    let (endpoint, crypto) = listen("127.0.0.1:0".parse().unwrap(), &pki.server).map_err(|e| e.to_string())?;
    let proxy_addr = endpoint.local_addr().unwrap();
    let (relay, _relay_events) = session(Role::Relay);
    let (proxy, mut proxy_events) = session(Role::Proxy);
    let proxy_subflows = Arc::new(ProxySubflows::default());
    let (proxy_runs_tx, mut proxy_runs) = mpsc::unbounded_channel();
    let listener = tokio::spawn(proxy_listener(endpoint, crypto, proxy.clone(), proxy_subflows.clone(), proxy_runs_tx));
    let unplanned = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut fault_tx = Vec::new();
    let mut carriers = Vec::new();
    for p in 0..2 {
        let (tx, rx) = mpsc::unbounded_channel();
        fault_tx.push(tx);
        carriers.push(tokio::spawn(relay_carrier(
            relay.clone(),
            PathId(p),
            proxy_addr,
            pki.client.clone(),
            proxy_subflows.clone(),
            rx,
            unplanned.clone(),
        )));
    }
    let progress = Arc::new(AtomicU64::new(0));
    let total: u64 = sizes.iter().map(|&(u, d)| (u + d) as u64).sum();
    let schedule = tokio::spawn({
        let (faults, progress) = (faults.to_vec(), progress.clone());
        async move {
            for f in faults {
                while progress.load(Ordering::Relaxed) * 1000 < f.at * total {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                let _ = fault_tx[usize::from(f.path)].send(f);
            }
            // Holding the senders keeps the carriers going until aborted.
            std::future::pending::<()>().await
        }
    });

    // The proxy's shell hands each connection it is told of to the loop
    // below, which runs both ends of every passenger.
    let (opened_tx, mut opened) = mpsc::unbounded_channel();
    let shell = tokio::spawn({
        let proxy = proxy.clone();
        async move {
            while let Some(ev) = proxy_events.recv().await {
                if let SessionEvent::ConnOpened { conn, dst, .. } = ev {
                    if opened_tx.send((usize::from(dst.port() - 1000), proxy.stream(conn))).is_err() {
                        return;
                    }
                }
            }
        }
    });
    let mut ends = tokio::task::JoinSet::new();
    for (i, &size) in sizes.iter().enumerate() {
        let (relay, progress) = (relay.clone(), progress.clone());
        ends.spawn(async move {
            let dst = std::net::SocketAddr::from(([10, 0, 0, 1], 1000 + i as u16));
            let stream = relay.open(UserId([i as u8 + 1; 16]), dst).map_err(|e| format!("passenger {i}: {e}"))?;
            passenger_end(stream, i, Role::Relay, size, &progress).await
        });
    }
    // Until every end is done or the first fails: a failing end resets
    // its connection, and the other end's error then only echoes it.
    let outcome = async {
        let (mut done, mut seen) = (0, std::collections::HashSet::new());
        while done < 2 * sizes.len() {
            tokio::select! {
                Some((i, stream)) = opened.recv() => {
                    if !seen.insert(i) {
                        return Err(format!("passenger {i} opened twice at the proxy"));
                    }
                    let (progress, size) = (progress.clone(), sizes[i]);
                    ends.spawn(async move { passenger_end(stream, i, Role::Proxy, size, &progress).await });
                }
                Some(r) = ends.join_next() => {
                    r.map_err(|e| format!("a passenger's task panicked: {e}"))??;
                    done += 1;
                }
                else => return Err("the proxy's events ended before every passenger had opened".to_string()),
            }
        }
        Ok(())
    };
    // A hang guard only: a case moves a few MB over loopback.
    let guard = Duration::from_secs(60);
    let outcome = match tokio::time::timeout(guard, outcome).await {
        Ok(r) => r,
        Err(_) => {
            let state = |s: &Session| {
                s.peek(|st, _| {
                    let stats = st.ep.stats();
                    format!(
                        "{} connections open ({} reset), paths up {:?}",
                        st.ep.conn_count(),
                        stats.conns_reset,
                        st.ep.up_paths()
                    )
                })
            };
            Err(format!(
                "hang guard: after {guard:?} the passengers had received {} of {total} bytes; relay: {}; proxy: {}",
                progress.load(Ordering::Relaxed),
                state(&relay),
                state(&proxy),
            ))
        }
    };
    // On a failure the case ends here: dropping its runtime stops the rest.
    outcome?;
    // The carriers stop (their fault senders gone) before the sessions
    // close, which would end their subflows with no fault.
    schedule.abort();
    let mut runs = Vec::new();
    for c in carriers {
        let c = tokio::time::timeout(Duration::from_secs(20), c).await;
        runs.extend(c.map_err(|_| "hang guard: a carrier did not stop".to_string())?.map_err(|e| e.to_string())?);
    }
    relay.close();
    proxy.close();
    listener.abort();
    shell.abort();
    while let Ok(r) = proxy_runs.try_recv() {
        runs.push(r);
    }
    for r in runs {
        // Cancelled is an aborted run (a fault); a panic is a failure.
        if let Ok(Err(e)) = tokio::time::timeout(Duration::from_secs(10), r).await {
            if e.is_panic() {
                return Err(format!("a subflow's run panicked: {e}"));
            }
        }
    }
    let unplanned = unplanned.lock().unwrap();
    if !unplanned.is_empty() {
        return Err(format!("subflows failed with no fault: {unplanned:?}"));
    }
    Ok(())
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: cases(8),
        // A failing case takes seconds (a hang a minute): shrink briefly.
        max_shrink_iters: 16,
        ..proptest::prelude::ProptestConfig::default()
    })]

    /// Passengers' bytes, both ways over up to three connections, arrive
    /// intact and in order while a schedule closes, drops or silences
    /// either QUIC subflow (or both), at either end, and brings a new one
    /// up for the path after a while; nothing panics.
    #[test]
    fn passenger_bytes_arrive_intact_while_quic_subflows_die_and_return(
        sizes in proptest::collection::vec((0usize..1_000_000, 0usize..1_000_000), 1..=3),
        mut faults in proptest::collection::vec(fault(), 1..=4),
    ) {
        faults.sort_by_key(|f| f.at);
        count_panics_on_prop_threads();
        let before = PROP_PANICS.load(Ordering::SeqCst);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(PROP_THREADS)
            .enable_all()
            .build()
            .unwrap();
        let r = rt.block_on(carry_through_faults(&sizes, &faults));
        rt.shutdown_timeout(Duration::from_secs(5));
        let panics = PROP_PANICS.load(Ordering::SeqCst) - before;
        proptest::prop_assert_eq!(panics, 0, "tasks panicked (their messages are above)");
        if let Err(e) = r {
            return Err(proptest::test_runner::TestCaseError::fail(e));
        }
    }
}
