//! Per-subflow state measured end to end at the data level.
//!
//! Every ack-eliciting frame sent on a subflow advances that subflow's byte
//! counter; the peer returns the count it has received in `PATH_ACK`. From
//! the send time of each counted frame the sender gets RTT samples, bytes in
//! flight, and BBR-style delivery-rate samples — measured above TCP and TLS,
//! so they hold through any middlebox (an Envoy in TLS passthrough, a NAT).
//!
//! Availability is defined here once, for everyone: see [`Availability`].

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::ids::PathId;
use crate::wire::LinkState;

/// Whether a path can carry a new packet now. Two tiers, as in Linux MPTCP:
/// a path that is `Down` is out of every decision; a `Full` path is
/// temporarily unavailable (its window or local queue is full) but its state
/// still informs schedulers such as BLEST and ECF, which may choose to wait
/// for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Availability {
    /// Not established, or lost. Never selected.
    Down,
    /// Established but no room in its congestion window or local queue.
    Full,
    /// Established with room for at least one more packet.
    Available,
}

/// Tunables of the path estimators.
#[derive(Clone, Debug, PartialEq)]
pub struct PathConfig {
    /// RTT assumed before the first sample.
    pub initial_rtt: Duration,
    /// Lower bound of the retransmission timeout.
    pub min_rto: Duration,
    /// Upper bound of the retransmission timeout.
    pub max_rto: Duration,
    /// Window before the first delivery-rate sample, and the floor after.
    pub initial_cwnd_bytes: u64,
    pub min_cwnd_bytes: u64,
    pub max_cwnd_bytes: u64,
    /// In-flight target as a multiple of the estimated bandwidth-delay
    /// product (BBR's cwnd gain).
    pub cwnd_gain: f64,
    /// Most bytes queued in the endpoint for this path but not yet handed to
    /// the socket: the scheduler decides late, as MPTCP does with a small
    /// send buffer.
    pub queue_limit_bytes: u64,
    /// How long the minimum-RTT and maximum-rate filters remember a sample.
    pub min_rtt_window: Duration,
    pub rate_window: Duration,
    /// A path with data outstanding and no acknowledgement progress for
    /// max(`stale_srtt_factor` × SRTT, `stale_after_min`) is stale
    /// ([`PathView::stale`]); its first acknowledgement makes it active again.
    /// Schedulerlets decide what staleness means (`stale-filter`).
    pub stale_after_min: Duration,
    pub stale_srtt_factor: u32,
}

/// When a path with data outstanding and no acknowledgement progress becomes
/// stale: after max(`srtt_factor` × SRTT, `min`). A pipeline may set it
/// ([`crate::sched::Schedulerlet::stale_threshold`], the `stale-filter`'s
/// `srtt_factor` and `min_ms`); otherwise [`PathConfig`]'s fields apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StaleThreshold {
    pub srtt_factor: u32,
    pub min: Duration,
}

impl PathConfig {
    /// Set the stale threshold.
    pub fn set_stale_threshold(&mut self, t: StaleThreshold) {
        self.stale_srtt_factor = t.srtt_factor;
        self.stale_after_min = t.min;
    }

    pub fn stale_threshold(&self) -> StaleThreshold {
        StaleThreshold { srtt_factor: self.stale_srtt_factor, min: self.stale_after_min }
    }
}

impl Default for PathConfig {
    fn default() -> Self {
        PathConfig {
            initial_rtt: Duration::from_millis(100),
            min_rto: Duration::from_millis(200),
            max_rto: Duration::from_secs(60),
            initial_cwnd_bytes: 128 * 1024,
            min_cwnd_bytes: 32 * 1024,
            max_cwnd_bytes: 64 * 1024 * 1024,
            cwnd_gain: 2.0,
            queue_limit_bytes: 64 * 1024,
            min_rtt_window: Duration::from_secs(10),
            rate_window: Duration::from_secs(2),
            stale_after_min: Duration::from_millis(300),
            stale_srtt_factor: 2,
        }
    }
}

/// One counted frame still waiting for its `PATH_ACK`.
#[derive(Clone, Debug)]
pub(crate) struct SentRecord {
    /// Path byte counter after this frame.
    pub end: u64,
    pub sent_at: Instant,
    /// Delivery counters at send time, for rate samples.
    pub delivered_at_send: u64,
    pub delivered_time_at_send: Instant,
    /// The window was full after this frame: its rate sample measures the
    /// path, not how much the application had to send.
    pub cwnd_limited: bool,
    /// The passenger data this frame carried, for reinjection.
    pub segment: Option<SegmentRef>,
}

