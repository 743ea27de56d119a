//! A relay–proxy session: the sans-IO [`Endpoint`] behind a mutex, driven by
//! one task per subflow direction and one timer task.
//!
//! Locking is short and never held across an await: every interaction goes
//! through [`Session::with`], which runs a closure on the endpoint, then
//! dispatches the endpoint's events (waking passenger streams, forwarding
//! the rest to the shell), runs the scheduler, and wakes the subflow writers
//! that have frames to send and the timer when its deadline moved.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use polycorn_core::wire::LinkState;
use polycorn_core::{ConnId, Endpoint, Event, PathId, Recv, StreamError, UserId, MAX_PATHS};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::{mpsc, Notify};

use crate::subflow::MAX_WRITE;

/// Events the shell acts on (everything that is not about waking a stream).
#[derive(Debug, Clone)]
pub enum SessionEvent {
    ConnOpened {
        conn: ConnId,
        user: UserId,
        dst: std::net::SocketAddr,
    },
    Telemetry {
        seq: u64,
        payload: Bytes,
    },
    /// A copy of a record already delivered (see `Event::TelemetryDuplicate`).
    TelemetryDuplicate {
        seq: u64,
        payload: Bytes,
    },
    TelemetryAcked {
        seq: u64,
    },
    PathStatus {
        path: PathId,
        state: LinkState,
        cell: u64,
    },
}

/// Events queued for the shell at most; beyond it an event is dropped
/// (counted in [`State::events_dropped`]) by its kind's rule in
/// [`Session::with`]: a connection is reset, a telemetry record is left
/// unacknowledged (the relay sends it again), a status is only logged anyway.
/// The shell's event loops never wait on anything but the queue, so this is
/// reached only by a peer that asks faster than a runtime thread can answer.
pub const EVENT_QUEUE: usize = 4096;
/// Telemetry payload bytes queued for the shell at most (a record is up to
/// 64 KiB: [`EVENT_QUEUE`] records alone could hold 256 MiB).
pub const EVENT_TELEMETRY_BYTES: usize = 4 * 1024 * 1024;

/// The shell's side of a session's event queue.
pub struct Events {
    rx: mpsc::Receiver<SessionEvent>,
    telemetry_bytes: Arc<AtomicUsize>,
}

impl Events {
    /// The next event; None once the session is gone.
    pub async fn recv(&mut self) -> Option<SessionEvent> {
        let ev = self.rx.recv().await?;
        if let SessionEvent::Telemetry { payload, .. } | SessionEvent::TelemetryDuplicate { payload, .. } = &ev {
            self.telemetry_bytes.fetch_sub(payload.len(), Ordering::Relaxed);
        }
        Some(ev)
    }
}

/// The locked part of a session.
pub struct State {
    pub ep: Endpoint,
    /// Events dropped because the shell's queue was full ([`EVENT_QUEUE`],
    /// [`EVENT_TELEMETRY_BYTES`]).
    pub events_dropped: u64,
    read_wakers: HashMap<ConnId, Waker>,
    write_wakers: HashMap<ConnId, Waker>,
    armed: Option<Instant>,
    /// Generation of the subflow currently carrying each path: a newer
    /// subflow for the same path supersedes the older one, whose tasks then
    /// must neither feed the endpoint nor take the path down.
    path_gen: Vec<u64>,
}

struct Inner {
    state: Mutex<State>,
    path_notify: Vec<Notify>,
    path_dead: Vec<Notify>,
    path_superseded: Vec<Notify>,
    /// A path's writer wrote (its control queue may have drained).
    path_drained: Vec<Notify>,
    timer: Notify,
    closed: Notify,
    events: mpsc::Sender<SessionEvent>,
    /// Telemetry payload bytes in `events`.
    telemetry_bytes: Arc<AtomicUsize>,
    /// The paths' radio states, for the QUIC subflows' controllers.
    hints: Arc<crate::quic::HintBoard>,
}

/// Cheap to clone; every clone drives the same endpoint.
#[derive(Clone)]
pub struct Session {
    inner: Arc<Inner>,
}

/// A session reference that does not keep it alive (for background tasks
/// that end with it).
#[derive(Clone)]
pub struct WeakSession(Weak<Inner>);

impl WeakSession {
    pub fn upgrade(&self) -> Option<Session> {
        self.0.upgrade().map(|inner| Session { inner })
    }
}

