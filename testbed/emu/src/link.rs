//! One direction of one carrier: loss → droptail bottleneck queue → delay line, with blackouts.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use thiserror::Error;

use crate::schedule::{BlackoutKind, LossKeying, LossProcess, Schedule, ScheduleError};
use crate::trace::Trace;

/// Bytes one trace line lets leave by default: a full-size IP packet (MTU 1500).
pub const DEFAULT_OPPORTUNITY_BYTES: usize = 1500;

/// mm-link's `PACKET_SIZE`: it counts the 4-byte TUN packet-information header that its
/// packets carry; use it as [`LinkConfig::opportunity_bytes`] to reproduce mm-link byte for
/// byte on packets that include that header.
pub const MAHIMAHI_OPPORTUNITY_BYTES: usize = 1504;

/// How the bottleneck queue is drained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Service {
    /// Delivery opportunities from a Mahimahi trace, repeated forever (mm-link's default).
    Trace(Trace),
    /// A constant bit rate: a packet of `n` bytes occupies the server for `n · 8 / rate`
    /// (rounded up to the nanosecond), work-conserving, FIFO.
    ConstantRate {
        /// Link rate in bits per second (> 0).
        bits_per_sec: u64,
    },
}

/// Configuration of a [`Link`].
#[derive(Debug, Clone, PartialEq)]
pub struct LinkConfig {
    /// How the bottleneck queue drains.
    pub service: Service,
    /// Byte budget of one trace delivery opportunity (ignored for constant rate).
    pub opportunity_bytes: usize,
    /// Droptail limit on queued bytes; `None` = unbounded (mm-link's default "infinite" queue).
    pub buffer_bytes: Option<usize>,
    /// Delay, loss and blackout schedule.
    pub schedule: Schedule,
    /// Seed of the loss process's random draws.
    pub seed: u64,
    /// What the loss process's draws are keyed by: time (the default; common random numbers
    /// across links offered different traffic) or packet count (the emulator's first versions).
    pub loss_keying: LossKeying,
    /// Record a [`LinkEvent`] per packet and blackout edge, drained with [`Link::drain_events`].
    pub event_log: bool,
}

impl LinkConfig {
    /// A link with the given service, 1500-byte opportunities, an unbounded buffer, no delay,
    /// no loss, no blackouts, seed 0, time-keyed loss and no event log.
    pub fn new(service: Service) -> Self {
        Self {
            service,
            opportunity_bytes: DEFAULT_OPPORTUNITY_BYTES,
            buffer_bytes: None,
            schedule: Schedule::default(),
            seed: 0,
            loss_keying: LossKeying::Time,
            event_log: false,
        }
    }
}

/// Why a [`LinkConfig`] was rejected.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ConfigError {
    /// Constant rate of zero.
    #[error("constant rate must be positive")]
    ZeroRate,
    /// Opportunities of zero bytes.
    #[error("opportunity_bytes must be positive")]
    ZeroOpportunity,
    /// The schedule is inconsistent.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
}

/// What [`Link::push`] did with a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// In the bottleneck queue.
    Queued,
    /// Lost by the Gilbert–Elliott process.
    DroppedLoss,
    /// Did not fit in the droptail buffer.
    DroppedBuffer,
    /// Arrived during a [`BlackoutKind::Flush`] blackout.
    DroppedBlackout,
}

/// A packet leaving the link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// Sequence number assigned at [`Link::push`] (counts every pushed packet, dropped or not).
    pub id: u64,
    /// The payload, untouched.
    pub data: Vec<u8>,
    /// When it was pushed.
    pub arrival: Duration,
    /// When it left the bottleneck queue (the delivery opportunity or service completion).
    pub dequeued: Duration,
    /// When it leaves the delay stage, i.e. the link.
    pub departure: Duration,
}

/// A packet and byte count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counter {
    /// Packets.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
}

impl Counter {
    fn add(&mut self, bytes: usize) {
        self.packets += 1;
        self.bytes += bytes as u64;
    }
}

