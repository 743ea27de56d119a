//! The controller against a packet-level railway link in virtual time: a
//! bottleneck of time-varying capacity with radio loss, outages and a
//! finite queue, and a sender that behaves as quinn does towards its
//! controller (window-limited, paced at 1.25 × window / SRTT, losses
//! declared by packet threshold when later packets are acknowledged, probe
//! timeouts that back off through an outage, persistent congestion when the
//! lost packets span several RTTs).

use super::*;
use crate::testing::SplitMix64;
use std::collections::{BTreeMap, BinaryHeap};

const MTU: u64 = 1200;
const STEP: Duration = Duration::from_millis(1);

#[derive(Clone)]
struct LinkSpec {
    /// (from second, Mbit/s).
    capacity: Vec<(f64, f64)>,
    owd: Duration,
    /// (from second, one-way delay): the base RTT moves with the cell.
    owd_steps: Vec<(f64, Duration)>,
    loss: f64,
    /// (start s, end s): nothing gets through, the queue is lost.
    outages: Vec<(f64, f64)>,
    buffer: u64,
    seconds: f64,
    /// Before this second the sender has only a keep-alive every 500 ms.
    busy_from: f64,
}

impl LinkSpec {
    fn steady(mbps: f64, rtt_ms: u64, loss: f64) -> Self {
        LinkSpec {
            capacity: vec![(0.0, mbps)],
            owd: Duration::from_millis(rtt_ms / 2),
            owd_steps: vec![],
            loss,
            outages: vec![],
            buffer: 4 << 20,
            seconds: 30.0,
            busy_from: 0.0,
        }
    }
    fn mbps_at(&self, s: f64) -> f64 {
        self.capacity.iter().rev().find(|(from, _)| *from <= s).map_or(0.0, |c| c.1)
    }
    fn owd_at(&self, s: f64) -> Duration {
        self.owd_steps.iter().rev().find(|(from, _)| *from <= s).map_or(self.owd, |o| o.1)
    }
    fn down_at(&self, s: f64) -> bool {
        self.outages.iter().any(|(a, b)| (*a..*b).contains(&s))
    }
}

/// What the sender's controller is.
trait Cc {
    fn window(&self) -> u64;
    fn on_sent(&mut self, now: Instant, bytes: u64, in_flight: u64);
    fn on_ack(&mut self, now: Instant, sent: Instant, bytes: u64);
    fn on_loss(&mut self, now: Instant, sent: Instant, persistent: bool, bytes: u64);
    fn on_hint(&mut self, _now: Instant, _hint: Hint) {}
    /// The controller's own pace (bytes/s); None: the transport's, from the
    /// window.
    fn pacing_rate(&self) -> Option<f64> {
        None
    }
}

impl Cc for Railway {
    fn window(&self) -> u64 {
        Railway::window(self)
    }
    fn on_sent(&mut self, now: Instant, bytes: u64, in_flight: u64) {
        Railway::on_sent(self, now, bytes, in_flight)
    }
    fn on_ack(&mut self, now: Instant, sent: Instant, bytes: u64) {
        Railway::on_ack(self, now, sent, bytes)
    }
    fn on_loss(&mut self, now: Instant, sent: Instant, persistent: bool, bytes: u64) {
        Railway::on_loss(self, now, sent, persistent, bytes)
    }
    fn on_hint(&mut self, now: Instant, hint: Hint) {
        Railway::on_hint(self, now, hint)
    }
    fn pacing_rate(&self) -> Option<f64> {
        Railway::pacing_rate(self)
    }
}

/// RFC 9002's NewReno, the loss-based reference.
struct NewReno {
    window: u64,
    ssthresh: u64,
    recovery_start: Option<Instant>,
    acked: u64,
}

impl Cc for NewReno {
    fn window(&self) -> u64 {
        self.window
    }
    fn on_sent(&mut self, _: Instant, _: u64, _: u64) {}
    fn on_ack(&mut self, _: Instant, sent: Instant, bytes: u64) {
        if self.recovery_start.is_some_and(|r| sent <= r) {
            return;
        }
        if self.window < self.ssthresh {
            self.window += bytes;
        } else {
            self.acked += bytes;
            if self.acked >= self.window {
                self.acked -= self.window;
                self.window += MTU;
            }
        }
    }
    fn on_loss(&mut self, now: Instant, sent: Instant, persistent: bool, _: u64) {
        if self.recovery_start.is_some_and(|r| sent <= r) {
            return;
        }
        self.recovery_start = Some(now);
        self.window = (self.window / 2).max(2 * MTU);
        self.ssthresh = self.window;
        if persistent {
            self.window = 2 * MTU;
        }
    }
}