impl Session {
    /// Wrap `ep`; returns the session and the shell's event stream. Spawns
    /// the timer task on the current runtime.
    pub fn new(ep: Endpoint) -> (Session, Events) {
        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        let telemetry_bytes = Arc::new(AtomicUsize::new(0));
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                ep,
                events_dropped: 0,
                read_wakers: HashMap::new(),
                write_wakers: HashMap::new(),
                armed: None,
                path_gen: vec![0; MAX_PATHS],
            }),
            path_notify: (0..MAX_PATHS).map(|_| Notify::new()).collect(),
            path_dead: (0..MAX_PATHS).map(|_| Notify::new()).collect(),
            path_superseded: (0..MAX_PATHS).map(|_| Notify::new()).collect(),
            path_drained: (0..MAX_PATHS).map(|_| Notify::new()).collect(),
            timer: Notify::new(),
            closed: Notify::new(),
            events: tx,
            telemetry_bytes: telemetry_bytes.clone(),
            hints: Arc::default(),
        });
        let s = Session { inner };
        tokio::spawn(s.clone().timer_task());
        (s, Events { rx, telemetry_bytes })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the endpoint in an unknown
        // state; continuing with it is still better than taking the whole
        // train offline, and tests catch such panics.
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The paths' radio states as the subflows' controllers read them: the
    /// proxy's follow the relay's path-status frames, the relay's follow
    /// [`Session::report_link`].
    pub fn hints(&self) -> &Arc<crate::quic::HintBoard> {
        &self.inner.hints
    }

    /// The relay's radio saw `path` change state: tell the proxy (a
    /// path-status frame) and this side's controller.
    pub fn report_link(&self, path: PathId, state: LinkState, cell: u64) {
        self.inner.hints.report(path, state);
        self.with(|st, _| st.ep.report_link(path, state, cell));
    }

    pub fn downgrade(&self) -> WeakSession {
        WeakSession(Arc::downgrade(&self.inner))
    }

    /// Run `f` on the endpoint for reading (statistics, the trace) without
    /// dispatching events or scheduling afterwards: `f` must not change
    /// what the endpoint would send.
    pub fn peek<R>(&self, f: impl FnOnce(&mut State, Instant) -> R) -> R {
        let mut st = self.lock();
        f(&mut st, Instant::now())
    }

    /// Run `f` on the endpoint, then dispatch what it caused.
    pub fn with<R>(&self, f: impl FnOnce(&mut State, Instant) -> R) -> R {
        let mut st = self.lock();
        let now = Instant::now();
        let r = f(&mut st, now);
        self.after(&mut st, now);
        r
    }

    fn after(&self, st: &mut State, now: Instant) {
        while let Some(ev) = st.ep.poll_event() {
            match ev {
                Event::Readable(c) => wake(&mut st.read_wakers, c),
                Event::Writable(c) => wake(&mut st.write_wakers, c),
                Event::ConnReset { conn, .. } | Event::ConnClosed(conn) => {
                    wake(&mut st.read_wakers, conn);
                    wake(&mut st.write_wakers, conn);
                }
                Event::PathDead(p) => self.inner.path_dead[p.index()].notify_one(),
                Event::ConnOpened { conn, user, dst } => {
                    if !self.event(st, SessionEvent::ConnOpened { conn, user, dst }) {
                        st.ep.reset(conn, RESET_OVERLOADED, now);
                    }
                }
                Event::Telemetry { seq, payload } => {
                    self.event(st, SessionEvent::Telemetry { seq, payload });
                }
                Event::TelemetryDuplicate { seq, payload } => {
                    self.event(st, SessionEvent::TelemetryDuplicate { seq, payload });
                }
                Event::TelemetryAcked { seq } => {
                    self.event(st, SessionEvent::TelemetryAcked { seq });
                }
                Event::PathStatus { path, state, cell } => {
                    self.inner.hints.report(path, state);
                    self.event(st, SessionEvent::PathStatus { path, state, cell });
                }
            }
        }
        st.ep.schedule(now);
        for p in st.ep.up_paths() {
            if st.ep.has_pending(p) {
                self.inner.path_notify[p.index()].notify_one();
            }
        }
        // Wake the timer only when the deadline moved earlier: a later one
        // just makes the timer fire early once and re-arm, which is cheaper
        // than waking it on every frame sent.
        if let Some(t) = st.ep.poll_timeout() {
            if st.armed.is_none_or(|a| t < a) {
                st.armed = Some(t);
                self.inner.timer.notify_one();
            }
        }
    }

    /// Queue `ev` for the shell; false (and counted) when the queue is full
    /// or, for telemetry, holds [`EVENT_TELEMETRY_BYTES`] already. A shell
    /// that has dropped its receiver takes nothing, and that is no loss.
    fn event(&self, st: &mut State, ev: SessionEvent) -> bool {
        let bytes = match &ev {
            SessionEvent::Telemetry { payload, .. } | SessionEvent::TelemetryDuplicate { payload, .. } => payload.len(),
            _ => 0,
        };
        let queued = &self.inner.telemetry_bytes;
        if bytes > 0 && queued.fetch_add(bytes, Ordering::Relaxed) + bytes > EVENT_TELEMETRY_BYTES {
            queued.fetch_sub(bytes, Ordering::Relaxed);
            st.events_dropped += 1;
            return false;
        }
        match self.inner.events.try_send(ev) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                queued.fetch_sub(bytes, Ordering::Relaxed);
                st.events_dropped += 1;
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                queued.fetch_sub(bytes, Ordering::Relaxed);
                true
            }
        }
    }

    async fn timer_task(self) {
        let weak = Arc::downgrade(&self.inner);
        drop(self);
        loop {
            let Some(inner) = weak.upgrade() else { return };
            let s = Session { inner };
            let deadline = {
                let mut st = s.lock();
                st.armed = st.ep.poll_timeout();
                st.armed
            };
            let timer = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(tokio::time::Instant::from_std(d)).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = timer => s.with(|st, now| st.ep.handle_timeout(now)),
                _ = s.inner.timer.notified() => {}
                _ = s.inner.closed.notified() => return,
            }
            drop(s);
        }
    }

    /// End the session: reset every passenger connection (their streams
    /// return errors, so the tasks copying them end and close their
    /// sockets), stop the subflows and the timer.
    pub fn close(&self) {
        self.with(|st, _| st.ep.abort_all(RESET_ABORTED));
        self.inner.closed.notify_waiters();
        for n in &self.inner.path_superseded {
            n.notify_waiters();
        }
    }

    /// Open a passenger connection (relay side).
    pub fn open(&self, user: UserId, dst: std::net::SocketAddr) -> Result<ConnStream, StreamError> {
        let conn = self.with(|st, now| st.ep.open(user, dst, now))?;
        Ok(self.stream(conn))
    }

    /// A stream over an existing connection (proxy side, after
    /// [`SessionEvent::ConnOpened`]).
    pub fn stream(&self, conn: ConnId) -> ConnStream {
        ConnStream { session: self.clone(), conn, read_eof: false, write_fin: false }
    }

    /// Reset a connection (for example when the upstream connect failed).
    pub fn reset(&self, conn: ConnId, code: u32) {
        self.with(|st, now| st.ep.reset(conn, code, now));
    }

    /// Carry one subflow until it fails, the peer breaks the protocol, the
    /// endpoint declares the path dead, or the session closes. Calls
    /// `path_up` first and `path_down` last.
    ///
    /// `probe`, when given, reads the transport's unsent bytes on every
    /// read and before every transmit poll, for the path's send-buffer
    /// occupancy, and how much one write should take
    /// ([`SendProbe`]); without it writes take up to
    /// [`MAX_WRITE`].
    pub async fn run_path<S>(&self, path: PathId, stream: S, probe: Option<SendProbe>) -> io::Result<()>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        self.run_path_until(path, stream, probe, std::future::pending()).await
    }

    /// [`Session::run_path`], ended also when `lost` completes (with its
    /// error): the relay's carrier interface went down, so nothing more
    /// will cross this subflow and waiting for the endpoint's dead-path
    /// timer would leave the path counted up (and `/readyz` green) for
    /// seconds. `path_down` runs either way.
    pub async fn run_path_until<S, L>(
        &self,
        path: PathId,
        stream: S,
        probe: Option<SendProbe>,
        lost: L,
    ) -> io::Result<()>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
        L: std::future::Future<Output = io::Error>,
    {
        let (mut rd, mut wr) = tokio::io::split(stream);
        let superseded_err = || io::Error::other("superseded by a newer subflow for the same path");
        // Whoever carried this path before stops first.
        self.inner.path_superseded[path.index()].notify_waiters();
        let superseded = self.inner.path_superseded[path.index()].notified();
        tokio::pin!(superseded);
        superseded.as_mut().enable();
        let gen = self.with(|st, now| {
            st.path_gen[path.index()] += 1;
            if st.ep.is_path_up(path) {
                st.ep.path_down(path, now);
            }
            st.ep.path_up(path, now);
            st.path_gen[path.index()]
        });
        let reader = async {
            let mut buf = vec![0u8; 256 * 1024];
            loop {
                let n = rd.read(&mut buf).await?;
                if n == 0 {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "subflow closed by peer"));
                }
                let paused = self.with(|st, now| {
                    if st.path_gen[path.index()] != gen {
                        return Err(superseded_err());
                    }
                    if let Some(unsent) = probe.as_ref().and_then(|p| p.unsent_bytes()) {
                        st.ep.set_kernel_unsent(path, unsent);
                    }
                    st.ep
                        .handle_input(path, &buf[..n], now)
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                    Ok(st.ep.input_paused(path))
                })?;
                if paused {
                    // The peer asks for answers faster than it reads them:
                    // read nothing more from it until the writer has
                    // drained the control queue (the endpoint declares the
                    // path dead if the queue fills up regardless).
                    loop {
                        let drained = self.inner.path_drained[path.index()].notified();
                        tokio::pin!(drained);
                        drained.as_mut().enable();
                        if !self.peek(|st, _| st.ep.input_paused(path)) {
                            break;
                        }
                        let _ = tokio::time::timeout(Duration::from_millis(200), drained).await;
                    }
                }
            }
        };
        // Bytes taken for a write count in flight from then on, though a
        // paced subflow may hold them back for a while: take no more than it
        // lets go at once, so the rest waits in the endpoint, where the
        // scheduler can still move it and the path's RTT (and so its
        // window) does not grow with the writer's own backlog.
        let quantum = || probe.as_ref().map_or(MAX_WRITE, |p| p.write_quantum()).clamp(1, MAX_WRITE);
        let writer = async {
            let mut out = Vec::with_capacity(2 * MAX_WRITE);
            loop {
                out.clear();
                let n = self.with(|st, now| {
                    if st.path_gen[path.index()] != gen {
                        return Err(superseded_err());
                    }
                    // What the last write left unsent in the kernel counts toward
                    // the path's occupancy before the scheduler decides again.
                    if let Some(unsent) = probe.as_ref().and_then(|p| p.unsent_bytes()) {
                        st.ep.set_kernel_unsent(path, unsent);
                    }
                    Ok(st.ep.poll_transmit(path, now, &mut out, quantum()))
                })?;
                if n == 0 {
                    self.inner.path_notify[path.index()].notified().await;
                    continue;
                }
                wr.write_all(&out).await?;
                wr.flush().await?;
                self.inner.path_drained[path.index()].notify_waiters();
            }
        };
        let dead = self.inner.path_dead[path.index()].notified();
        let r: io::Result<()> = tokio::select! {
            r = reader => r,
            r = writer => r,
            _ = dead => Err(io::Error::new(io::ErrorKind::TimedOut, "path declared dead: nothing heard while data was in flight")),
            _ = &mut superseded => Err(superseded_err()),
            e = lost => Err(e),
        };
        self.with(|st, now| {
            if st.path_gen[path.index()] == gen {
                st.ep.path_down(path, now);
            }
        });
        let _ = wr.shutdown().await;
        r
    }
}

