//! Two endpoints, a relay and a proxy, joined by simulated paths and driven
//! in virtual time by a test application.
//!
//! The harness plays both shells. Like a real shell it drains events after
//! every call, writes to a path only while the socket's unsent bytes are
//! under a small kernel buffer (TCP_NOTSENT_LOWAT), reports those unsent
//! bytes to the endpoint, closes a subflow the endpoint reports dead and
//! reconnects it after a backoff when the radio is usable. The application
//! opens connections on the relay, writes deterministic pseudo-random
//! content in each direction, and checks every byte it reads.
//!
//! For HRSCH's handover-failure prediction the harness also plays the
//! shells' telemetry: [`Harness::set_train`] gives both endpoints a moving
//! train's position (the proxy without telemetry delay),
//! [`Harness::set_failure_table`] loads a failure table into both, and
//! [`Harness::report_link`] makes the relay's radio report a state and cell,
//! which reaches the proxy in `PATH_STATUS` frames over the simulated paths.
//!
//! Time only moves when nothing more can happen at the current instant; it
//! then jumps to the earliest of: a scheduled action (connection start,
//! kill, revive, reconnect, slow-reader wake-up), a segment starting to
//! serialize or arriving (blackouts are folded into these), or an
//! endpoint's `poll_timeout`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::pipe::{Blackouts, DirSpec, Pipe, PipeStats};
use super::rng::{fill_content, mix};
use super::trace::MahimahiTrace;
use crate::endpoint::{Endpoint, EndpointConfig, EndpointStats, Event, Recv, Role};
use crate::ids::{ConnId, PathId, UserId, MAX_PATHS};
use crate::path::PathStats;
use crate::sched::{FailureTable, Pipeline, Registry, TrackDirection, TrainState};
use crate::wire::LinkState;

/// Largest read or write the test application makes at once.
const APP_CHUNK: usize = 64 * 1024;
/// Burst a rate-limited reader may read at once.
const READ_BURST: f64 = 16.0 * 1024.0;
/// Rounds of work at one instant after which the harness assumes a
/// livelock (an endpoint that keeps producing work without time passing).
const MAX_ROUNDS_PER_INSTANT: usize = 100_000;

/// Which end of the session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Side {
    Relay,
    Proxy,
}

impl Side {
    fn idx(self) -> usize {
        self as usize
    }
}

/// A path goes away at `at` (its subflow and everything in it are lost) and,
/// optionally, comes back at `revive_at`, with a fresh subflow at both ends
/// at that instant (even inside a blackout: the revive is the test's word).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kill {
    pub at: Duration,
    pub revive_at: Option<Duration>,
}

/// One simulated path: a radio link with an uplink and a downlink.
#[derive(Clone, Debug)]
pub struct PathSpec {
    /// Relay → proxy.
    pub up: DirSpec,
    /// Proxy → relay.
    pub down: DirSpec,
    /// Outages `[start, end)` of both directions: nothing is serialized or
    /// delivered, queues are held.
    pub blackouts: Vec<(Duration, Duration)>,
    pub kills: Vec<Kill>,
}

impl PathSpec {
    pub fn new(up: DirSpec, down: DirSpec) -> Self {
        PathSpec { up, down, blackouts: Vec::new(), kills: Vec::new() }
    }

    /// The same rate (bytes per second) and one-way delay both ways.
    pub fn rate(bytes_per_sec: u64, one_way_delay: Duration) -> Self {
        Self::new(DirSpec::rate(bytes_per_sec, one_way_delay), DirSpec::rate(bytes_per_sec, one_way_delay))
    }

    /// The same rate in Mbit/s and one-way delay both ways.
    pub fn mbit(mbit_per_sec: f64, one_way_delay: Duration) -> Self {
        Self::rate((mbit_per_sec * 125_000.0) as u64, one_way_delay)
    }

    /// Mahimahi traces for each direction.
    pub fn trace(up: Arc<MahimahiTrace>, down: Arc<MahimahiTrace>, one_way_delay: Duration) -> Self {
        Self::new(DirSpec::trace(up, one_way_delay), DirSpec::trace(down, one_way_delay))
    }

    /// Segment loss probability in both directions.
    pub fn with_loss(mut self, p: f64) -> Self {
        self.up.loss = p;
        self.down.loss = p;
        self
    }

    pub fn with_blackout(mut self, start: Duration, end: Duration) -> Self {
        self.blackouts.push((start, end));
        self
    }

    pub fn with_kill(mut self, at: Duration, revive_at: Option<Duration>) -> Self {
        self.kills.push(Kill { at, revive_at });
        self
    }
}

/// A train moving at constant speed, for handover-failure prediction. Both
/// endpoints are given its position every `report_every` (the proxy at the
/// same instant, as if the relay-agent's telemetry took no time).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrainSpec {
    /// Position along the track at time 0 (m).
    pub start_m: f64,
    pub speed_mps: f64,
    pub direction: TrackDirection,
    pub report_every: Duration,
}

impl TrainSpec {
    /// Position at virtual time `t`.
    pub fn position(&self, t: Duration) -> f64 {
        let d = self.speed_mps * t.as_secs_f64();
        match self.direction {
            TrackDirection::Increasing => self.start_m + d,
            TrackDirection::Decreasing => self.start_m - d,
        }
    }
}

