//! The endpoint: one side of a relay–proxy session, as a pure state machine.
//!
//! The shell feeds it bytes read from each subflow ([`Endpoint::handle_input`]),
//! asks it for bytes to write ([`Endpoint::poll_transmit`]), tells it when a
//! subflow comes up or goes down, and drives its timers
//! ([`Endpoint::poll_timeout`] / [`Endpoint::handle_timeout`]). Passenger
//! connections are opened, written, read, finished and reset through it;
//! what happened is reported by [`Endpoint::poll_event`]. Time is always a
//! parameter: nothing here reads a clock, sleeps or touches a socket.
//!
//! Call order in a shell: after any call that changes state, drain
//! `poll_event`, then call `poll_transmit` for every path whose socket can
//! take bytes, then re-arm the timer from `poll_timeout`.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::budget::{MemoryBudget, Pressure};
use crate::conn::{AckError, Conn, ConnState, RecvError, SendLimits, WindowLimits, INITIAL_MAX_DATA};
use crate::ctrl::{CtrlQueue, CTRL_MAX, CTRL_PAUSE};
use crate::ids::{ConnId, PathId, PathMask, UserId, MAX_PATHS};
use crate::path::{Availability, FailureForecast, Path, PathConfig, PathStats, PathView, SegmentRef, SentRecord};
use crate::sched::users::UserScheduler;
use crate::sched::{Context, FailureTable, HeadContext, PacketInfo, Pipeline, Reinject, TailContext, TrainState};
use crate::trace::{self, CopyKind, RequeueCause, TraceEvent, TraceRecord, Tracer};
use crate::wire::{self, Frame, FrameDecoder, LinkState, WireError};

/// Which end of the session this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// On the train: opens connections for passengers.
    Relay,
    /// In the cloud: accepts them and connects upstream.
    Proxy,
}

/// Tunables of an endpoint. Defaults suit a train with a few cellular
/// carriers; every value is documented in the shells' `--help`.
#[derive(Clone, Debug)]
pub struct EndpointConfig {
    pub role: Role,
    /// Largest passenger payload per DATA frame (one "packet" of the
    /// scheduler). 16 KiB minus the frame header fits one TLS record.
    pub segment_bytes: u32,
    /// Most bytes one connection may hold on its send side (unsent plus
    /// sent and unacknowledged).
    pub conn_send_buffer_bytes: u64,
    /// Floor of the not-sent low-water mark: unsent bytes a connection may
    /// always hold, whatever the budget; above it, about two round trips
    /// of the connection's delivery rate.
    pub conn_unsent_min_bytes: u64,
    /// The not-sent low-water mark of a new connection, before its rate is
    /// measured (bytes above the floor are charged to the budget). Large
    /// enough for a short response to be in the buffer whole, so the
    /// scheduler knows where it ends and keeps its tail off a path whose
    /// packets would arrive after the faster one had delivered it all.
    pub conn_unsent_initial_bytes: u64,
    /// Receive window per connection (the most bytes a peer may send beyond
    /// what the passenger has read): where autotuning starts, its cap, and
    /// the least memory pressure shrinks it to. Equal initial and max fix
    /// the window (no autotuning).
    pub conn_window_initial_bytes: u64,
    pub conn_window_max_bytes: u64,
    pub conn_window_min_bytes: u64,
    /// Memory shared by every connection's send buffer and receive window
    /// (see [`crate::budget`]); clones share one account.
    pub budget: MemoryBudget,
    /// Memory the shells hold for each connection beyond its buffers here
    /// (sockets, task, the copy buffers between the stream and the
    /// passenger's or server's socket), charged to the budget for the
    /// connection's whole life.
    pub conn_overhead_bytes: u64,
    /// A hard budget: a new connection reserves its overhead and both
    /// floors (minimum window, not-sent floor) when it opens, and is
    /// refused ([`RESET_OVERLOADED`]) when they do not fit under the
    /// budget's `high` level, so the account never passes it. Otherwise
    /// floors are granted whatever the level (and never refused).
    pub hard_budget: bool,
    pub path: PathConfig,
    /// Time constant of the proportional-fair user scheduler.
    pub user_fairness_tau: Duration,
    /// A keepalive PING goes out on a path idle this long.
    pub ping_interval: Duration,
    /// A path with data in flight that hears nothing this long is reported
    /// dead ([`Event::PathDead`]); the shell then closes and reconnects it.
    pub dead_after: Duration,
    /// A train position ([`Endpoint::set_train_state`]) is extrapolated at
    /// its speed for at most this long; older, no handover failure is
    /// predicted.
    pub train_state_max_age: Duration,
    /// Most connections at once (the proxy: one train's; the relay: all
    /// its passengers'). Beyond it the relay refuses [`Endpoint::open`] and
    /// the proxy answers an `OPEN` with a `RESET` ([`RESET_REFUSED_LIMIT`]).
    pub max_conns: usize,
    /// Most connections of one passenger at once, so one passenger cannot
    /// take every slot.
    pub max_conns_per_user: usize,
}

/// `RESET` code of a connection refused because a connection cap was
/// reached ([`EndpointConfig::max_conns`], `max_conns_per_user`).
pub const RESET_REFUSED_LIMIT: u32 = 4;

/// `RESET` code of a connection refused because the endpoint cannot take
/// it now: its memory budget has no room for the connection's reservation
/// ([`EndpointConfig::hard_budget`]), or the shell's event queue is full.
pub const RESET_OVERLOADED: u32 = 5;

/// How long a RESET sent is sent again when a path goes down, and how many
/// are kept for it: longer than a subflow takes to be declared dead and
/// replaced, bounded so a burst of resets costs little memory.
const RESET_RESEND_WINDOW: Duration = Duration::from_secs(60);
const RESET_RESEND_MAX: usize = 1024;

/// Default per-connection cap of the receive window and of the send buffer.
pub const DEFAULT_CONN_BUFFER_MAX: u64 = 8 * 1024 * 1024;
/// Default memory budget of a relay-agent (one train).
pub const DEFAULT_RELAY_BUDGET: u64 = 64 * 1024 * 1024;
/// Default memory budget of a proxy (one train; half the chart's pod memory limit).
pub const DEFAULT_PROXY_BUDGET: u64 = 256 * 1024 * 1024;

/// How often, at most, windows are shrunk under memory pressure.
const RECLAIM_INTERVAL: Duration = Duration::from_millis(100);

impl EndpointConfig {
    pub fn send_limits(&self) -> SendLimits {
        SendLimits {
            cap: self.conn_send_buffer_bytes,
            min_unsent: self.conn_unsent_min_bytes,
            initial_unsent: self.conn_unsent_initial_bytes,
        }
    }

    pub fn window_limits(&self) -> WindowLimits {
        WindowLimits {
            initial: self.conn_window_initial_bytes,
            max: self.conn_window_max_bytes,
            min: self.conn_window_min_bytes,
        }
    }

    /// Fix every connection's receive window at `bytes` (no autotuning).
    pub fn set_fixed_window(&mut self, bytes: u64) {
        self.conn_window_initial_bytes = bytes;
        self.conn_window_max_bytes = bytes;
        self.conn_window_min_bytes = bytes.min(INITIAL_MAX_DATA);
    }

    pub fn new(role: Role) -> Self {
        EndpointConfig {
            role,
            segment_bytes: 16 * 1024 - wire::DATA_OVERHEAD as u32,
            conn_send_buffer_bytes: DEFAULT_CONN_BUFFER_MAX,
            conn_unsent_min_bytes: 128 * 1024,
            // The peer's initial receive window: no more could be sent
            // before a window update anyway.
            conn_unsent_initial_bytes: 1024 * 1024,
            // A short download finishes within the first few round trips,
            // before autotuning could double a smaller window (measured:
            // docs/results.md, "diagnostic E"). 2 MiB helped 4 MB downloads
            // over a strong and a weak carrier in virtual time but not on
            // the emulated railway (docs/results.md, "The receive
            // window's start and growth on the railway"), so 1 MiB stays.
            // The budget grants it only below its low level, so many
            // connections start small.
            conn_window_initial_bytes: 1024 * 1024,
            conn_window_max_bytes: DEFAULT_CONN_BUFFER_MAX,
            conn_window_min_bytes: INITIAL_MAX_DATA,
            budget: MemoryBudget::with_high(DEFAULT_RELAY_BUDGET),
            conn_overhead_bytes: 0,
            hard_budget: false,
            path: PathConfig::default(),
            user_fairness_tau: Duration::from_secs(1),
            ping_interval: Duration::from_secs(1),
            dead_after: Duration::from_secs(10),
            train_state_max_age: Duration::from_secs(30),
            max_conns: 16_384,
            // A browser keeps tens of connections; the proxy leaves the
            // per-passenger cap to the relay (its connections outlive the
            // relay's by a round trip, so the same cap could refuse a
            // passenger the relay admitted).
            max_conns_per_user: match role {
                Role::Relay => 1024,
                Role::Proxy => usize::MAX,
            },
        }
    }
}

/// What a write of `want` bytes costs the budget: `forced`, charged whatever
/// the level (a soft budget's floor), and `beyond`, granted only as far as
/// the budget has room. Costs count the send buffer's capacity, not only
/// its bytes.
struct SendPlan {
    want: usize,
    under_floor: usize,
    /// What the send side counts for now.
    now_part: u64,
    forced: u64,
    beyond: u64,
}

impl SendPlan {
    /// Bytes accepted with `got` of `beyond` granted, and whether the
    /// buffer must grow only as far as they need (no doubling).
    fn accepted(&self, c: &Conn, got: u64) -> (usize, bool) {
        if got >= self.beyond {
            return (self.want, false);
        }
        let n = self.want.min(c.send.room_within(self.now_part + self.forced + got)).max(self.under_floor);
        (n, true)
    }
}

/// What happened, for the shell to act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The relay opened a connection (proxy side): connect to `dst`.
    ConnOpened { conn: ConnId, user: UserId, dst: SocketAddr },
    /// Data (or the end of the stream) can be read.
    Readable(ConnId),
    /// Send-buffer space was freed.
    Writable(ConnId),
    /// The peer reset the connection.
    ConnReset { conn: ConnId, code: u32 },
    /// Both directions completed; the connection is gone.
    ConnClosed(ConnId),
    /// A radio interface reported a new state or cell (proxy side).
    PathStatus { path: PathId, state: LinkState, cell: u64 },
    /// A telemetry record arrived (proxy side), once per `seq`.
    Telemetry { seq: u64, payload: Bytes },
    /// Another copy of a telemetry record already delivered as
    /// [`Event::Telemetry`] (or one older than the de-duplication window)
    /// arrived (proxy side): a copy from a slower path, or the relay sending
    /// it again because no acknowledgement reached it. The shell acknowledges
    /// it again if its sink has the record (else the relay would resend it
    /// forever), ignores it while the sink is still storing it, and stores it
    /// (payload included) if an earlier attempt failed or was forgotten.
    TelemetryDuplicate { seq: u64, payload: Bytes },
    /// The peer stored telemetry record `seq` (relay side); one record per
    /// acknowledgement, in any order.
    TelemetryAcked { seq: u64 },
    /// A path has had data in flight and heard nothing for `dead_after`.
    PathDead(PathId),
}

/// Errors of calls on a connection.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    #[error("connection {0} does not exist (closed or never opened)")]
    UnknownConn(ConnId),
    #[error("connection {0} was reset by the peer")]
    Reset(ConnId),
    #[error("only the relay-agent opens connections")]
    WrongRole,
    #[error("connection refused: {0} connections at once is the cap")]
    TooManyConns(usize),
    #[error("connection refused: the memory budget has no room for another connection")]
    NoMemory,
    #[error("a telemetry record of {0} bytes is larger than a frame carries ({max} bytes)", max = wire::MAX_TELEMETRY_PAYLOAD)]
    TelemetryTooLarge(usize),
}

/// A subflow broke the protocol; the shell closes that subflow (the others
/// and every connection carry on).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    #[error("path {0}: {1}")]
    Wire(PathId, WireError),
    #[error("path {0}: peer acknowledged {1} bytes but only {2} were sent")]
    BadPathAck(PathId, u64, u64),
    #[error("path {0}: connection {1}: {2}")]
    Stream(PathId, ConnId, RecvError),
    #[error("path {0}: connection {1}: {2}")]
    Ack(PathId, ConnId, AckError),
    #[error("path {0}: unexpected {1} frame")]
    Unexpected(PathId, &'static str),
    #[error("path {0} is not up")]
    PathNotUp(PathId),
}

/// Result of [`Endpoint::recv`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recv {
    /// This many bytes were copied.
    Data(usize),
    /// The peer finished its direction and everything was read.
    Fin,
    /// Nothing to read now; wait for [`Event::Readable`].
    Blocked,
}

/// Endpoint-wide counters (plain data; shells export them).
#[derive(Clone, Debug, Default)]
pub struct EndpointStats {
    pub conns_opened: u64,
    pub conns_closed: u64,
    pub conns_reset: u64,
    /// Connections refused because a cap was reached (relay: `open`
    /// refused; proxy: `OPEN` answered with a `RESET`).
    pub conns_refused: u64,
    pub decisions: u64,
    pub reinjected_bytes: u64,
    pub redundant_bytes: u64,
    pub duplicate_bytes_received: u64,
    pub telemetry_received: u64,
    pub protocol_errors: u64,
    /// Subflows established ([`Endpoint::path_up`] calls): a change tells a
    /// shell that a path came (back) up, however briefly it was down.
    pub paths_up: u64,
    /// Receive windows grown by autotuning, and the bytes they grew by.
    pub window_growths: u64,
    pub window_growth_bytes: u64,
    /// Time connections' new data waited only for the peer's window, summed
    /// over closed connections (open ones: [`Endpoint::flow_stats`]).
    pub window_limited_us: u64,
    /// Time passengers' writes waited for send room, summed over closed
    /// connections (open ones: [`Endpoint::flow_stats`]).
    pub send_limited_us: u64,
    /// Window heads sent again for head-of-line recovery (`opp-reinject`).
    pub head_reinjections: u64,
    /// Segments of a flow's tail sent again from a slow path (`tail-reinject`).
    pub tail_reinjections: u64,
    /// Paths that became stale (no acknowledgement progress, or no service).
    pub stale_transitions: u64,
    /// Head-of-line stalls that ended ([`crate::conn::RecvStream::note_hol`]):
    /// all of them, those that lasted at least [`HOL_STALL_LONG`] and
    /// [`HOL_STALL_VERY_LONG`], and their summed length.
    pub hol_stalls: u64,
    pub hol_stalls_long: u64,
    pub hol_stalls_very_long: u64,
    pub hol_stall_us: u64,
    /// Paths declared dead because their control queue reached
    /// [`crate::ctrl::CTRL_MAX`] frames (a peer that does not read them).
    pub ctrl_overflows: u64,
    /// Reads after which a path's control queue held [`crate::ctrl::CTRL_PAUSE`]
    /// frames, so the shell stopped reading it until the writer drained it.
    pub input_pauses: u64,
}

/// Proxy: connection ids remembered above the lowest one whose OPEN has not
/// arrived; a gap further back than this is given up (its OPEN is not
/// coming: the relay has opened this many connections since).
pub const OPENED_WINDOW: usize = 65_536;

/// A head-of-line stall this long is counted as long: above the RTT
/// difference of two healthy cellular carriers, so a path went slow or
/// dark under the connection's head.
pub const HOL_STALL_LONG: Duration = Duration::from_millis(200);
/// A stall this long is what a passenger notices.
pub const HOL_STALL_VERY_LONG: Duration = Duration::from_secs(1);

/// What the endpoint's connections hold now (plain data; shells export it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlowStats {
    /// Sum and largest of the connections' receive windows.
    pub window_sum_bytes: u64,
    pub window_max_bytes: u64,
    /// Bytes held out of order (above a gap) in receive buffers.
    pub out_of_order_bytes: u64,
    /// Send side: bytes written and not yet placed, and placed and not yet
    /// acknowledged.
    pub unsent_bytes: u64,
    pub in_flight_bytes: u64,
    /// Time new data waited only for the peer's window, over all
    /// connections ever (closed ones included), counting waits once they
    /// end.
    pub window_limited_us: u64,
    /// Time passengers' writes waited for send room (the not-sent low-water
    /// mark, the connection's cap or the memory budget), the same way.
    pub send_limited_us: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Copy {
    First,
    Redundant,
    Reinjection,
}