#[derive(Default)]
struct Outcome {
    /// Bytes delivered over the bytes the link could carry while up.
    utilisation: f64,
    /// p95 of RTT minus the link's two-way propagation delay, after the
    /// first 5 s (start-up's overshoot is its own test).
    queue_p95: Duration,
    /// ... over the whole run.
    queue_p95_all: Duration,
    /// (second, queueing delay) of every acknowledged packet.
    queue: Vec<(f64, Duration)>,
    /// Delivered per second of the run.
    per_second: Vec<u64>,
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct AckArrival {
    at: std::cmp::Reverse<Instant>,
    pn: u64,
}

/// `hints`: (second, hint) the sender's controller is told.
fn simulate(spec: &LinkSpec, cc: &mut dyn Cc, seed: u64, hints: &[(f64, Hint)]) -> Outcome {
    let t0 = Instant::now();
    let mut rng = SplitMix64::new(seed);
    let mut now = t0;
    let mut in_flight: BTreeMap<u64, (Instant, u64)> = BTreeMap::new();
    let mut in_flight_bytes = 0u64;
    let mut queue: VecDeque<u64> = VecDeque::new(); // pns waiting at the bottleneck
    let mut queue_bytes = 0u64;
    let mut acks: BinaryHeap<AckArrival> = BinaryHeap::new();
    let mut credit = 0.0f64;
    let mut tokens = 10.0 * MTU as f64;
    let mut srtt: Option<Duration> = None;
    let mut next_pn = 0u64;
    let mut largest_acked: Option<u64> = None;
    let mut last_progress = t0;
    let mut pto_count = 0u32;
    let mut rtts: Vec<Duration> = Vec::new();
    let mut rtts_all: Vec<Duration> = Vec::new();
    let mut queue_log: Vec<(f64, Duration)> = Vec::new();
    let mut delivered = 0u64;
    let mut offered = 0.0f64;
    let mut per_second = vec![0u64; spec.seconds.ceil() as usize + 1];
    let mut next_hint = 0;
    let steps = (spec.seconds * 1000.0) as u64;
    for _ in 0..steps {
        now += STEP;
        let s = now.duration_since(t0).as_secs_f64();
        while next_hint < hints.len() && hints[next_hint].0 <= s {
            cc.on_hint(now, hints[next_hint].1);
            next_hint += 1;
        }
        // The bottleneck serves its queue.
        let down = spec.down_at(s);
        if down {
            queue.clear();
            queue_bytes = 0;
            credit = 0.0;
        } else {
            let bps = spec.mbps_at(s) * 1e6 / 8.0;
            offered += bps * STEP.as_secs_f64();
            credit += bps * STEP.as_secs_f64();
            while let Some(&pn) = queue.front() {
                if credit < MTU as f64 {
                    break;
                }
                credit -= MTU as f64;
                queue.pop_front();
                queue_bytes -= MTU;
                if !rng.chance(spec.loss) {
                    acks.push(AckArrival { at: std::cmp::Reverse(now + 2 * spec.owd_at(s)), pn });
                }
            }
            if queue.is_empty() {
                credit = credit.min(MTU as f64);
            }
        }
        // Acknowledgements reach the sender.
        let mut acked_any = false;
        while acks.peek().is_some_and(|a| a.at.0 <= now) {
            let a = acks.pop().expect("peeked");
            let Some((sent, bytes)) = in_flight.remove(&a.pn) else { continue };
            in_flight_bytes -= bytes;
            let rtt = now - sent;
            let queued = rtt.saturating_sub(2 * spec.owd_at(sent.duration_since(t0).as_secs_f64()));
            rtts_all.push(queued);
            queue_log.push((s, queued));
            if s >= 5.0 {
                rtts.push(queued);
            }
            srtt = Some(srtt.map_or(rtt, |s| (s * 7 + rtt) / 8));
            delivered += bytes;
            per_second[s as usize] += bytes;
            cc.on_ack(now, sent, bytes);
            largest_acked = Some(largest_acked.map_or(a.pn, |l| l.max(a.pn)));
            acked_any = true;
        }
        if acked_any {
            last_progress = now;
            pto_count = 0;
            // Packet threshold 3 (RFC 9002).
            let largest = largest_acked.expect("acked");
            let lost: Vec<u64> = in_flight.range(..largest.saturating_sub(2)).map(|(pn, _)| *pn).collect();
            if !lost.is_empty() {
                let first = in_flight[&lost[0]].0;
                let last = in_flight[lost.last().expect("non-empty")].0;
                let bytes: u64 = lost.iter().map(|pn| in_flight[pn].1).sum();
                let persistent = last - first > 3 * srtt.unwrap_or(Duration::from_millis(333));
                for pn in &lost {
                    in_flight_bytes -= in_flight.remove(pn).expect("listed").1;
                }
                cc.on_loss(now, last, persistent, bytes);
            }
        }
        // The sender: window-limited and paced; a probe when nothing was
        // heard for a (backed-off) probe timeout.
        let srtt_now = srtt.unwrap_or(Duration::from_millis(333));
        // The controller's pace, or the transport's from the window (as
        // quinn's pacer and the relay's shell do).
        let rate = cc.pacing_rate().unwrap_or(1.25 * cc.window() as f64 / srtt_now.as_secs_f64());
        tokens = (tokens + rate * STEP.as_secs_f64()).min((10 * MTU).max(cc.window() / 8) as f64);
        let pto = (srtt_now * 2 + Duration::from_millis(25)) * 2u32.pow(pto_count.min(8));
        let probe = !in_flight.is_empty() && now - last_progress > pto;
        if probe {
            pto_count += 1;
            last_progress = now;
        }
        let mut sent_now = 0;
        let idle = s < spec.busy_from;
        let keep_alive = idle && now.duration_since(t0).as_millis() % 500 == 0;
        while (probe && sent_now < 2)
            || (keep_alive && sent_now < 1)
            || (!idle && in_flight_bytes + MTU <= cc.window() && tokens >= MTU as f64)
        {
            tokens -= MTU as f64;
            cc.on_sent(now, MTU, in_flight_bytes);
            in_flight.insert(next_pn, (now, MTU));
            in_flight_bytes += MTU;
            if !down && queue_bytes + MTU <= spec.buffer {
                queue.push_back(next_pn);
                queue_bytes += MTU;
            }
            next_pn += 1;
            sent_now += 1;
        }
    }
    rtts.sort();
    rtts_all.sort();
    Outcome {
        utilisation: delivered as f64 / offered.max(1.0),
        queue_p95: rtts.get(rtts.len() * 95 / 100).copied().unwrap_or_default(),
        queue_p95_all: rtts_all.get(rtts_all.len() * 95 / 100).copied().unwrap_or_default(),
        queue: queue_log,
        per_second,
    }
}

/// Bytes delivered in the whole second after the first one, from `from`
/// on, in which anything was delivered again.
fn second_after_return(per_second: &[u64], from: usize) -> u64 {
    let back = (from..per_second.len()).find(|&i| per_second[i] > 0).expect("delivery resumes");
    per_second.get(back + 1).copied().unwrap_or(0)
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outcome")
            .field("utilisation", &self.utilisation)
            .field("queue_p95", &self.queue_p95)
            .field("queue_p95_all", &self.queue_p95_all)
            .field("per_second", &self.per_second)
            .finish()
    }
}