/// A passenger connection for the test application to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnSpec {
    /// Passenger number; users are distinct source addresses.
    pub user: u16,
    /// Bytes the passenger sends (relay → proxy).
    pub upload: u64,
    /// Bytes the server sends back (proxy → relay).
    pub download: u64,
    /// When the passenger connects.
    pub start: Duration,
    /// The server starts sending only after the whole upload arrived (a
    /// request–response exchange); otherwise both directions run at once.
    pub respond_after_upload: bool,
}

impl ConnSpec {
    pub fn new(user: u16) -> Self {
        ConnSpec { user, upload: 0, download: 0, start: Duration::ZERO, respond_after_upload: false }
    }
    pub fn upload(mut self, bytes: u64) -> Self {
        self.upload = bytes;
        self
    }
    pub fn download(mut self, bytes: u64) -> Self {
        self.download = bytes;
        self
    }
    pub fn at(mut self, start: Duration) -> Self {
        self.start = start;
        self
    }
    pub fn request_response(mut self) -> Self {
        self.respond_after_upload = true;
        self
    }
}

/// Tunables of the simulated shells and application.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub relay: EndpointConfig,
    pub proxy: EndpointConfig,
    /// The shell writes to a subflow only while its unsent bytes are below
    /// this (TCP_NOTSENT_LOWAT).
    pub kernel_buffer_bytes: u64,
    /// After `PathDead` (or a protocol error) the subflow is closed and
    /// reconnected this much later, once the path is alive and out of any
    /// blackout.
    pub reconnect_after: Duration,
    /// Application read rates in bytes per second; `None` reads at once.
    pub relay_read_rate: Option<u64>,
    pub proxy_read_rate: Option<u64>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            relay: EndpointConfig::new(Role::Relay),
            proxy: EndpointConfig::new(Role::Proxy),
            kernel_buffer_bytes: 64 * 1024,
            reconnect_after: Duration::from_secs(1),
            relay_read_rate: None,
            proxy_read_rate: None,
        }
    }
}

/// Something that happened to a path, for the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathChange {
    Up,
    Killed,
    Revived,
    /// An endpoint reported [`Event::PathDead`]; the shell closed the subflow.
    Dead(Side),
    /// The receiving endpoint refused bytes; the shell closed the subflow.
    InputError(Side),
    Reconnected,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathLogEntry {
    pub at: Duration,
    pub path: PathId,
    pub change: PathChange,
}

/// One direction of one connection as the application saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamReport {
    pub expected: u64,
    /// Bytes read by the receiving application.
    pub received: u64,
    /// The receiver read the end of the stream.
    pub fin: bool,
    /// Offset of the first byte that differed from what was sent (or of
    /// the first byte beyond the expected length).
    pub first_mismatch: Option<u64>,
    /// When the receiver read the end of the stream.
    pub done_at: Option<Duration>,
}