/// A packet of passenger data as placed on one path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegmentRef {
    pub conn: crate::ids::ConnId,
    pub offset: u64,
}

/// Snapshot of a path's state, read by schedulerlets. Units are in the
/// field names.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PathView {
    pub id: PathId,
    pub availability: Availability,
    pub srtt_us: u64,
    pub rttvar_us: u64,
    pub min_rtt_us: u64,
    pub in_flight_bytes: u64,
    pub cwnd_bytes: u64,
    /// Send-buffer occupancy: bytes the endpoint has queued for this path
    /// that have not reached the socket yet, plus what the shell reports as
    /// unsent in the kernel.
    pub queued_bytes: u64,
    /// Delivery-rate estimate (bytes per second); 0 before any sample.
    pub delivery_rate_bps: u64,
    /// How many retransmission timeouts the oldest unacknowledged frame on
    /// this path has suffered.
    pub rto_count: u32,
    /// Time since a packet of passenger data was last scheduled here.
    pub idle_us: u64,
    /// Bytes scheduled on other paths since this path was last used.
    pub bytes_since_use: u64,
    pub link_state: LinkState,
    /// Current cell, as reported by the relay-agent; 0 when unknown.
    pub cell: u64,
    /// No acknowledgement progress for a while with data outstanding, or the
    /// modem reported no service (see [`PathConfig::stale_after_min`]).
    pub stale: bool,
    /// Where the train is relative to the predicted handover-failure
    /// location of this path's current cell (POLYCORN §3, §4.3); `None`
    /// when nothing is predicted: no train position, no failure table, the
    /// cell is unknown or not in the table. Filled by the endpoint from
    /// [`crate::Endpoint::set_train_state`] and
    /// [`crate::Endpoint::set_failure_table`].
    pub failure: Option<FailureForecast>,
}

/// A predicted handover failure on a path, as schedulerlets see it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FailureForecast {
    /// Distance (m) the train still has to travel, in its direction of
    /// travel, to the predicted failure location; negative once the train
    /// has passed it while still on the same cell (the handover is overdue).
    pub distance_m: f64,
    /// Train speed (m/s) from the latest position report.
    pub speed_mps: f64,
}

impl FailureForecast {
    /// Predicted time to the failure, t_HOF (µs); 0 once passed, `None`
    /// when the train is not moving.
    pub fn time_to_failure_us(&self) -> Option<u64> {
        if self.distance_m <= 0.0 {
            Some(0)
        } else if self.speed_mps > 0.0 && self.speed_mps.is_finite() {
            Some((self.distance_m / self.speed_mps * 1e6).min(u64::MAX as f64) as u64)
        } else {
            None
        }
    }
}

impl PathView {
    /// Estimated one-way delay: half the smoothed RTT.
    pub fn owd_us(&self) -> u64 {
        self.srtt_us / 2
    }

    /// Estimated bandwidth in bytes per second, falling back to window/RTT
    /// before the first rate sample.
    pub fn bandwidth_bps(&self) -> u64 {
        if self.delivery_rate_bps > 0 {
            self.delivery_rate_bps
        } else {
            (self.cwnd_bytes as u128 * 1_000_000 / u128::from(self.srtt_us.max(1))) as u64
        }
    }
}

/// Statistics a shell exports (plain data; the shells make metrics).
#[derive(Clone, Debug, Default)]
pub struct PathStats {
    pub sent_bytes: u64,
    pub received_bytes: u64,
    pub data_bytes_sent: u64,
    pub reinjected_bytes: u64,
    pub redundant_bytes: u64,
    pub rto_events: u64,
    pub state_changes: u64,
    /// Times the path became stale, and times its window was halved by
    /// head-of-line penalisation.
    pub stale_transitions: u64,
    pub penalisations: u64,
}