impl Outcome {
    /// The `q` quantile of the queueing delay of packets acknowledged in
    /// `[from, to)` seconds.
    fn queue_quantile(&self, from: f64, to: f64, q: f64) -> Duration {
        let mut v: Vec<Duration> = self.queue.iter().filter(|(t, _)| (from..to).contains(t)).map(|x| x.1).collect();
        v.sort();
        v.get(((v.len() as f64 * q) as usize).min(v.len().saturating_sub(1))).copied().unwrap_or_default()
    }
}

fn railway(now: Instant) -> Railway {
    Railway::new(RailwayConfig::default(), now)
}

fn run(spec: &LinkSpec, cc: &mut dyn Cc) -> Outcome {
    simulate(spec, cc, 7, &[])
}

fn newreno() -> NewReno {
    NewReno { window: 32 * MTU, ssthresh: u64::MAX, recovery_start: None, acked: 0 }
}

#[test]
fn radio_loss_does_not_throttle_it_and_the_queue_stays_short() {
    for (mbps, rtt, loss) in [(20.0, 50, 0.01), (50.0, 80, 0.02), (5.0, 120, 0.03)] {
        let spec = LinkSpec::steady(mbps, rtt, loss);
        let mut cc = railway(Instant::now());
        let r = run(&spec, &mut cc);
        assert!(r.utilisation >= 0.85, "{mbps} Mbit/s, {rtt} ms, {loss} loss: {r:?}");
        // About the target, with the overshoot after each drain round.
        let target = cc.config().target_queue_delay;
        assert!(r.queue_p95 <= target * 2, "{mbps} Mbit/s, {rtt} ms: {r:?}");
        assert!(r.queue_p95_all <= target * 2, "start-up: {mbps} Mbit/s, {rtt} ms: {r:?}");
        assert!(cc.stats().lossy_rounds_tolerated > 0);
        // The loss-based reference on the same link, for contrast.
        let reno = run(&spec, &mut newreno());
        assert!(reno.utilisation < 0.7 * r.utilisation, "newreno {reno:?} vs railway {r:?}");
    }
}

