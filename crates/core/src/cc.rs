//! `railway`: congestion control for one subflow over a cellular carrier on
//! a moving train, sans-IO (every call takes `now`).
//!
//! A carrier on a high-speed railway loses packets to radio (not queues),
//! goes silent for tens of milliseconds in every handover and for seconds in
//! a failed one, and swings its base RTT as the train moves between cells.
//! Loss-based controllers read all three as congestion and collapse their
//! window; BBR's model overestimates the rate after an outage and follows a
//! stale minimum RTT. This controller:
//!
//! - models the path as BBR does (windowed-max delivery rate `bw`,
//!   windowed-min RTT `rtprop`) and sets the window to
//!   `gain × bw × (rtprop + target_queue_delay)`. The window is also the
//!   pacing input of the transport (quinn paces at 1.25 × window / SRTT), so
//!   a standing queue lowers the rate by itself and queueing delay stays
//!   near `target_queue_delay` above the path's minimum;
//! - treats loss as congestion only when a round loses more than
//!   `loss_tolerance` of what it delivered, and then backs the rate
//!   estimate off to what was delivered, not to a floor;
//! - tells an interruption from congestion: when every packet of a period
//!   is lost (persistent congestion) while the RTT before it showed no
//!   queue, or while a handover hint says the radio is switching cells, the
//!   model is held and the window restored as soon as acknowledgements
//!   return, with one probing round instead of a restart from a minimum;
//! - lets the relay's radio events ([`Hint`]) freeze the model during a
//!   handover, so that samples taken while the link is down neither drag
//!   the rate estimate down nor count as loss.
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
    /// Queueing delay allowed over the path's minimum RTT: the window covers
    /// `bw × (rtprop + target_queue_delay)`. Covers RTT jitter (ack
    /// aggregation, radio scheduling) without which the pipe would run dry.
    pub target_queue_delay: Duration,
    /// Window of the minimum-RTT filter. Short, because the base RTT moves
    /// with the serving cell: a minimum from two cells ago underestimates
    /// the pipe.
    pub rtprop_window: Duration,
    /// Rounds of the maximum-rate filter.
    pub bw_rounds: usize,
    /// Share of a round's bytes that may be lost without it counting as
    /// congestion (radio loss).
    pub loss_tolerance: f64,
    /// Round-trip queueing delay above which an outage is taken for
    /// congestion after all.
    pub outage_queue_delay: Duration,
    /// A handover hint without its end holds the model at most this long.
    pub max_hold: Duration,
    /// Gains of the probing cycle, one per round: above 1 probes for more
    /// rate, 1 cruises at `bw × (rtprop + target_queue_delay)`, below 1
    /// drains to under `bw × rtprop` (the queue empties).
    pub gain_cycle: Vec<f64>,
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
            rtprop_window: Duration::from_secs(4),
            bw_rounds: 8,
            loss_tolerance: 0.1,
            outage_queue_delay: Duration::from_millis(200),
            max_hold: Duration::from_secs(15),
            gain_cycle: vec![1.25, 0.9, 1.0, 1.0, 1.0, 1.0],
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Doubling per round until the rate stops growing.
    Startup,
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
    /// Minimum RTT per ~second bucket, newest last: (bucket start, min).
    rtt_buckets: VecDeque<(Instant, Duration)>,
    /// Minimum RTT of the current round (queue signal).
    round_min_rtt: Option<Duration>,
    last_round_min_rtt: Option<Duration>,
    delivered: u64,
    delivered_time: Instant,
    first_sent_time: Instant,
    sent: VecDeque<Sent>,
    round: u64,
    round_end_delivered: u64,
    round_lost: u64,
    round_delivered_start: u64,
    cycle: usize,
    /// Startup: the best rate so far and rounds without growth.
    full_bw: f64,
    full_bw_rounds: u32,
    held_since: Option<Instant>,
    held_window: u64,
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
            rtt_buckets: VecDeque::new(),
            round_min_rtt: None,
            last_round_min_rtt: None,
            delivered: 0,
            delivered_time: now,
            first_sent_time: now,
            sent: VecDeque::new(),
            round: 0,
            round_end_delivered: 0,
            round_lost: 0,
            round_delivered_start: 0,
            cycle: 0,
            full_bw: 0.0,
            full_bw_rounds: 0,
            held_since: None,
            held_window: 0,
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

    /// The minimum RTT over the filter's window, if any.
    pub fn rtprop(&self) -> Option<Duration> {
        self.rtt_buckets.iter().map(|b| b.1).min()
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
        let rate = (self.delivered - rec.delivered) as f64 / interval.as_secs_f64();
        let best = self.bw().unwrap_or(0.0);
        if rec.app_limited && rate < best {
            return;
        }
        match self.bw_rounds.back_mut() {
            Some(b) => *b = b.max(rate),
            None => self.bw_rounds.push_back(rate),
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
        while self.rtt_buckets.front().is_some_and(|(t, _)| now.saturating_duration_since(*t) > self.cfg.rtprop_window)
        {
            self.rtt_buckets.pop_front();
        }
    }

    fn end_round(&mut self, now: Instant) {
        let _ = now;
        self.round += 1;
        let delivered = self.delivered - self.round_delivered_start;
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
        if self.mode == Mode::Startup {
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
                self.mode = Mode::Probe;
                // Start on the draining phase: startup left a queue.
                self.cycle = 1;
            }
        } else if self.mode == Mode::Probe {
            self.cycle = (self.cycle + 1) % self.cfg.gain_cycle.len();
        }
        self.reprobe = false;
        if self.bw_rounds.len() >= self.cfg.bw_rounds {
            self.bw_rounds.pop_front();
        }
        self.bw_rounds.push_back(0.0);
        if self.mode != Mode::Held {
            self.update_window();
        }
    }

    fn gain(&self) -> f64 {
        if self.reprobe {
            return 1.25;
        }
        self.cfg.gain_cycle.get(self.cycle).copied().unwrap_or(1.0)
    }

    fn update_window(&mut self) {
        if self.mode != Mode::Probe {
            return;
        }
        let (Some(bw), Some(rtprop)) = (self.bw(), self.rtprop()) else { return };
        let gain = self.gain();
        // A draining round (gain below 1) aims below the bare pipe, so the
        // queue empties and the RTT filter sees the path's minimum again;
        // without it a standing queue would pass for propagation delay once
        // the filter's window moved past the last empty queue, and ratchet
        // the window up by the target delay every window.
        let allowed = if gain < 1.0 { rtprop } else { rtprop + self.cfg.target_queue_delay };
        let w = (gain * bw * allowed.as_secs_f64()) as u64;
        self.window = w.clamp(self.cfg.min_window, self.cfg.max_window);
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
    }

    /// A radio event on this path.
    pub fn on_hint(&mut self, now: Instant, hint: Hint) {
        match hint {
            Hint::HandoverStart => {
                if self.mode != Mode::Held {
                    self.stats.handovers_held += 1;
                    self.held_window = self.window;
                    self.held_since = Some(now);
                    self.mode = if self.bw().is_some() { Mode::Held } else { self.mode };
                    if self.mode != Mode::Held {
                        self.held_since = None;
                    }
                }
            }
            Hint::HandoverEnd => self.release(),
        }
    }

    fn release(&mut self) {
        if self.mode == Mode::Held {
            self.mode = Mode::Probe;
            self.held_since = None;
            self.window = self.held_window.max(self.window);
            self.round_lost = 0;
            self.reprobe = true;
            self.update_window();
        }
    }

    fn expire_hold(&mut self, now: Instant) {
        if self.held_since.is_some_and(|t| now.saturating_duration_since(t) > self.cfg.max_hold) {
            self.release();
        }
    }
}

#[cfg(test)]
mod tests;