/// Counters of a [`Link`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LinkStats {
    /// Everything pushed.
    pub arrived: Counter,
    /// Everything returned by [`Link::poll_deliver`].
    pub delivered: Counter,
    /// Lost by the Gilbert–Elliott process.
    pub dropped_loss: Counter,
    /// Dropped by the droptail buffer.
    pub dropped_buffer: Counter,
    /// Arrivals dropped during a flush blackout.
    pub dropped_blackout: Counter,
    /// Queued packets dropped at the start of a flush blackout.
    pub flushed: Counter,
    /// Largest number of queued bytes seen.
    pub max_queue_bytes: usize,
}

/// What happened, in a [`LinkEvent`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A packet entered the bottleneck queue.
    Enqueue,
    /// A packet was lost by the loss process.
    DropLoss,
    /// A packet did not fit in the buffer.
    DropBuffer,
    /// A packet arrived during a flush blackout.
    DropBlackout,
    /// A queued packet was dropped at a flush blackout's start.
    Flush,
    /// A packet left the bottleneck queue for the delay stage.
    Dequeue,
    /// A packet left the link ([`Link::poll_deliver`] returned it).
    Deliver,
    /// A blackout began.
    BlackoutStart(BlackoutKind),
    /// A blackout ended.
    BlackoutEnd(BlackoutKind),
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Self::Enqueue => "enqueue",
            Self::DropLoss => "drop-loss",
            Self::DropBuffer => "drop-buffer",
            Self::DropBlackout => "drop-blackout",
            Self::Flush => "flush",
            Self::Dequeue => "dequeue",
            Self::Deliver => "deliver",
            Self::BlackoutStart(BlackoutKind::Hold) => "blackout-start-hold",
            Self::BlackoutStart(BlackoutKind::Flush) => "blackout-start-flush",
            Self::BlackoutEnd(BlackoutKind::Hold) => "blackout-end-hold",
            Self::BlackoutEnd(BlackoutKind::Flush) => "blackout-end-flush",
        };
        f.write_str(s)
    }
}

/// One entry of the per-packet event log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkEvent {
    /// When it happened (link time).
    pub time: Duration,
    /// What happened.
    pub kind: EventKind,
    /// The packet's id (`None` for blackout edges).
    pub id: Option<u64>,
    /// The packet's size in bytes (0 for blackout edges).
    pub size: usize,
    /// Bytes in the bottleneck queue after the event.
    pub queue_bytes: usize,
}

impl fmt::Display for LinkEvent {
    /// `<time_ms> <kind> id=<id|-> size=<bytes> queue=<bytes>`, e.g.
    /// `12.500000 dequeue id=3 size=1500 queue=3000`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.6} {} id=", self.time.as_nanos() as f64 / 1e6, self.kind)?;
        match self.id {
            Some(id) => write!(f, "{id}")?,
            None => f.write_str("-")?,
        }
        write!(f, " size={} queue={}", self.size, self.queue_bytes)
    }
}

#[derive(Debug)]
struct Queued {
    id: u64,
    data: Vec<u8>,
    arrival: Duration,
}

#[derive(Debug)]
enum Server {
    Trace {
        trace: Trace,
        /// Index of the next unspent opportunity (over all repetitions).
        next: u64,
        /// The packet being sent across opportunities and its bytes still to send (mm-link's
        /// `packet_in_transit_`); not counted in the queue's bytes, as in mm-link.
        in_transit: Option<(Queued, usize)>,
    },
    Rate {
        bits_per_sec: u64,
        /// When the server last finished a packet (or was flushed).
        free_at: Duration,
    },
}

/// One direction of one emulated carrier. See the crate docs for the model.
///
/// Time is a [`Duration`] since the link's epoch (the start of the trip); callers holding
/// `Instant`s pass `now.duration_since(start)`. Time must not go backwards: an earlier `now`
/// than one seen before is treated as the latest one seen.
#[derive(Debug)]
pub struct Link {
    server: Server,
    opportunity_bytes: usize,
    buffer_bytes: Option<usize>,
    schedule: Schedule,
    loss: LossProcess,
    queue: VecDeque<Queued>,
    queue_bytes: usize,
    delay_line: VecDeque<Packet>,
    last_departure: Duration,
    /// Index into the blackout edges (2·i = start of blackout i, 2·i + 1 = its end).
    next_edge: usize,
    clock: Duration,
    next_id: u64,
    stats: LinkStats,
    /// Delivered packets by their time in the bottleneck queue, in
    /// milliseconds (the last bucket holds everything longer).
    sojourn_ms: Vec<u64>,
    log: Option<Vec<LinkEvent>>,
}

