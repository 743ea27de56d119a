//! `railway`: congestion control for one subflow over a cellular carrier on
//! a moving train, sans-IO (every call takes `now`).
//!
//! A carrier on a high-speed railway loses packets to radio (not queues),
//! goes silent for tens of milliseconds in every handover and for seconds in
//! a failed one, changes its rate by several times within seconds, and
//! swings its base RTT as the train moves between cells. Loss-based
//! controllers read loss and silence as congestion and collapse their
//! window; BBR's rate model lags the rate and, to keep the pipe full,
//! keeps a queue of a whole round trip or more (quinn's BBR on the emulated
//! railway: median smoothed RTT 670 ms on a 100 ms path, a third of its
//! packets dropped at the bottleneck).
//!
//! A cellular carrier queues each user's traffic separately at the base
//! station, so the queue a subflow sees is its own. This controller keeps
//! that queue at a target delay instead:
//!
//! - once per round trip it measures the queueing delay `q` as the
//!   round's smallest RTT over the path's minimum (`rtprop`, a windowed
//!   minimum) and scales the window by `(rtprop + target) / (rtprop + q)`,
//!   at most doubling and at least halving it: below the target the window
//!   grows (doubling from an empty queue is the start-up), above it the
//!   window shrinks by what drains the excess in one round. A standing
//!   queue of `target_queue_delay` keeps the carrier busy when its rate
//!   jumps, and bounds the delay when it falls;
//! - every `drain_interval` one round aims at an empty queue, so the
//!   minimum-RTT filter sees the path's floor again (without it, a standing
//!   queue would pass for propagation delay once the filter's window moved
//!   past the last empty queue, and the target would ratchet up);
//! - loss is congestion only when a round loses more than `loss_tolerance`
//!   of what it delivered (radio loss is not); then the window backs off;
//! - a silence (every packet of a period lost: quinn's persistent
//!   congestion) is an interruption unless the round before it had a queue
//!   past `outage_queue_delay`: the window is kept, so the carrier is used
//!   at its last rate as soon as acknowledgements return;
//! - the relay's radio events ([`Hint`]) hold the window through a
//!   handover: samples taken while the radio switches cells neither count
//!   as loss nor move the delay estimate.
//!
//! The transport shell feeds it sends, acknowledgements and losses; nothing
//! here depends on a QUIC implementation.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// What the radio side knows about the path, as the relay learns it from
/// its modem (and the proxy from the relay's path-status frames).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hint {
    /// The carrier started a handover or lost service: the link may go
    /// silent.
    HandoverStart,
    /// The carrier is registered on a cell again.
    HandoverEnd,
}

/// Parameters of [`Railway`].
#[derive(Clone, Debug, PartialEq)]
pub struct RailwayConfig {
    /// Datagram size the windows are counted in.
    pub mtu: u64,
    pub initial_window: u64,
    pub min_window: u64,
    pub max_window: u64,
    /// Queueing delay the window aims at, over the path's minimum RTT.
    pub target_queue_delay: Duration,
    /// Window of the minimum-RTT filter. Short, because the base RTT moves
    /// with the serving cell.
    pub rtprop_window: Duration,
    /// How often one round aims at an empty queue (well inside
    /// `rtprop_window`, so the filter always holds a floor).
    pub drain_interval: Duration,
    /// Share of a round's bytes that may be lost without it counting as
    /// congestion (radio loss).
    pub loss_tolerance: f64,
    /// Queueing delay before a silence above which it is taken for
    /// congestion after all.
    pub outage_queue_delay: Duration,
    /// A handover hint without its end holds the window at most this long.
    pub max_hold: Duration,
}