#[derive(Debug)]
struct Queued {
    seg: SegmentRef,
    len: u32,
    fin: bool,
    copy: Copy,
}

#[derive(Debug)]
struct Slot {
    path: Path,
    decoder: FrameDecoder,
    ctrl: CtrlQueue,
    data: VecDeque<Queued>,
}

/// One side of a session.
pub struct Endpoint {
    cfg: EndpointConfig,
    pipeline: Pipeline,
    epoch: Instant,
    slots: Vec<Option<Slot>>,
    conns: HashMap<ConnId, Conn>,
    /// Live connections per passenger (for `max_conns_per_user`).
    user_conns: HashMap<UserId, usize>,
    next_conn: u32,
    /// Proxy: every connection id below this was opened (or reset before
    /// its OPEN came); ids above it that were. Ids are unwrapped to 64 bits
    /// (the wire's 32 wrap after 2^32 connections; see [`Self::unwrap_conn`]).
    opened_floor: u64,
    opened_above: BTreeSet<u64>,
    users: UserScheduler,
    events: VecDeque<Event>,
    /// Connections with a data-level ACK or WINDOW to send.
    ack_queue: VecDeque<ConnId>,
    telemetry_floor: u64,
    telemetry_seen: BTreeSet<u64>,
    next_ping: u64,
    stats: EndpointStats,
    views: Vec<PathView>,
    acked_scratch: Vec<SentRecord>,
    /// RESETs made while no path was up, for the first path to come up; at
    /// most [`RESET_RESEND_MAX`], oldest dropped first, so connections reset
    /// during a long outage cannot grow it, or flood that path's control
    /// queue when it comes up (a peer that misses a RESET ends that
    /// connection at its own idle timeout).
    orphan_resets: VecDeque<Frame>,
    /// RESETs sent in the last [`RESET_RESEND_WINDOW`] (at most
    /// [`RESET_RESEND_MAX`]), oldest first. Control frames are not
    /// acknowledged: a RESET written on subflows that all die before
    /// delivering it would leave the peer holding the connection for good,
    /// so a path going down sends them again on the others (a RESET is
    /// idempotent at the receiver).
    recent_resets: VecDeque<(Instant, Frame)>,
    /// Handover-failure prediction inputs (POLYCORN §3, §4.3).
    train: Option<TrainState>,
    failure_table: Option<FailureTable>,
    /// Sequence number of the last `PATH_STATUS` sent.
    path_status_seq: u32,
    /// Per path, the sequence number of the newest `PATH_STATUS` received.
    path_status_last: [Option<u32>; MAX_PATHS],
    /// Last time windows were shrunk under memory pressure.
    last_reclaim: Option<Instant>,
    /// The opt-in segment trace ([`Self::enable_trace`]).
    trace: Option<Tracer>,
}

impl Drop for Endpoint {
    /// A proxy's budget outlives its sessions: give back what this one held.
    fn drop(&mut self) {
        let held: u64 = self.conns.values().map(|c| c.charged).sum();
        self.cfg.budget.release(held);
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("role", &self.cfg.role)
            .field("pipeline", &self.pipeline)
            .field("conns", &self.conns.len())
            .finish_non_exhaustive()
    }
}

fn data_frame_len(len: u32) -> u64 {
    wire::DATA_OVERHEAD as u64 + u64::from(len)
}

impl Endpoint {
    /// An endpoint scheduling with `pipeline`; a stale threshold the
    /// pipeline sets (the `stale-filter`'s parameters) replaces `cfg.path`'s.
    pub fn new(mut cfg: EndpointConfig, pipeline: Pipeline, now: Instant) -> Self {
        if let Some(t) = pipeline.stale_threshold() {
            cfg.path.set_stale_threshold(t);
        }
        Endpoint {
            users: UserScheduler::new(cfg.user_fairness_tau),
            cfg,
            pipeline,
            epoch: now,
            slots: (0..MAX_PATHS).map(|_| None).collect(),
            conns: HashMap::new(),
            user_conns: HashMap::new(),
            next_conn: 1,
            opened_floor: 1,
            opened_above: BTreeSet::new(),
            events: VecDeque::new(),
            ack_queue: VecDeque::new(),
            telemetry_floor: 0,
            telemetry_seen: BTreeSet::new(),
            next_ping: 0,
            stats: EndpointStats::default(),
            views: Vec::with_capacity(MAX_PATHS),
            acked_scratch: Vec::new(),
            orphan_resets: VecDeque::new(),
            recent_resets: VecDeque::new(),
            train: None,
            failure_table: None,
            path_status_seq: 0,
            path_status_last: [None; MAX_PATHS],
            last_reclaim: None,
            trace: None,
        }
    }

    pub fn role(&self) -> Role {
        self.cfg.role
    }

    pub fn config(&self) -> &EndpointConfig {
        &self.cfg
    }

    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// Start recording a segment trace ([`crate::trace`]): at most
    /// `capacity` records wait for [`Self::poll_trace`], later ones are
    /// dropped and counted.
    pub fn enable_trace(&mut self, capacity: usize) {
        self.trace = Some(Tracer::new(capacity));
    }

    /// Stop recording; records not yet taken are dropped.
    pub fn disable_trace(&mut self) {
        self.trace = None;
    }

    /// The oldest trace record not yet taken; `None` when tracing is off or
    /// nothing is waiting.
    pub fn poll_trace(&mut self) -> Option<TraceRecord> {
        self.trace.as_mut().and_then(Tracer::pop)
    }

    /// Trace records dropped because the shell did not drain them in time.
    pub fn trace_dropped(&self) -> u64 {
        self.trace.as_ref().map_or(0, Tracer::dropped)
    }

    // ----- paths -------------------------------------------------------

    /// A subflow for `path` is established (after the HELLO exchange).
    pub fn path_up(&mut self, path: PathId, now: Instant) {
        let cfg = self.cfg.path.clone();
        let slot = self.slots[path.index()].get_or_insert_with(|| Slot {
            path: Path::new(path, cfg, now),
            decoder: FrameDecoder::new(),
            ctrl: CtrlQueue::default(),
            data: VecDeque::new(),
        });
        slot.path.reset_transport(now);
        slot.decoder = FrameDecoder::new();
        slot.ctrl.clear();
        slot.data.clear();
        slot.path.up = true;
        slot.path.stats.state_changes += 1;
        self.stats.paths_up += 1;
        trace::record(&mut self.trace, now, TraceEvent::PathUp { path });
        // Connections whose OPEN no copy has confirmed yet are announced on
        // the new path too, before any of their data can be placed on it.
        let mut unconfirmed: Vec<&Conn> = self.conns.values().filter(|c| c.open_unconfirmed).collect();
        unconfirmed.sort_by_key(|c| c.id);
        for c in unconfirmed {
            slot.ctrl.push_back(Frame::Open { conn: c.id, user: c.user, dst: c.dst });
            slot.ctrl.push_back(Frame::Window { conn: c.id, max_data: c.recv.advertised() });
        }
        slot.ctrl.extend(self.orphan_resets.drain(..));
    }

    /// The subflow for `path` is gone. Everything it had not delivered goes
    /// back to its connections' send buffers, to be sent on other paths.
    pub fn path_down(&mut self, path: PathId, now: Instant) {
        let Some(slot) = self.slots[path.index()].as_mut() else { return };
        if !slot.path.up {
            return;
        }
        slot.path.up = false;
        slot.path.stats.state_changes += 1;
        trace::record(&mut self.trace, now, TraceEvent::PathDown { path });
        let lost_frames = !slot.path.sent.is_empty();
        let segs: Vec<SegmentRef> = slot.path.unacked_segments().collect();
        slot.ctrl.clear();
        // What was queued and not written goes back as on a stale path.
        self.drain_queue(path.index(), now);
        let slot = self.slots[path.index()].as_mut().expect("checked above");
        slot.path.reset_transport(now);
        let mask = PathMask::single(path);
        for s in segs {
            if let Some(c) = self.conns.get_mut(&s.conn) {
                // The copy on this path is lost with the subflow, so this
                // path may carry the segment again once it is back.
                c.send.forget_paths(s.offset, mask);
                if c.send.requeue(s.offset).is_some() {
                    self.users.activate(c.user, c.id, now);
                    let ev =
                        TraceEvent::Requeued { path, conn: s.conn, offset: s.offset, cause: RequeueCause::PathDown };
                    trace::record(&mut self.trace, now, ev);
                }
            }
        }
        // ACK and WINDOW frames go out once, on one path, so any the lost
        // subflow had not delivered are gone. A lost WINDOW deadlocks its
        // connection when the reader has already read everything: the peer
        // waits for credit this side believes it gave. Both frames are
        // idempotent, so re-announce every connection's state elsewhere.
        if lost_frames {
            self.reannounce_flow_state();
        }
        self.resend_resets(now);
    }

    /// Queue every connection's data-level ACK and WINDOW again (both are
    /// idempotent), for when those sent on one path may never arrive.
    fn reannounce_flow_state(&mut self) {
        let mut ids: Vec<ConnId> = self.conns.keys().copied().collect();
        ids.sort_unstable(); // deterministic frame order
        for id in ids {
            let c = self.conns.get_mut(&id).expect("listed above");
            if !c.ack_pending && c.window_pending.is_none() {
                self.ack_queue.push_back(id);
            }
            c.ack_pending = true;
            c.window_pending = Some(c.recv.advertised());
        }
    }

    /// Whether `path` is up.
    pub fn is_path_up(&self, path: PathId) -> bool {
        self.slots[path.index()].as_ref().is_some_and(|s| s.path.up)
    }

    /// Paths that are up, in id order.
    pub fn up_paths(&self) -> Vec<PathId> {
        self.slots.iter().flatten().filter(|s| s.path.up).map(|s| s.path.id).collect()
    }

    pub fn path_view(&self, path: PathId, now: Instant) -> Option<PathView> {
        self.slots[path.index()].as_ref().map(|s| self.view_of(&s.path, now))
    }

    /// A path's view with its handover-failure forecast.
    fn view_of(&self, p: &Path, now: Instant) -> PathView {
        let mut v = p.view(now);
        v.failure = self.forecast(p, now);
        v
    }

    /// Where the train is relative to the predicted failure location of the
    /// path's current cell, if anything is predicted.
    fn forecast(&self, p: &Path, now: Instant) -> Option<FailureForecast> {
        let train = self.train.as_ref()?;
        let table = self.failure_table.as_ref()?;
        if p.cell == 0 || now.saturating_duration_since(train.at) > self.cfg.train_state_max_age {
            return None;
        }
        let distance_m = table.distance_to_failure(p.cell, train.direction, train.position_at(now))?;
        Some(FailureForecast { distance_m, speed_mps: train.speed_mps })
    }

    /// Handover-failure prediction (POLYCORN §4.3): where the train is.
    /// The relay-agent's shell calls this with every GPS fix; the proxy's
    /// with every position the relay-agent reports in telemetry, `at`
    /// converted to the proxy's clock (the arrival time minus the path's
    /// one-way delay is close enough). Positions are extrapolated at
    /// `speed_mps` for up to [`EndpointConfig::train_state_max_age`].
    /// Paths' cells come from [`Self::report_link`] (relay) and
    /// `PATH_STATUS` (proxy).
    pub fn set_train_state(&mut self, state: TrainState) {
        self.train = Some(state);
    }

    pub fn train_state(&self) -> Option<TrainState> {
        self.train
    }

    /// Handover-failure prediction: the failure-location table (LinkDB),
    /// replacing any previous one. Without a table nothing is predicted.
    pub fn set_failure_table(&mut self, table: FailureTable) {
        self.failure_table = Some(table);
    }

    pub fn failure_table(&self) -> Option<&FailureTable> {
        self.failure_table.as_ref()
    }

    pub fn path_stats(&self, path: PathId) -> Option<&PathStats> {
        self.slots[path.index()].as_ref().map(|s| s.path.stats())
    }

    /// Unsent bytes the shell sees in the kernel socket of `path`; they
    /// count toward the path's send-buffer occupancy.
    pub fn set_kernel_unsent(&mut self, path: PathId, bytes: u64) {
        if let Some(s) = self.slots[path.index()].as_mut() {
            s.path.kernel_unsent_bytes = bytes;
        }
    }

    /// Relay side: a radio interface changed state or cell. Announced to the
    /// proxy on every live path, ahead of data.
    pub fn report_link(&mut self, path: PathId, state: LinkState, cell: u64) {
        if let Some(s) = self.slots[path.index()].as_mut() {
            s.path.link_state = state;
            s.path.cell = cell;
        }
        self.path_status_seq = self.path_status_seq.wrapping_add(1);
        self.broadcast_front(Frame::PathStatus { path, state, cell, seq: self.path_status_seq });
    }

    /// Relay side: send a telemetry record with top priority on every live
    /// path; the proxy keeps the first copy. A record larger than a frame
    /// carries ([`wire::MAX_TELEMETRY_PAYLOAD`]) is refused.
    pub fn send_telemetry(&mut self, seq: u64, payload: Bytes) -> Result<(), StreamError> {
        if payload.len() > wire::MAX_TELEMETRY_PAYLOAD {
            return Err(StreamError::TelemetryTooLarge(payload.len()));
        }
        self.broadcast_front(Frame::Telemetry { seq, payload });
        Ok(())
    }

    /// Proxy side: telemetry record `seq` is stored durably (acknowledges
    /// that one record, not the ones before it).
    pub fn ack_telemetry(&mut self, seq: u64) {
        self.broadcast_front(Frame::TelemetryAck { seq });
    }

    fn broadcast_front(&mut self, f: Frame) {
        for s in self.slots.iter_mut().flatten().filter(|s| s.path.up) {
            s.ctrl.push_front(f.clone());
        }
        self.check_ctrl_overflow();
    }

    fn broadcast(&mut self, f: Frame) {
        for s in self.slots.iter_mut().flatten().filter(|s| s.path.up) {
            s.ctrl.push_back(f.clone());
        }
        self.check_ctrl_overflow();
    }

    /// A path whose control queue reached [`CTRL_MAX`] frames is declared
    /// dead: its peer has not read it for that long while frames for it kept
    /// coming (from input on other paths, or answers to its own); taking it
    /// down empties the queue.
    fn check_ctrl_overflow(&mut self) {
        for s in self.slots.iter_mut().flatten() {
            if s.path.up && !s.path.dead_reported && s.ctrl.len() >= CTRL_MAX {
                s.path.dead_reported = true;
                self.stats.ctrl_overflows += 1;
                self.events.push_back(Event::PathDead(s.path.id));
            }
        }
    }

    /// Control frames queued on `path` (answers, announcements, resets).
    pub fn ctrl_backlog(&self, path: PathId) -> usize {
        self.slots[path.index()].as_ref().map_or(0, |s| s.ctrl.len())
    }

    /// Whether the shell should stop reading `path` until its writer has
    /// drained the control queue: it holds [`CTRL_PAUSE`] frames, so the
    /// peer is asking for answers faster than it reads them.
    pub fn input_paused(&self, path: PathId) -> bool {
        self.ctrl_backlog(path) >= CTRL_PAUSE
    }

    // ----- connections -------------------------------------------------

    /// Relay side: a passenger `user` connects to `dst`.
    pub fn open(&mut self, user: UserId, dst: SocketAddr, now: Instant) -> Result<ConnId, StreamError> {
        if self.cfg.role != Role::Relay {
            return Err(StreamError::WrongRole);
        }
        if let Some(cap) = self.over_cap(user) {
            self.stats.conns_refused += 1;
            return Err(StreamError::TooManyConns(cap));
        }
        // Ids wrap after 2^32 connections; one still live is skipped (a
        // session has at most a few thousand), and 0 is never used.
        let mut id = ConnId(self.next_conn);
        while id.0 == 0 || self.conns.contains_key(&id) {
            id = ConnId(id.0.wrapping_add(1));
        }
        let Some(mut c) = self.new_conn(id, user, dst) else {
            self.stats.conns_refused += 1;
            return Err(StreamError::NoMemory);
        };
        self.next_conn = id.0.wrapping_add(1).max(1);
        c.open_unconfirmed = true;
        self.broadcast(Frame::Open { conn: id, user, dst });
        // The receive window rides with every copy of the OPEN: the proxy
        // may send past the protocol's initial 64 KiB as soon as the first
        // OPEN arrives, not only when the path that happens to carry the
        // ack queue (perhaps the slowest) delivers the update.
        if let Some(limit) = c.recv.initial_window_update() {
            self.broadcast(Frame::Window { conn: id, max_data: limit });
            for path in self.up_paths() {
                trace::record(&mut self.trace, now, TraceEvent::WindowSent { path, conn: id, max_data: limit });
            }
        }
        self.insert_conn(c);
        self.stats.conns_opened += 1;
        Ok(id)
    }