#[test]
fn an_outage_holds_the_model_and_the_rate_returns_at_once() {
    let mut spec = LinkSpec::steady(20.0, 60, 0.005);
    spec.outages = vec![(10.0, 12.5)];
    spec.seconds = 20.0;
    let mut cc = railway(Instant::now());
    let r = run(&spec, &mut cc);
    assert!(cc.stats().outages_held >= 1, "{:?}", cc.stats());
    assert_eq!(cc.stats().outages_congested, 0);
    // Once the first probe after the outage is answered (when depends on
    // the transport's backed-off probe timer, not on the controller), the
    // next second carries most of what the link offers; NewReno restarts
    // from two packets.
    let cap = 20e6 / 8.0;
    let after = second_after_return(&r.per_second, 12);
    assert!(after as f64 >= 0.9 * cap, "after the outage: {:?}", r.per_second);
    let reno = run(&spec, &mut newreno());
    let reno_after = second_after_return(&reno.per_second, 12);
    assert!((reno_after as f64) < 0.7 * after as f64, "newreno {:?}", reno.per_second);
}

#[test]
fn a_capacity_drop_is_followed_without_a_standing_queue() {
    let mut spec = LinkSpec::steady(40.0, 60, 0.0);
    spec.capacity = vec![(0.0, 40.0), (10.0, 8.0)];
    spec.seconds = 25.0;
    let mut cc = railway(Instant::now());
    let r = run(&spec, &mut cc);
    assert!(r.utilisation >= 0.85, "{r:?}");
    let rate = cc.rate().expect("a rate") * 8.0 / 1e6;
    assert!((5.0..=10.0).contains(&rate), "{rate} Mbit/s on an 8 Mbit/s link");
    // What was in flight at 40 Mbit/s queues at 8 (the window is two
    // pipes plus the target's bytes): it drains within a few seconds, and no
    // queue stands after that, nor does the RTT filter take one for delay.
    assert!(r.queue_quantile(10.0, 25.0, 1.0) <= Duration::from_millis(1500), "{r:?}");
    assert!(r.queue_quantile(14.0, 25.0, 0.95) <= Duration::from_millis(150), "{r:?}");
    assert!(cc.rtprop() <= Some(Duration::from_millis(70)), "{:?}", cc.rtprop());
    assert!(cc.stats().slowdowns >= 1, "{:?}", cc.stats());
}

#[test]
fn a_queue_before_the_silence_makes_it_congestion() {
    let t0 = Instant::now();
    let mut cc = railway(t0);
    let ms = Duration::from_millis;
    let mut now = t0;
    // A path at 50 ms that builds a 500 ms queue, then loses a whole period.
    for i in 0..400u64 {
        now += ms(5);
        cc.on_sent(now, MTU, 0);
        let rtt = if i < 200 { ms(50) } else { ms(550) };
        cc.on_ack(now + rtt, now, MTU);
    }
    cc.on_loss(now + ms(500), now, true, 50 * MTU);
    assert_eq!(cc.stats().outages_congested, 1);
    assert!(cc.window() <= cc.config().initial_window, "{}", cc.window());
}

#[test]
fn heavy_loss_is_congestion_and_backs_the_rate_off() {
    let spec = LinkSpec::steady(20.0, 50, 0.25);
    let mut cc = railway(Instant::now());
    let _ = run(&spec, &mut cc);
    assert!(cc.stats().loss_backoffs > 0, "{:?}", cc.stats());
}

