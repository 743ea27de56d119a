//! `railway`: congestion control for one subflow over a cellular carrier on
//! a moving train, sans-IO (every call takes `now`).
//!
//! A carrier on a high-speed railway loses packets to radio (not queues),
//! goes silent for tens of milliseconds in every handover and for seconds in
//! a failed one, changes its rate several times over within seconds, and
//! swings its base RTT as the train moves between cells (the testbed's
//! railway moves a path's one-way delay by tens of milliseconds within a
//! second). Loss-based controllers read loss and silence as congestion and
//! collapse their window. Delay is no cleaner a signal here: a controller
//! that holds the queueing delay (RTT over its minimum) to a target reads
//! the base RTT's swings as queue, and on the testbed's railway it left
//! most of the carrier unused. This controller:
//!
//! - models the path as BBR does (windowed-max delivery rate `bw` over
//!   `bw_rounds` rounds that carried samples, windowed-min RTT `rtprop`)
//!   and paces at `gain × bw` ([`Railway::pacing_rate`]; the shell paces,
//!   because quinn's own pacer follows the window alone), with a window
//!   that only caps what is in flight at `2 × bw × rtprop` plus a standing
//!   queue: `target_queue_delay` of bytes on a steady carrier,
//!   `surge_queue_delay` (every round paced at the top gain) on one whose
//!   per-round rate swings ([`Railway::surge`]), so a rate surge finds
//!   packets waiting;
//! - cycles its pacing gain (a probing round above 1, a draining round
//!   below it, so the minimum-RTT filter sees the floor again, then
//!   cruising rounds);
//! - treats loss as congestion only when a round loses more than
//!   `loss_tolerance` of what it delivered, and then backs the rate
//!   estimate off to what was delivered, not to a floor;
//! - tells an interruption from congestion: when every packet of a period
//!   is lost (persistent congestion) while the RTT before it showed no
//!   queue past `outage_queue_delay`, the model is kept and the window
//!   restored as soon as acknowledgements return, with one probing round
//!   instead of a restart from a minimum;
//! - lets the relay's radio events ([`Hint`]) freeze the model during a
//!   handover, so that samples taken while the link is down neither drag
//!   the rate estimate down nor count as loss;
//! - learns nothing from rounds that did not fill the window: an idle path
//!   keeps the rate it last measured instead of decaying to what its
//!   keep-alives carry, and a path that carried only keep-alives still
//!   starts up as a new one.
//!
//! The transport shell feeds it acknowledgements and losses; nothing here
//! depends on a QUIC implementation.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// What the radio side knows about the path, as the relay learns it from
/// its modem (and the proxy from the relay's path-status frames).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hint {
    /// The carrier started a handover: the link may go silent.
    HandoverStart,
    /// The handover ended (succeeded, or the modem re-attached).
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
    /// In-flight room beyond twice the pipe, as queueing time at the rate
    /// estimate: the window is `2 × bw × rtprop + bw × target_queue_delay`,
    /// for acknowledgements that arrive in bursts. Start-up also ends when
    /// a round's smallest RTT is this far over the minimum.
    pub target_queue_delay: Duration,
    /// Window of the minimum-RTT filter. Shorter ones follow the base RTT's
    /// swings sooner but let a standing queue pass for propagation delay
    /// (on the testbed's railway 1 s filters queued several times longer
    /// than 4 s ones).
    pub rtprop_window: Duration,
    /// The minimum RTT over this longer window, times `rtprop_swing`,
    /// bounds the one above: a queue that stood longer than `rtprop_window`
    /// (a carrier that slowed down under a hold, a drain too weak to empty
    /// it) would otherwise pass for propagation delay, size the window
    /// from itself and stand for good. The railway's base RTT swings by up
    /// to about 4 times its floor within seconds, not more.
    pub rtprop_floor_window: Duration,
    pub rtprop_swing: f64,
    /// Rounds (that carried samples) of the maximum-rate filter: how long a
    /// rate the carrier no longer has keeps the pace, and so how deep the
    /// queue grows when the carrier slows down.
    pub bw_rounds: usize,
    /// ... and at most this old.
    pub bw_max_age: Duration,
    /// Share of a round's bytes that may be lost without it counting as
    /// congestion (radio loss).
    pub loss_tolerance: f64,
    /// Round-trip queueing delay above which an outage is taken for
    /// congestion after all.
    pub outage_queue_delay: Duration,
    /// A handover hint without its end holds the model at most this long.
    pub max_hold: Duration,
    /// How often the pace drops below the rate (for `drain_max_rounds`
    /// rounds, or until the RTT stops falling), so that a queue that built
    /// up (a carrier that slowed down faster than the rate filter forgot)
    /// does not stand for good and pass for propagation delay; `None`:
    /// never. Rarely and briefly, because every drain round is a round
    /// below the carrier's rate.
    pub drain_interval: Option<Duration>,
    /// A drain ends after this many rounds even if the RTT still falls
    /// (on the railway the base RTT moves on its own).
    pub drain_max_rounds: u32,
    /// A full round whose best rate sample is under this share of the
    /// estimate cuts the estimate to that sample times 1.25 (0: never).
    pub slowdown: f64,
    /// A full round whose smallest RTT is this far over the minimum cuts the
    /// estimate to the round's best sample and drains: a bound on the queue
    /// whatever the estimate.
    pub max_queue_delay: Duration,
    /// Pacing gains of the probing cycle, one per round: above 1 probes for
    /// more rate, 1 cruises at the estimate, below 1 drains the queue.
    pub gain_cycle: Vec<f64>,
    /// On a carrier whose rate swings (see `variability`), the standing
    /// queue kept for its surges in place of `target_queue_delay`, with
    /// every round of the gain cycle paced at its highest gain.
    pub surge_queue_delay: Duration,
    /// Coefficient of variation of the per-round delivery rate under which
    /// the carrier counts as steady and over which as swinging (linear in
    /// between).
    pub variability: (f64, f64),
    /// Full rounds the coefficient of variation is taken over.
    pub variability_rounds: usize,
}