    /// A new connection, its initial window charged to the budget: the
    /// configured initial window below the low level (half the budget, where
    /// windows grow freely), as much of it as fits under that level, else
    /// the minimum. Up to the pressure level, an initial window (a promise
    /// made before the connection showed any need) crowded out the send
    /// buffers: with 2 MiB windows (tried on the railway), 100 passengers' connections took the
    /// proxy's account to its pressure level at once, and the send floors
    /// charged on top went past the budget (the benchmark's ci profile).
    ///
    /// First the connection's reservation: the shells' overhead and the
    /// minimum window, plus the not-sent floor with a hard budget. A hard
    /// budget with no room for it under `high` refuses the connection
    /// (None); a soft one charges it whatever the level.
    fn new_conn(&mut self, id: ConnId, user: UserId, dst: SocketAddr) -> Option<Conn> {
        let mut c = Conn::new(id, user, dst, self.cfg.send_limits(), self.cfg.window_limits());
        c.overhead = self.cfg.conn_overhead_bytes;
        if self.cfg.hard_budget {
            c.send_reserved = self.cfg.send_limits().min_unsent.clamp(1, self.cfg.conn_send_buffer_bytes.max(1));
        }
        let budget = &self.cfg.budget;
        let floor = c.recv.limits().min;
        let extra = c.recv.window() - floor;
        c.recv.set_window(floor);
        let reservation = c.commitment();
        if self.cfg.hard_budget {
            if !budget.try_charge(reservation, budget.levels().high) {
                budget.note_denied();
                return None;
            }
        } else {
            budget.charge(reservation);
        }
        let got = if extra > 0 { budget.charge_up_to(extra, budget.levels().low) } else { 0 };
        if got < extra {
            budget.note_denied();
        }
        c.recv.set_window(floor + got);
        // The protocol's initial limit, already promised to the peer, counts
        // in the commitment whatever the window: a window grown within it
        // commits nothing more, so what it was charged beyond is given back.
        let now = c.commitment();
        debug_assert!(now <= reservation + got, "{now} > {reservation} + {got}");
        budget.release((reservation + got).saturating_sub(now));
        c.charged = now;
        Some(c)
    }

    /// Bring a connection's charge to the budget in line with what it holds
    /// and has promised (releases; growth is charged where it is granted).
    fn settle(budget: &MemoryBudget, c: &mut Conn) {
        let now = c.commitment();
        if now < c.charged {
            budget.release(c.charged - now);
        } else if now > c.charged {
            budget.charge(now - c.charged);
        }
        c.charged = now;
    }

    /// The cap a new connection of `user` would exceed, if any.
    fn over_cap(&self, user: UserId) -> Option<usize> {
        if self.conns.len() >= self.cfg.max_conns {
            return Some(self.cfg.max_conns);
        }
        let mine = self.user_conns.get(&user).copied().unwrap_or(0);
        (mine >= self.cfg.max_conns_per_user).then_some(self.cfg.max_conns_per_user)
    }

    fn insert_conn(&mut self, c: Conn) {
        *self.user_conns.entry(c.user).or_default() += 1;
        self.conns.insert(c.id, c);
    }

    /// Remove a connection and release what it held.
    fn remove_conn(&mut self, conn: ConnId) -> Option<Conn> {
        let c = self.conns.remove(&conn)?;
        if let std::collections::hash_map::Entry::Occupied(mut e) = self.user_conns.entry(c.user) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
        self.cfg.budget.release(c.charged);
        self.stats.window_limited_us += c.send.window_limited_noted().as_micros() as u64;
        self.stats.send_limited_us += c.send.send_limited_noted().as_micros() as u64;
        self.users.deactivate(c.user, conn);
        Some(c)
    }

    /// The largest smoothed RTT of the live paths: the round trip that
    /// autotuning measures over (MPTCP's RTT_max).
    pub fn rtt_max(&self) -> Duration {
        self.live_srtts().max().unwrap_or(self.cfg.path.initial_rtt)
    }

    /// The smallest smoothed RTT of the live paths: how often autotuning
    /// measures the read rate.
    pub fn rtt_min(&self) -> Duration {
        self.live_srtts().min().unwrap_or(self.cfg.path.initial_rtt)
    }