/// The sender's and receiver's state of one subflow.
#[derive(Debug)]
pub struct Path {
    pub(crate) id: PathId,
    pub(crate) up: bool,
    cfg: PathConfig,
    srtt: Option<Duration>,
    rttvar: Duration,
    min_rtt: Option<(Duration, Instant)>,
    rate_samples: VecDeque<(Instant, u64)>,
    max_rate_bps: u64,
    // Sender side.
    pub(crate) tx_counter: u64,
    pub(crate) acked_counter: u64,
    pub(crate) sent: VecDeque<SentRecord>,
    delivered: u64,
    delivered_time: Instant,
    pub(crate) queued_bytes: u64,
    pub(crate) kernel_unsent_bytes: u64,
    pub(crate) rto_count: u32,
    /// Exponent of the timer's backoff: raised by each timeout, cleared
    /// only by a valid RTT sample (Karn's algorithm: the backed-off timer
    /// is kept for new data until an acknowledgement of a frame sent after
    /// the last timeout gives a sample). Clearing it on any acknowledgement
    /// lets a path whose RTT exceeds the un-backed-off timer time out on
    /// every flight, and fence every sample away, for ever.
    rto_backoff: u32,
    pub(crate) rto_deadline: Option<Instant>,
    /// Byte counter when the retransmission timer last fired. Frames at or
    /// below it were outstanding across a timeout, during which the TCP
    /// beneath retransmitted or the link stalled: their RTT is not the
    /// path's (Karn's algorithm, RFC 6298 §3), and one outage sample would
    /// otherwise inflate `srtt` for many RTTs.
    rto_fence: u64,
    pub(crate) last_used: Instant,
    pub(crate) bytes_since_use: u64,
    /// Last time a counted frame was sent (keepalive pings go after idle).
    pub(crate) last_tx: Instant,
    pub(crate) dead_reported: bool,
    // Receiver side.
    pub(crate) rx_counter: u64,
    pub(crate) rx_acked: u64,
    pub(crate) rx_last_arrival: Instant,
    pub(crate) link_state: LinkState,
    pub(crate) cell: u64,
    pub(crate) stats: PathStats,
    /// Last time the peer acknowledged new bytes on this subflow.
    pub(crate) last_ack_progress: Instant,
    pub(crate) stale: bool,
    /// Head-of-line penalisation: the window is halved until an
    /// acknowledgement arrives at or after this time.
    penalised_until: Option<Instant>,
}

impl Path {
    pub(crate) fn new(id: PathId, cfg: PathConfig, now: Instant) -> Self {
        Path {
            id,
            up: false,
            cfg,
            srtt: None,
            rttvar: Duration::ZERO,
            min_rtt: None,
            rate_samples: VecDeque::new(),
            max_rate_bps: 0,
            tx_counter: 0,
            acked_counter: 0,
            sent: VecDeque::new(),
            delivered: 0,
            delivered_time: now,
            queued_bytes: 0,
            kernel_unsent_bytes: 0,
            rto_count: 0,
            rto_backoff: 0,
            rto_deadline: None,
            rto_fence: 0,
            last_used: now,
            bytes_since_use: 0,
            last_tx: now,
            dead_reported: false,
            rx_counter: 0,
            rx_acked: 0,
            rx_last_arrival: now,
            link_state: LinkState::Connected,
            cell: 0,
            stats: PathStats::default(),
            last_ack_progress: now,
            stale: false,
            penalised_until: None,
        }
    }

    /// Forget everything that belonged to the previous subflow; keep the
    /// RTT and rate estimates as a starting point.
    pub(crate) fn reset_transport(&mut self, now: Instant) {
        self.tx_counter = 0;
        self.acked_counter = 0;
        self.sent.clear();
        self.queued_bytes = 0;
        self.kernel_unsent_bytes = 0;
        self.rto_count = 0;
        self.rto_backoff = 0;
        self.rto_deadline = None;
        self.rto_fence = 0;
        self.rx_counter = 0;
        self.rx_acked = 0;
        self.delivered_time = now;
        self.last_tx = now;
        self.dead_reported = false;
        self.last_ack_progress = now;
        self.stale = false;
        self.penalised_until = None;
    }

    /// When the path becomes stale if no acknowledgement progress comes:
    /// `None` when nothing is outstanding or it already is.
    pub(crate) fn stale_deadline(&self) -> Option<Instant> {
        if self.stale {
            return None;
        }
        let oldest = self.sent.front()?.sent_at;
        if self.link_state == LinkState::NoService {
            // The modem's handover signal: stale now.
            return Some(oldest);
        }
        // Before the first RTT sample the armed timer stands in for the
        // unknown RTT: a path is not stale before it could have answered.
        let rtt_bound = match self.srtt {
            Some(s) => s * self.cfg.stale_srtt_factor,
            None => self.backed_off_rto(),
        };
        let wait = rtt_bound.max(self.cfg.stale_after_min);
        Some(self.last_ack_progress.max(oldest) + wait)
    }