/// Longest queueing time [`Link::sojourn_quantile`] tells apart.
const SOJOURN_BUCKETS_MS: usize = 20_000;

impl Link {
    /// A link at time zero with an empty queue.
    pub fn new(config: LinkConfig) -> Result<Self, ConfigError> {
        config.schedule.validate()?;
        if config.opportunity_bytes == 0 {
            return Err(ConfigError::ZeroOpportunity);
        }
        let server = match config.service {
            Service::Trace(trace) => Server::Trace { trace, next: 0, in_transit: None },
            Service::ConstantRate { bits_per_sec: 0 } => return Err(ConfigError::ZeroRate),
            Service::ConstantRate { bits_per_sec } => Server::Rate { bits_per_sec, free_at: Duration::ZERO },
        };
        Ok(Self {
            server,
            opportunity_bytes: config.opportunity_bytes,
            buffer_bytes: config.buffer_bytes,
            schedule: config.schedule,
            loss: LossProcess::new(config.loss_keying, config.seed),
            queue: VecDeque::new(),
            queue_bytes: 0,
            delay_line: VecDeque::new(),
            last_departure: Duration::ZERO,
            next_edge: 0,
            clock: Duration::ZERO,
            next_id: 0,
            stats: LinkStats::default(),
            sojourn_ms: vec![0; SOJOURN_BUCKETS_MS + 1],
            log: config.event_log.then(Vec::new),
        })
    }

    /// Offers a packet arriving at `now`. The link is first brought up to `now` (opportunities
    /// at or before `now` are spent before the packet joins the queue, as mm-link does).
    pub fn push(&mut self, now: Duration, data: Vec<u8>) -> Admission {
        self.advance(now);
        let now = self.clock;
        let id = self.next_id;
        self.next_id += 1;
        let len = data.len();
        self.stats.arrived.add(len);
        if self.blackout_at(now).is_some_and(|b| b == BlackoutKind::Flush) {
            self.stats.dropped_blackout.add(len);
            self.event(now, EventKind::DropBlackout, Some(id), len);
            return Admission::DroppedBlackout;
        }
        if let Some(p) = self.schedule.loss.at(now) {
            if self.loss.lose(now, &p, &self.schedule.loss) {
                self.stats.dropped_loss.add(len);
                self.event(now, EventKind::DropLoss, Some(id), len);
                return Admission::DroppedLoss;
            }
        }
        if self.buffer_bytes.is_some_and(|limit| self.queue_bytes + len > limit) {
            self.stats.dropped_buffer.add(len);
            self.event(now, EventKind::DropBuffer, Some(id), len);
            return Admission::DroppedBuffer;
        }
        self.queue.push_back(Queued { id, data, arrival: now });
        self.queue_bytes += len;
        self.stats.max_queue_bytes = self.stats.max_queue_bytes.max(self.queue_bytes);
        self.event(now, EventKind::Enqueue, Some(id), len);
        Admission::Queued
    }

    /// The next packet whose departure time is `<= now`, in FIFO order.
    pub fn poll_deliver(&mut self, now: Duration) -> Option<Packet> {
        self.advance(now);
        if self.delay_line.front()?.departure > self.clock {
            return None;
        }
        let p = self.delay_line.pop_front()?;
        self.stats.delivered.add(p.data.len());
        let queued = p.dequeued.saturating_sub(p.arrival).as_millis() as usize;
        self.sojourn_ms[queued.min(SOJOURN_BUCKETS_MS)] += 1;
        self.event(p.departure, EventKind::Deliver, Some(p.id), p.data.len());
        Some(p)
    }