fn wake(map: &mut HashMap<ConnId, Waker>, c: ConnId) {
    if let Some(w) = map.remove(&c) {
        w.wake();
    }
}

/// A passenger connection as a byte stream. Dropping it before both
/// directions finished resets the connection.
pub struct ConnStream {
    session: Session,
    conn: ConnId,
    read_eof: bool,
    write_fin: bool,
}

impl ConnStream {
    pub fn id(&self) -> ConnId {
        self.conn
    }

    /// Reset the connection with `code` and consume the stream.
    pub fn reset(mut self, code: u32) {
        let conn = self.conn;
        self.session.reset(conn, code);
        // Already reset: the drop must not reset again.
        self.read_eof = true;
        self.write_fin = true;
    }
}

fn stream_err(e: StreamError) -> io::Error {
    match e {
        StreamError::Reset(_) => io::Error::new(io::ErrorKind::ConnectionReset, e.to_string()),
        StreamError::UnknownConn(_) => io::Error::new(io::ErrorKind::ConnectionReset, e.to_string()),
        StreamError::TooManyConns(_) | StreamError::NoMemory => {
            io::Error::new(io::ErrorKind::ConnectionRefused, e.to_string())
        }
        StreamError::WrongRole | StreamError::TelemetryTooLarge(_) => io::Error::other(e.to_string()),
    }
}