impl Default for RailwayConfig {
    fn default() -> Self {
        let mtu = 1200;
        RailwayConfig {
            mtu,
            initial_window: 32 * mtu,
            min_window: 4 * mtu,
            max_window: 64 << 20,
            target_queue_delay: Duration::from_millis(40),
            surge_queue_delay: Duration::from_millis(150),
            variability: (0.2, 0.5),
            variability_rounds: 8,
            rtprop_window: Duration::from_secs(10),
            rtprop_floor_window: Duration::from_secs(60),
            rtprop_swing: 4.0,
            bw_rounds: 4,
            bw_max_age: Duration::from_secs(2),
            loss_tolerance: 0.1,
            outage_queue_delay: Duration::from_millis(200),
            max_hold: Duration::from_secs(15),
            drain_interval: Some(Duration::from_secs(5)),
            drain_max_rounds: 1,
            slowdown: 0.3,
            max_queue_delay: Duration::from_millis(500),
            gain_cycle: vec![1.25, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Doubling per round until the rate stops growing.
    Startup,
    /// After start-up: pacing below the rate until start-up's queue is gone.
    Drain,
    /// Following the model through the gain cycle.
    Probe,
    /// A handover hint holds the model.
    Held,
}

/// Counters for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RailwayStats {
    /// Persistent losses taken for an interruption (model kept).
    pub outages_held: u64,
    /// Persistent losses taken for congestion (model reset).
    pub outages_congested: u64,
    /// Rounds whose loss exceeded the tolerance (rate backed off).
    pub loss_backoffs: u64,
    /// Rounds whose loss stayed within the tolerance.
    pub lossy_rounds_tolerated: u64,
    pub handovers_held: u64,
    /// Rounds whose best sample was far under the estimate (estimate cut).
    pub slowdowns: u64,
    /// Rounds whose smallest RTT was past `max_queue_delay` over the
    /// minimum (estimate cut, drain).
    pub queue_ceilings: u64,
}

#[derive(Clone, Copy, Debug)]
struct Sent {
    time: Instant,
    /// Bytes delivered when it was sent, and when the latest of them was.
    delivered: u64,
    delivered_time: Instant,
    first_sent_time: Instant,
    app_limited: bool,
}

/// Start-up's window over the measured pipe (BBR's 2/ln 2).
const STARTUP_GAIN: f64 = 2.89;

/// What a slow-down cuts the rate estimate to, over the round's best sample.
const SLOWDOWN_HEADROOM: f64 = 1.25;

/// The in-flight cap over the pipe when pacing (BBR's cwnd gain).
const CWND_GAIN: f64 = 2.0;

/// Sent packets remembered for rate samples at most (older ones are
/// forgotten; an ack for one just yields no sample).
const MAX_SENT_RECORDS: usize = 1 << 15;

/// The controller. See the module documentation.
#[derive(Clone, Debug)]
pub struct Railway {
    cfg: RailwayConfig,
    mode: Mode,
    window: u64,
    /// Delivery-rate maxima of the latest rounds (bytes/s), newest last.
    bw_rounds: VecDeque<f64>,
    /// When each of those slots began.
    bw_slot_start: VecDeque<Instant>,
    /// Minimum RTT per ~second bucket, newest last: (bucket start, min).
    rtt_buckets: VecDeque<(Instant, Duration)>,
    /// Minimum RTT of the current round (queue signal).
    round_min_rtt: Option<Duration>,
    last_round_min_rtt: Option<Duration>,
    delivered: u64,
    delivered_time: Instant,
    first_sent_time: Instant,
    sent: VecDeque<Sent>,
    round_end_delivered: u64,
    round_lost: u64,
    round_delivered_start: u64,
    round_start: Instant,
    /// The longest wait between two acknowledgements in this round.
    round_max_ack_gap: Duration,
    /// When acknowledgements last resumed after a silence.
    silence_ended: Option<Instant>,
    /// Packets sent before this give no rate sample.
    samples_from: Instant,
    /// Delivery rate of the latest full rounds (bytes/s), newest last.
    round_rates: VecDeque<f64>,
    cycle: usize,
    /// The current round gave the rate filter a sample, and one taken
    /// with the window full.
    round_inserted: bool,
    round_full_sample: bool,
    /// A sample was ever taken with the window full.
    measured_full: bool,
    /// Startup: the best rate so far and rounds without growth.
    full_bw: f64,
    full_bw_rounds: u32,
    held_since: Option<Instant>,
    held_window: u64,
    /// A draining phase's previous round's smallest RTT, and when the
    /// latest drain ended.
    drain_prev_min: Option<Duration>,
    drain_rounds: u32,
    last_drain: Instant,
    /// The mode a hold interrupted, and returns to.
    held_mode: Mode,
    /// The first round after an outage or handover probes above the model.
    reprobe: bool,
    last_ack: Option<Instant>,
    stats: RailwayStats,
}

impl Railway {
    pub fn new(cfg: RailwayConfig, now: Instant) -> Self {
        Railway {
            window: cfg.initial_window,
            mode: Mode::Startup,
            bw_rounds: VecDeque::new(),
            bw_slot_start: VecDeque::new(),
            rtt_buckets: VecDeque::new(),
            round_min_rtt: None,
            last_round_min_rtt: None,
            delivered: 0,
            delivered_time: now,
            first_sent_time: now,
            sent: VecDeque::new(),
            round_end_delivered: 0,
            round_lost: 0,
            round_delivered_start: 0,
            round_start: now,
            round_max_ack_gap: Duration::ZERO,
            silence_ended: None,
            samples_from: now,
            round_rates: VecDeque::new(),
            cycle: 0,
            round_inserted: false,
            round_full_sample: false,
            measured_full: false,
            full_bw: 0.0,
            full_bw_rounds: 0,
            held_since: None,
            held_window: 0,
            held_mode: Mode::Startup,
            drain_prev_min: None,
            drain_rounds: 0,
            last_drain: now,
            reprobe: false,
            last_ack: None,
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

    /// The rate estimate (bytes/s), if any.
    pub fn bw(&self) -> Option<f64> {
        self.bw_rounds.iter().copied().reduce(f64::max)
    }

    /// The rate estimate (bytes/s), if any.
    pub fn rate(&self) -> Option<f64> {
        self.bw()
    }

    /// The latest round's smallest RTT over the minimum.
    pub fn queue_delay(&self) -> Option<Duration> {
        Some(self.last_round_min_rtt?.saturating_sub(self.rtprop()?))
    }

    /// The minimum RTT over the filter's window, at most `rtprop_swing`
    /// times the minimum over `rtprop_floor_window`, if any.
    pub fn rtprop(&self) -> Option<Duration> {
        let newest = self.rtt_buckets.back()?.0;
        let recent = self
            .rtt_buckets
            .iter()
            .filter(|b| newest.saturating_duration_since(b.0) <= self.cfg.rtprop_window)
            .map(|b| b.1)
            .min()?;
        let floor = self.rtt_buckets.iter().map(|b| b.1).min()?;
        Some(recent.min(floor.mul_f64(self.cfg.rtprop_swing)))
    }

    pub fn set_mtu(&mut self, mtu: u16) {
        self.cfg.mtu = u64::from(mtu).max(1200);
        self.cfg.min_window = self.cfg.min_window.max(4 * self.cfg.mtu);
        self.window = self.window.max(self.cfg.min_window);
    }

    /// A packet (or a batch ending with one) of `bytes` was sent.
    pub fn on_sent(&mut self, now: Instant, bytes: u64, in_flight_before: u64) {
        let _ = bytes;
        let app_limited = in_flight_before + 2 * self.cfg.mtu < self.window;
        if in_flight_before == 0 {
            // Idle restart: rate samples must not span the idle time.
            self.first_sent_time = now;
            self.delivered_time = now;
        }
        if self.sent.len() == MAX_SENT_RECORDS {
            self.sent.pop_front();
        }
        self.sent.push_back(Sent {
            time: now,
            delivered: self.delivered,
            delivered_time: self.delivered_time,
            first_sent_time: self.first_sent_time,
            app_limited,
        });
    }

    /// A packet sent at `sent` and carrying `bytes` was acknowledged.
    pub fn on_ack(&mut self, now: Instant, sent: Instant, bytes: u64) {
        self.expire_hold(now);
        self.delivered += bytes;
        self.delivered_time = now;
        if let Some(prev) = self.last_ack {
            let gap = now.saturating_duration_since(prev);
            self.round_max_ack_gap = self.round_max_ack_gap.max(gap);
            if self.rtprop().is_some_and(|p| gap > (2 * p).max(Duration::from_millis(200))) {
                self.silence_ended = Some(now);
            }
        }
        self.last_ack = Some(now);
        let rtt = now.saturating_duration_since(sent);
        if self.mode != Mode::Held {
            self.on_rtt(now, rtt);
        }
        // The record of this packet (send times are non-decreasing).
        let i = self.sent.partition_point(|s| s.time <= sent);
        let rec = if i > 0 && self.sent[i - 1].time == sent { Some(self.sent[i - 1]) } else { None };
        // Everything sent before it is acknowledged or lost by now.
        self.sent.drain(..i.saturating_sub(1));
        if self.mode == Mode::Startup {
            // Slow start, held to twice the pipe measured so far: the rate
            // samples double each round while the path has room, so this
            // stops growth only once the queue holds a round's worth.
            let cap = match (self.bw(), self.rtprop()) {
                (Some(bw), Some(rtprop)) if bw > 0.0 => {
                    ((STARTUP_GAIN * bw * rtprop.as_secs_f64()) as u64).max(self.cfg.initial_window)
                }
                _ => self.cfg.max_window,
            };
            self.window = (self.window + bytes).min(cap.max(self.window)).min(self.cfg.max_window);
        }
        let Some(rec) = rec else { return };
        self.first_sent_time = rec.time;
        if rec.delivered >= self.round_end_delivered {
            self.end_round(now);
            self.round_end_delivered = self.delivered;
        }
        let interval = now
            .saturating_duration_since(rec.delivered_time)
            .max(rec.time.saturating_duration_since(rec.first_sent_time));
        if interval < Duration::from_micros(500) || self.mode == Mode::Held {
            return;
        }
        // A sample whose interval spans a silence (sent before an outage,
        // acknowledged after it) reads the silence as a slow carrier.
        if self.silence_ended.is_some_and(|t| rec.first_sent_time < t) || rec.time < self.samples_from {
            return;
        }
        let rate = (self.delivered - rec.delivered) as f64 / interval.as_secs_f64();
        let best = self.bw().unwrap_or(0.0);
        // A sample taken while the sender had less to send than the window
        // says what the sender offered, not what the path carries: it only
        // counts when it beats the estimate.
        if rec.app_limited && rate < best {
            return;
        }
        if !rec.app_limited {
            self.round_full_sample = true;
            self.measured_full = true;
        }
        self.round_inserted = true;
        match self.bw_rounds.back_mut() {
            Some(b) => *b = b.max(rate),
            None => {
                self.bw_rounds.push_back(rate);
                self.bw_slot_start.push_back(now);
            }
        }
        // Rounds as long as a deep queue makes them would keep a rate the
        // carrier lost long ago: slots also age out by time, keeping the
        // one being filled.
        while self.bw_rounds.len() > 1
            && self.bw_slot_start.front().is_some_and(|t| now.saturating_duration_since(*t) > self.cfg.bw_max_age)
        {
            self.bw_rounds.pop_front();
            self.bw_slot_start.pop_front();
        }
        self.update_window();
    }

    fn on_rtt(&mut self, now: Instant, rtt: Duration) {
        self.round_min_rtt = Some(self.round_min_rtt.map_or(rtt, |m| m.min(rtt)));
        let bucket = self.cfg.rtprop_window / 4;
        match self.rtt_buckets.back_mut() {
            Some((start, min)) if now.saturating_duration_since(*start) < bucket => *min = (*min).min(rtt),
            _ => self.rtt_buckets.push_back((now, rtt)),
        }
        while self
            .rtt_buckets
            .front()
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) > self.cfg.rtprop_floor_window)
        {
            self.rtt_buckets.pop_front();
        }
    }

    fn end_round(&mut self, now: Instant) {
        let delivered = self.delivered - self.round_delivered_start;
        let length = now.saturating_duration_since(self.round_start);
        if self.round_full_sample && matches!(self.mode, Mode::Probe) && length > Duration::from_millis(1) {
            if self.round_rates.len() == self.cfg.variability_rounds {
                self.round_rates.pop_front();
            }
            self.round_rates.push_back(delivered as f64 / length.as_secs_f64());
        }
        self.round_start = now;
        // A full round whose best delivery-rate sample was under half the
        // estimate: the carrier slowed down (a cell edge, a loaded cell).
        // Waiting for the rate filter to forget would pace a queue of
        // several seconds into it. A round with a silence in it (an outage,
        // a handover) is not one: its acknowledgements stopped rather than
        // slowed.
        let gap = std::mem::take(&mut self.round_max_ack_gap);
        let steady = self.rtprop().is_some_and(|p| gap <= (2 * p).max(Duration::from_millis(200)));
        // A queue past the ceiling in a full round: the estimate is above
        // what the carrier delivers (it slowed down more gently than the
        // slow-down rule sees, or acknowledgements bunch up), and the loss
        // tolerance would let the buffer overflow unnoticed. Back to the
        // round's best sample, and drain.
        let queue_now = match (self.round_min_rtt, self.rtprop()) {
            (Some(r), Some(p)) => r.saturating_sub(p),
            _ => Duration::ZERO,
        };
        if self.round_full_sample && self.mode == Mode::Probe && queue_now > self.cfg.max_queue_delay {
            let this_round = self.bw_rounds.back().copied().unwrap_or(0.0);
            if this_round > 0.0 {
                self.stats.queue_ceilings += 1;
                for b in self.bw_rounds.iter_mut() {
                    *b = b.min(this_round);
                }
                self.mode = Mode::Drain;
                self.drain_prev_min = None;
                self.drain_rounds = 0;
            }
        }
        if steady && self.round_full_sample && matches!(self.mode, Mode::Probe | Mode::Drain) {
            let n = self.bw_rounds.len();
            let this_round = self.bw_rounds.back().copied().unwrap_or(0.0);
            let before = self.bw_rounds.iter().take(n.saturating_sub(1)).copied().fold(0.0, f64::max);
            if this_round > 0.0 && this_round < self.cfg.slowdown * before {
                self.stats.slowdowns += 1;
                for b in self.bw_rounds.iter_mut() {
                    *b = b.min(this_round * SLOWDOWN_HEADROOM);
                }
            }
        }
        if self.round_lost > 0 && self.mode != Mode::Held {
            let share = self.round_lost as f64 / (delivered + self.round_lost).max(1) as f64;
            if share > self.cfg.loss_tolerance {
                self.stats.loss_backoffs += 1;
                // The rate the path delivered this round is what it has.
                let round_rate = self.bw_rounds.back().copied().unwrap_or(0.0);
                let cap = round_rate.max(self.bw().unwrap_or(0.0) * 0.7) * 0.85;
                for b in self.bw_rounds.iter_mut() {
                    *b = b.min(cap);
                }
                if self.mode == Mode::Startup {
                    self.mode = Mode::Probe;
                    self.cycle = 1;
                }
            } else {
                self.stats.lossy_rounds_tolerated += 1;
            }
        }
        self.round_lost = 0;
        self.round_delivered_start = self.delivered;
        self.last_round_min_rtt = self.round_min_rtt.take();
        let (full, inserted) = (self.round_full_sample, self.round_inserted);
        self.round_full_sample = false;
        self.round_inserted = false;
        // Only rounds that filled the window say whether the rate stopped
        // growing: a path that carried only keep-alives is not full.
        if self.mode == Mode::Startup && full {
            let bw = self.bw().unwrap_or(0.0);
            let queue = match (self.last_round_min_rtt, self.rtprop()) {
                (Some(r), Some(p)) => r.saturating_sub(p),
                _ => Duration::ZERO,
            };
            if bw >= self.full_bw * 1.25 {
                self.full_bw = bw;
                self.full_bw_rounds = 0;
            } else {
                self.full_bw_rounds += 1;
            }
            if self.full_bw_rounds >= 3 || queue > self.cfg.target_queue_delay {
                self.mode = Mode::Drain;
            }
        } else if self.mode == Mode::Drain {
            // Until the RTT stops falling: the queue is gone, whatever the
            // minimum-RTT filter holds (a queue that stood longer than the
            // filter's window is in it).
            let min = self.last_round_min_rtt;
            let falling = match (min, self.drain_prev_min) {
                (Some(m), Some(p)) => m.as_secs_f64() < 0.95 * p.as_secs_f64(),
                _ => true,
            };
            self.drain_prev_min = min;
            self.drain_rounds += 1;
            if !falling || self.drain_rounds >= self.cfg.drain_max_rounds {
                self.drain_rounds = 0;
                self.mode = Mode::Probe;
                self.drain_prev_min = None;
                self.last_drain = now;
                // Cruise first: the queue was just emptied.
                self.cycle = 2 % self.cfg.gain_cycle.len();
            }
        } else if self.mode == Mode::Probe {
            self.cycle = (self.cycle + 1) % self.cfg.gain_cycle.len();
            if self.cfg.drain_interval.is_some_and(|d| now.saturating_duration_since(self.last_drain) >= d) {
                self.mode = Mode::Drain;
            }
        }
        self.reprobe = false;
        // The filter moves on only with rounds that gave it a sample, so an
        // idle path keeps the rate it last measured instead of decaying to
        // what its keep-alives carry.
        if inserted {
            if self.bw_rounds.len() >= self.cfg.bw_rounds {
                self.bw_rounds.pop_front();
                self.bw_slot_start.pop_front();
            }
            self.bw_rounds.push_back(0.0);
            self.bw_slot_start.push_back(now);
        }
        if self.mode != Mode::Held {
            self.update_window();
        }
    }

    fn gain(&self) -> f64 {
        let top = self.cfg.gain_cycle.iter().copied().fold(1.0, f64::max);
        if self.reprobe {
            return top;
        }
        let g = self.cfg.gain_cycle.get(self.cycle).copied().unwrap_or(1.0);
        g + (top - g) * self.surge()
    }

    /// How far the carrier's rate swings, from 0 (steady) to 1 (swinging
    /// as the railway's fading makes it): the share of the surge headroom
    /// in use.
    pub fn surge(&self) -> f64 {
        let n = self.round_rates.len();
        if n < self.cfg.variability_rounds.max(2) {
            return 0.0;
        }
        let mean = self.round_rates.iter().sum::<f64>() / n as f64;
        if mean <= 0.0 {
            return 0.0;
        }
        let var = self.round_rates.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n as f64;
        let cov = var.sqrt() / mean;
        let (lo, hi) = self.cfg.variability;
        ((cov - lo) / (hi - lo).max(1e-9)).clamp(0.0, 1.0)
    }

    fn update_window(&mut self) {
        if !matches!(self.mode, Mode::Probe | Mode::Drain) {
            return;
        }
        let (Some(bw), Some(rtprop)) = (self.bw(), self.rtprop()) else { return };
        // The pace sets the rate; the window only caps what is in flight,
        // with room for acknowledgements that come in bursts.
        let pipe = bw * rtprop.as_secs_f64();
        let f = self.surge();
        let queue =
            self.cfg.target_queue_delay.as_secs_f64() * (1.0 - f) + self.cfg.surge_queue_delay.as_secs_f64() * f;
        let w = (CWND_GAIN * pipe + bw * queue) as u64;
        self.window = w.clamp(self.cfg.min_window, self.cfg.max_window);
    }

    /// The rate to send at (bytes/s): the probing cycle's gain times the
    /// rate estimate, start-up's gain before the first estimate from a full
    /// window, the estimate itself while a handover hint holds the model (a
    /// hint arrives late, often after a short handover ended, and the
    /// transport's own pacing from the window would then queue a burst).
    /// `None`: no estimate yet; the transport's pacing follows the window.
    pub fn pacing_rate(&self) -> Option<f64> {
        let bw = self.bw().filter(|b| *b > 0.0)?;
        match self.mode {
            // An estimate from keep-alives alone would pace start-up at
            // their rate: until a full window measured the path, the
            // transport paces from the window.
            Mode::Startup if !self.measured_full => None,
            Mode::Startup => Some(STARTUP_GAIN * bw),
            Mode::Drain => Some(bw / STARTUP_GAIN),
            Mode::Probe => Some(self.gain() * bw),
            Mode::Held => Some(bw),
        }
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
        // Was there a queue before the silence? Then it was congestion.
        let queue = match (self.last_round_min_rtt.or(self.round_min_rtt), self.rtprop()) {
            (Some(r), Some(p)) => r.saturating_sub(p),
            _ => Duration::ZERO,
        };
        if queue > self.cfg.outage_queue_delay {
            self.stats.outages_congested += 1;
            self.bw_rounds.clear();
            self.bw_slot_start.clear();
            self.full_bw = 0.0;
            self.full_bw_rounds = 0;
            self.window = self.cfg.initial_window.max(self.cfg.min_window);
            self.mode = Mode::Startup;
        } else {
            self.stats.outages_held += 1;
            // The losses of the silence are not the round's congestion.
            self.round_lost = 0;
            self.reprobe = true;
            self.update_window();
        }
        self.restart_sampling(now);
    }

    /// Rate samples from here on start here: one that spanned a silence
    /// would read it as a slow carrier. Packets already in flight give
    /// none: moving their start forward instead would divide everything
    /// delivered since they left by the few milliseconds since `now`, a
    /// rate many times the carrier's.
    fn restart_sampling(&mut self, now: Instant) {
        self.first_sent_time = now;
        self.delivered_time = now;
        self.samples_from = now;
    }

    /// A radio event on this path.
    pub fn on_hint(&mut self, now: Instant, hint: Hint) {
        match hint {
            Hint::HandoverStart => {
                if self.mode != Mode::Held {
                    self.stats.handovers_held += 1;
                    self.held_window = self.window;
                    self.held_mode = self.mode;
                    self.held_since = Some(now);
                    self.mode = if self.bw().is_some() { Mode::Held } else { self.mode };
                    if self.mode != Mode::Held {
                        self.held_since = None;
                    }
                }
            }
            Hint::HandoverEnd => self.release(now),
        }
    }

    fn release(&mut self, now: Instant) {
        if self.mode == Mode::Held {
            self.mode = self.held_mode;
            self.held_since = None;
            self.window = self.held_window.max(self.window);
            self.round_lost = 0;
            self.reprobe = true;
            self.update_window();
            self.restart_sampling(now);
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