    /// When to call again: the earliest of the next departure from the delay stage, the next
    /// usable delivery opportunity or service completion while packets are queued, and the
    /// next flush-blackout start while packets are queued. Never earlier than `now` (it is
    /// `now` when [`Link::poll_deliver`] has something to return at `now`); after everything
    /// due at `now` has been polled it is strictly later. `None`: the link is empty.
    pub fn next_event(&mut self, now: Duration) -> Option<Duration> {
        self.advance(now);
        let now = self.clock;
        let mut next = self.delay_line.front().map(|p| p.departure.max(now));
        if self.backlog() {
            let candidates = [self.next_service_time(), self.next_flush_start()];
            for t in candidates.into_iter().flatten() {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        next
    }

    /// The `q` quantile (0..=1) of the delivered packets' time in the
    /// bottleneck queue, to the millisecond (capped at 20 s): the queueing
    /// delay a sender added, whatever its transport. `None` before any
    /// delivery.
    pub fn sojourn_quantile(&self, q: f64) -> Option<Duration> {
        let total: u64 = self.sojourn_ms.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (ms, n) in self.sojourn_ms.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(Duration::from_millis(ms as u64));
            }
        }
        None
    }

    /// Counters so far.
    pub fn stats(&self) -> &LinkStats {
        &self.stats
    }

    /// The latest time the link has been brought up to.
    pub fn now(&self) -> Duration {
        self.clock
    }

    /// Bytes waiting in the bottleneck queue (excluding a packet partly sent by a trace
    /// opportunity, as mm-link counts).
    pub fn queue_bytes(&self) -> usize {
        self.queue_bytes
    }

    /// Packets in the bottleneck queue, including one partly sent.
    pub fn queue_packets(&self) -> usize {
        self.queue.len() + usize::from(matches!(self.server, Server::Trace { in_transit: Some(_), .. }))
    }

    /// Packets that left the queue and are in the delay stage.
    pub fn in_flight(&self) -> usize {
        self.delay_line.len()
    }