impl AsyncRead for ConnStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.read_eof {
            return Poll::Ready(Ok(()));
        }
        let conn = self.conn;
        let r = self.session.with(|st, now| {
            let r = st.ep.recv(conn, buf.initialize_unfilled(), now);
            if r == Ok(Recv::Blocked) {
                st.read_wakers.insert(conn, cx.waker().clone());
            }
            r
        });
        match r {
            Ok(Recv::Data(n)) => {
                buf.advance(n);
                Poll::Ready(Ok(()))
            }
            Ok(Recv::Fin) => {
                self.read_eof = true;
                Poll::Ready(Ok(()))
            }
            Ok(Recv::Blocked) => Poll::Pending,
            Err(e) => Poll::Ready(Err(stream_err(e))),
        }
    }
}

impl ConnStream {
    /// [`AsyncWrite::poll_write`], saying whether `buf` ends a burst (it came
    /// from a read shorter than the reader's buffer: the source has nothing
    /// more for now); see [`polycorn_core::Endpoint::send_burst`].
    pub fn poll_write_burst(&self, cx: &mut Context<'_>, buf: &[u8], end: bool) -> Poll<io::Result<usize>> {
        let conn = self.conn;
        let r = self.session.with(|st, now| {
            let r = st.ep.send_burst(conn, buf, end, now);
            if r == Ok(0) && !buf.is_empty() {
                st.write_wakers.insert(conn, cx.waker().clone());
            }
            r
        });
        match r {
            Ok(0) if !buf.is_empty() => Poll::Pending,
            Ok(n) => Poll::Ready(Ok(n)),
            Err(e) => Poll::Ready(Err(stream_err(e))),
        }
    }
}