impl StreamReport {
    /// Every byte arrived exactly once, in order, intact, then the FIN.
    pub fn intact(&self) -> bool {
        self.fin && self.received == self.expected && self.first_mismatch.is_none()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnReport {
    pub index: usize,
    pub conn: Option<ConnId>,
    pub user: u16,
    pub opened_at: Option<Duration>,
    pub upload: StreamReport,
    pub download: StreamReport,
    /// From open until both directions were read to the end.
    pub completion: Option<Duration>,
    pub closed_relay: bool,
    pub closed_proxy: bool,
    pub reset: bool,
}

impl ConnReport {
    pub fn intact(&self) -> bool {
        !self.reset && self.upload.intact() && self.download.intact()
    }
    /// Intact, and both endpoints closed it.
    pub fn done(&self) -> bool {
        self.intact() && self.closed_relay && self.closed_proxy
    }
}

#[derive(Clone, Debug)]
pub struct PathReport {
    pub id: PathId,
    pub relay: Option<PathStats>,
    pub proxy: Option<PathStats>,
    /// Relay → proxy pipes over every subflow incarnation.
    pub up: PipeStats,
    /// Proxy → relay.
    pub down: PipeStats,
}

impl PathReport {
    /// Reinjected bytes placed on this path by either endpoint.
    pub fn reinjected_bytes(&self) -> u64 {
        self.relay.as_ref().map_or(0, |s| s.reinjected_bytes) + self.proxy.as_ref().map_or(0, |s| s.reinjected_bytes)
    }
    /// Retransmission timeouts either endpoint had on this path.
    pub fn rto_events(&self) -> u64 {
        self.relay.as_ref().map_or(0, |s| s.rto_events) + self.proxy.as_ref().map_or(0, |s| s.rto_events)
    }
}

/// Outcome of a run.
#[derive(Clone, Debug)]
pub struct Report {
    /// Virtual time when the run stopped.
    pub elapsed: Duration,
    /// Every connection finished (done or reset) before the deadline.
    pub finished: bool,
    pub conns: Vec<ConnReport>,
    pub relay: EndpointStats,
    pub proxy: EndpointStats,
    pub paths: Vec<PathReport>,
    /// Largest [`Endpoint::buffered_bytes`] seen after any instant.
    pub max_buffered_relay: u64,
    pub max_buffered_proxy: u64,
    pub input_errors: Vec<String>,
    pub app_errors: Vec<String>,
    pub path_log: Vec<PathLogEntry>,
}

impl Report {
    /// Every connection done and no protocol or application error.
    pub fn all_done(&self) -> bool {
        self.finished
            && self.conns.iter().all(ConnReport::done)
            && self.input_errors.is_empty()
            && self.app_errors.is_empty()
    }

    /// Panic with a readable summary unless [`Self::all_done`].
    pub fn assert_all_done(&self) {
        if self.all_done() {
            return;
        }
        let bad: Vec<&ConnReport> = self.conns.iter().filter(|c| !c.done()).take(5).collect();
        panic!(
            "run not clean at {:?} (finished: {}): {} of {} connections not done, first: {:#?}\n\
             input errors: {:?}\napp errors: {:?}\npath log: {:?}",
            self.elapsed,
            self.finished,
            self.conns.iter().filter(|c| !c.done()).count(),
            self.conns.len(),
            bad,
            self.input_errors,
            self.app_errors,
            self.path_log
        );
    }

    /// The latest connection completion time.
    pub fn last_completion(&self) -> Option<Duration> {
        self.conns.iter().map(|c| c.completion).max().flatten()
    }

    /// Application bytes read in both directions.
    pub fn bytes_delivered(&self) -> u64 {
        self.conns.iter().map(|c| c.upload.received + c.download.received).sum()
    }
}

#[derive(Debug)]
struct StreamState {
    key: u64,
    total: u64,
    written: u64,
    finished: bool,
    read: u64,
    fin: bool,
    mismatch: Option<u64>,
    done_at: Option<u64>,
}

impl StreamState {
    fn new(key: u64, total: u64) -> Self {
        StreamState { key, total, written: 0, finished: false, read: 0, fin: false, mismatch: None, done_at: None }
    }

    fn report(&self) -> StreamReport {
        StreamReport {
            expected: self.total,
            received: self.read,
            fin: self.fin,
            first_mismatch: self.mismatch,
            done_at: self.done_at.map(Duration::from_nanos),
        }
    }

    /// Check `got`, just read at offset `self.read`.
    fn check(&mut self, got: &[u8], expect: &mut [u8]) {
        let off = self.read;
        self.read += got.len() as u64;
        if self.mismatch.is_some() {
            return;
        }
        if self.read > self.total {
            self.mismatch = Some(self.total.max(off));
            return;
        }
        let expect = &mut expect[..got.len()];
        fill_content(self.key, off, expect);
        if let Some(i) = got.iter().zip(expect.iter()).position(|(a, b)| a != b) {
            self.mismatch = Some(off + i as u64);
        }
    }
}

#[derive(Debug)]
struct AppConn {
    spec: ConnSpec,
    id: Option<ConnId>,
    opened_at: Option<u64>,
    accepted: bool,
    up: StreamState,
    down: StreamState,
    closed: [bool; 2],
    reset: bool,
}

impl AppConn {
    fn finished(&self) -> bool {
        self.reset || (self.up.fin && self.down.fin && self.closed[0] && self.closed[1])
    }
}

#[derive(Debug)]
struct Reader {
    rate: Option<u64>,
    tokens: f64,
    last: u64,
}

impl Reader {
    fn budget(&mut self, now: u64) -> usize {
        let Some(rate) = self.rate else { return usize::MAX };
        let dt = (now - self.last) as f64 / 1e9;
        self.tokens = (self.tokens + dt * rate as f64).min(READ_BURST);
        self.last = now;
        self.tokens as usize
    }

    fn spend(&mut self, n: usize) {
        if self.rate.is_some() {
            self.tokens -= n as f64;
        }
    }

    /// When a full burst will be available again.
    fn refill_at(&self, now: u64) -> u64 {
        let rate = self.rate.expect("only rate-limited readers wait") as f64;
        now + (((READ_BURST - self.tokens).max(1.0) / rate) * 1e9).ceil() as u64
    }
}

#[derive(Debug)]
struct SimPath {
    up: DirSpec,
    down: DirSpec,
    blackouts: Arc<Blackouts>,
    alive: bool,
    /// `[relay → proxy, proxy → relay]` while a subflow is established.
    pipes: Option<[Pipe; 2]>,
    incarnation: u64,
    reconnect_pending: bool,
    /// Counters of torn-down pipes.
    retired: [PipeStats; 2],
}

#[derive(Clone, Copy, Debug)]
enum Action {
    Open(usize),
    Kill(usize),
    Revive(usize),
    Reconnect(usize),
    /// A rate-limited reader may read again.
    Wake,
    /// The train's position is reported to both endpoints.
    Gps,
    /// The relay's radio on a path reports a state and cell.
    Link(usize, LinkState, u64),
}

fn user_id(user: u16) -> UserId {
    UserId::from(Ipv4Addr::new(10, 66, (user >> 8) as u8, user as u8))
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).expect("virtual times fit in u64 nanoseconds")
}

/// A relay and a proxy over simulated paths, in virtual time.
pub struct Harness {
    cfg: SimConfig,
    base: Instant,
    now: u64,
    seed: u64,
    relay: Endpoint,
    proxy: Endpoint,
    paths: Vec<SimPath>,
    conns: Vec<AppConn>,
    by_id: BTreeMap<ConnId, usize>,
    actions: BTreeMap<(u64, u64), Action>,
    action_seq: u64,
    readable: [BTreeSet<ConnId>; 2],
    readers: [Reader; 2],
    wake_at: Option<u64>,
    input_errors: Vec<String>,
    app_errors: Vec<String>,
    path_log: Vec<PathLogEntry>,
    max_buffered: [u64; 2],
    /// Application reads and writes (fixed size).
    io_buf: Vec<u8>,
    expect_buf: Vec<u8>,
    /// Bytes moving between an endpoint and a pipe.
    wire_buf: Vec<u8>,
    train: Option<TrainSpec>,
}

impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harness")
            .field("now", &Duration::from_nanos(self.now))
            .field("paths", &self.paths.len())
            .field("conns", &self.conns.len())
            .finish_non_exhaustive()
    }
}