    /// Mark the path stale; returns whether it just became so.
    pub(crate) fn mark_stale(&mut self) -> bool {
        if self.stale {
            return false;
        }
        self.stale = true;
        self.stats.stale_transitions += 1;
        true
    }

    /// Head-of-line penalisation (Raiciu et al., NSDI 2012, §4.2): halve
    /// the window for one smoothed RTT, at most once per RTT. Returns
    /// whether it was applied.
    pub(crate) fn penalise(&mut self, now: Instant) -> bool {
        if self.penalised_until.is_some_and(|t| now < t) {
            return false;
        }
        self.penalised_until = Some(now + self.srtt());
        self.stats.penalisations += 1;
        true
    }

    pub fn id(&self) -> PathId {
        self.id
    }

    pub fn srtt(&self) -> Duration {
        self.srtt.unwrap_or(self.cfg.initial_rtt)
    }

    /// Retransmission timeout, RFC 6298 style, before backoff: before the
    /// first RTT sample 1 s (§2.1; 3 × `initial_rtt` if that is longer), so
    /// a path whose RTT is several hundred milliseconds (a loaded cellular
    /// carrier) does not time out on its first flight.
    pub fn rto(&self) -> Duration {
        let base = match self.srtt {
            Some(s) => s + 4 * self.rttvar,
            None => (3 * self.cfg.initial_rtt).max(Duration::from_secs(1)),
        };
        base.clamp(self.cfg.min_rto, self.cfg.max_rto)
    }

    /// The timer as armed: [`Self::rto`] with the current backoff.
    fn backed_off_rto(&self) -> Duration {
        self.rto().saturating_mul(1u32 << self.rto_backoff.min(16)).min(self.cfg.max_rto)
    }

    /// When a small frame written now would reach the peer, relative to
    /// now: half the smoothed RTT plus the time the bytes queued ahead of
    /// it (in the endpoint and unsent in the kernel) take at the path's
    /// delivery rate (window per RTT before a rate sample).
    pub(crate) fn small_frame_delay(&self) -> Duration {
        let srtt = self.srtt();
        let rate = if self.max_rate_bps > 0 {
            self.max_rate_bps as f64
        } else {
            self.cwnd_bytes() as f64 / srtt.as_secs_f64().max(1e-6)
        };
        let queued = (self.queued_bytes + self.kernel_unsent_bytes) as f64;
        srtt / 2 + Duration::from_secs_f64((queued / rate.max(1.0)).min(3600.0))
    }

    pub fn in_flight_bytes(&self) -> u64 {
        self.tx_counter - self.acked_counter
    }

    /// In-flight limit: `cwnd_gain` × rate × min RTT (BBR), but never less
    /// than rate × smoothed RTT. On cellular links most RTT variation is not
    /// queueing (radio scheduling, HARQ, handovers: hsr-facts §15.5), and a
    /// window of 2 × BDP(min RTT) would cap a path at a fraction of its rate
    /// whenever the RTT spikes past twice its minimum.
    pub fn cwnd_bytes(&self) -> u64 {
        let cwnd = match (self.max_rate_bps, self.min_rtt) {
            (r, Some((m, _))) if r > 0 => {
                let bdp = r as f64 * m.as_secs_f64();
                let pipe = r as f64 * self.srtt().as_secs_f64();
                ((bdp * self.cfg.cwnd_gain).max(pipe) as u64).clamp(self.cfg.min_cwnd_bytes, self.cfg.max_cwnd_bytes)
            }
            _ => self.cfg.initial_cwnd_bytes,
        };
        if self.rto_count > 0 {
            // The retransmission timer fired and nothing has been
            // acknowledged since: like TCP's loss window after an RTO, the
            // path takes no more than a probe until an acknowledgement
            // shows it delivers again. Without this a path that went dark
            // keeps its window and goes on absorbing new data that only
            // the blackout's end (or a reinjection) will deliver.
            self.cfg.min_cwnd_bytes.min(cwnd)
        } else if self.penalised_until.is_some() {
            (cwnd / 2).max(self.cfg.min_cwnd_bytes)
        } else {
            cwnd
        }
    }