impl AsyncWrite for ConnStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let conn = self.conn;
        let r = self.session.with(|st, now| {
            let r = st.ep.send(conn, buf, now);
            if r == Ok(0) {
                st.write_wakers.insert(conn, cx.waker().clone());
            }
            r
        });
        match r {
            Ok(0) => Poll::Pending,
            Ok(n) => Poll::Ready(Ok(n)),
            Err(e) => Poll::Ready(Err(stream_err(e))),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.write_fin {
            let conn = self.conn;
            self.session.with(|st, now| st.ep.finish(conn, now)).map_err(stream_err)?;
            self.write_fin = true;
        }
        Poll::Ready(Ok(()))
    }
}

impl Drop for ConnStream {
    fn drop(&mut self) {
        let conn = self.conn;
        let graceful = self.read_eof && self.write_fin;
        self.session.with(|st, now| {
            st.read_wakers.remove(&conn);
            st.write_wakers.remove(&conn);
            if !graceful {
                st.ep.reset(conn, RESET_ABORTED, now);
            }
        });
    }
}

/// What a session's writer reads about a subflow's send side below it.
#[derive(Debug)]
pub enum SendProbe {
    /// A TCP subflow: the kernel's unsent bytes.
    Tcp(crate::subflow::UnsentProbe),
    /// A QUIC subflow: how much its pacer lets go at once.
    Quic(crate::quic::QuicSendGauge),
}

impl SendProbe {
    /// Bytes written to the subflow and not yet sent, where the transport
    /// says.
    pub fn unsent_bytes(&self) -> Option<u64> {
        match self {
            SendProbe::Tcp(p) => p.unsent_bytes(),
            SendProbe::Quic(_) => None,
        }
    }

    /// Most bytes worth taking from the endpoint for one write.
    pub fn write_quantum(&self) -> usize {
        match self {
            SendProbe::Tcp(_) => MAX_WRITE,
            SendProbe::Quic(g) => g.write_quantum(),
        }
    }
}