impl Default for RailwayConfig {
    fn default() -> Self {
        let mtu = 1200;
        RailwayConfig {
            mtu,
            initial_window: 32 * mtu,
            min_window: 4 * mtu,
            max_window: 64 << 20,
            target_queue_delay: Duration::from_millis(80),
            rtprop_window: Duration::from_secs(6),
            drain_interval: Duration::from_secs(2),
            loss_tolerance: 0.1,
            outage_queue_delay: Duration::from_millis(400),
            max_hold: Duration::from_secs(15),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Following the queueing delay.
    Track,
    /// A drain round: aiming at an empty queue.
    Drain,
    /// A handover hint holds the window.
    Held,
}

/// Counters for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RailwayStats {
    /// Silences taken for an interruption (window kept).
    pub outages_held: u64,
    /// Silences taken for congestion (window reset).
    pub outages_congested: u64,
    /// Rounds whose loss exceeded the tolerance (window backed off).
    pub loss_backoffs: u64,
    /// Rounds whose loss stayed within the tolerance.
    pub lossy_rounds_tolerated: u64,
    pub handovers_held: u64,
    pub rounds: u64,
}

#[derive(Clone, Copy, Debug)]
struct Sent {
    time: Instant,
    /// Bytes delivered when it was sent.
    delivered: u64,
}

/// Sent packets remembered for round counting at most (older ones are
/// forgotten; an ack for one just does not end a round).
const MAX_SENT_RECORDS: usize = 1 << 15;
/// Most a window changes in one round, up and down.
const MAX_GROWTH: f64 = 2.0;
const MAX_SHRINK: f64 = 0.5;
/// Share of the way to the target delay a round's growth goes.
const GROWTH_GAIN: f64 = 0.5;
/// A drain round's window over the last round's rate × rtprop.
const DRAIN_GAIN: f64 = 0.9;
/// A round over the loss tolerance multiplies the window by this.
const LOSS_BACKOFF: f64 = 0.85;

/// The controller. See the module documentation.
#[derive(Clone, Debug)]
pub struct Railway {
    cfg: RailwayConfig,
    mode: Mode,
    window: u64,
    /// Minimum RTT per bucket (a quarter of the filter's window), newest
    /// last: (bucket start, min).
    rtt_buckets: VecDeque<(Instant, Duration)>,
    delivered: u64,
    sent: VecDeque<Sent>,
    round_end_delivered: u64,
    round_start: Instant,
    round_min_rtt: Option<Duration>,
    /// (time, RTT) of the latest samples, increasing RTTs: the front is the
    /// minimum of the latest half rtprop, the queue as it is now (a whole
    /// round's minimum lags a growing window by a round).
    recent: VecDeque<(Instant, Duration)>,
    /// The latest completed round's queueing delay.
    last_queue: Option<Duration>,
    round_lost: u64,
    round_delivered_start: u64,
    /// A packet of this round was sent with the window full.
    round_window_limited: bool,
    last_drain: Instant,
    held_since: Option<Instant>,
    held_window: u64,
    /// Delivery rate of the latest round (bytes/s), for logs.
    rate: Option<f64>,
    stats: RailwayStats,
}

impl Railway {
    pub fn new(cfg: RailwayConfig, now: Instant) -> Self {
        Railway {
            window: cfg.initial_window,
            mode: Mode::Track,
            rtt_buckets: VecDeque::new(),
            delivered: 0,
            sent: VecDeque::new(),
            round_end_delivered: 0,
            round_start: now,
            round_min_rtt: None,
            recent: VecDeque::new(),
            last_queue: None,
            round_lost: 0,
            round_delivered_start: 0,
            round_window_limited: false,
            last_drain: now,
            held_since: None,
            held_window: 0,
            rate: None,
            stats: RailwayStats::default(),
            cfg,
        }
    }

    pub fn config(&self) -> &RailwayConfig {
        &self.cfg
    }