#[test]
fn a_handover_hint_freezes_the_model_and_its_end_restores_the_window() {
    let mut spec = LinkSpec::steady(20.0, 60, 0.005);
    spec.outages = vec![(10.0, 11.0)];
    spec.seconds = 14.0;
    let hints = [(9.95, Hint::HandoverStart), (11.0, Hint::HandoverEnd)];
    let mut cc = railway(Instant::now());
    let r = simulate(&spec, &mut cc, 7, &hints);
    assert_eq!(cc.stats().handovers_held, 1);
    let cap = 20e6 / 8.0;
    let after = second_after_return(&r.per_second, 11);
    assert!(after as f64 >= 0.9 * cap, "after the handover: {:?}", r.per_second);
    // Driven directly: what the hint changes.
    let mut before = 0;
    let t0 = Instant::now();
    let mut c = railway(t0);
    let mut now = t0;
    for _ in 0..2000 {
        now += Duration::from_millis(2);
        c.on_sent(now, MTU, c.window());
        c.on_ack(now + Duration::from_millis(60), now, MTU);
        before = c.window();
    }
    c.on_hint(now, Hint::HandoverStart);
    assert_eq!(c.mode(), Mode::Held);
    c.on_loss(now + Duration::from_millis(900), now, true, 100 * MTU);
    assert_eq!(c.window(), before, "a loss inside a handover changes nothing");
    assert_eq!(c.stats().outages_held + c.stats().outages_congested, 0);
    c.on_hint(now + Duration::from_secs(1), Hint::HandoverEnd);
    assert_eq!(c.mode(), Mode::Probe);
    assert_eq!(c.window(), before);
    // A start without an end holds for max_hold at most.
    c.on_hint(now + Duration::from_secs(2), Hint::HandoverStart);
    c.on_ack(now + Duration::from_secs(30), now + Duration::from_secs(2), MTU);
    assert_ne!(c.mode(), Mode::Held);
}

#[test]
fn a_hint_released_with_packets_in_flight_keeps_the_rate_estimate() {
    // The end of a handover (or of an outage taken for one) restarts rate
    // sampling while the window is still in flight; the first
    // acknowledgements after it must not read as a burst far above the
    // carrier's rate.
    let mut spec = LinkSpec::steady(10.0, 100, 0.0);
    spec.seconds = 20.0;
    let hints: Vec<(f64, Hint)> =
        (0..6).flat_map(|k| [(8.0 + k as f64, Hint::HandoverStart), (8.3 + k as f64, Hint::HandoverEnd)]).collect();
    let mut cc = railway(Instant::now());
    let r = simulate(&spec, &mut cc, 7, &hints);
    let cap = 10e6 / 8.0;
    assert!(cc.bw().is_some_and(|b| b <= 1.5 * cap), "estimate {:?} over a {cap} B/s link", cc.bw());
    assert!(r.queue_quantile(8.0, 20.0, 0.95) <= Duration::from_millis(300), "{r:?}");
}

#[test]
fn the_base_rtt_moving_with_the_cell_neither_starves_nor_bloats_it() {
    let mut spec = LinkSpec::steady(20.0, 40, 0.01);
    let ms = Duration::from_millis;
    spec.owd_steps = vec![(8.0, ms(45)), (16.0, ms(15)), (24.0, ms(35))];
    let mut cc = railway(Instant::now());
    let r = run(&spec, &mut cc);
    assert!(r.utilisation >= 0.8, "{r:?}");
    assert!(r.queue_p95 <= ms(150), "{r:?}");
}

#[test]
fn a_path_that_carried_only_keep_alives_ramps_up_when_the_load_comes() {
    let mut spec = LinkSpec::steady(20.0, 60, 0.005);
    spec.busy_from = 20.0;
    spec.seconds = 30.0;
    let mut cc = railway(Instant::now());
    let r = run(&spec, &mut cc);
    let cap = 20e6 / 8.0;
    // Within 2 s of the load, most of the link; as a path fresh from its
    // handshake would.
    let busy: u64 = r.per_second[22..30].iter().sum();
    assert!(busy as f64 >= 0.85 * 8.0 * cap, "{:?}", r.per_second);
    assert!(r.per_second[21] as f64 >= 0.5 * cap, "{:?}", r.per_second);
}

#[test]
fn a_carrier_fading_out_does_not_fill_its_buffer() {
    // 22 Mbit/s down to about 1 Mbit/s over a minute, 10 % every 2 s: each
    // step too small for the slow-down rule, the 4 MB buffer 30 s deep at
    // the end.
    let mut spec = LinkSpec::steady(22.0, 80, 0.005);
    spec.capacity = (0..30).map(|k| (2.0 * k as f64, 22.0 * 0.9f64.powi(k))).collect();
    spec.seconds = 60.0;
    let mut cc = railway(Instant::now());
    let r = run(&spec, &mut cc);
    assert!(r.utilisation >= 0.8, "{r:?}");
    let worst = r.queue_quantile(0.0, 60.0, 0.99);
    assert!(worst <= Duration::from_millis(1500), "p99 queueing {worst:?}; {:?} rtprop {:?}", cc.stats(), cc.rtprop());
}