    /// The smoothed RTTs of the live paths.
    fn live_srtts(&self) -> impl Iterator<Item = Duration> + '_ {
        self.slots.iter().flatten().filter(|s| s.path.up).map(|s| s.path.srtt())
    }

    /// What this endpoint's connections have charged to the budget (equal
    /// to the budget's `used` when no other endpoint shares it).
    pub fn charged_total(&self) -> u64 {
        self.conns.values().map(|c| c.charged).sum()
    }

    /// The memory budget this endpoint charges.
    pub fn budget(&self) -> &MemoryBudget {
        &self.cfg.budget
    }

    /// What the connections hold now.
    pub fn flow_stats(&self) -> FlowStats {
        let mut f = FlowStats {
            window_limited_us: self.stats.window_limited_us,
            send_limited_us: self.stats.send_limited_us,
            ..FlowStats::default()
        };
        for c in self.conns.values() {
            f.window_sum_bytes += c.recv.window();
            f.window_max_bytes = f.window_max_bytes.max(c.recv.window());
            f.out_of_order_bytes += c.recv.out_of_order_bytes();
            f.unsent_bytes += c.send.unsent();
            f.in_flight_bytes += c.send.in_flight();
            // Only finished waits: a counter must never go back when a
            // connection that is waiting now closes.
            f.window_limited_us += c.send.window_limited_noted().as_micros() as u64;
            f.send_limited_us += c.send.send_limited_noted().as_micros() as u64;
        }
        f
    }

    /// Autotuning: grow `conn`'s receive window toward what it asks for, as
    /// far as the budget allows (see [`crate::budget`]); under pressure,
    /// shrink windows instead.
    fn tune_window(&mut self, conn: ConnId, now: Instant) {
        let rtt_max = self.rtt_max();
        let rtt_min = self.rtt_min();
        let n = self.conns.len() as u64;
        let Some(c) = self.conns.get_mut(&conn) else { return };
        let Some(want) = c.recv.wanted_window(now, rtt_min, rtt_max) else { return };
        let budget = &self.cfg.budget;
        let levels = budget.levels();
        let cur = c.recv.window();
        let target = match budget.pressure() {
            Pressure::Free => want,
            Pressure::Moderate => want.min(cur.max(levels.pressure / n.max(1))),
            Pressure::Pressure | Pressure::High => cur,
        };
        // A hard budget keeps its upper half for reservations ([`Self::grant_limit`]).
        let limit = if self.cfg.hard_budget { levels.low } else { levels.pressure };
        let got = if target > cur { budget.charge_up_to(target - cur, limit) } else { 0 };
        if got < want - cur {
            budget.note_denied();
        }
        if got > 0 {
            // Charged above; `settle` gives back what an outstanding larger
            // advertisement already covered.
            c.charged += got;
            c.recv.set_window(cur + got);
            Self::settle(budget, c);
            self.stats.window_growths += 1;
            self.stats.window_growth_bytes += got;
            if let Some(limit) = c.recv.window_update() {
                let queued = c.window_pending.is_some() || c.ack_pending;
                c.window_pending = Some(limit);
                if !queued {
                    self.ack_queue.push_back(conn);
                }
            }
        }
        if budget.pressure() >= Pressure::Pressure {
            self.reclaim(now);
        }
    }

    /// Above the pressure level, shrink receive windows, largest first, to
    /// half (never below the minimum window), until the account is below
    /// the pressure level again. A shrunk window takes effect as the
    /// passenger reads: what was advertised stays promised.
    fn reclaim(&mut self, now: Instant) {
        if self.last_reclaim.is_some_and(|t| now < t + RECLAIM_INTERVAL) {
            return;
        }
        self.last_reclaim = Some(now);
        let budget = self.cfg.budget.clone();
        let pressure = budget.levels().pressure;
        let mut by_size: Vec<(u64, ConnId)> = self
            .conns
            .values()
            .filter(|c| c.recv.window() > c.recv.limits().min)
            .map(|c| (c.recv.window(), c.id))
            .collect();
        by_size.sort_unstable_by(|a, b| b.cmp(a));
        for (w, id) in by_size {
            if budget.used() < pressure {
                break;
            }
            let c = self.conns.get_mut(&id).expect("listed above");
            let new = c.recv.set_window(w / 2);
            budget.note_reclaimed(w - new);
            Self::settle(&budget, c);
        }
    }

    /// Queue a WINDOW with the configured window if it exceeds the
    /// protocol's initial one.
    fn announce_window(&mut self, c: &mut Conn) {
        if let Some(limit) = c.recv.initial_window_update() {
            c.window_pending = Some(limit);
            self.ack_queue.push_back(c.id);
        }
    }

    /// Reset every connection (the session is being replaced or shut down):
    /// each is reported as [`Event::ConnReset`] so its streams end.
    pub fn abort_all(&mut self, code: u32) {
        let ids: Vec<ConnId> = self.conns.keys().copied().collect();
        for id in ids {
            if self.remove_conn(id).is_some() {
                self.stats.conns_reset += 1;
                self.events.push_back(Event::ConnReset { conn: id, code });
            }
        }
    }

    fn conn_mut(&mut self, conn: ConnId) -> Result<&mut Conn, StreamError> {
        match self.conns.get_mut(&conn) {
            None => Err(StreamError::UnknownConn(conn)),
            Some(c) if c.state == ConnState::Reset => Err(StreamError::Reset(conn)),
            Some(c) => Ok(c),
        }
    }

    /// Bytes `send` would accept now (budget included, when no other
    /// endpoint sharing it charges meanwhile).
    pub fn send_room(&self, conn: ConnId) -> usize {
        let Some(c) = self.conns.get(&conn) else { return 0 };
        let budget = &self.cfg.budget;
        let plan = self.send_plan(c, c.send.room());
        let headroom = self.grant_limit().saturating_sub(budget.used() + plan.forced);
        plan.accepted(c, headroom.min(plan.beyond)).0
    }

    /// How far send buffers grow beyond their floors: a soft budget's
    /// `high`; a hard one's `low`, so the other half stays for new
    /// connections' reservations (transfers that opened first cannot lock
    /// the connections after them out) and for memory counted as it
    /// arrives.
    fn grant_limit(&self) -> u64 {
        let levels = self.cfg.budget.levels();
        if self.cfg.hard_budget {
            levels.low
        } else {
            levels.high
        }
    }

    /// What writing `want` bytes to `c` costs the budget (see [`SendPlan`]).
    fn send_plan(&self, c: &Conn, want: usize) -> SendPlan {
        let now_part = c.send_part(c.send.memory());
        let cost = |n: usize, exact: bool| c.send_part(c.send.memory_after_write(n, exact)) - now_part;
        // A soft budget grants the bytes under the floor whatever the level;
        // a hard one reserved the floor when the connection opened.
        let under_floor = if self.cfg.hard_budget {
            0
        } else {
            want.min(self.cfg.conn_unsent_min_bytes.saturating_sub(c.send.buffered()) as usize)
        };
        // Growing only as far as the floor needs: what is forced stays
        // within the floor.
        let forced = cost(under_floor, true);
        SendPlan { want, under_floor, now_part, forced, beyond: cost(want, false).saturating_sub(forced) }
    }

    /// Queue passenger bytes; returns how many were accepted, bounded by the
    /// connection's not-sent low-water mark, its cap and the memory budget
    /// (a connection may always hold `conn_unsent_min_bytes`). When it is
    /// less than offered, wait for [`Event::Writable`].
    pub fn send(&mut self, conn: ConnId, data: &[u8], now: Instant) -> Result<usize, StreamError> {
        self.send_burst(conn, data, false, now)
    }

    /// [`Self::send`], saying whether `data` ends a burst: the shell read it
    /// with a read shorter than its buffer, so the passenger (or server) has
    /// nothing more for now. When all of it is accepted, the connection's
    /// unsent bytes are a burst's tail ([`crate::sched::PacketInfo::is_burst_tail`])
    /// until the next write; a partial accept or a plain `send` clears it.
    pub fn send_burst(&mut self, conn: ConnId, data: &[u8], end: bool, now: Instant) -> Result<usize, StreamError> {
        let budget = self.cfg.budget.clone();
        self.conn_mut(conn)?;
        let c = self.conns.get(&conn).expect("checked above");
        let plan = self.send_plan(c, data.len().min(c.send.room()));
        budget.charge(plan.forced);
        let got = if plan.beyond > 0 { budget.charge_up_to(plan.beyond, self.grant_limit()) } else { 0 };
        if got < plan.beyond {
            budget.note_denied();
        }
        let c = self.conns.get_mut(&conn).expect("checked above");
        let (n, exact) = plan.accepted(c, got);
        c.charged += plan.forced + got;
        let written = c.send.write_with(&data[..n], exact);
        debug_assert_eq!(written, n);
        Self::settle(&budget, c);
        c.send.note_write(n < data.len(), now);
        // A write refused in part (or whole) leaves bytes with the writer:
        // what is unsent here is no burst's tail then. An empty write with
        // `end` marks what is unsent now (an explicit flush).
        c.send.set_burst_end(end && n == data.len());
        let user = c.user;
        if n > 0 {
            self.users.activate(user, conn, now);
        }
        Ok(n)
    }

    /// The passenger finished sending (FIN).
    pub fn finish(&mut self, conn: ConnId, now: Instant) -> Result<(), StreamError> {
        let c = self.conn_mut(conn)?;
        c.send.finish();
        let user = c.user;
        self.users.activate(user, conn, now);
        Ok(())
    }

    /// Abort the connection in both directions.
    pub fn reset(&mut self, conn: ConnId, code: u32, now: Instant) {
        if self.remove_conn(conn).is_some() {
            self.stats.conns_reset += 1;
            self.send_reset(Frame::Reset { conn, code }, now);
        }
    }

    /// Send a RESET on every path that is up (or the first to come up), and
    /// remember it for [`Self::resend_resets`].
    fn send_reset(&mut self, f: Frame, now: Instant) {
        if self.recent_resets.len() == RESET_RESEND_MAX {
            self.recent_resets.pop_front();
        }
        self.recent_resets.push_back((now, f.clone()));
        if self.up_paths().is_empty() {
            // No path to carry it now: the first path to come up does.
            self.keep_orphan_reset(f);
        } else {
            self.broadcast(f);
        }
    }

    fn keep_orphan_reset(&mut self, f: Frame) {
        if self.orphan_resets.len() == RESET_RESEND_MAX {
            self.orphan_resets.pop_front();
        }
        self.orphan_resets.push_back(f);
    }

    /// A path went down, perhaps with RESETs it had not delivered: send the
    /// recent ones again on the paths still up, or on the first to come up.
    fn resend_resets(&mut self, now: Instant) {
        while self.recent_resets.front().is_some_and(|(t, _)| now.saturating_duration_since(*t) > RESET_RESEND_WINDOW) {
            self.recent_resets.pop_front();
        }
        let frames: Vec<Frame> = self.recent_resets.iter().map(|(_, f)| f.clone()).collect();
        if self.up_paths().is_empty() {
            for f in frames {
                if !self.orphan_resets.contains(&f) {
                    self.keep_orphan_reset(f);
                }
            }
        } else {
            for f in frames {
                self.broadcast(f);
            }
        }
    }

    /// Read passenger bytes that arrived in order.
    pub fn recv(&mut self, conn: ConnId, buf: &mut [u8], now: Instant) -> Result<Recv, StreamError> {
        let budget = self.cfg.budget.clone();
        let c = self.conn_mut(conn)?;
        let n = c.recv.read(buf);
        let mut enqueue = false;
        if let Some(limit) = c.recv.window_update() {
            enqueue = c.window_pending.is_none() && !c.ack_pending;
            c.window_pending = Some(limit);
        }
        Self::settle(&budget, c);
        if enqueue {
            self.ack_queue.push_back(conn);
        }
        if n > 0 {
            self.tune_window(conn, now);
        }
        let c = self.conns.get_mut(&conn).expect("checked");
        if n > 0 {
            return Ok(Recv::Data(n));
        }
        if c.recv.is_finished() {
            c.fin_read = true;
            self.maybe_close(conn);
            return Ok(Recv::Fin);
        }
        Ok(Recv::Blocked)
    }

    pub fn readable_bytes(&self, conn: ConnId) -> usize {
        self.conns.get(&conn).map_or(0, |c| c.recv.readable())
    }

    pub fn conn_count(&self) -> usize {
        self.conns.len()
    }

    /// A connection's bytes written and not yet acknowledged by the peer,
    /// and whether its last write ended a burst ([`Self::send_burst`]).
    pub fn send_state(&self, conn: ConnId) -> Option<(u64, bool)> {
        self.conns.get(&conn).map(|c| (c.send.buffered(), c.send.burst_end()))
    }

    pub fn has_conn(&self, conn: ConnId) -> bool {
        self.conns.contains_key(&conn)
    }

    /// Bytes held in connection buffers (send and receive).
    pub fn buffered_bytes(&self) -> u64 {
        self.conns.values().map(|c| c.send.buffered() + c.recv.buffered()).sum()
    }

    fn maybe_close(&mut self, conn: ConnId) {
        if self.conns.get(&conn).is_some_and(|c| c.is_closed()) {
            let c = self.remove_conn(conn).expect("checked");
            self.stats.conns_closed += 1;
            self.events.push_back(Event::ConnClosed(conn));
            if c.ack_pending {
                // The peer's last bytes (and its FIN) are not acknowledged
                // yet, and the ACK queue skips closed connections. Without
                // this ACK the peer learns of its FIN only from path-level
                // acknowledgements, which do not come for a copy it skipped
                // because an earlier SACK covered it: it would never close.
                let (cumulative, sack) = c.recv.ack_state(wire::MAX_SACK_RANGES);
                self.broadcast(Frame::Ack { conn, cumulative, fin: c.recv.fin_received(), sack });
            }
        }
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    pub fn stats(&self) -> &EndpointStats {
        &self.stats
    }

    pub fn active_users(&self) -> usize {
        self.users.active_users()
    }

    // ----- input ---------------------------------------------------------

    /// Bytes read from the subflow of `path`. On error the shell closes that
    /// subflow (and calls [`Self::path_down`]).
    pub fn handle_input(&mut self, path: PathId, data: &[u8], now: Instant) -> Result<(), InputError> {
        let slot = match self.slots[path.index()].as_mut() {
            Some(s) if s.path.up => s,
            _ => return Err(InputError::PathNotUp(path)),
        };
        slot.path.stats.received_bytes += data.len() as u64;
        slot.decoder.push(data);
        loop {
            let slot = self.slots[path.index()].as_mut().expect("checked above");
            let d = match slot.decoder.next_frame() {
                Ok(Some(d)) => d,
                Ok(None) => {
                    if self.input_paused(path) {
                        self.stats.input_pauses += 1;
                    }
                    return Ok(());
                }
                Err(e) => {
                    self.stats.protocol_errors += 1;
                    return Err(InputError::Wire(path, e));
                }
            };
            if d.frame.is_ack_eliciting() {
                slot.path.rx_counter += d.wire_len as u64;
                slot.path.rx_last_arrival = now;
            }
            if let Err(e) = self.on_frame(path, d.frame, now) {
                self.stats.protocol_errors += 1;
                return Err(e);
            }
        }
    }

    fn on_frame(&mut self, path: PathId, frame: Frame, now: Instant) -> Result<(), InputError> {
        match frame {
            Frame::PathAck { received, delay_us } => {
                let slot = self.slots[path.index()].as_mut().expect("path exists");
                let mut acked = std::mem::take(&mut self.acked_scratch);
                acked.clear();
                let sent = slot.path.tx_counter;
                let was_stale = slot.path.stale;
                if !slot.path.on_path_ack(received, Duration::from_micros(u64::from(delay_us)), now, &mut acked) {
                    self.acked_scratch = acked;
                    return Err(InputError::BadPathAck(path, received, sent));
                }
                if was_stale && !slot.path.stale {
                    trace::record(&mut self.trace, now, TraceEvent::Fresh { path });
                }
                let rtt_max = self.rtt_max();
                for r in &acked {
                    if let Some(seg) = r.segment {
                        self.on_segment_delivered(seg, rtt_max, now);
                    }
                }
                self.acked_scratch = acked;
            }
            Frame::Ping { id, timestamp_us } => {
                // Coalesced: one PONG per path, the newest PING's.
                let slot = self.slots[path.index()].as_mut().expect("path exists");
                slot.ctrl.push_back(Frame::Pong { id, timestamp_us });
            }
            Frame::Pong { .. } => {}
            Frame::Open { conn, user, dst } => {
                if self.cfg.role != Role::Proxy {
                    return Err(InputError::Unexpected(path, "OPEN"));
                }
                if !self.note_opened(conn) {
                    return Ok(()); // a copy of an OPEN already handled
                }
                if self.remove_conn(conn).is_some() {
                    // The id came round again (2^32 connections on) while
                    // this side still held a connection under it, which the
                    // relay no longer does (it skips ids it holds), or the
                    // relay is faulty: the old connection ends here.
                    self.stats.protocol_errors += 1;
                    self.stats.conns_reset += 1;
                    self.events.push_back(Event::ConnReset { conn, code: 0 });
                }
                if self.over_cap(user).is_some() {
                    self.stats.conns_refused += 1;
                    self.send_reset(Frame::Reset { conn, code: RESET_REFUSED_LIMIT }, now);
                    return Ok(());
                }
                let Some(mut c) = self.new_conn(conn, user, dst) else {
                    self.stats.conns_refused += 1;
                    self.send_reset(Frame::Reset { conn, code: RESET_OVERLOADED }, now);
                    return Ok(());
                };
                self.announce_window(&mut c);
                self.insert_conn(c);
                self.stats.conns_opened += 1;
                self.events.push_back(Event::ConnOpened { conn, user, dst });
            }
            Frame::Data { conn, offset, fin, payload } => {
                let Some(c) = self.conns.get_mut(&conn) else { return Ok(()) };
                c.open_unconfirmed = false;
                let new = c.recv.insert(offset, &payload, fin).map_err(|e| InputError::Stream(path, conn, e))?;
                self.stats.duplicate_bytes_received += payload.len() as u64 - new;
                // The ready buffer grows within the window, which is charged;
                // pieces above a gap are memory already taken: counted now.
                Self::settle(&self.cfg.budget, c);
                let len = payload.len() as u32;
                trace::record(&mut self.trace, now, TraceEvent::Received { path, conn, offset, len, new: new as u32 });
                if let Some(stall) = c.recv.note_hol(now) {
                    let stall_us = stall.as_micros() as u64;
                    trace::record(&mut self.trace, now, TraceEvent::HolStall { conn, stall_us });
                    self.stats.hol_stalls += 1;
                    self.stats.hol_stalls_long += u64::from(stall >= HOL_STALL_LONG);
                    self.stats.hol_stalls_very_long += u64::from(stall >= HOL_STALL_VERY_LONG);
                    self.stats.hol_stall_us += stall.as_micros() as u64;
                }
                if !c.ack_pending && c.window_pending.is_none() {
                    self.ack_queue.push_back(conn);
                }
                c.ack_pending = true;
                if new > 0 || c.recv.fin_received() {
                    self.events.push_back(Event::Readable(conn));
                }
            }
            Frame::Ack { conn, cumulative, fin, sack } => {
                let rtt_max = self.rtt_max();
                let Some(c) = self.conns.get_mut(&conn) else { return Ok(()) };
                let freed = c.send.on_ack(cumulative, fin, &sack).map_err(|e| InputError::Ack(path, conn, e))?;
                c.open_unconfirmed = false;
                self.after_ack(conn, freed, rtt_max, now);
            }
            Frame::Window { conn, max_data } => {
                let Some(c) = self.conns.get_mut(&conn) else { return Ok(()) };
                trace::record(&mut self.trace, now, TraceEvent::WindowReceived { path, conn, max_data });
                c.open_unconfirmed = false;
                c.send.set_max_data(max_data);
                if let Some(limited) = c.send.note_window_limit(now) {
                    trace::record(&mut self.trace, now, TraceEvent::WindowLimited { conn, limited });
                }
                let user = c.user;
                self.users.activate(user, conn, now);
            }
            Frame::Reset { conn, code } => {
                if self.remove_conn(conn).is_some() {
                    self.stats.conns_reset += 1;
                    self.events.push_back(Event::ConnReset { conn, code });
                } else if self.cfg.role == Role::Proxy {
                    // Reset before its OPEN was sent (or arrived): that id is
                    // done, and an OPEN arriving late must not revive it.
                    self.note_opened(conn);
                }
            }
            Frame::PathStatus { path: p, state, cell, seq } => {
                // Every copy after the first, and late copies of older
                // reports, change nothing.
                let last = &mut self.path_status_last[p.index()];
                if last.is_some_and(|l| seq.wrapping_sub(l) as i32 <= 0) {
                    return Ok(());
                }
                *last = Some(seq);
                if let Some(s) = self.slots[p.index()].as_mut() {
                    s.path.link_state = state;
                    s.path.cell = cell;
                }
                self.events.push_back(Event::PathStatus { path: p, state, cell });
            }
            Frame::Telemetry { seq, payload } => {
                if seq >= self.telemetry_floor && self.telemetry_seen.insert(seq) {
                    self.stats.telemetry_received += 1;
                    self.events.push_back(Event::Telemetry { seq, payload });
                    // Bound the de-duplication set: forget far-behind seqs.
                    while self.telemetry_seen.len() > 4096 {
                        let first = self.telemetry_seen.pop_first().expect("non-empty");
                        self.telemetry_floor = first + 1;
                    }
                } else {
                    self.events.push_back(Event::TelemetryDuplicate { seq, payload });
                }
            }
            Frame::TelemetryAck { seq } => self.events.push_back(Event::TelemetryAcked { seq }),
            Frame::Hello { .. } => return Err(InputError::Unexpected(path, "HELLO")),
            Frame::HelloAck { .. } => return Err(InputError::Unexpected(path, "HELLO_ACK")),
        }
        Ok(())
    }

    /// Proxy: the 64-bit id of wire id `conn`, the one closest to the floor
    /// (serial-number arithmetic, as TCP compares sequence numbers); `None`
    /// for one before the first id.
    fn unwrap_conn(&self, conn: ConnId) -> Option<u64> {
        let d = conn.0.wrapping_sub(self.opened_floor as u32) as i32;
        self.opened_floor.checked_add_signed(i64::from(d))
    }

    /// Proxy: record that connection `conn` was opened (or reset); returns
    /// false when it already was. The ids above the floor are bounded: gaps
    /// left further back than [`OPENED_WINDOW`] ids (an OPEN that never
    /// came, from a faulty or hostile relay) are given up and the floor
    /// moves past them.
    fn note_opened(&mut self, conn: ConnId) -> bool {
        let Some(id) = self.unwrap_conn(conn) else { return false };
        if id < self.opened_floor || !self.opened_above.insert(id) {
            return false;
        }
        while self.opened_above.len() > OPENED_WINDOW {
            let first = self.opened_above.pop_first().expect("non-empty");
            self.opened_floor = first + 1;
        }
        // The relay never uses id 0 and skips ids it still holds: their
        // OPEN is not coming either.
        while self.opened_above.remove(&self.opened_floor)
            || self.opened_floor as u32 == 0
            || self.conns.contains_key(&ConnId(self.opened_floor as u32))
        {
            self.opened_floor += 1;
        }
        true
    }

    fn on_segment_delivered(&mut self, seg: SegmentRef, rtt_max: Duration, now: Instant) {
        let Some(c) = self.conns.get_mut(&seg.conn) else { return };
        c.open_unconfirmed = false;
        let freed = c.send.on_delivered(seg.offset);
        self.after_ack(seg.conn, freed, rtt_max, now);
    }

    /// Bookkeeping after an acknowledgement freed `freed` bytes of `conn`.
    fn after_ack(&mut self, conn: ConnId, freed: u64, rtt_max: Duration, now: Instant) {
        let Some(c) = self.conns.get_mut(&conn) else { return };
        c.send.update_rate(now, rtt_max);
        if freed > 0 {
            Self::settle(&self.cfg.budget, c);
            trace::record(&mut self.trace, now, TraceEvent::Acked { conn, cumulative: c.send.acked_base() });
        }
        if c.send.writer_wake_due() {
            c.send.unblock_writer(now);
            self.events.push_back(Event::Writable(conn));
        }
        self.maybe_close(conn);
    }

    // ----- output --------------------------------------------------------

    /// Append frames for `path` to `out`, at most `max` bytes (but always at
    /// least one frame if any is due). Runs the scheduler first. Returns the
    /// number of bytes appended.
    pub fn poll_transmit(&mut self, path: PathId, now: Instant, out: &mut Vec<u8>, max: usize) -> usize {
        let start = out.len();
        match self.slots[path.index()].as_ref() {
            Some(s) if s.path.up => {}
            _ => return 0,
        }
        let room = |out: &Vec<u8>, n: usize| out.len() == start || out.len() - start + n <= max;
        let acks_here = self.may_carry_acks(path);

        let slot = self.slots[path.index()].as_mut().expect("checked");
        if slot.path.rx_counter > slot.path.rx_acked {
            let delay =
                now.saturating_duration_since(slot.path.rx_last_arrival).as_micros().min(u128::from(u32::MAX)) as u32;
            Frame::PathAck { received: slot.path.rx_counter, delay_us: delay }.encode(out);
            slot.path.rx_acked = slot.path.rx_counter;
        }
        while let Some(f) = slot.ctrl.front() {
            let n = f.encoded_len();
            if !room(out, n) {
                return out.len() - start;
            }
            let f = slot.ctrl.pop_front().expect("front exists");
            f.encode(out);
            slot.path.on_frame_sent(n, None, now);
        }

        // Data-level ACKs and window updates ride on the quickest healthy
        // path.
        if acks_here {
            while let Some(&cid) = self.ack_queue.front() {
                let Some(c) = self.conns.get_mut(&cid) else {
                    self.ack_queue.pop_front();
                    continue;
                };
                let mut frames = Vec::with_capacity(2);
                if c.ack_pending {
                    let (cumulative, sack) = c.recv.ack_state(wire::MAX_SACK_RANGES);
                    frames.push(Frame::Ack { conn: cid, cumulative, fin: c.recv.fin_received(), sack });
                }
                if let Some(max_data) = c.window_pending {
                    frames.push(Frame::Window { conn: cid, max_data });
                }
                let n: usize = frames.iter().map(Frame::encoded_len).sum();
                if !room(out, n) {
                    return out.len() - start;
                }
                if let Some(max_data) = c.window_pending {
                    trace::record(&mut self.trace, now, TraceEvent::WindowSent { path, conn: cid, max_data });
                }
                c.ack_pending = false;
                c.window_pending = None;
                self.ack_queue.pop_front();
                let slot = self.slots[path.index()].as_mut().expect("checked");
                for f in frames {
                    let before = out.len();
                    f.encode(out);
                    slot.path.on_frame_sent(out.len() - before, None, now);
                }
            }
        }

        self.schedule(now);

        let slot = self.slots[path.index()].as_mut().expect("checked");
        while let Some(q) = slot.data.front() {
            let n = data_frame_len(q.len);
            if !room(out, n as usize) {
                break;
            }
            let q = slot.data.pop_front().expect("front exists");
            slot.path.queued_bytes -= n;
            let Some(c) = self.conns.get(&q.seg.conn) else { continue };
            let Some(payload) = c.send.segment_payload(q.seg.offset) else {
                continue; // delivered by another copy meanwhile
            };
            debug_assert_eq!(payload.len(), q.len as usize);
            wire::encode_data_frame(out, q.seg.conn, q.seg.offset, q.fin, payload);
            slot.path.on_frame_sent(n as usize, Some(q.seg), now);
            let copy = match q.copy {
                Copy::First => CopyKind::First,
                Copy::Redundant => CopyKind::Redundant,
                Copy::Reinjection => CopyKind::Reinjection,
            };
            let ev = TraceEvent::Sent { path, conn: q.seg.conn, offset: q.seg.offset, len: q.len, copy };
            trace::record(&mut self.trace, now, ev);
            slot.path.stats.data_bytes_sent += u64::from(q.len);
            match q.copy {
                Copy::First => {}
                Copy::Redundant => {
                    slot.path.stats.redundant_bytes += u64::from(q.len);
                    self.stats.redundant_bytes += u64::from(q.len);
                }
                Copy::Reinjection => {
                    slot.path.stats.reinjected_bytes += u64::from(q.len);
                    self.stats.reinjected_bytes += u64::from(q.len);
                }
            }
        }
        out.len() - start
    }

    /// Whether `path` has frames waiting to be written.
    /// Includes data-level ACKs and WINDOW updates waiting for any healthy
    /// path: a shell that slept on those would leave a flow-controlled peer
    /// waiting for the next keepalive.
    pub fn has_pending(&self, path: PathId) -> bool {
        self.slots[path.index()].as_ref().is_some_and(|s| {
            s.path.up
                && (!s.ctrl.is_empty()
                    || !s.data.is_empty()
                    || s.path.rx_counter > s.path.rx_acked
                    || (!self.ack_queue.is_empty() && self.may_carry_acks(path)))
        })
    }

    /// Whether data-level ACKs and WINDOW updates may ride on `path` now:
    /// the healthy path on which a small frame would arrive first (the
    /// lowest RTT, counting what is queued ahead of it), or any path when
    /// none is healthy. Radio reports can say "no service" on every path
    /// while a subflow still works (or never say anything else); ACKs held
    /// back then would deadlock every flow-controlled connection.
    ///
    /// On whichever healthy path polled first, a window update could take
    /// the slow carrier: virtual time, 4 MB over carriers of 300 and 30 ms
    /// one way, `minrtt` took 2.07 s with the slow one as path 0 and 1.79 s
    /// with the paths the other way round (`testing/hetero.rs`).
    fn may_carry_acks(&self, path: PathId) -> bool {
        let up = || self.slots.iter().flatten().filter(|s| s.path.up);
        match self.slots[path.index()].as_ref() {
            Some(s) if s.path.up => {
                let best = up()
                    .filter(|s| Self::carries_acks(&s.path))
                    .min_by_key(|s| (s.path.small_frame_delay(), s.path.id()))
                    .map(|s| s.path.id());
                best.is_none_or(|b| b == path)
            }
            _ => false,
        }
    }

    /// Whether data-level ACKs and WINDOW updates may ride on this path.
    fn carries_acks(p: &Path) -> bool {
        p.rto_count == 0 && !p.stale && p.link_state != LinkState::NoService
    }

    /// A view's path state anew within one scheduling pass: neither the
    /// train nor the cells moved since `refresh_views` (same `now`), so the
    /// forecast is kept.
    fn update_view(v: &mut PathView, p: &Path, now: Instant) {
        let failure = v.failure;
        *v = p.view(now);
        v.failure = failure;
    }

    fn refresh_views(&mut self, now: Instant) {
        let mut views = std::mem::take(&mut self.views);
        views.clear();
        for s in self.slots.iter().flatten() {
            if s.path.up {
                views.push(self.view_of(&s.path, now));
            }
        }
        self.views = views;
    }

    /// Run scheduling rounds until no path has room or nothing is left to
    /// send: pick a user (proportional fair), a flow (round robin), the
    /// flow's lowest unsent packet (reinjections first), then paths for it.
    pub fn schedule(&mut self, now: Instant) {
        self.refresh_views(now);
        let live = self.views.iter().fold(PathMask::EMPTY, |mut m, v| {
            m.insert(v.id);
            m
        });
        let mut skip: Vec<UserId> = Vec::new();
        loop {
            if !self.views.iter().any(|v| v.availability == Availability::Available) {
                return;
            }
            let Some((user, cid)) = self.users.next(now, &skip) else { return };
            let Some(c) = self.conns.get_mut(&cid) else {
                self.users.deactivate(user, cid);
                continue;
            };
            let Some(pkt) = c.send.next_packet(self.cfg.segment_bytes) else {
                if c.send.tail_in_flight() {
                    let slow = self.pipeline.on_tail_in_flight(&TailContext { now, paths: &self.views, conn: cid });
                    let n = if slow.is_empty() { 0 } else { c.send.reinject_from(slow) };
                    if n > 0 {
                        self.stats.tail_reinjections += n as u64;
                        trace::record(
                            &mut self.trace,
                            now,
                            TraceEvent::TailReinjected { conn: cid, from: slow, segments: n as u32 },
                        );
                        continue; // the next round picks the reinjections up
                    }
                }
                if let Some(limited) = c.send.note_window_limit(now) {
                    trace::record(&mut self.trace, now, TraceEvent::WindowLimited { conn: cid, limited });
                }
                if c.send.is_window_limited() {
                    if let Some((off, len, head_paths, done)) = c.send.head_in_flight() {
                        let ctx = HeadContext {
                            now,
                            paths: &self.views,
                            conn: cid,
                            head_offset: off,
                            head_len: len,
                            head_paths,
                            head_reinjected: done,
                        };
                        let act = self.pipeline.on_head_blocked(&ctx);
                        if act.reinject || !act.penalise.is_empty() {
                            let ev = TraceEvent::HeadBlocked {
                                conn: cid,
                                offset: off,
                                reinject: act.reinject && !done,
                                penalised: act.penalise,
                            };
                            trace::record(&mut self.trace, now, ev);
                        }
                        for p in act.penalise.iter() {
                            if let Some(s) = self.slots[p.index()].as_mut() {
                                if s.path.penalise(now) {
                                    if let Some(v) = self.views.iter_mut().find(|v| v.id == p) {
                                        Self::update_view(v, &s.path, now);
                                    }
                                }
                            }
                        }
                        if act.reinject && c.send.reinject_head(off) {
                            self.stats.head_reinjections += 1;
                            continue; // the next round picks the reinjection up
                        }
                    }
                }
                self.users.deactivate(user, cid);
                continue;
            };
            if pkt.reinjection && live.minus(pkt.paths_used).is_empty() {
                // Every live path already has a copy (a redundant one, or
                // an earlier reinjection): there is nowhere to reinject it,
                // and waiting would hold back the flow's new data behind
                // it. The copies in flight deliver it; a path that goes
                // down throws its copies back (`path_down`).
                c.send.on_scheduled(&pkt, PathMask::EMPTY);
                continue;
            }
            let info = PacketInfo {
                conn: cid,
                user,
                offset: pkt.offset,
                len: pkt.len,
                is_tail: c.send.fin_requested(),
                is_burst_tail: !c.send.fin_requested() && c.send.burst_end(),
                is_reinjection: pkt.reinjection && !pkt.unwritten,
                paths_used: pkt.paths_used,
                remaining_bytes: c.send.remaining_bytes(),
                send_window_bytes: c.send.window_room(),
            };
            let placed = self.pipeline.select(&Context { now, paths: &self.views, packet: &info });
            self.stats.decisions += 1;
            if placed.is_empty() {
                skip.push(user);
                continue;
            }
            c.send.on_scheduled(&pkt, placed);
            if c.send.writer_wake_due() {
                // Unsent bytes left for a path: the writer may refill.
                c.send.unblock_writer(now);
                self.events.push_back(Event::Writable(cid));
            }
            let frame = data_frame_len(pkt.len);
            let seg = SegmentRef { conn: cid, offset: pkt.offset };
            // The first copy is on the lowest path a hard selector did not
            // add (idle-inject's copies are redundant wherever they go).
            let first = placed.minus(self.pipeline.last_copies()).iter().next();
            for p in placed.iter() {
                let copy = match pkt.reinjection && !pkt.unwritten {
                    true => Copy::Reinjection,
                    false if Some(p) == first => Copy::First,
                    false => Copy::Redundant,
                };
                let slot = self.slots[p.index()].as_mut().expect("placed on a live path");
                slot.data.push_back(Queued { seg, len: pkt.len, fin: pkt.fin, copy });
                slot.path.queued_bytes += frame;
                slot.path.last_used = now;
                slot.path.bytes_since_use = 0;
            }
            for s in self.slots.iter_mut().flatten() {
                if s.path.up && !placed.contains(s.path.id) {
                    s.path.bytes_since_use += u64::from(pkt.len);
                }
            }
            for v in self.views.iter_mut() {
                if let Some(s) = self.slots[v.id.index()].as_ref() {
                    Self::update_view(v, &s.path, now);
                }
            }
            self.users.served(user, u64::from(pkt.len), now);
        }
    }

    // ----- timers --------------------------------------------------------

    /// When [`Self::handle_timeout`] must next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut t: Option<Instant> = None;
        let mut upd = |x: Instant| t = Some(t.map_or(x, |t| t.min(x)));
        for s in self.slots.iter().flatten().filter(|s| s.path.up) {
            if let Some(d) = s.path.rto_deadline {
                upd(d);
            }
            if let Some(d) = s.path.stale_deadline() {
                upd(d);
            }
            upd(s.path.last_tx + self.cfg.ping_interval);
            if let Some(r) = s.path.sent.front() {
                if !s.path.dead_reported {
                    upd(r.sent_at.max(s.path.rx_last_arrival) + self.cfg.dead_after);
                }
            }
        }
        t
    }

    /// Take back the segments placed on path slot `i` but still queued in
    /// the endpoint (they never left): they go to their connections for
    /// reinjection, and the path may carry them again later.
    fn drain_queue(&mut self, i: usize, now: Instant) {
        let Some(slot) = self.slots[i].as_mut() else { return };
        let mask = PathMask::single(slot.path.id);
        let queued: Vec<Queued> = slot.data.drain(..).collect();
        for q in &queued {
            slot.path.queued_bytes -= data_frame_len(q.len);
        }
        for q in queued {
            if let Some(c) = self.conns.get_mut(&q.seg.conn) {
                if c.send.requeue_unwritten(q.seg.offset, mask).is_some() {
                    self.users.activate(c.user, c.id, now);
                }
            }
        }
    }

    /// Return segments in flight on path slot `i` to their connections for
    /// reinjection, as `action` says.
    fn reinject_from(&mut self, i: usize, action: Reinject, cause: RequeueCause, now: Instant) {
        let Some(slot) = self.slots[i].as_ref() else { return };
        let segs: Vec<SegmentRef> = match action {
            Reinject::Nothing => Vec::new(),
            Reinject::Oldest => {
                let conns = &self.conns;
                slot.path
                    .unacked_segments()
                    .find(|s| conns.get(&s.conn).is_some_and(|c| c.send.is_unacked(s.offset)))
                    .into_iter()
                    .collect()
            }
            Reinject::AllUnacked => slot.path.unacked_segments().collect(),
        };
        let path = slot.path.id;
        for s in segs {
            if let Some(c) = self.conns.get_mut(&s.conn) {
                if c.send.requeue(s.offset).is_some() {
                    self.users.activate(c.user, c.id, now);
                    let ev = TraceEvent::Requeued { path, conn: s.conn, offset: s.offset, cause };
                    trace::record(&mut self.trace, now, ev);
                }
            }
        }
    }

    /// Fire due timers: retransmission timeouts (and reinjection), stale
    /// paths, keepalive pings, dead-path detection.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.users.forget_idle(now);
        if self.cfg.budget.pressure() >= Pressure::Pressure {
            self.reclaim(now);
        }
        for i in 0..MAX_PATHS {
            let Some(slot) = self.slots[i].as_mut() else { continue };
            if !slot.path.up {
                continue;
            }
            if slot.path.rto_deadline.is_some_and(|d| d <= now) {
                slot.path.on_rto(now);
                let view = slot.path.view(now);
                let action = self.pipeline.on_rto(now, &view);
                let ev =
                    TraceEvent::Rto { path: view.id, count: view.rto_count, in_flight: view.in_flight_bytes, action };
                trace::record(&mut self.trace, now, ev);
                // What is queued here and not yet written never left: with
                // the path in timeout (its window down to a probe) it goes
                // back to its connections, for any path with room, whatever
                // the reinjection handler does with what is in flight.
                self.drain_queue(i, now);
                self.reinject_from(i, action, RequeueCause::Rto, now);
            }
            let slot = self.slots[i].as_mut().expect("checked");
            if slot.path.stale_deadline().is_some_and(|d| d <= now) && slot.path.mark_stale() {
                self.stats.stale_transitions += 1;
                let view = slot.path.view(now);
                let action = self.pipeline.on_stale(now, &view);
                let no_service = view.link_state == LinkState::NoService;
                let ev = TraceEvent::Stale { path: view.id, in_flight: view.in_flight_bytes, no_service, action };
                trace::record(&mut self.trace, now, ev);
                if action == Reinject::AllUnacked {
                    self.drain_queue(i, now);
                }
                self.reinject_from(i, action, RequeueCause::Stale, now);
                // ACKs and WINDOWs it carried may be stuck with it: the peer
                // could wait for credit this side believes it gave.
                self.reannounce_flow_state();
            }
            let slot = self.slots[i].as_mut().expect("checked");
            if now >= slot.path.last_tx + self.cfg.ping_interval {
                self.next_ping += 1;
                let ts = now.saturating_duration_since(self.epoch).as_micros() as u64;
                let f = Frame::Ping { id: self.next_ping, timestamp_us: ts };
                // Counted when written; mark now so one idle period sends one ping.
                slot.path.last_tx = now;
                slot.ctrl.push_back(f);
            }
            if let Some(r) = slot.path.sent.front() {
                if !slot.path.dead_reported && now >= r.sent_at.max(slot.path.rx_last_arrival) + self.cfg.dead_after {
                    slot.path.dead_reported = true;
                    self.events.push_back(Event::PathDead(slot.path.id));
                    trace::record(&mut self.trace, now, TraceEvent::PathDead { path: slot.path.id });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::Registry;

    fn pair(name: &str, now: Instant) -> (Endpoint, Endpoint) {
        let r = Registry::with_builtins();
        let relay = Endpoint::new(EndpointConfig::new(Role::Relay), r.build(name).unwrap(), now);
        let proxy = Endpoint::new(EndpointConfig::new(Role::Proxy), r.build(name).unwrap(), now);
        (relay, proxy)
    }

    /// A pair running `name` with paths 0 and 1 up, and one passenger
    /// connection whose request reached the proxy; `trace`: both ends
    /// record a segment trace from the start.
    fn requested(name: &str, now: Instant, trace: bool) -> (Endpoint, Endpoint, ConnId) {
        let (mut relay, mut proxy) = pair(name, now);
        if trace {
            relay.enable_trace(10_000);
            proxy.enable_trace(10_000);
        }
        paths_up(&mut relay, &mut proxy, &[PathId(0), PathId(1)], now);
        let c = relay.open(UserId([1; 16]), "10.99.0.10:80".parse().unwrap(), now).unwrap();
        relay.send(c, b"GET /", now).unwrap();
        pump(&mut relay, &mut proxy, now);
        (relay, proxy, c)
    }

    /// Bring `paths` up at both ends.
    fn paths_up(relay: &mut Endpoint, proxy: &mut Endpoint, paths: &[PathId], now: Instant) {
        for &p in paths {
            relay.path_up(p, now);
            proxy.path_up(p, now);
        }
    }

    /// Move everything both sides want to send on every path, instantly.
    fn pump(a: &mut Endpoint, b: &mut Endpoint, now: Instant) {
        for _ in 0..1000 {
            let mut moved = false;
            for p in a.up_paths() {
                let mut out = Vec::new();
                if a.poll_transmit(p, now, &mut out, 1 << 20) > 0 {
                    b.handle_input(p, &out, now).unwrap();
                    moved = true;
                }
            }
            for p in b.up_paths() {
                let mut out = Vec::new();
                if b.poll_transmit(p, now, &mut out, 1 << 20) > 0 {
                    a.handle_input(p, &out, now).unwrap();
                    moved = true;
                }
            }
            if !moved {
                return;
            }
        }
        panic!("endpoints never went quiet");
    }

    /// Records, per scheduling decision, whether the packet was a burst's tail.
    struct BurstRecorder(std::sync::Arc<std::sync::Mutex<Vec<bool>>>);

    impl crate::sched::Schedulerlet for BurstRecorder {
        fn name(&self) -> &'static str {
            "burst-recorder"
        }
        fn kind(&self) -> crate::sched::Kind {
            crate::sched::Kind::SelectionFilter
        }
        fn apply(&mut self, ctx: &crate::sched::Context<'_>, _sets: &mut crate::sched::PathSets) {
            self.0.lock().unwrap().push(ctx.packet.is_burst_tail);
        }
    }

    #[test]
    fn a_write_that_ends_a_burst_marks_what_is_unsent_until_the_next_write() {
        let now = Instant::now();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let lets: Vec<Box<dyn crate::sched::Schedulerlet>> =
            vec![Box::new(crate::sched::lets::MinRtt), Box::new(BurstRecorder(seen.clone()))];
        let pipeline = Pipeline::new("rec", lets, Box::new(crate::sched::lets::RtoOldest));
        let mut proxy = Endpoint::new(EndpointConfig::new(Role::Proxy), pipeline, now);
        let mut relay = pair("minrtt", now).0;
        paths_up(&mut relay, &mut proxy, &[PathId(0), PathId(1)], now);
        let c = relay.open(UserId([1; 16]), "10.99.0.10:80".parse().unwrap(), now).unwrap();
        relay.send(c, b"GET /", now).unwrap();
        pump(&mut relay, &mut proxy, now);
        let take = |proxy: &mut Endpoint| {
            proxy.schedule(now);
            let v = std::mem::take(&mut *seen.lock().unwrap());
            assert!(!v.is_empty(), "a decision was made");
            v
        };
        proxy.send_burst(c, &[1; 3000], false, now).unwrap();
        assert!(take(&mut proxy).iter().all(|b| !b), "mid-burst");
        proxy.send_burst(c, &[2; 100], true, now).unwrap();
        assert!(take(&mut proxy).iter().all(|b| *b), "the burst's last bytes");
        proxy.send(c, &[3; 100], now).unwrap();
        assert!(take(&mut proxy).iter().all(|b| !b), "a plain write clears it");
        // A write accepted only in part leaves bytes with the writer.
        let room = proxy.send_room(c);
        let big = vec![4; room + 10_000];
        assert_eq!(proxy.send_burst(c, &big, true, now).unwrap(), room);
        assert!(take(&mut proxy).iter().all(|b| !b), "partial accept");
        assert!(!proxy.conns[&c].send.burst_end());
    }

    #[test]
    fn the_receive_window_rides_with_every_copy_of_the_open() {
        // Whichever path delivers the OPEN first, the proxy learns the
        // relay's window with it and may send past the initial 64 KiB.
        let now = Instant::now();
        let mut relay = pair("minrtt", now).0;
        for p in [PathId(0), PathId(1)] {
            relay.path_up(p, now);
        }
        let c = relay.open(UserId([1; 16]), "10.99.0.10:80".parse().unwrap(), now).unwrap();
        for p in [PathId(1), PathId(0)] {
            let mut out = Vec::new();
            relay.poll_transmit(p, now, &mut out, 1 << 20);
            let mut other = pair("minrtt", now).1;
            other.path_up(p, now);
            other.handle_input(p, &out, now).unwrap();
            assert_eq!(other.poll_event().map(|e| matches!(e, Event::ConnOpened { .. })), Some(true));
            let room = other.conns[&c].send.window_room();
            assert!(room > crate::conn::INITIAL_MAX_DATA, "path {p:?} alone carried the window: room {room}");
        }
    }

    #[test]
    fn a_connection_carries_bytes_both_ways_and_closes() {
        let now = Instant::now();
        let (mut relay, mut proxy) = pair("minrtt", now);
        paths_up(&mut relay, &mut proxy, &[PathId(0), PathId(1)], now);
        let user = UserId::from("10.66.0.2".parse::<std::net::IpAddr>().unwrap());
        let dst: SocketAddr = "10.99.0.10:80".parse().unwrap();
        let c = relay.open(user, dst, now).unwrap();
        relay.send(c, b"GET / HTTP/1.0\r\n\r\n", now).unwrap();
        relay.finish(c, now).unwrap();
        pump(&mut relay, &mut proxy, now);
        assert_eq!(proxy.poll_event(), Some(Event::ConnOpened { conn: c, user, dst }));
        let mut buf = [0u8; 64];
        assert_eq!(proxy.recv(c, &mut buf, now), Ok(Recv::Data(18)));
        assert_eq!(&buf[..18], b"GET / HTTP/1.0\r\n\r\n");
        assert_eq!(proxy.recv(c, &mut buf, now), Ok(Recv::Fin));
        proxy.send(c, b"HTTP/1.0 200 OK\r\n\r\nhi", now).unwrap();
        proxy.finish(c, now).unwrap();
        pump(&mut relay, &mut proxy, now);
        assert_eq!(relay.recv(c, &mut buf, now), Ok(Recv::Data(21)));
        assert_eq!(relay.recv(c, &mut buf, now), Ok(Recv::Fin));
        pump(&mut relay, &mut proxy, now);
        assert!(!relay.has_conn(c), "relay closed");
        assert!(!proxy.has_conn(c), "proxy closed");
    }

    #[test]
    fn a_reader_that_read_the_last_bytes_still_reads_the_end() {
        // The last bytes read may be all there is before a FIN that has
        // already arrived; the acknowledgement of this side's own FIN can
        // then complete the connection before the reader asks again. The
        // reader must still read the end, not a connection that is gone
        // (the shells would turn that into a reset of the passenger's
        // socket after every byte had arrived).
        let now = Instant::now();
        let (mut relay, mut proxy) = pair("minrtt", now);
        paths_up(&mut relay, &mut proxy, &[PathId(0), PathId(1)], now);
        let c = relay.open(UserId([1; 16]), "10.99.0.10:80".parse().unwrap(), now).unwrap();
        relay.send(c, b"request", now).unwrap();
        relay.finish(c, now).unwrap();
        pump(&mut relay, &mut proxy, now);
        proxy.send(c, b"response", now).unwrap();
        proxy.finish(c, now).unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(proxy.recv(c, &mut buf, now), Ok(Recv::Data(7)));
        pump(&mut relay, &mut proxy, now);
        assert!(proxy.has_conn(c), "closed before its reader read the end");
        assert!(proxy.conns[&c].send.is_done(), "the relay acknowledged the proxy's FIN");
        assert!(!std::iter::from_fn(|| proxy.poll_event()).any(|e| e == Event::ConnClosed(c)));
        assert_eq!(proxy.recv(c, &mut buf, now), Ok(Recv::Fin));
        assert!(!proxy.has_conn(c), "closed once its end was read");
        assert_eq!(proxy.poll_event(), Some(Event::ConnClosed(c)));
        assert_eq!(relay.recv(c, &mut buf, now), Ok(Recv::Data(8)));
        assert_eq!(relay.recv(c, &mut buf, now), Ok(Recv::Fin));
        assert!(!relay.has_conn(c));
    }

    #[test]
    fn data_on_a_lost_path_is_resent_on_another() {
        let now = Instant::now();
        let (mut relay, mut proxy) = pair("roundrobin", now);
        paths_up(&mut relay, &mut proxy, &[PathId(0), PathId(1)], now);
        let user = UserId([1; 16]);
        let c = relay.open(user, "10.99.0.10:80".parse().unwrap(), now).unwrap();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let mut sent = relay.send(c, &data, now).unwrap();
        assert!(sent > 0);
        // Path 0's bytes are written to a subflow that then dies.
        let mut lost = Vec::new();
        relay.poll_transmit(PathId(0), now, &mut lost, 1 << 20);
        relay.path_down(PathId(0), now);
        proxy.path_down(PathId(0), now);
        let mut got = vec![0u8; data.len()];
        let mut n = 0;
        loop {
            pump(&mut relay, &mut proxy, now);
            while let Ok(Recv::Data(k)) = proxy.recv(c, &mut got[n..], now) {
                n += k;
            }
            if sent == data.len() {
                pump(&mut relay, &mut proxy, now);
                while let Ok(Recv::Data(k)) = proxy.recv(c, &mut got[n..], now) {
                    n += k;
                }
                break;
            }
            sent += relay.send(c, &data[sent..], now).unwrap();
        }
        assert_eq!(n, data.len());
        assert_eq!(got, data);
    }

    #[test]
    fn telemetry_is_delivered_once_though_sent_on_every_path() {
        let now = Instant::now();
        let (mut relay, mut proxy) = pair("minrtt", now);
        paths_up(&mut relay, &mut proxy, &[PathId(0), PathId(1), PathId(2)], now);
        relay.send_telemetry(1, Bytes::from_static(b"gps")).unwrap();
        pump(&mut relay, &mut proxy, now);
        let ev: Vec<Event> = std::iter::from_fn(|| proxy.poll_event()).collect();
        let gps = Bytes::from_static(b"gps");
        assert_eq!(ev[0], Event::Telemetry { seq: 1, payload: gps.clone() });
        assert_eq!(
            ev[1..],
            [
                Event::TelemetryDuplicate { seq: 1, payload: gps.clone() },
                Event::TelemetryDuplicate { seq: 1, payload: gps }
            ],
            "the other paths' copies are duplicates"
        );
        proxy.ack_telemetry(1);
        pump(&mut relay, &mut proxy, now);
        let ev: Vec<Event> = std::iter::from_fn(|| relay.poll_event()).collect();
        assert!(ev.contains(&Event::TelemetryAcked { seq: 1 }));
    }

    #[test]
    fn a_resent_telemetry_record_surfaces_as_a_duplicate_so_it_can_be_acked_again() {
        let now = Instant::now();
        let (mut relay, mut proxy) = pair("minrtt", now);
        paths_up(&mut relay, &mut proxy, &[PathId(0)], now);
        relay.send_telemetry(7, Bytes::from_static(b"handover")).unwrap();
        pump(&mut relay, &mut proxy, now);
        let ev: Vec<Event> = std::iter::from_fn(|| proxy.poll_event()).collect();
        assert_eq!(ev, vec![Event::Telemetry { seq: 7, payload: Bytes::from_static(b"handover") }]);
        // The ack was lost; the relay's spool sends the record again.
        relay.send_telemetry(7, Bytes::from_static(b"handover")).unwrap();
        pump(&mut relay, &mut proxy, now);
        let ev: Vec<Event> = std::iter::from_fn(|| proxy.poll_event()).collect();
        assert_eq!(
            ev,
            vec![Event::TelemetryDuplicate { seq: 7, payload: Bytes::from_static(b"handover") }],
            "not delivered twice, but not swallowed either"
        );
        assert_eq!(proxy.stats().telemetry_received, 1);
        assert_eq!(relay.stats().paths_up, 1, "the relay's spool resends when this changes");
        proxy.ack_telemetry(7);
        pump(&mut relay, &mut proxy, now);
        let ev: Vec<Event> = std::iter::from_fn(|| relay.poll_event()).collect();
        assert!(ev.contains(&Event::TelemetryAcked { seq: 7 }));
    }

    #[test]
    fn a_reset_made_while_no_path_is_up_goes_out_on_the_next_path() {
        let now = Instant::now();
        let (mut relay, mut proxy) = pair("minrtt", now);
        paths_up(&mut relay, &mut proxy, &[PathId(0)], now);
        let c = relay.open(UserId([1; 16]), "10.99.0.10:80".parse().unwrap(), now).unwrap();
        pump(&mut relay, &mut proxy, now);
        assert!(proxy.has_conn(c));
        relay.path_down(PathId(0), now);
        proxy.path_down(PathId(0), now);
        relay.reset(c, 9, now);
        paths_up(&mut relay, &mut proxy, &[PathId(1)], now);
        pump(&mut relay, &mut proxy, now);
        assert!(!proxy.has_conn(c), "the proxy learned of the reset");
    }

    #[test]
    fn a_window_update_wakes_the_writers() {
        let now = Instant::now();
        let (mut relay, mut proxy) = pair("minrtt", now);
        paths_up(&mut relay, &mut proxy, &[PathId(0)], now);
        let c = relay.open(UserId([1; 16]), "10.99.0.10:80".parse().unwrap(), now).unwrap();
        // Fill the window: reading it all frees more than half of it.
        let half = proxy.config().conn_window_initial_bytes as usize / 2;
        while proxy.readable_bytes(c) < half {
            assert!(relay.send(c, &vec![5u8; 1 << 20], now).unwrap() > 0);
            pump(&mut relay, &mut proxy, now);
        }
        let n = proxy.readable_bytes(c);
        assert!(!proxy.has_pending(PathId(0)));
        let mut buf = vec![0u8; n];
        assert_eq!(proxy.recv(c, &mut buf, now), Ok(Recv::Data(n)));
        assert!(proxy.has_pending(PathId(0)), "the WINDOW frame must wake a writer");
    }

    #[test]
    fn a_reinjection_with_a_copy_on_every_path_does_not_hold_back_new_data() {
        let now = Instant::now();
        let (mut relay, _) = pair("redundant", now);
        for p in [PathId(0), PathId(1)] {
            relay.path_up(p, now);
        }
        let c = relay.open(UserId([1; 16]), "10.99.0.10:80".parse().unwrap(), now).unwrap();
        relay.send(c, &[7u8; 20_000], now).unwrap();
        for p in [PathId(0), PathId(1)] {
            relay.poll_transmit(p, now, &mut Vec::new(), 1 << 20);
        }
        // Both paths time out: their oldest packet is thrown back, but it
        // already has a copy on each path, so it cannot be placed anywhere.
        let later = now + Duration::from_secs(1);
        relay.handle_timeout(later);
        assert_eq!(relay.path_stats(PathId(0)).unwrap().rto_events, 1);
        let before = relay.path_stats(PathId(1)).unwrap().data_bytes_sent;
        relay.send(c, &[8u8; 10_000], later).unwrap();
        relay.poll_transmit(PathId(1), later, &mut Vec::new(), 1 << 20);
        let sent = relay.path_stats(PathId(1)).unwrap().data_bytes_sent - before;
        assert_eq!(sent, 10_000, "the new bytes went out; the unplaceable reinjection was dropped");
        assert_eq!(relay.stats().reinjected_bytes, 0);
    }

    #[test]
    fn the_train_state_and_failure_table_become_forecasts_in_path_views() {
        use crate::sched::TrackDirection::Increasing;
        let t0 = Instant::now();
        let (mut relay, _) = pair("hrsch", t0);
        relay.path_up(PathId(0), t0);
        relay.path_up(PathId(1), t0);
        relay.report_link(PathId(0), LinkState::Connected, 42);
        assert_eq!(relay.path_view(PathId(0), t0).unwrap().failure, None, "no train, no table");
        relay.set_failure_table(FailureTable::new(7).with(42, Increasing, 1_000.0));
        relay.set_train_state(TrainState { position_m: 200.0, speed_mps: 80.0, direction: Increasing, at: t0 });
        assert_eq!(relay.failure_table().map(FailureTable::version), Some(7));
        let f = relay.path_view(PathId(0), t0 + Duration::from_secs(5)).unwrap().failure.unwrap();
        assert_eq!(f, FailureForecast { distance_m: 400.0, speed_mps: 80.0 }, "extrapolated 400 m");
        assert_eq!(f.time_to_failure_us(), Some(5_000_000));
        assert_eq!(relay.path_view(PathId(1), t0).unwrap().failure, None, "path 1's cell is unknown");
        let stale = t0 + relay.config().train_state_max_age + Duration::from_millis(1);
        assert_eq!(relay.path_view(PathId(0), stale).unwrap().failure, None, "a stale position predicts nothing");
    }

    #[test]
    fn a_cumulative_ack_inside_a_segment_is_a_protocol_error_and_the_connection_carries_on() {
        // The hardening issue's recipe: this used to underflow `offset -
        // acked_base` when the segment was sent again.
        let now = Instant::now();
        let (mut relay, mut proxy) = pair("minrtt", now);
        paths_up(&mut relay, &mut proxy, &[PathId(0)], now);
        let c = relay.open(UserId([1; 16]), "10.99.0.10:80".parse().unwrap(), now).unwrap();
        let data: Vec<u8> = (0..20_000u32).map(|i| (i % 253) as u8).collect();
        assert_eq!(relay.send(c, &data, now), Ok(20_000));
        relay.schedule(now);
        let mut first = Vec::new();
        relay.poll_transmit(PathId(0), now, &mut first, 1 << 20);
        let mut bad = Vec::new();
        Frame::Ack { conn: c, cumulative: 100, fin: false, sack: vec![] }.encode(&mut bad);
        let err = relay.handle_input(PathId(0), &bad, now).unwrap_err();
        assert!(matches!(err, InputError::Ack(PathId(0), _, AckError::InsideSegment { cumulative: 100, .. })), "{err}");
        assert_eq!(relay.stats().protocol_errors, 1);
        // The shell closes the subflow; a new one carries everything again.
        relay.path_down(PathId(0), now);
        proxy.path_down(PathId(0), now);
        paths_up(&mut relay, &mut proxy, &[PathId(0)], now);
        relay.schedule(now);
        relay.finish(c, now).unwrap();
        pump(&mut relay, &mut proxy, now);
        let mut got = vec![0u8; 30_000];
        let mut n = 0;
        while let Ok(Recv::Data(k)) = proxy.recv(c, &mut got[n..], now) {
            n += k;
        }
        assert!(got[..n] == data[..], "every byte once, in order: {n} of {} bytes", data.len());
    }

    #[test]
    fn initial_windows_are_granted_only_below_the_low_level() {
        // Budget 16 MiB: low 8, pressure 12. Initial windows of 2 MiB (the
        // minimum charged as any connection's, the rest granted): the first
        // four fit under 8 MiB, the next get the minimum; the rest of the
        // budget stays for send buffers and for windows that grow because
        // they are used.
        let t0 = Instant::now();
        let budget = MemoryBudget::with_high(16 << 20);
        let mut cfg = EndpointConfig::new(Role::Relay);
        cfg.budget = budget.clone();
        cfg.conn_window_initial_bytes = 2 << 20;
        let min = cfg.conn_window_min_bytes;
        let mut relay = Endpoint::new(cfg, Registry::with_builtins().build("minrtt").unwrap(), t0);
        let dst: SocketAddr = "10.99.0.10:80".parse().unwrap();
        let windows: Vec<u64> = (0..8)
            .map(|_| {
                let id = relay.open(UserId([3; 16]), dst, t0).unwrap();
                relay.conns[&id].recv.window()
            })
            .collect();
        assert_eq!(windows[..4], [2 << 20; 4], "{windows:?}");
        assert_eq!(windows[4..], [min; 4], "{windows:?}");
        assert!(budget.used() <= budget.levels().low + 4 * min, "used {} of {:?}", budget.used(), budget.levels());
    }

    #[test]
    fn memory_pressure_shrinks_the_largest_window_first() {
        let t0 = Instant::now();
        let budget = MemoryBudget::new(crate::budget::BudgetLevels { low: 0, pressure: 1 << 20, high: 2 << 20 });
        let r = Registry::with_builtins();
        let mut cfg = EndpointConfig::new(Role::Proxy);
        cfg.budget = budget.clone();
        cfg.conn_window_initial_bytes = 64 * 1024;
        let mut proxy = Endpoint::new(cfg, r.build("minrtt").unwrap(), t0);
        proxy.path_up(PathId(0), t0);
        let mut relay = Endpoint::new(EndpointConfig::new(Role::Relay), r.build("minrtt").unwrap(), t0);
        relay.path_up(PathId(0), t0);
        let user = UserId([2; 16]);
        let dst: SocketAddr = "10.99.0.10:80".parse().unwrap();
        let ids: Vec<ConnId> = (0..3).map(|_| relay.open(user, dst, t0).unwrap()).collect();
        pump(&mut relay, &mut proxy, t0);
        // Give the connections windows of 512 KiB, 256 KiB, 128 KiB by hand
        // (as autotuning would), pushing the budget over its pressure level.
        for (id, w) in ids.iter().zip([512 * 1024, 256 * 1024, 128 * 1024]) {
            let c = proxy.conns.get_mut(id).unwrap();
            c.recv.set_window(w);
            Endpoint::settle(&budget, c);
        }
        budget.charge(300 * 1024); // another train's connections
        assert_eq!(budget.pressure(), Pressure::Pressure);
        proxy.handle_timeout(t0 + Duration::from_secs(1));
        let windows: Vec<u64> = ids.iter().map(|id| proxy.conns[id].recv.window()).collect();
        assert_eq!(windows, [256 * 1024, 256 * 1024, 128 * 1024], "only the largest shrank: enough was reclaimed");
        assert_eq!(budget.stats().reclaimed_bytes, 256 * 1024);
        assert!(budget.pressure() < Pressure::Pressure);
        budget.release(300 * 1024);
        assert_eq!(proxy.charged_total(), budget.used());
    }

    #[test]
    fn the_proxy_never_opens_connections() {
        let now = Instant::now();
        let (_, mut proxy) = pair("minrtt", now);
        assert_eq!(proxy.open(UserId([0; 16]), "1.2.3.4:80".parse().unwrap(), now), Err(StreamError::WrongRole));
    }

    #[test]
    fn an_open_frame_from_the_proxy_is_a_protocol_error() {
        let now = Instant::now();
        let (mut relay, _) = pair("minrtt", now);
        relay.path_up(PathId(0), now);
        let mut v = Vec::new();
        Frame::Open { conn: ConnId(1), user: UserId([0; 16]), dst: "1.2.3.4:80".parse().unwrap() }.encode(&mut v);
        assert!(matches!(relay.handle_input(PathId(0), &v, now), Err(InputError::Unexpected(_, "OPEN"))));
    }

    #[test]
    fn a_late_copy_of_an_older_path_status_does_not_undo_a_newer_one() {
        let now = Instant::now();
        let (mut relay, mut proxy) = pair("minrtt", now);
        paths_up(&mut relay, &mut proxy, &[PathId(0), PathId(1)], now);
        pump(&mut relay, &mut proxy, now);
        // Two reports about path 0, each copied onto both paths.
        relay.report_link(PathId(0), LinkState::Connected, 11);
        let mut old = [Vec::new(), Vec::new()];
        for (i, o) in old.iter_mut().enumerate() {
            relay.poll_transmit(PathId(i as u8), now, o, 1 << 20);
        }
        relay.report_link(PathId(0), LinkState::Connected, 22);
        let mut new = Vec::new();
        relay.poll_transmit(PathId(0), now, &mut new, 1 << 20);
        // Path 0 delivers both in order; path 1 delivers the older one late.
        proxy.handle_input(PathId(0), &old[0], now).unwrap();
        proxy.handle_input(PathId(0), &new, now).unwrap();
        assert_eq!(proxy.path_view(PathId(0), now).unwrap().cell, 22);
        proxy.handle_input(PathId(1), &old[1], now).unwrap();
        assert_eq!(proxy.path_view(PathId(0), now).unwrap().cell, 22, "the stale copy was ignored");
        let statuses =
            std::iter::from_fn(|| proxy.poll_event()).filter(|e| matches!(e, Event::PathStatus { .. })).count();
        assert_eq!(statuses, 2, "one event per report, not per copy");
    }

    #[test]
    fn the_trace_shows_where_each_segment_went_and_what_came_back() {
        let now = Instant::now();
        let (mut relay, mut proxy, c) = requested("roundrobin", now, true);
        let data = vec![7u8; 100_000];
        proxy.send(c, &data, now).unwrap();
        // Path 0's copies are written, then its subflow dies before they arrive.
        let mut lost = Vec::new();
        proxy.poll_transmit(PathId(0), now, &mut lost, 1 << 20);
        proxy.path_down(PathId(0), now);
        relay.path_down(PathId(0), now);
        pump(&mut relay, &mut proxy, now);
        let mut buf = vec![0u8; 200_000];
        let mut got = 0;
        while let Ok(Recv::Data(n)) = relay.recv(c, &mut buf[got..], now) {
            got += n;
        }
        assert_eq!(got, data.len());

        let sent: Vec<TraceEvent> = std::iter::from_fn(|| proxy.poll_trace()).map(|r| r.event).collect();
        let on0: Vec<u64> = sent
            .iter()
            .filter_map(|e| match *e {
                TraceEvent::Sent { path: PathId(0), conn, offset, .. } if conn == c => Some(offset),
                _ => None,
            })
            .collect();
        assert!(!on0.is_empty(), "round robin wrote segments to path 0: {sent:?}");
        for off in &on0 {
            assert!(
                sent.contains(&TraceEvent::Requeued {
                    path: PathId(0),
                    conn: c,
                    offset: *off,
                    cause: RequeueCause::PathDown
                }),
                "segment {off} lost with path 0 was given back"
            );
            assert!(
                sent.iter().any(|e| matches!(*e, TraceEvent::Sent { path: PathId(1), offset, copy: CopyKind::Reinjection, .. } if offset == *off)),
                "and sent again on path 1"
            );
        }
        assert!(sent.contains(&TraceEvent::PathDown { path: PathId(0) }));
        assert!(sent.iter().any(
            |e| matches!(*e, TraceEvent::Acked { conn, cumulative } if conn == c && cumulative == data.len() as u64)
        ));

        let recv: Vec<TraceEvent> = std::iter::from_fn(|| relay.poll_trace()).map(|r| r.event).collect();
        let new_bytes: u64 = recv
            .iter()
            .filter_map(|e| match *e {
                TraceEvent::Received { conn, new, .. } if conn == c => Some(u64::from(new)),
                _ => None,
            })
            .sum();
        assert_eq!(new_bytes, data.len() as u64, "every byte arrived once as new");
        assert!(recv.iter().all(|e| !matches!(e, TraceEvent::Received { path: PathId(0), .. })));
        let window_sent = recv.iter().find_map(|e| match *e {
            TraceEvent::WindowSent { conn, max_data, .. } if conn == c => Some(max_data),
            _ => None,
        });
        let window_got = sent.iter().find_map(|e| match *e {
            TraceEvent::WindowReceived { conn, max_data, .. } if conn == c => Some(max_data),
            _ => None,
        });
        assert!(window_sent.is_some() && window_sent == window_got, "the relay's WINDOW, as sent and as received");
        assert_eq!(proxy.trace_dropped(), 0);
        assert_eq!(proxy.poll_trace(), None);
    }

    #[test]
    fn the_trace_shows_when_the_peers_window_holds_a_connection_back() {
        let now = Instant::now();
        let r = Registry::with_builtins();
        let mut cfg = EndpointConfig::new(Role::Relay);
        cfg.set_fixed_window(INITIAL_MAX_DATA);
        let mut relay = Endpoint::new(cfg, r.build("minrtt").unwrap(), now);
        let mut proxy = Endpoint::new(EndpointConfig::new(Role::Proxy), r.build("minrtt").unwrap(), now);
        proxy.enable_trace(10_000);
        paths_up(&mut relay, &mut proxy, &[PathId(0)], now);
        let c = relay.open(UserId([1; 16]), "10.99.0.10:80".parse().unwrap(), now).unwrap();
        relay.send(c, b"GET /", now).unwrap();
        pump(&mut relay, &mut proxy, now);
        proxy.send(c, &vec![1u8; 3 * INITIAL_MAX_DATA as usize], now).unwrap();
        pump(&mut relay, &mut proxy, now);
        let limited = |ep: &mut Endpoint| -> Vec<bool> {
            std::iter::from_fn(|| ep.poll_trace())
                .filter_map(|r| match r.event {
                    TraceEvent::WindowLimited { conn, limited } if conn == c => Some(limited),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(limited(&mut proxy), vec![true], "the relay read nothing: the proxy waits for its window");
        let mut buf = vec![0u8; 4 * INITIAL_MAX_DATA as usize];
        while let Ok(Recv::Data(_)) = relay.recv(c, &mut buf, now) {}
        pump(&mut relay, &mut proxy, now);
        assert_eq!(limited(&mut proxy).first(), Some(&false), "the relay's WINDOW released it");
    }

    #[test]
    fn data_queued_for_a_path_that_times_out_is_sent_elsewhere_as_a_first_copy() {
        let now = Instant::now();
        let (_relay, mut proxy, c) = requested("minrtt", now, false);
        // Path 1 looks much slower, so minRTT fills path 0 first.
        proxy.slots[1].as_mut().unwrap().path.on_rtt_sample_for_test(Duration::from_millis(500), now);
        proxy.send(c, &vec![3u8; 200_000], now).unwrap();
        proxy.schedule(now);
        // One frame of path 0 is written (and lost in its blackout); the
        // rest waits in the endpoint's queue for path 0.
        let mut lost = Vec::new();
        proxy.poll_transmit(PathId(0), now, &mut lost, 1);
        let queued = proxy.slots[0].as_ref().unwrap().data.len();
        assert!(queued >= 2, "segments wait in path 0's queue: {queued}");
        let before = proxy.stats().reinjected_bytes;
        // Path 0's timer fires: the written frame is reinjected (rto-oldest),
        // the queued ones go back as never sent.
        let later = now + Duration::from_secs(5);
        proxy.handle_timeout(later);
        // Path 1 first writes what was already queued for it, then what
        // came back from path 0.
        let mut out = Vec::new();
        for _ in 0..3 {
            proxy.poll_transmit(PathId(1), later, &mut out, 1 << 22);
        }
        let reinjected = proxy.stats().reinjected_bytes - before;
        let seg = u64::from(proxy.cfg.segment_bytes);
        assert!(out.len() as u64 > 7 * seg, "path 1 sent its own and path 0's segments: {}", out.len());
        assert!(reinjected <= seg, "only the written segment counts as reinjected: {reinjected}");
        let left = proxy.slots[0].as_ref().unwrap().data.len();
        assert!(left <= 1, "the path in timeout holds at most a probe: {left} segments queued");
    }

    // ----- a faulty or hostile peer ------------------------------------

    fn encoded(frames: impl IntoIterator<Item = Frame>) -> Vec<u8> {
        let mut out = Vec::new();
        for f in frames {
            f.encode(&mut out);
        }
        out
    }

    fn decoded(bytes: &[u8]) -> Vec<Frame> {
        let mut d = FrameDecoder::new();
        d.push(bytes);
        std::iter::from_fn(|| d.next_frame().unwrap().map(|f| f.frame)).collect()
    }

    /// The (connection, code) of every RESET in `bytes`.
    fn resets_in(bytes: &[u8]) -> Vec<(u32, u32)> {
        decoded(bytes)
            .into_iter()
            .filter_map(|f| match f {
                Frame::Reset { conn, code } => Some((conn.0, code)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_million_pings_leave_one_pong_queued() {
        let now = Instant::now();
        let (_relay, mut proxy) = pair("minrtt", now);
        proxy.path_up(PathId(0), now);
        for chunk in 0..100u64 {
            let input = encoded((0..10_000u64).map(|i| Frame::Ping { id: chunk * 10_000 + i, timestamp_us: i }));
            proxy.handle_input(PathId(0), &input, now).unwrap();
            assert!(proxy.ctrl_backlog(PathId(0)) <= 1, "{}", proxy.ctrl_backlog(PathId(0)));
        }
        let mut out = Vec::new();
        proxy.poll_transmit(PathId(0), now, &mut out, 1 << 20);
        let pongs: Vec<u64> = decoded(&out)
            .into_iter()
            .filter_map(|f| match f {
                Frame::Pong { id, .. } => Some(id),
                _ => None,
            })
            .collect();
        assert_eq!(pongs, vec![999_999], "the newest PING is answered, once");
        assert!(!proxy.input_paused(PathId(0)));
    }

    #[test]
    fn duplicate_telemetry_is_acknowledged_once_per_record_however_often_it_comes() {
        let now = Instant::now();
        let (_relay, mut proxy) = pair("minrtt", now);
        proxy.path_up(PathId(0), now);
        proxy.path_up(PathId(1), now);
        let input =
            encoded((0..200_000u64).map(|i| Frame::Telemetry { seq: i % 5, payload: Bytes::from_static(b"x") }));
        proxy.handle_input(PathId(0), &input, now).unwrap();
        // The shell acknowledges every copy it is shown (first or duplicate).
        while let Some(ev) = proxy.poll_event() {
            if let Event::Telemetry { seq, .. } | Event::TelemetryDuplicate { seq, .. } = ev {
                proxy.ack_telemetry(seq);
            }
        }
        assert_eq!(proxy.ctrl_backlog(PathId(0)), 5);
        assert_eq!(proxy.ctrl_backlog(PathId(1)), 5);
    }

    #[test]
    fn a_flood_of_resets_pauses_input_then_a_peer_that_never_reads_loses_the_path() {
        let now = Instant::now();
        let (_relay, mut proxy) = pair("minrtt", now);
        proxy.path_up(PathId(0), now);
        proxy.path_up(PathId(1), now);
        let dst: SocketAddr = "10.0.0.1:22".parse().unwrap();
        let mut next = 1u32;
        let feed = |proxy: &mut Endpoint, next: &mut u32, n: u32| {
            let input =
                encoded((*next..*next + n).map(|c| Frame::Open { conn: ConnId(c), user: UserId([7; 16]), dst }));
            *next += n;
            proxy.handle_input(PathId(0), &input, now).unwrap();
            // The shell refuses each destination: a RESET on every path.
            while let Some(ev) = proxy.poll_event() {
                if let Event::ConnOpened { conn, .. } = ev {
                    proxy.reset(conn, 1, now);
                }
            }
        };
        feed(&mut proxy, &mut next, 1000);
        assert!(!proxy.input_paused(PathId(0)));
        feed(&mut proxy, &mut next, CTRL_PAUSE as u32);
        assert!(proxy.input_paused(PathId(0)), "the shell stops reading path 0");
        // Path 1's peer writes and reads; path 0's peer never reads: if the
        // shell kept reading path 0 anyway, the queue would stop at CTRL_MAX.
        let mut dead = Vec::new();
        while proxy.ctrl_backlog(PathId(0)) < CTRL_MAX && next < 200_000 {
            let mut out = Vec::new();
            proxy.poll_transmit(PathId(1), now, &mut out, 1 << 22);
            let input =
                encoded((next..next + 1000).map(|c| Frame::Open { conn: ConnId(c), user: UserId([7; 16]), dst }));
            next += 1000;
            proxy.handle_input(PathId(0), &input, now).unwrap();
            while let Some(ev) = proxy.poll_event() {
                match ev {
                    Event::ConnOpened { conn, .. } => proxy.reset(conn, 1, now),
                    Event::PathDead(p) => dead.push(p),
                    _ => {}
                }
            }
        }
        assert!(proxy.ctrl_backlog(PathId(0)) < CTRL_MAX + 2000);
        assert_eq!(proxy.stats().ctrl_overflows, 1);
        assert_eq!(dead, vec![PathId(0)], "path 0 is declared dead, once");
        let mut out = Vec::new();
        proxy.poll_transmit(PathId(1), now, &mut out, 1 << 22);
        assert_eq!(proxy.ctrl_backlog(PathId(1)), 0, "path 1 was drained by its writer");
        // The shell takes the dead path down: its queue is gone.
        proxy.path_down(PathId(0), now);
        assert_eq!(proxy.ctrl_backlog(PathId(0)), 0);
    }

    #[test]
    fn a_relay_reset_before_its_open_was_sent_leaves_no_gap_at_the_proxy() {
        let now = Instant::now();
        let (mut relay, mut proxy) = pair("minrtt", now);
        let dst: SocketAddr = "10.99.0.10:80".parse().unwrap();
        // No path is up: the OPEN of the first connection is never sent.
        let gone = relay.open(UserId([1; 16]), dst, now).unwrap();
        relay.reset(gone, 3, now);
        paths_up(&mut relay, &mut proxy, &[PathId(0)], now);
        for _ in 0..10 {
            let c = relay.open(UserId([1; 16]), dst, now).unwrap();
            pump(&mut relay, &mut proxy, now);
            relay.reset(c, 0, now);
            pump(&mut relay, &mut proxy, now);
        }
        assert!(proxy.opened_above.is_empty(), "{:?}", proxy.opened_above);
        assert_eq!(proxy.opened_floor, 12);
        while proxy.poll_event().is_some() {}
        // A late copy of the first OPEN does not revive the connection.
        let late = encoded([Frame::Open { conn: gone, user: UserId([1; 16]), dst }]);
        proxy.handle_input(PathId(0), &late, now).unwrap();
        assert!(!std::iter::from_fn(|| proxy.poll_event()).any(|e| matches!(e, Event::ConnOpened { .. })));
    }

    #[test]
    fn a_reset_lost_with_every_subflow_that_carried_it_is_sent_again() {
        let now = Instant::now();
        let (mut relay, mut proxy) = pair("minrtt", now);
        paths_up(&mut relay, &mut proxy, &[PathId(0), PathId(1)], now);
        let dst: SocketAddr = "10.99.0.10:80".parse().unwrap();
        let c = relay.open(UserId([1; 16]), dst, now).unwrap();
        relay.send(c, &[7; 1000], now).unwrap();
        pump(&mut relay, &mut proxy, now);
        while relay.poll_event().is_some() {}
        // The proxy resets the connection (a refused upstream, say) and
        // writes the RESET on both subflows, which both die with it unread.
        proxy.reset(c, 9, now);
        for p in [PathId(0), PathId(1)] {
            let mut lost = Vec::new();
            assert!(proxy.poll_transmit(p, now, &mut lost, 1 << 20) > 0);
        }
        let later = now + Duration::from_secs(1);
        for p in [PathId(0), PathId(1)] {
            relay.path_down(p, later);
            proxy.path_down(p, later);
        }
        for p in [PathId(0), PathId(1)] {
            relay.path_up(p, later);
            proxy.path_up(p, later);
        }
        pump(&mut relay, &mut proxy, later);
        let ev: Vec<Event> = std::iter::from_fn(|| relay.poll_event()).collect();
        assert!(ev.contains(&Event::ConnReset { conn: c, code: 9 }), "{ev:?}");
        assert!(!relay.conns.contains_key(&c));
        // One path lost, the other still up: sent again on it.
        let c2 = relay.open(UserId([1; 16]), dst, later).unwrap();
        pump(&mut relay, &mut proxy, later);
        proxy.reset(c2, 5, later);
        let mut lost = Vec::new();
        assert!(proxy.poll_transmit(PathId(0), later, &mut lost, 1 << 20) > 0);
        proxy.path_down(PathId(0), later);
        relay.path_down(PathId(0), later);
        pump(&mut relay, &mut proxy, later);
        assert!(!relay.conns.contains_key(&c2));
        // Old resets are forgotten: a path going down much later sends none.
        let much_later = later + RESET_RESEND_WINDOW + Duration::from_secs(1);
        proxy.path_down(PathId(1), much_later);
        assert!(proxy.recent_resets.is_empty() && proxy.orphan_resets.is_empty());
    }

    #[test]
    fn resets_while_no_path_is_up_keep_the_endpoints_memory_bounded() {
        let now = Instant::now();
        let (mut relay, mut proxy) = pair("minrtt", now);
        let dst: SocketAddr = "10.99.0.10:80".parse().unwrap();
        // A long outage: passengers open and give up on connection after
        // connection, each one reset with no path to carry its RESET.
        for _ in 0..20 * RESET_RESEND_MAX {
            let c = relay.open(UserId([2; 16]), dst, now).unwrap();
            relay.reset(c, 1, now);
        }
        assert_eq!(relay.orphan_resets.len(), RESET_RESEND_MAX);
        // The first path up gets the most recent ones and stays healthy.
        paths_up(&mut relay, &mut proxy, &[PathId(0)], now);
        let queued = relay.slots[0].as_ref().unwrap().ctrl.len();
        assert!(queued < CTRL_PAUSE, "{queued} control frames queued");
        assert!(relay.orphan_resets.is_empty());
        pump(&mut relay, &mut proxy, now);
        assert!(relay.up_paths().contains(&PathId(0)));
    }

    #[test]
    fn opens_that_skip_ids_keep_the_proxys_memory_of_them_bounded() {
        let now = Instant::now();
        let (_relay, mut proxy) = pair("minrtt", now);
        proxy.path_up(PathId(0), now);
        let dst: SocketAddr = "10.99.0.10:80".parse().unwrap();
        // Id 1 never comes; every other id does, then is reset.
        for c in 2..(OPENED_WINDOW as u32 + 5000) {
            let input = encoded([
                Frame::Open { conn: ConnId(c), user: UserId([2; 16]), dst },
                Frame::Reset { conn: ConnId(c), code: 0 },
            ]);
            proxy.handle_input(PathId(0), &input, now).unwrap();
            while proxy.poll_event().is_some() {}
        }
        assert!(proxy.opened_above.len() <= OPENED_WINDOW);
        assert!(proxy.opened_floor > 1, "the gap at id 1 was given up");
        assert!(proxy.conns.is_empty());
    }

    #[test]
    fn connection_ids_wrap_past_live_connections_on_both_sides() {
        let now = Instant::now();
        let (mut relay, mut proxy) = pair("minrtt", now);
        paths_up(&mut relay, &mut proxy, &[PathId(0)], now);
        let dst: SocketAddr = "10.99.0.10:80".parse().unwrap();
        let live = relay.open(UserId([1; 16]), dst, now).unwrap();
        pump(&mut relay, &mut proxy, now);
        // 2^32 connections later (as if): the relay's counter and the
        // proxy's floor are just below the wrap.
        relay.next_conn = u32::MAX - 1;
        proxy.opened_floor = u64::from(u32::MAX - 1);
        let mut ids = Vec::new();
        for _ in 0..4 {
            let c = relay.open(UserId([1; 16]), dst, now).unwrap();
            ids.push(c.0);
            pump(&mut relay, &mut proxy, now);
        }
        assert_eq!(ids, vec![u32::MAX - 1, u32::MAX, 2, 3], "0 and the live id 1 are skipped");
        assert_eq!(proxy.conns.len(), 5);
        assert!(proxy.conns.contains_key(&live));
        assert_eq!(proxy.opened_floor, (1u64 << 32) + 4);
        // A copy of an OPEN already handled changes nothing.
        let copy = encoded([Frame::Open { conn: ConnId(2), user: UserId([9; 16]), dst }]);
        proxy.handle_input(PathId(0), &copy, now).unwrap();
        assert_eq!(proxy.conns.len(), 5);
        // Another 2^32 ids later the live connection's id comes round again
        // (the relay dropped it, the proxy did not yet; or a faulty relay):
        // the old connection ends, the new one is served.
        while proxy.poll_event().is_some() {}
        proxy.opened_floor = (2u64 << 32) + u64::from(u32::MAX - 10);
        let reuse = encoded([Frame::Open { conn: live, user: UserId([9; 16]), dst }]);
        proxy.handle_input(PathId(0), &reuse, now).unwrap();
        let ev: Vec<Event> = std::iter::from_fn(|| proxy.poll_event()).collect();
        assert!(ev.contains(&Event::ConnReset { conn: live, code: 0 }), "{ev:?}");
        assert!(ev.iter().any(|e| matches!(e, Event::ConnOpened { conn, .. } if *conn == live)));
        assert_eq!(proxy.conns[&live].user, UserId([9; 16]));
        assert_eq!(proxy.conns.len(), 5);
    }

    #[test]
    fn a_telemetry_record_too_large_for_a_frame_is_refused_not_a_panic() {
        let now = Instant::now();
        let (mut relay, _proxy) = pair("minrtt", now);
        relay.path_up(PathId(0), now);
        let big = Bytes::from(vec![0u8; wire::MAX_TELEMETRY_PAYLOAD + 1]);
        assert_eq!(relay.send_telemetry(1, big), Err(StreamError::TelemetryTooLarge(wire::MAX_TELEMETRY_PAYLOAD + 1)));
        let max = Bytes::from(vec![0u8; wire::MAX_TELEMETRY_PAYLOAD]);
        relay.send_telemetry(2, max).unwrap();
        let mut out = Vec::new();
        relay.poll_transmit(PathId(0), now, &mut out, 1 << 20);
        assert!(out.len() > wire::MAX_TELEMETRY_PAYLOAD);
    }

    #[test]
    fn one_passenger_cannot_take_every_connection_and_the_proxy_caps_a_train() {
        let now = Instant::now();
        let r = Registry::with_builtins();
        let mut rc = EndpointConfig::new(Role::Relay);
        rc.max_conns_per_user = 3;
        rc.max_conns = 5;
        let mut relay = Endpoint::new(rc, r.build("minrtt").unwrap(), now);
        let dst: SocketAddr = "10.99.0.10:80".parse().unwrap();
        let (a, b, c) = (UserId([1; 16]), UserId([2; 16]), UserId([3; 16]));
        let a1 = relay.open(a, dst, now).unwrap();
        relay.open(a, dst, now).unwrap();
        relay.open(a, dst, now).unwrap();
        assert_eq!(relay.open(a, dst, now), Err(StreamError::TooManyConns(3)));
        relay.open(b, dst, now).unwrap();
        relay.open(b, dst, now).unwrap();
        assert_eq!(relay.open(c, dst, now), Err(StreamError::TooManyConns(5)));
        assert_eq!(relay.stats().conns_refused, 2);
        // A slot freed is a slot again.
        relay.reset(a1, 0, now);
        relay.open(a, dst, now).unwrap();

        let mut pc = EndpointConfig::new(Role::Proxy);
        pc.max_conns = 2;
        let mut proxy = Endpoint::new(pc, r.build("minrtt").unwrap(), now);
        proxy.path_up(PathId(0), now);
        let input = encoded((1..=4).map(|i| Frame::Open { conn: ConnId(i), user: a, dst }));
        proxy.handle_input(PathId(0), &input, now).unwrap();
        assert_eq!(proxy.conn_count(), 2);
        assert_eq!(proxy.stats().conns_refused, 2);
        let mut out = Vec::new();
        proxy.poll_transmit(PathId(0), now, &mut out, 1 << 20);
        let resets = resets_in(&out);
        assert_eq!(resets, vec![(3, RESET_REFUSED_LIMIT), (4, RESET_REFUSED_LIMIT)]);
    }

    /// A proxy's hard budget with room for two connections' reservations:
    /// the third OPEN is answered with RESET code 5 (overloaded) and
    /// charges nothing; the two admitted still take data; once one closes,
    /// a new one is admitted. The account never passes the budget.
    #[test]
    fn a_hard_budget_refuses_an_open_it_cannot_reserve_and_keeps_the_admitted_working() {
        let now = Instant::now();
        let r = Registry::with_builtins();
        let mut pc = EndpointConfig::new(Role::Proxy);
        pc.hard_budget = true;
        pc.conn_overhead_bytes = 160 * 1024;
        let reservation = pc.conn_overhead_bytes + pc.conn_window_min_bytes + pc.conn_unsent_min_bytes;
        let high = 2 * reservation + reservation / 2;
        pc.budget = MemoryBudget::with_high(high);
        let mut proxy = Endpoint::new(pc, r.build("minrtt").unwrap(), now);
        proxy.path_up(PathId(0), now);
        let (a, dst) = (UserId([1; 16]), "10.99.0.10:80".parse::<SocketAddr>().unwrap());
        let input = encoded((1..=3).map(|i| Frame::Open { conn: ConnId(i), user: a, dst }));
        proxy.handle_input(PathId(0), &input, now).unwrap();
        assert_eq!(proxy.conn_count(), 2);
        assert_eq!(proxy.stats().conns_refused, 1);
        assert!(proxy.budget().used() >= 2 * reservation, "each admitted connection holds its reservation");
        assert!(proxy.budget().stats().peak <= high, "the account never passes the budget");
        let mut out = Vec::new();
        proxy.poll_transmit(PathId(0), now, &mut out, 1 << 20);
        let resets = resets_in(&out);
        assert_eq!(resets, vec![(3, RESET_OVERLOADED)]);
        // The admitted connections take what the server sends: their floor
        // at least, and more as far as the budget goes.
        let server = vec![7u8; 1 << 20];
        let took = proxy.send(ConnId(1), &server, now).unwrap();
        assert!(took >= 32 * 1024, "took {took}");
        assert!(proxy.send(ConnId(2), &server, now).unwrap() > 0);
        assert!(proxy.budget().stats().peak <= high, "peak {} of {high}", proxy.budget().stats().peak);
        assert_eq!(proxy.charged_total(), proxy.budget().used());
        // A connection gone gives its reservation back: a new one fits.
        proxy.reset(ConnId(2), 0, now);
        let input = encoded([Frame::Open { conn: ConnId(4), user: a, dst }]);
        proxy.handle_input(PathId(0), &input, now).unwrap();
        assert_eq!(proxy.conn_count(), 2);
        assert_eq!(proxy.stats().conns_refused, 1);
        assert!(proxy.budget().stats().peak <= high);
    }

    /// The relay opens nothing its hard budget cannot reserve either.
    #[test]
    fn a_relay_with_a_hard_budget_refuses_an_open_beyond_it() {
        let now = Instant::now();
        let r = Registry::with_builtins();
        let mut rc = EndpointConfig::new(Role::Relay);
        rc.hard_budget = true;
        let reservation = rc.conn_window_min_bytes + rc.conn_unsent_min_bytes;
        rc.budget = MemoryBudget::with_high(reservation + reservation / 2);
        let mut relay = Endpoint::new(rc, r.build("minrtt").unwrap(), now);
        let (a, dst) = (UserId([1; 16]), "10.99.0.10:80".parse::<SocketAddr>().unwrap());
        let first = relay.open(a, dst, now).unwrap();
        assert_eq!(relay.open(a, dst, now), Err(StreamError::NoMemory));
        relay.reset(first, 0, now);
        relay.open(a, dst, now).unwrap();
        assert_eq!(relay.budget().used(), relay.charged_total());
    }
}