impl Harness {
    /// Both ends run the built-in scheduler `scheduler`, default tunables.
    /// Panics on an unknown scheduler name (this is test code).
    pub fn new(scheduler: &str, paths: Vec<PathSpec>, seed: u64) -> Self {
        let r = Registry::with_builtins();
        let build = || r.build(scheduler).unwrap_or_else(|e| panic!("{e}"));
        Self::with_config(SimConfig::default(), build(), build(), paths, seed)
    }

    /// Any tunables and pipelines. Every path comes up at time 0.
    pub fn with_config(
        cfg: SimConfig,
        relay_pipeline: Pipeline,
        proxy_pipeline: Pipeline,
        paths: Vec<PathSpec>,
        seed: u64,
    ) -> Self {
        Self::with_config_at(cfg, relay_pipeline, proxy_pipeline, paths, seed, Duration::ZERO)
    }

    /// [`Self::with_config`] with the paths coming up at virtual time
    /// `start` instead of 0 (a trip replayed from the middle: trace
    /// opportunities, delay schedules and blackouts keep their times).
    pub fn with_config_at(
        cfg: SimConfig,
        relay_pipeline: Pipeline,
        proxy_pipeline: Pipeline,
        paths: Vec<PathSpec>,
        seed: u64,
        start: Duration,
    ) -> Self {
        assert!(!paths.is_empty() && paths.len() <= MAX_PATHS, "1..={MAX_PATHS} paths");
        assert_eq!(cfg.relay.role, Role::Relay, "SimConfig::relay must have Role::Relay");
        assert_eq!(cfg.proxy.role, Role::Proxy, "SimConfig::proxy must have Role::Proxy");
        // The only clock read: a base that virtual time is added to.
        let base = Instant::now();
        let readers = [cfg.relay_read_rate, cfg.proxy_read_rate].map(|rate| Reader {
            rate,
            tokens: if rate.is_some() { READ_BURST } else { 0.0 },
            last: 0,
        });
        let mut h = Harness {
            relay: Endpoint::new(cfg.relay.clone(), relay_pipeline, base),
            proxy: Endpoint::new(cfg.proxy.clone(), proxy_pipeline, base),
            cfg,
            base,
            now: ns(start),
            seed,
            paths: Vec::new(),
            conns: Vec::new(),
            by_id: BTreeMap::new(),
            actions: BTreeMap::new(),
            action_seq: 0,
            readable: [BTreeSet::new(), BTreeSet::new()],
            readers,
            wake_at: None,
            input_errors: Vec::new(),
            app_errors: Vec::new(),
            path_log: Vec::new(),
            max_buffered: [0; 2],
            io_buf: vec![0; APP_CHUNK],
            expect_buf: vec![0; APP_CHUNK],
            wire_buf: Vec::new(),
            train: None,
        };
        for (i, spec) in paths.into_iter().enumerate() {
            let spans = spec.blackouts.iter().map(|&(s, e)| (ns(s), ns(e))).collect();
            for k in &spec.kills {
                h.schedule(ns(k.at), Action::Kill(i));
                if let Some(r) = k.revive_at {
                    assert!(r > k.at, "path {i}: revive_at must follow the kill");
                    h.schedule(ns(r), Action::Revive(i));
                }
            }
            h.paths.push(SimPath {
                up: spec.up,
                down: spec.down,
                blackouts: Arc::new(Blackouts::new(spans)),
                alive: true,
                pipes: None,
                incarnation: 0,
                reconnect_pending: false,
                retired: Default::default(),
            });
            h.bring_up(i, PathChange::Up);
        }
        h
    }

    /// Add a connection; it opens at `spec.start`. Returns its index.
    pub fn open(&mut self, spec: ConnSpec) -> usize {
        let k = self.conns.len();
        let key = |dir: u64| mix(self.seed ^ mix(((k as u64) << 1) | dir));
        let (up, down) = (StreamState::new(key(0), spec.upload), StreamState::new(key(1), spec.download));
        let start = ns(spec.start).max(self.now);
        self.conns.push(AppConn {
            spec,
            id: None,
            opened_at: None,
            accepted: false,
            up,
            down,
            closed: [false; 2],
            reset: false,
        });
        self.schedule(start, Action::Open(k));
        k
    }