    /// Takes the events recorded since the last call (empty unless [`LinkConfig::event_log`]).
    pub fn drain_events(&mut self) -> Vec<LinkEvent> {
        self.log.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn event(&mut self, time: Duration, kind: EventKind, id: Option<u64>, size: usize) {
        let queue_bytes = self.queue_bytes;
        if let Some(log) = self.log.as_mut() {
            log.push(LinkEvent { time, kind, id, size, queue_bytes });
        }
    }

    fn backlog(&self) -> bool {
        !self.queue.is_empty() || matches!(self.server, Server::Trace { in_transit: Some(_), .. })
    }

    fn blackout_at(&self, t: Duration) -> Option<BlackoutKind> {
        let b = &self.schedule.blackouts;
        let i = b.partition_point(|b| b.end <= t);
        b.get(i).filter(|b| b.start <= t).map(|b| b.kind)
    }

    fn next_edge_time(&self) -> Option<Duration> {
        let b = self.schedule.blackouts.get(self.next_edge / 2)?;
        Some(if self.next_edge % 2 == 0 { b.start } else { b.end })
    }

    /// Start of the next flush blackout not yet begun.
    fn next_flush_start(&self) -> Option<Duration> {
        let first = self.next_edge.div_ceil(2);
        self.schedule.blackouts.get(first..)?.iter().find(|b| b.kind == BlackoutKind::Flush).map(|b| b.start)
    }

    /// Time of the next service event given a backlog: the next trace opportunity outside any
    /// blackout (opportunities inside one are skipped, i.e. wasted), or the completion of the
    /// head packet at constant rate (service pauses during blackouts).
    fn next_service_time(&mut self) -> Option<Duration> {
        let blackouts = &self.schedule.blackouts;
        match &mut self.server {
            Server::Trace { trace, next, .. } => loop {
                let t = trace.opportunity_time(*next);
                let i = blackouts.partition_point(|b| b.end <= t);
                match blackouts.get(i) {
                    Some(b) if b.start <= t => *next = trace.first_at_or_after(b.end, false),
                    _ => return Some(t),
                }
            },
            Server::Rate { bits_per_sec, free_at } => {
                let head = self.queue.front()?;
                let need_ns = (head.data.len() as u128 * 8 * 1_000_000_000).div_ceil(u128::from(*bits_per_sec));
                let mut rem = Duration::from_nanos(u64::try_from(need_ns).unwrap_or(u64::MAX));
                let mut t = (*free_at).max(head.arrival);
                let mut i = blackouts.partition_point(|b| b.end <= t);
                while let Some(b) = blackouts.get(i) {
                    if t + rem <= b.start {
                        break;
                    }
                    if b.start > t {
                        rem -= b.start - t;
                    }
                    t = b.end;
                    i += 1;
                }
                Some(t + rem)
            }
        }
    }

    /// Processes every opportunity, completion and blackout edge up to `now`, in time order.
    fn advance(&mut self, now: Duration) {
        let now = now.max(self.clock);
        self.clock = now;
        loop {
            let service = if self.backlog() { self.next_service_time() } else { None };
            let edge = self.next_edge_time();
            // On a tie a blackout end goes first and a start last: service that completes
            // exactly at a blackout's start happened before it.
            let end_edge = self.next_edge % 2 == 1;
            let (t, is_edge) = match (edge, service) {
                (Some(e), Some(s)) if e < s || (e == s && end_edge) => (e, true),
                (_, Some(s)) => (s, false),
                (Some(e), None) => (e, true),
                (None, None) => break,
            };
            if t > now {
                break;
            }
            if is_edge {
                self.process_edge();
            } else {
                self.serve(t);
            }
        }
        if !self.backlog() {
            // mm-link spends (wastes) every opportunity at or before `now` on an empty queue.
            if let Server::Trace { trace, next, .. } = &mut self.server {
                if trace.opportunity_time(*next) <= now {
                    *next = trace.first_at_or_after(now, true);
                }
            }
        }
    }

    fn process_edge(&mut self) {
        let b = self.schedule.blackouts[self.next_edge / 2];
        let start = self.next_edge % 2 == 0;
        self.next_edge += 1;
        if !start {
            self.event(b.end, EventKind::BlackoutEnd(b.kind), None, 0);
            return;
        }
        self.event(b.start, EventKind::BlackoutStart(b.kind), None, 0);
        if b.kind == BlackoutKind::Flush {
            let mut dropped: Vec<Queued> = self.queue.drain(..).collect();
            self.queue_bytes = 0;
            match &mut self.server {
                Server::Trace { in_transit, .. } => {
                    if let Some((p, _)) = in_transit.take() {
                        dropped.insert(0, p);
                    }
                }
                Server::Rate { free_at, .. } => *free_at = (*free_at).max(b.start),
            }
            for p in dropped {
                self.stats.flushed.add(p.data.len());
                self.event(b.start, EventKind::Flush, Some(p.id), p.data.len());
            }
        }
    }

    /// Spends the service event at `t` (mm-link's `rationalize` loop body for one opportunity).
    fn serve(&mut self, t: Duration) {
        let mut done: Vec<Queued> = Vec::new();
        match &mut self.server {
            Server::Trace { next, in_transit, .. } => {
                *next += 1;
                let mut budget = self.opportunity_bytes;
                while budget > 0 {
                    if in_transit.is_none() {
                        let Some(p) = self.queue.pop_front() else { break };
                        self.queue_bytes -= p.data.len();
                        let len = p.data.len();
                        *in_transit = Some((p, len));
                    }
                    let Some((_, left)) = in_transit.as_mut() else { break };
                    let amount = budget.min(*left);
                    *left -= amount;
                    budget -= amount;
                    if *left == 0 {
                        done.extend(in_transit.take().map(|(p, _)| p));
                    }
                }
            }
            Server::Rate { free_at, .. } => {
                if let Some(p) = self.queue.pop_front() {
                    self.queue_bytes -= p.data.len();
                    *free_at = t;
                    done.push(p);
                }
            }
        }
        for p in done {
            let departure = (t + self.schedule.delay.at(t)).max(self.last_departure);
            self.last_departure = departure;
            self.event(t, EventKind::Dequeue, Some(p.id), p.data.len());
            self.delay_line.push_back(Packet { id: p.id, data: p.data, arrival: p.arrival, dequeued: t, departure });
        }
    }
}