impl From<crate::subflow::UnsentProbe> for SendProbe {
    fn from(p: crate::subflow::UnsentProbe) -> Self {
        SendProbe::Tcp(p)
    }
}

/// RESET codes. Shells map them to what passengers see (a TCP RST).
pub const RESET_ABORTED: u32 = 1;
pub const RESET_CONNECT_FAILED: u32 = 2;
pub const RESET_REFUSED_BY_POLICY: u32 = 3;
/// A connection whose OPEN arrived while the shell's event queue was full
/// ([`EVENT_QUEUE`]), or whose reservation the proxy's memory budget had no
/// room for.
pub use polycorn_core::endpoint::RESET_OVERLOADED;
pub use polycorn_core::endpoint::RESET_REFUSED_LIMIT;

#[cfg(test)]
mod tests {
    use super::*;
    use polycorn_core::ctrl::{CTRL_MAX, CTRL_PAUSE};
    use polycorn_core::wire::Frame;
    use polycorn_core::{EndpointConfig, Registry, Role};
    use tokio::io::AsyncWriteExt;

    /// A shell that does not keep up with its events (here: never reads
    /// them) holds at most EVENT_QUEUE of them and EVENT_TELEMETRY_BYTES of
    /// telemetry: new connections beyond are reset, records left
    /// unacknowledged, and both counted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_shell_that_does_not_keep_up_holds_a_bounded_queue_of_events() {
        let pipeline = Registry::with_builtins().build("minrtt").unwrap();
        let ep = Endpoint::new(EndpointConfig::new(Role::Proxy), pipeline, Instant::now());
        let (session, mut events) = Session::new(ep);
        let (peer, ours) = tokio::io::duplex(1 << 20);
        let run = tokio::spawn({
            let session = session.clone();
            async move { session.run_path(PathId(0), ours, None).await }
        });
        let (mut peer_rd, mut peer_wr) = tokio::io::split(peer);
        let drain = tokio::spawn(async move {
            let mut buf = vec![0u8; 1 << 16];
            while peer_rd.read(&mut buf).await.is_ok_and(|n| n > 0) {}
        });
        let dst: std::net::SocketAddr = "10.0.0.1:22".parse().unwrap();
        let mut out = Vec::new();
        // More OPENs than the queue holds (fewer than the connection cap).
        for c in 1..=(EVENT_QUEUE as u32 + 1000) {
            Frame::Open { conn: ConnId(c), user: UserId([c as u8; 16]), dst }.encode(&mut out);
        }
        // Telemetry records of 60 KB: 4 MiB hold 69 of them.
        let payload = Bytes::from(vec![7u8; 60_000]);
        for seq in 1..=200u64 {
            Frame::Telemetry { seq, payload: payload.clone() }.encode(&mut out);
        }
        peer_wr.write_all(&out).await.unwrap();
        let queued = || session.peek(|st, _| st.events_dropped);
        let deadline = Instant::now() + Duration::from_secs(30);
        while session.peek(|st, _| st.ep.stats().telemetry_received) < 200 {
            assert!(Instant::now() < deadline, "the proxy did not read every frame");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(queued(), 1000 + 200, "1000 OPENs and every record: the queue was full of connections");
        assert_eq!(events.rx.len(), EVENT_QUEUE);
        // The connections beyond the queue were reset, not left waiting for
        // a shell that never heard of them.
        assert_eq!(session.peek(|st, _| st.ep.conn_count()), EVENT_QUEUE);
        // The shell reads: every event it gets is a connection, then room
        // for telemetry, held to its byte bound.
        let mut n = 0;
        while let Ok(Some(ev)) = tokio::time::timeout(Duration::from_millis(200), events.recv()).await {
            assert!(matches!(ev, SessionEvent::ConnOpened { .. }), "{ev:?}");
            n += 1;
            if n == EVENT_QUEUE {
                break;
            }
        }
        assert_eq!(n, EVENT_QUEUE);
        assert_eq!(events.telemetry_bytes.load(Ordering::Relaxed), 0);
        let mut out = Vec::new();
        for seq in 201..=400u64 {
            Frame::Telemetry { seq, payload: payload.clone() }.encode(&mut out);
        }
        peer_wr.write_all(&out).await.unwrap();
        while session.peek(|st, _| st.ep.stats().telemetry_received) < 400 {
            assert!(Instant::now() < deadline, "the proxy did not read every frame");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let held = EVENT_TELEMETRY_BYTES / 60_000;
        assert_eq!(events.rx.len(), held);
        assert_eq!(events.telemetry_bytes.load(Ordering::Relaxed), held * 60_000);
        assert_eq!(queued(), 1000 + 200 + (200 - held as u64));
        session.close();
        drop(peer_wr);
        let _ = run.await;
        drain.abort();
    }

    /// A relay that floods OPENs, to a destination the proxy refuses or past
    /// the connection cap, and never reads the RESETs: the proxy stops
    /// reading the subflow instead of queueing RESETs (or connections)
    /// without bound, and carries on once the peer reads.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_peer_that_asks_faster_than_it_reads_is_not_read() {
        let pipeline = Registry::with_builtins().build("minrtt").unwrap();
        let mut cfg = EndpointConfig::new(Role::Proxy);
        cfg.max_conns = 500;
        let ep = Endpoint::new(cfg, pipeline, Instant::now());
        let (session, mut events) = Session::new(ep);
        let refuse = {
            let session = session.clone();
            tokio::spawn(async move {
                while let Some(ev) = events.recv().await {
                    if let SessionEvent::ConnOpened { conn, .. } = ev {
                        session.reset(conn, RESET_REFUSED_BY_POLICY);
                    }
                }
            })
        };
        let (peer, ours) = tokio::io::duplex(64 * 1024);
        let run = tokio::spawn({
            let session = session.clone();
            async move { session.run_path(PathId(0), ours, None).await }
        });
        let (mut peer_rd, mut peer_wr) = tokio::io::split(peer);
        let dst: std::net::SocketAddr = "10.0.0.1:22".parse().unwrap();
        let chunk = |from: u32| {
            let mut out = Vec::new();
            for c in from..from + 1000 {
                Frame::Open { conn: ConnId(c), user: UserId([3; 16]), dst }.encode(&mut out);
            }
            out
        };
        // Write until the proxy stops taking bytes (or 10^6 OPENs: the
        // queue would then have passed CTRL_MAX long ago). `write` is
        // cancel-safe: a write that times out wrote nothing.
        let mut next = 1u32;
        let mut pending = chunk(next);
        let mut pos = 0;
        while next < 1_000_000 {
            match tokio::time::timeout(Duration::from_secs(1), peer_wr.write(&pending[pos..])).await {
                Ok(Ok(n)) => pos += n,
                Ok(Err(e)) => panic!("write after {next} OPENs: {e}; the subflow ended: {:?}", run.await),
                Err(_) => {
                    if session.peek(|st, _| st.ep.stats().input_pauses) > 0 {
                        break;
                    }
                }
            }
            if pos == pending.len() {
                next += 1000;
                pending = chunk(next);
                pos = 0;
            }
        }
        let (backlog, pauses, overflows) = session
            .peek(|st, _| (st.ep.ctrl_backlog(PathId(0)), st.ep.stats().input_pauses, st.ep.stats().ctrl_overflows));
        assert!(next < 100_000, "the proxy stopped reading after {next} OPENs");
        assert!(pauses >= 1);
        assert_eq!(overflows, 0);
        assert!((CTRL_PAUSE..CTRL_MAX).contains(&backlog), "{backlog}");
        assert!(!run.is_finished(), "the subflow stays up");
        assert!(session.peek(|st, _| st.ep.conn_count()) <= 500);
        // The peer reads its RESETs: the proxy reads again.
        let drain = tokio::spawn(async move {
            let mut buf = vec![0u8; 1 << 16];
            while peer_rd.read(&mut buf).await.is_ok_and(|n| n > 0) {}
        });
        let before = session.peek(|st, _| st.ep.stats().conns_opened);
        let mut rest = pending[pos..].to_vec();
        for _ in 0..20 {
            if let Err(e) = peer_wr.write_all(&rest).await {
                panic!("write after {next} OPENs: {e}; the subflow ended: {:?}", run.await);
            }
            next += 1000;
            rest = chunk(next);
        }
        let after = session.peek(|st, _| st.ep.stats().conns_opened);
        assert!(after > before, "{before} -> {after}");
        session.close();
        drop(peer_wr);
        let _ = run.await;
        drain.abort();
        refuse.abort();
    }
}