    /// Run a train: both endpoints get its position from now on, every
    /// `spec.report_every`.
    pub fn set_train(&mut self, spec: TrainSpec) {
        assert!(!spec.report_every.is_zero(), "report_every must be positive");
        self.train = Some(spec);
        self.schedule(self.now, Action::Gps);
    }

    /// Give both endpoints a failure-location table, now.
    pub fn set_failure_table(&mut self, table: FailureTable) {
        self.relay.set_failure_table(table.clone());
        self.proxy.set_failure_table(table);
    }

    /// At `at`, the relay's radio on path `path` reports `state` and `cell`
    /// ([`Endpoint::report_link`]); the proxy learns it from `PATH_STATUS`,
    /// over whichever paths are up.
    pub fn report_link(&mut self, path: usize, at: Duration, state: LinkState, cell: u64) {
        assert!(path < self.paths.len(), "no path {path}");
        self.schedule(ns(at).max(self.now), Action::Link(path, state, cell));
    }

    /// Current virtual time since the start.
    pub fn now(&self) -> Duration {
        Duration::from_nanos(self.now)
    }

    /// Current virtual time as the endpoints see it.
    pub fn instant(&self) -> Instant {
        self.at()
    }

    pub fn relay(&self) -> &Endpoint {
        &self.relay
    }

    pub fn proxy(&self) -> &Endpoint {
        &self.proxy
    }

    /// The endpoints for calls a test makes itself (e.g.
    /// [`Endpoint::enable_trace`] and [`Endpoint::poll_trace`]).
    pub fn relay_mut(&mut self) -> &mut Endpoint {
        &mut self.relay
    }

    pub fn proxy_mut(&mut self) -> &mut Endpoint {
        &mut self.proxy
    }

    pub fn endpoint(&self, side: Side) -> &Endpoint {
        match side {
            Side::Relay => &self.relay,
            Side::Proxy => &self.proxy,
        }
    }

    /// The id the relay gave connection `index`, once opened.
    pub fn conn_id(&self, index: usize) -> Option<ConnId> {
        self.conns.get(index).and_then(|c| c.id)
    }

    pub fn config(&self) -> &SimConfig {
        &self.cfg
    }

    /// Every connection finished (completed and closed, or reset).
    pub fn finished(&self) -> bool {
        self.conns.iter().all(AppConn::finished)
    }

    /// Run until every connection finished or virtual time would pass
    /// `deadline`.
    pub fn run_until(&mut self, deadline: Duration) -> Report {
        self.run_observed(deadline, |_| {})
    }

    /// [`Self::run_until`], calling `observe` after every instant.
    pub fn run_observed(&mut self, deadline: Duration, mut observe: impl FnMut(&Harness)) -> Report {
        let deadline = ns(deadline);
        loop {
            self.settle();
            observe(self);
            if self.finished() {
                break;
            }
            match self.next_event() {
                Some(t) if t <= deadline => self.now = t,
                _ => break,
            }
        }
        self.report()
    }

    /// Settle the current instant and move to the next event, unless it is
    /// beyond `limit`. Returns whether time moved.
    pub fn step(&mut self, limit: Duration) -> bool {
        self.settle();
        match self.next_event() {
            Some(t) if t <= ns(limit) => {
                self.now = t;
                true
            }
            _ => false,
        }
    }

    /// Bytes the applications have read so far of connection `index`:
    /// (upload, download).
    pub fn received(&self, index: usize) -> (u64, u64) {
        self.conns.get(index).map_or((0, 0), |c| (c.up.read, c.down.read))
    }