    pub fn availability(&self) -> Availability {
        if !self.up {
            Availability::Down
        } else if self.queued_bytes >= self.cfg.queue_limit_bytes
            // Bytes unsent in the kernel are already in flight (written and
            // not acknowledged), so they are not added again here; they
            // only count toward the send-buffer occupancy of `view()`.
            || self.in_flight_bytes() + self.queued_bytes >= self.cwnd_bytes()
        {
            Availability::Full
        } else {
            Availability::Available
        }
    }

    pub fn view(&self, now: Instant) -> PathView {
        let srtt = self.srtt();
        PathView {
            id: self.id,
            availability: self.availability(),
            srtt_us: srtt.as_micros() as u64,
            rttvar_us: self.rttvar.as_micros() as u64,
            min_rtt_us: self.min_rtt.map_or(srtt, |m| m.0).as_micros() as u64,
            in_flight_bytes: self.in_flight_bytes(),
            cwnd_bytes: self.cwnd_bytes(),
            queued_bytes: self.queued_bytes + self.kernel_unsent_bytes,
            delivery_rate_bps: self.max_rate_bps,
            rto_count: self.rto_count,
            idle_us: now.saturating_duration_since(self.last_used).as_micros() as u64,
            bytes_since_use: self.bytes_since_use,
            link_state: self.link_state,
            cell: self.cell,
            stale: self.stale,
            failure: None,
        }
    }

    pub fn stats(&self) -> &PathStats {
        &self.stats
    }

    /// Record a counted frame of `len` bytes handed to the socket.
    pub(crate) fn on_frame_sent(&mut self, len: usize, segment: Option<SegmentRef>, now: Instant) {
        if self.sent.is_empty() {
            self.rto_deadline = Some(now + self.backed_off_rto());
            // A rate sample must not span a period with nothing in flight.
            self.delivered_time = now;
        }
        self.last_tx = now;
        self.tx_counter += len as u64;
        self.stats.sent_bytes += len as u64;
        self.sent.push_back(SentRecord {
            end: self.tx_counter,
            sent_at: now,
            delivered_at_send: self.delivered,
            delivered_time_at_send: self.delivered_time,
            cwnd_limited: self.in_flight_bytes() + self.queued_bytes >= self.cwnd_bytes(),
            segment,
        });
    }

    /// Process a `PATH_ACK`; returns the records it acknowledged.
    pub(crate) fn on_path_ack(
        &mut self,
        received: u64,
        delay: Duration,
        now: Instant,
        acked: &mut Vec<SentRecord>,
    ) -> bool {
        if received <= self.acked_counter || received > self.tx_counter {
            return received <= self.tx_counter;
        }
        let newly = received - self.acked_counter;
        self.acked_counter = received;
        self.last_ack_progress = now;
        self.stale = false;
        if self.penalised_until.is_some_and(|t| now >= t) {
            self.penalised_until = None;
        }
        self.delivered += newly;
        self.delivered_time = now;
        let mut newest: Option<SentRecord> = None;
        while let Some(r) = self.sent.front() {
            if r.end > received {
                break;
            }
            let r = self.sent.pop_front().expect("front exists");
            if let Some(prev) = newest.replace(r) {
                acked.push(prev);
            }
        }
        if let Some(r) = newest {
            if r.end > self.rto_fence {
                let rtt = now.saturating_duration_since(r.sent_at);
                let rtt = rtt.checked_sub(delay).filter(|d| !d.is_zero()).unwrap_or(rtt);
                self.on_rtt_sample(rtt, now);
                self.rto_backoff = 0;
            }
            let interval = now.saturating_duration_since(r.delivered_time_at_send);
            if interval >= Duration::from_micros(100) {
                let bytes = self.delivered - r.delivered_at_send;
                let rate = (bytes as f64 / interval.as_secs_f64()) as u64;
                self.on_rate_sample(rate, r.cwnd_limited, now);
            }
            acked.push(r);
        }
        self.rto_count = 0;
        self.rto_deadline = if self.sent.is_empty() { None } else { Some(now + self.backed_off_rto()) };
        true
    }

    /// An RTT sample, as a path acknowledgement would give (tests only).
    #[cfg(test)]
    pub(crate) fn on_rtt_sample_for_test(&mut self, rtt: Duration, now: Instant) {
        self.on_rtt_sample(rtt, now);
    }