    /// Bytes that may be in flight.
    pub fn window(&self) -> u64 {
        self.window
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn stats(&self) -> RailwayStats {
        self.stats
    }

    /// The latest round's delivery rate (bytes/s), if any.
    pub fn rate(&self) -> Option<f64> {
        self.rate
    }

    /// The latest round's queueing delay over the minimum RTT.
    pub fn queue_delay(&self) -> Option<Duration> {
        self.last_queue
    }

    /// The minimum RTT over the filter's window, if any.
    pub fn rtprop(&self) -> Option<Duration> {
        self.rtt_buckets.iter().map(|b| b.1).min()
    }

    pub fn set_mtu(&mut self, mtu: u16) {
        self.cfg.mtu = u64::from(mtu).max(1200);
        self.cfg.min_window = self.cfg.min_window.max(4 * self.cfg.mtu);
        self.window = self.window.max(self.cfg.min_window);
    }

    /// A packet (or a batch ending with one) was sent while
    /// `in_flight_before` bytes were in flight.
    pub fn on_sent(&mut self, now: Instant, bytes: u64, in_flight_before: u64) {
        if in_flight_before + bytes + 2 * self.cfg.mtu >= self.window {
            self.round_window_limited = true;
        }
        if self.sent.len() == MAX_SENT_RECORDS {
            self.sent.pop_front();
        }
        self.sent.push_back(Sent { time: now, delivered: self.delivered });
    }

    /// A packet sent at `sent` and carrying `bytes` was acknowledged.
    pub fn on_ack(&mut self, now: Instant, sent: Instant, bytes: u64) {
        self.expire_hold(now);
        self.delivered += bytes;
        if self.mode == Mode::Held {
            return;
        }
        let rtt = now.saturating_duration_since(sent);
        self.on_rtt(now, rtt);
        // The record of this packet (send times are non-decreasing).
        let i = self.sent.partition_point(|s| s.time <= sent);
        let rec = if i > 0 && self.sent[i - 1].time == sent { Some(self.sent[i - 1]) } else { None };
        // Everything sent before it is acknowledged or lost by now.
        self.sent.drain(..i.saturating_sub(1));
        if rec.is_some_and(|r| r.delivered >= self.round_end_delivered) {
            self.end_round(now);
        }
    }

    fn on_rtt(&mut self, now: Instant, rtt: Duration) {
        self.round_min_rtt = Some(self.round_min_rtt.map_or(rtt, |m| m.min(rtt)));
        // Sliding minimum over the latest half rtprop (monotonic deque).
        while self.recent.back().is_some_and(|&(_, r)| r >= rtt) {
            self.recent.pop_back();
        }
        self.recent.push_back((now, rtt));
        let span = self.rtprop().map_or(Duration::from_millis(10), |p| (p / 2).max(Duration::from_millis(10)));
        while self.recent.front().is_some_and(|&(t, _)| now.saturating_duration_since(t) > span) {
            self.recent.pop_front();
        }
        let bucket = self.cfg.rtprop_window / 4;
        match self.rtt_buckets.back_mut() {
            Some((start, min)) if now.saturating_duration_since(*start) < bucket => *min = (*min).min(rtt),
            _ => self.rtt_buckets.push_back((now, rtt)),
        }
        while self.rtt_buckets.front().is_some_and(|(t, _)| now.saturating_duration_since(*t) > self.cfg.rtprop_window)
        {
            self.rtt_buckets.pop_front();
        }
    }

    fn end_round(&mut self, now: Instant) {
        self.stats.rounds += 1;
        let delivered = self.delivered - self.round_delivered_start;
        let elapsed = now.saturating_duration_since(self.round_start);
        if elapsed > Duration::ZERO {
            self.rate = Some(delivered as f64 / elapsed.as_secs_f64());
        }
        let lost = std::mem::take(&mut self.round_lost);
        let limited = std::mem::take(&mut self.round_window_limited);
        let round_min = self.round_min_rtt.take();
        self.round_delivered_start = self.delivered;
        self.round_end_delivered = self.delivered;
        self.round_start = now;
        let (Some(_), Some(rtprop)) = (round_min, self.rtprop()) else { return };
        let rtt = self.recent.front().map_or(rtprop, |r| r.1);
        let q = rtt.saturating_sub(rtprop);
        self.last_queue = Some(q);
        let share = lost as f64 / (delivered + lost).max(1) as f64;
        if lost > 0 && share <= self.cfg.loss_tolerance {
            self.stats.lossy_rounds_tolerated += 1;
        }
        let drain_to = match (self.mode, self.rate) {
            (Mode::Drain, Some(rate)) if limited => Some(DRAIN_GAIN * rate * rtprop.as_secs_f64()),
            _ => None,
        };
        let factor = if share > self.cfg.loss_tolerance {
            self.stats.loss_backoffs += 1;
            LOSS_BACKOFF
        } else if let Some(bdp) = drain_to {
            // Below the bare pipe for one round: the queue empties whatever
            // its size (scaling by the delay alone halves it at most).
            (bdp / self.window as f64).min(1.0)
        } else {
            let aim = match self.mode {
                Mode::Drain => Duration::ZERO,
                _ => self.cfg.target_queue_delay,
            };
            let (p, q, aim) = (rtprop.as_secs_f64(), q.as_secs_f64(), aim.as_secs_f64());
            let f = if q > aim {
                // Drains the excess in about one round.
                (p + aim) / (p + q)
            } else {
                // Half the step that would reach the aim: what a round
                // measures lags what the window did in it.
                1.0 + GROWTH_GAIN * (aim - q) / (p + q).max(1e-6)
            };
            // Growth needs a full window: a sender with less to send
            // learns nothing about the path's room.
            if f > 1.0 && !limited {
                1.0
            } else {
                f.clamp(MAX_SHRINK, MAX_GROWTH)
            }
        };
        self.window = ((self.window as f64 * factor) as u64).clamp(self.cfg.min_window, self.cfg.max_window);
        // A drain round whose window was not full drained nothing: try again.
        if self.mode == Mode::Drain && drain_to.is_none() {
            return;
        }
        self.mode = match self.mode {
            Mode::Drain => {
                self.last_drain = now;
                Mode::Track
            }
            _ if now.saturating_duration_since(self.last_drain) >= self.cfg.drain_interval => Mode::Drain,
            m => m,
        };
    }

    /// Packets were declared lost. `persistent`: every packet over a period
    /// of several RTTs was lost (the link went silent, or a queue
    /// overflowed for that long).
    pub fn on_loss(&mut self, now: Instant, sent: Instant, persistent: bool, lost_bytes: u64) {
        self.expire_hold(now);
        let _ = sent;
        if self.mode == Mode::Held {
            return;
        }
        self.round_lost += lost_bytes;
        if !persistent {
            return;
        }
        if self.last_queue.is_some_and(|q| q > self.cfg.outage_queue_delay) {
            self.stats.outages_congested += 1;
            self.window = self.cfg.initial_window.clamp(self.cfg.min_window, self.window.max(self.cfg.min_window));
        } else {
            self.stats.outages_held += 1;
        }
        // The silence's losses are not the next round's congestion, and the
        // silence emptied the queue: no drain round is due when the
        // carrier returns.
        self.round_lost = 0;
        self.round_window_limited = false;
        self.last_drain = now;
        if self.mode == Mode::Drain {
            self.mode = Mode::Track;
        }
    }

    /// A radio event on this path.
    pub fn on_hint(&mut self, now: Instant, hint: Hint) {
        match hint {
            Hint::HandoverStart if self.mode != Mode::Held => {
                self.stats.handovers_held += 1;
                self.held_window = self.window;
                self.held_since = Some(now);
                self.mode = Mode::Held;
            }
            Hint::HandoverStart => {}
            Hint::HandoverEnd => self.release(now),
        }
    }

    fn release(&mut self, now: Instant) {
        if self.mode == Mode::Held {
            self.mode = Mode::Track;
            self.held_since = None;
            self.window = self.held_window.max(self.cfg.min_window);
            // A fresh round: nothing measured inside the hold counts.
            self.round_lost = 0;
            self.round_min_rtt = None;
            self.round_window_limited = false;
            self.round_end_delivered = self.delivered;
            self.round_delivered_start = self.delivered;
            self.round_start = now;
            self.last_drain = now;
        }
    }

    fn expire_hold(&mut self, now: Instant) {
        if self.held_since.is_some_and(|t| now.saturating_duration_since(t) > self.cfg.max_hold) {
            self.release(now);
        }
    }
}

#[cfg(test)]
mod tests;