    pub fn report(&self) -> Report {
        let conns = self
            .conns
            .iter()
            .enumerate()
            .map(|(index, c)| ConnReport {
                index,
                conn: c.id,
                user: c.spec.user,
                opened_at: c.opened_at.map(Duration::from_nanos),
                upload: c.up.report(),
                download: c.down.report(),
                completion: match (c.opened_at, c.up.done_at, c.down.done_at) {
                    (Some(o), Some(u), Some(d)) if c.up.fin && c.down.fin => Some(Duration::from_nanos(u.max(d) - o)),
                    _ => None,
                },
                closed_relay: c.closed[0],
                closed_proxy: c.closed[1],
                reset: c.reset,
            })
            .collect();
        let paths = self
            .paths
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let id = PathId(i as u8);
                let mut dirs = p.retired.clone();
                if let Some(pipes) = &p.pipes {
                    for (d, pipe) in dirs.iter_mut().zip(pipes) {
                        d.add(pipe.stats());
                    }
                }
                let [up, down] = dirs;
                PathReport {
                    id,
                    relay: self.relay.path_stats(id).cloned(),
                    proxy: self.proxy.path_stats(id).cloned(),
                    up,
                    down,
                }
            })
            .collect();
        Report {
            elapsed: self.now(),
            finished: self.finished(),
            conns,
            relay: self.relay.stats().clone(),
            proxy: self.proxy.stats().clone(),
            paths,
            max_buffered_relay: self.max_buffered[0],
            max_buffered_proxy: self.max_buffered[1],
            input_errors: self.input_errors.clone(),
            app_errors: self.app_errors.clone(),
            path_log: self.path_log.clone(),
        }
    }

    // ----- the event loop ---------------------------------------------

    fn at(&self) -> Instant {
        self.base + Duration::from_nanos(self.now)
    }

    fn schedule(&mut self, t: u64, a: Action) {
        self.action_seq += 1;
        self.actions.insert((t, self.action_seq), a);
    }

    /// Do everything that can happen at the current instant.
    fn settle(&mut self) {
        for _ in 0..MAX_ROUNDS_PER_INSTANT {
            let mut progress = self.fire_actions();
            progress |= self.deliver();
            progress |= self.fire_timers();
            progress |= self.run_apps();
            progress |= self.transmit();
            progress |= self.serialize();
            if !progress {
                self.max_buffered[0] = self.max_buffered[0].max(self.relay.buffered_bytes());
                self.max_buffered[1] = self.max_buffered[1].max(self.proxy.buffered_bytes());
                return;
            }
        }
        panic!("no quiescence after {MAX_ROUNDS_PER_INSTANT} rounds at {:?}: livelock", self.now());
    }

    /// The earliest future event. Everything due now was done by `settle`,
    /// so an event at or before now is a bug (in the core or here).
    fn next_event(&mut self) -> Option<u64> {
        let now = self.now;
        let mut next: Option<u64> = None;
        let mut consider = |t: Option<u64>, what: &str| {
            if let Some(t) = t {
                assert!(t > now, "{what} is due at {t} ns, not after now ({now} ns), after settling");
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        };
        consider(self.actions.keys().next().map(|k| k.0), "an action");
        for p in &mut self.paths {
            for pipe in p.pipes.iter_mut().flatten() {
                consider(pipe.next_serialization(), "a serialization");
                consider(pipe.next_delivery(), "a delivery");
            }
        }
        for (ep, what) in [(&self.relay, "the relay's poll_timeout"), (&self.proxy, "the proxy's poll_timeout")] {
            consider(ep.poll_timeout().map(|t| ns(t.saturating_duration_since(self.base))), what);
        }
        next
    }

    fn fire_actions(&mut self) -> bool {
        let mut any = false;
        while let Some(e) = self.actions.first_entry() {
            if e.key().0 > self.now {
                break;
            }
            let a = e.remove();
            any = true;
            match a {
                Action::Open(k) => self.open_now(k),
                Action::Kill(i) => {
                    self.paths[i].alive = false;
                    self.log(i, PathChange::Killed);
                    self.take_down(i);
                }
                Action::Revive(i) => {
                    self.paths[i].alive = true;
                    if self.paths[i].pipes.is_none() {
                        self.bring_up(i, PathChange::Revived);
                    }
                }
                Action::Reconnect(i) => {
                    let p = &mut self.paths[i];
                    p.reconnect_pending = false;
                    if p.alive && p.pipes.is_none() {
                        // A handshake cannot complete during an outage.
                        let free = p.blackouts.release(self.now);
                        if free > self.now {
                            p.reconnect_pending = true;
                            self.schedule(free, Action::Reconnect(i));
                        } else {
                            self.bring_up(i, PathChange::Reconnected);
                        }
                    }
                }
                Action::Wake => self.wake_at = None,
                Action::Gps => {
                    let spec = self.train.expect("a train is set");
                    let state = TrainState {
                        position_m: spec.position(self.now()),
                        speed_mps: spec.speed_mps,
                        direction: spec.direction,
                        at: self.at(),
                    };
                    self.relay.set_train_state(state);
                    self.proxy.set_train_state(state);
                    self.schedule(self.now + ns(spec.report_every), Action::Gps);
                }
                Action::Link(i, state, cell) => self.relay.report_link(PathId(i as u8), state, cell),
            }
        }
        any
    }

    fn log(&mut self, i: usize, change: PathChange) {
        self.path_log.push(PathLogEntry { at: self.now(), path: PathId(i as u8), change });
    }

    fn bring_up(&mut self, i: usize, why: PathChange) {
        let now = self.now;
        let seed = self.seed;
        let p = &mut self.paths[i];
        p.incarnation += 1;
        let pipe_seed = |dir: u64| mix(seed ^ mix(((i as u64) << 40) | (p.incarnation << 1) | dir));
        p.pipes = Some([
            Pipe::new(p.up.clone(), p.blackouts.clone(), pipe_seed(0), now),
            Pipe::new(p.down.clone(), p.blackouts.clone(), pipe_seed(1), now),
        ]);
        let (id, at) = (PathId(i as u8), self.at());
        self.relay.path_up(id, at);
        self.proxy.path_up(id, at);
        self.log(i, why);
    }

    /// Close the subflow at both ends; whatever is inside is lost.
    fn take_down(&mut self, i: usize) {
        let p = &mut self.paths[i];
        let Some(mut pipes) = p.pipes.take() else { return };
        for (r, pipe) in p.retired.iter_mut().zip(pipes.iter_mut()) {
            pipe.discard();
            r.add(pipe.stats());
        }
        let (id, at) = (PathId(i as u8), self.at());
        self.relay.path_down(id, at);
        self.proxy.path_down(id, at);
    }

    /// A shell gives up on a subflow and dials again later.
    fn close_and_reconnect(&mut self, i: usize, why: PathChange) {
        if self.paths[i].pipes.is_none() {
            return;
        }
        self.log(i, why);
        self.take_down(i);
        if !self.paths[i].reconnect_pending {
            self.paths[i].reconnect_pending = true;
            self.schedule(self.now + ns(self.cfg.reconnect_after), Action::Reconnect(i));
        }
    }

    fn deliver(&mut self) -> bool {
        let (now, at) = (self.now, self.at());
        let mut progress = false;
        let mut failed: Vec<(usize, Side, String)> = Vec::new();
        let mut buf = std::mem::take(&mut self.wire_buf);
        for (i, p) in self.paths.iter_mut().enumerate() {
            let Some(pipes) = p.pipes.as_mut() else { continue };
            for (dir, pipe) in pipes.iter_mut().enumerate() {
                buf.clear();
                if pipe.deliver_due(now, &mut buf) == 0 {
                    continue;
                }
                progress = true;
                let (rx, side) = if dir == 0 { (&mut self.proxy, Side::Proxy) } else { (&mut self.relay, Side::Relay) };
                if let Err(e) = rx.handle_input(PathId(i as u8), &buf, at) {
                    failed.push((i, side, e.to_string()));
                    break;
                }
            }
        }
        self.wire_buf = buf;
        for (i, side, e) in failed {
            self.input_errors.push(format!("{:?} {side:?}: {e}", self.now()));
            self.close_and_reconnect(i, PathChange::InputError(side));
        }
        progress
    }

    fn fire_timers(&mut self) -> bool {
        let at = self.at();
        let mut progress = false;
        for ep in [&mut self.relay, &mut self.proxy] {
            if ep.poll_timeout().is_some_and(|t| t <= at) {
                ep.handle_timeout(at);
                progress = true;
            }
        }
        progress
    }

    fn transmit(&mut self) -> bool {
        let (now, at) = (self.now, self.at());
        let kernel = self.cfg.kernel_buffer_bytes;
        let mut progress = false;
        let mut buf = std::mem::take(&mut self.wire_buf);
        for (i, p) in self.paths.iter_mut().enumerate() {
            let Some(pipes) = p.pipes.as_mut() else { continue };
            let id = PathId(i as u8);
            for (dir, pipe) in pipes.iter_mut().enumerate() {
                let tx = if dir == 0 { &mut self.relay } else { &mut self.proxy };
                let unsent = pipe.unsent_bytes();
                tx.set_kernel_unsent(id, unsent);
                if unsent >= kernel {
                    continue;
                }
                buf.clear();
                if tx.poll_transmit(id, at, &mut buf, (kernel - unsent) as usize) > 0 {
                    pipe.push(&buf, now);
                    tx.set_kernel_unsent(id, pipe.unsent_bytes());
                    progress = true;
                }
            }
        }
        self.wire_buf = buf;
        progress
    }

    fn serialize(&mut self) -> bool {
        let now = self.now;
        let mut progress = false;
        for p in &mut self.paths {
            for pipe in p.pipes.iter_mut().flatten() {
                progress |= pipe.serialize_due(now) > 0;
            }
        }
        if progress {
            // Real shells see notsent fall as the kernel sends.
            for (i, p) in self.paths.iter().enumerate() {
                if let Some([up, down]) = &p.pipes {
                    self.relay.set_kernel_unsent(PathId(i as u8), up.unsent_bytes());
                    self.proxy.set_kernel_unsent(PathId(i as u8), down.unsent_bytes());
                }
            }
        }
        progress
    }

    // ----- the application ----------------------------------------------

    fn open_now(&mut self, k: usize) {
        let at = self.at();
        let c = &mut self.conns[k];
        let dst = SocketAddr::from((Ipv4Addr::new(192, 0, 2, 80), 80));
        match self.relay.open(user_id(c.spec.user), dst, at) {
            Ok(id) => {
                c.id = Some(id);
                c.opened_at = Some(self.now);
                self.by_id.insert(id, k);
            }
            Err(e) => self.app_errors.push(format!("open #{k}: {e}")),
        }
    }

    fn run_apps(&mut self) -> bool {
        let mut progress = false;
        for side in [Side::Relay, Side::Proxy] {
            loop {
                let ev = match side {
                    Side::Relay => self.relay.poll_event(),
                    Side::Proxy => self.proxy.poll_event(),
                };
                let Some(ev) = ev else { break };
                progress = true;
                self.on_event(side, ev);
            }
        }
        progress |= self.read_all();
        progress |= self.write_all();
        progress
    }

    fn on_event(&mut self, side: Side, ev: Event) {
        let idx = |h: &Self, c: &ConnId| h.by_id.get(c).copied();
        match ev {
            Event::ConnOpened { conn, .. } => match idx(self, &conn) {
                Some(k) if !self.conns[k].accepted => self.conns[k].accepted = true,
                Some(_) => self.app_errors.push(format!("{conn} opened twice at the proxy")),
                None => self.app_errors.push(format!("the proxy got {conn}, which the relay never opened")),
            },
            Event::Readable(conn) => {
                self.readable[side.idx()].insert(conn);
            }
            Event::ConnReset { conn, code } => {
                if let Some(k) = idx(self, &conn) {
                    self.conns[k].reset = true;
                }
                self.app_errors.push(format!("{side:?}: {conn} reset with code {code}"));
            }
            Event::ConnClosed(conn) => match idx(self, &conn) {
                Some(k) => self.conns[k].closed[side.idx()] = true,
                None => self.app_errors.push(format!("{side:?}: unknown {conn} closed")),
            },
            Event::PathDead(p) => self.close_and_reconnect(p.index(), PathChange::Dead(side)),
            Event::Writable(_)
            | Event::PathStatus { .. }
            | Event::Telemetry { .. }
            | Event::TelemetryDuplicate { .. }
            | Event::TelemetryAcked { .. } => {}
        }
    }

    fn read_all(&mut self) -> bool {
        let mut progress = false;
        for side in [Side::Relay, Side::Proxy] {
            let ready: Vec<ConnId> = self.readable[side.idx()].iter().copied().collect();
            for cid in ready {
                progress |= self.read_conn(side, cid);
            }
        }
        progress
    }

    fn read_conn(&mut self, side: Side, cid: ConnId) -> bool {
        let (now, s, instant) = (self.now, side.idx(), self.at());
        let Harness {
            relay,
            proxy,
            conns,
            by_id,
            readers,
            readable,
            wake_at,
            actions,
            action_seq,
            io_buf,
            expect_buf,
            app_errors,
            ..
        } = self;
        let Some(&k) = by_id.get(&cid) else {
            readable[s].remove(&cid);
            return false;
        };
        let (ep, stream) = match side {
            Side::Relay => (relay, &mut conns[k].down),
            Side::Proxy => (proxy, &mut conns[k].up),
        };
        let mut progress = false;
        loop {
            if stream.fin {
                readable[s].remove(&cid);
                return progress;
            }
            let budget = readers[s].budget(now).min(io_buf.len());
            if budget == 0 {
                // Stay readable; come back when the reader has appetite.
                let t = readers[s].refill_at(now);
                if wake_at.is_none_or(|w| w > t) {
                    *wake_at = Some(t);
                    *action_seq += 1;
                    actions.insert((t, *action_seq), Action::Wake);
                }
                return progress;
            }
            match ep.recv(cid, &mut io_buf[..budget], instant) {
                Ok(Recv::Data(n)) => {
                    readers[s].spend(n);
                    stream.check(&io_buf[..n], expect_buf);
                    progress = true;
                }
                Ok(Recv::Fin) => {
                    stream.fin = true;
                    stream.done_at = Some(now);
                    progress = true;
                }
                Ok(Recv::Blocked) => {
                    readable[s].remove(&cid);
                    return progress;
                }
                Err(e) => {
                    app_errors.push(format!("{side:?}: reading {cid}: {e}"));
                    readable[s].remove(&cid);
                    return progress;
                }
            }
        }
    }

    fn write_all(&mut self) -> bool {
        let at = self.at();
        let Harness { relay, proxy, conns, io_buf, app_errors, .. } = self;
        let mut progress = false;
        for c in conns.iter_mut() {
            let Some(id) = c.id else { continue };
            if c.reset {
                continue;
            }
            if !c.up.finished {
                progress |= write_stream(relay, id, &mut c.up, io_buf, at, app_errors);
            }
            if c.accepted && !c.down.finished && (!c.spec.respond_after_upload || c.up.fin) {
                progress |= write_stream(proxy, id, &mut c.down, io_buf, at, app_errors);
            }
        }
        progress
    }
}