    fn on_rtt_sample(&mut self, rtt: Duration, now: Instant) {
        match self.srtt {
            None => {
                self.srtt = Some(rtt);
                self.rttvar = rtt / 2;
            }
            Some(s) => {
                let diff = s.abs_diff(rtt);
                self.rttvar = (self.rttvar * 3 + diff) / 4;
                self.srtt = Some((s * 7 + rtt) / 8);
            }
        }
        match self.min_rtt {
            Some((m, at)) if rtt > m && now.saturating_duration_since(at) < self.cfg.min_rtt_window => {}
            _ => self.min_rtt = Some((rtt, now)),
        }
    }

    /// Windowed maximum of the delivery rate (BBR's bottleneck-bandwidth
    /// filter). A sample taken while the sender did not fill the window
    /// (app-limited: idle passengers, keepalives) only counts when it is
    /// higher than the current estimate, so a quiet path keeps its last
    /// estimate instead of decaying to the rate of its keepalives.
    fn on_rate_sample(&mut self, rate: u64, cwnd_limited: bool, now: Instant) {
        if !cwnd_limited && rate < self.max_rate_bps {
            return;
        }
        while let Some(&(t, _)) = self.rate_samples.front() {
            if now.saturating_duration_since(t) > self.cfg.rate_window {
                self.rate_samples.pop_front();
            } else {
                break;
            }
        }
        // Keep the deque monotonically decreasing: a windowed max filter.
        while let Some(&(_, r)) = self.rate_samples.back() {
            if r <= rate {
                self.rate_samples.pop_back();
            } else {
                break;
            }
        }
        self.rate_samples.push_back((now, rate));
        self.max_rate_bps = self.rate_samples.front().map_or(rate, |s| s.1);
    }

    /// Called when the retransmission timer fires. Returns the new RTO count.
    pub(crate) fn on_rto(&mut self, now: Instant) -> u32 {
        self.rto_count += 1;
        self.rto_backoff = (self.rto_backoff + 1).min(16);
        self.stats.rto_events += 1;
        self.rto_fence = self.tx_counter;
        self.rto_deadline = Some(now + self.backed_off_rto());
        self.rto_count
    }

    /// Every passenger segment this path has not had acknowledged.
    pub(crate) fn unacked_segments(&self) -> impl Iterator<Item = SegmentRef> + '_ {
        self.sent.iter().filter_map(|r| r.segment)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(now: Instant) -> Path {
        let mut p = Path::new(PathId(0), PathConfig::default(), now);
        p.up = true;
        p
    }

    #[test]
    fn rtt_and_in_flight_follow_path_acks() {
        let t0 = Instant::now();
        let mut p = path(t0);
        p.on_frame_sent(1000, None, t0);
        p.on_frame_sent(1000, None, t0 + Duration::from_millis(10));
        assert_eq!(p.in_flight_bytes(), 2000);
        let mut acked = Vec::new();
        assert!(p.on_path_ack(1000, Duration::ZERO, t0 + Duration::from_millis(50), &mut acked));
        assert_eq!(p.srtt(), Duration::from_millis(50));
        assert_eq!(p.in_flight_bytes(), 1000);
        assert!(p.on_path_ack(2000, Duration::from_millis(5), t0 + Duration::from_millis(65), &mut acked));
        // Sample 50 ms (65 - 10 - 5): srtt stays 50 ms.
        assert_eq!(p.srtt(), Duration::from_millis(50));
        assert_eq!(acked.len(), 2);
        assert_eq!(p.rto_deadline, None);
    }