/// Write as much of `s` as the send buffer takes, offering a whole buffer
/// as an application does (a partial write marks the writer blocked, as in
/// the shells); finish once all is in.
fn write_stream(
    ep: &mut Endpoint,
    id: ConnId,
    s: &mut StreamState,
    buf: &mut [u8],
    at: Instant,
    errors: &mut Vec<String>,
) -> bool {
    let mut progress = false;
    while s.written < s.total {
        let n = buf.len().min((s.total - s.written) as usize);
        // Only the bytes `send` can take need content (filling the whole
        // buffer on every blocked attempt made the tests ten times slower).
        let k = ep.send_room(id).min(n);
        fill_content(s.key, s.written, &mut buf[..k]);
        match ep.send(id, &buf[..n], at) {
            Ok(0) => return progress,
            Ok(m) => {
                debug_assert!(m <= k, "send took more than send_room said");
                s.written += m as u64;
                progress = true;
                if m < n {
                    return progress;
                }
            }
            Err(e) => {
                errors.push(format!("{:?}: writing {id}: {e}", ep.role()));
                s.finished = true;
                return progress;
            }
        }
    }
    if let Err(e) = ep.finish(id, at) {
        errors.push(format!("{:?}: finishing {id}: {e}", ep.role()));
    }
    s.finished = true;
    true
}