    #[test]
    fn a_path_without_ack_progress_goes_stale_and_its_first_ack_revives_it() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut p = path(t0);
        assert_eq!(p.stale_deadline(), None, "nothing outstanding, never stale");
        p.on_frame_sent(1000, None, t0);
        let mut acked = Vec::new();
        assert!(p.on_path_ack(1000, Duration::ZERO, t0 + ms(40), &mut acked));
        p.on_frame_sent(1000, None, t0 + ms(50));
        // srtt 40 ms: 2 × srtt is below the 300 ms floor.
        assert_eq!(p.stale_deadline(), Some(t0 + ms(350)));
        assert!(p.mark_stale());
        assert!(!p.mark_stale(), "counted once");
        assert!(p.view(t0 + ms(400)).stale);
        assert_eq!(p.stale_deadline(), None);
        assert!(p.on_path_ack(2000, Duration::ZERO, t0 + ms(900), &mut acked));
        assert!(!p.view(t0 + ms(900)).stale, "its first acknowledgement makes it active again");
        assert_eq!(p.stats.stale_transitions, 1);
        // The modem's "no service" makes a path with data outstanding stale at once.
        p.on_frame_sent(1000, None, t0 + ms(1000));
        p.link_state = LinkState::NoService;
        assert_eq!(p.stale_deadline(), Some(t0 + ms(1000)));
    }

    #[test]
    fn the_timer_stays_backed_off_until_a_valid_sample_so_a_delay_spike_is_learned() {
        // 50 ms for a while, then the path's RTT jumps to 700 ms (a loaded
        // cell): more than the timer armed from the old estimate. The first
        // flight times out and its samples are fenced off (Karn). If the
        // first acknowledgement cleared the backoff, every later flight
        // would time out too and the path would never learn the new RTT.
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut p = path(t0);
        let mut acked = Vec::new();
        let mut t = t0;
        for _ in 0..10 {
            p.on_frame_sent(1000, None, t);
            t += ms(50);
            assert!(p.on_path_ack(p.tx_counter, Duration::ZERO, t, &mut acked));
        }
        assert_eq!(p.srtt(), ms(50));
        let mut timeouts = Vec::new();
        for _ in 0..10 {
            p.on_frame_sent(1000, None, t);
            let ack_at = t + ms(700);
            let mut n = 0;
            while let Some(d) = p.rto_deadline.filter(|&d| d < ack_at) {
                p.on_rto(d);
                n += 1;
            }
            timeouts.push(n);
            assert!(p.on_path_ack(p.tx_counter, Duration::ZERO, ack_at, &mut acked));
            t = ack_at;
        }
        assert!(p.srtt() > ms(400), "the new RTT is learned: {:?}, timeouts per flight {timeouts:?}", p.srtt());
        assert_eq!(timeouts[5..], [0; 5], "and the timer stops firing: {timeouts:?}");
    }

    #[test]
    fn before_any_sample_the_timer_is_one_second() {
        let t0 = Instant::now();
        let mut p = path(t0);
        assert_eq!(p.rto(), Duration::from_secs(1));
        p.on_frame_sent(1000, None, t0);
        assert_eq!(p.rto_deadline, Some(t0 + Duration::from_secs(1)));
        // Nor is a path stale before its timer could have fired.
        assert_eq!(p.stale_deadline(), Some(t0 + Duration::from_secs(1)));
    }

    #[test]
    fn penalisation_halves_the_window_once_per_rtt_until_an_ack() {
        let t0 = Instant::now();
        let mut p = path(t0);
        let w = p.cwnd_bytes();
        assert!(p.penalise(t0));
        assert_eq!(p.cwnd_bytes(), (w / 2).max(PathConfig::default().min_cwnd_bytes));
        assert!(!p.penalise(t0 + Duration::from_millis(10)), "at most once per srtt");
        p.on_frame_sent(1000, None, t0);
        let mut acked = Vec::new();
        assert!(p.on_path_ack(1000, Duration::ZERO, t0 + Duration::from_millis(200), &mut acked));
        assert_eq!(p.penalised_until, None, "an acknowledgement after one srtt lifts it");
        assert!(p.penalise(t0 + Duration::from_millis(200)), "and it may be penalised again");
        assert_eq!(p.stats.penalisations, 2);
    }

    #[test]
    fn an_ack_beyond_what_was_sent_is_rejected() {
        let t0 = Instant::now();
        let mut p = path(t0);
        p.on_frame_sent(100, None, t0);
        let mut acked = Vec::new();
        assert!(!p.on_path_ack(101, Duration::ZERO, t0, &mut acked));
        assert!(p.on_path_ack(50, Duration::ZERO, t0, &mut acked));
        assert!(acked.is_empty(), "a partial frame acknowledges nothing");
    }

    #[test]
    fn an_idle_path_keeps_its_rate_estimate_but_a_full_one_follows_the_link() {
        let t0 = Instant::now();
        let mut p = path(t0);
        let mut acked = Vec::new();
        // 10 MB/s for 200 ms (as above).
        for i in 0..200u64 {
            let t = t0 + Duration::from_millis(i);
            p.on_frame_sent(10_000, None, t);
            if i >= 20 {
                p.on_path_ack((i - 19) * 10_000, Duration::ZERO, t, &mut acked);
            }
        }
        p.on_path_ack(p.tx_counter, Duration::ZERO, t0 + Duration::from_millis(220), &mut acked);
        // Then 10 s of 100-byte keepalives once a second: app-limited samples.
        for s in 1..=10u64 {
            let t = t0 + Duration::from_secs(s);
            p.on_frame_sent(100, None, t);
            p.on_path_ack(p.tx_counter, Duration::ZERO, t + Duration::from_millis(20), &mut acked);
        }
        let r = p.view(t0 + Duration::from_secs(11)).delivery_rate_bps;
        assert!(r >= 9_000_000, "an idle path forgot its rate: {r}");
        // Now the link gives only 1 MB/s while the window stays full: the
        // estimate follows once the old maximum leaves the 2 s window.
        let t1 = t0 + Duration::from_secs(12);
        let mut tx_ms = 0u64;
        for i in 0..4000u64 {
            let t = t1 + Duration::from_millis(i);
            while p.availability() == Availability::Available {
                p.on_frame_sent(1_000, None, t + Duration::from_micros(tx_ms % 1000));
                tx_ms += 1;
            }
            // 1 kB delivered per ms.
            let target = (p.acked_counter + 1_000).min(p.tx_counter);
            p.on_path_ack(target, Duration::ZERO, t, &mut acked);
        }
        let r = p.view(t1 + Duration::from_secs(4)).delivery_rate_bps;
        assert!((500_000..=2_000_000).contains(&r), "rate {r} did not follow a full path down");
    }

    #[test]
    fn the_window_covers_rate_times_smoothed_rtt() {
        let t0 = Instant::now();
        let mut p = path(t0);
        let mut acked = Vec::new();
        // One fast RTT sample (20 ms), then 400 ms ones: min RTT stays 20 ms.
        p.on_frame_sent(100_000, None, t0);
        p.on_path_ack(100_000, Duration::ZERO, t0 + Duration::from_millis(20), &mut acked);
        let mut t = t0 + Duration::from_millis(20);
        for _ in 0..20 {
            p.on_frame_sent(100_000, None, t);
            t += Duration::from_millis(400);
            p.on_path_ack(p.tx_counter, Duration::ZERO, t, &mut acked);
        }
        let v = p.view(t);
        let pipe = v.delivery_rate_bps as f64 * v.srtt_us as f64 / 1e6;
        assert!(v.cwnd_bytes as f64 >= pipe * 0.99, "cwnd {} < rate × srtt {pipe}", v.cwnd_bytes);
        assert!(v.min_rtt_us < 30_000 && v.srtt_us > 300_000, "{v:?}");
    }

    #[test]
    fn delivery_rate_tracks_a_steady_sender() {
        let t0 = Instant::now();
        let mut p = path(t0);
        // 10 kB every millisecond, acknowledged 20 ms later: 10 MB/s.
        let mut acked = Vec::new();
        for i in 0..200u64 {
            let t = t0 + Duration::from_millis(i);
            p.on_frame_sent(10_000, None, t);
            if i >= 20 {
                p.on_path_ack((i - 19) * 10_000, Duration::ZERO, t, &mut acked);
            }
        }
        let r = p.view(t0 + Duration::from_millis(200)).delivery_rate_bps;
        assert!((9_000_000..=11_000_000).contains(&r), "rate {r}");
    }

    #[test]
    fn rto_backs_off_and_resets_on_progress() {
        let t0 = Instant::now();
        let mut p = path(t0);
        p.on_frame_sent(100, None, t0);
        let d0 = p.rto_deadline.unwrap();
        assert_eq!(p.on_rto(d0), 1);
        let d1 = p.rto_deadline.unwrap();
        assert!(d1 - d0 > d0 - t0, "timer doubles");
        assert_eq!(p.on_rto(d1), 2);
        let mut acked = Vec::new();
        p.on_path_ack(100, Duration::ZERO, d1, &mut acked);
        assert_eq!(p.rto_count, 0);
    }

    #[test]
    fn availability_has_two_tiers() {
        let t0 = Instant::now();
        let mut p = path(t0);
        assert_eq!(p.availability(), Availability::Available);
        p.on_frame_sent(p.cwnd_bytes() as usize, None, t0);
        assert_eq!(p.availability(), Availability::Full);
        p.up = false;
        assert_eq!(p.availability(), Availability::Down);
    }
}
