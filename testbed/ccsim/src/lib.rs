//! A subflow's congestion controller over one carrier of a generated trip,
//! in virtual time.
//!
//! The emulator's own sans-IO [`Link`]s carry the data (the carrier's
//! downlink trace, delay, loss and blackout schedule) and the
//! acknowledgements (its uplink), exactly as `polycorn-emu` does on the
//! testbed; a sender that behaves towards its controller as quinn does
//! (window-limited, paced, acknowledgements every second packet or after
//! 25 ms, losses by packet and time threshold, probe timeouts that back off,
//! persistent congestion) drives the controller. A trip of several minutes
//! replays in about a second, so a controller's parameters can be compared
//! on many trips, side by side, where the namespace testbed runs one trip
//! in real time and shares two cores with every copy of the topology.
//!
//! What it leaves out, so its numbers rank controllers rather than predict
//! the testbed's: the tunnel's own framing and scheduler, the receiving
//! passenger's TCP, quinn's exact packet sizes, and CPU.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::path::Path;
use std::time::{Duration, Instant};

use polycorn_core::cc::{Hint, Railway};
use polycorn_emu::{Admission, Blackout, Link, LinkConfig, LossKeying, Schedule, Service, Trace};

/// Bytes of one trace opportunity (the emulator's default).
pub const OPPORTUNITY_BYTES: u64 = 1500;

/// The controller's state in a few words, for a timeline.
fn describe(cc: &Railway) -> String {
    format!(
        "{:?} surge {:.2} bw {:.1} Mbit/s rtprop {} ms queue {} ms",
        cc.mode(),
        cc.surge(),
        cc.bw().unwrap_or(0.0) * 8e-6,
        cc.rtprop().map_or(0, |d| d.as_millis()),
        cc.queue_delay().map_or(0, |d| d.as_millis()),
    )
}

#[derive(Debug)]
pub struct LoadError(String);

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LoadError {}

/// One carrier of a trip written by `polycorn-tracegen generate`.
pub struct Carrier {
    down: Link,
    up: Link,
    down_trace: Trace,
    blackouts: Vec<Blackout>,
    /// (start, end) of each handover, from the trip's event log.
    pub handovers: Vec<(Duration, Duration)>,
}

fn read(path: &Path) -> Result<String, LoadError> {
    std::fs::read_to_string(path).map_err(|e| LoadError(format!("{}: {e}", path.display())))
}

impl Carrier {
    /// Carrier `i` of the trip in `dir`, with the testbed's droptail buffer
    /// and seeds (`polycorn-emu --seed 1`, as `testbed/topology.sh` starts it).
    pub fn load(dir: &Path, i: usize, buffer_bytes: usize) -> Result<Self, LoadError> {
        let trace = |name: String| -> Result<Trace, LoadError> {
            let p = dir.join(name);
            Trace::parse(&read(&p)?).map_err(|e| LoadError(format!("{}: {e}", p.display())))
        };
        let sched_path = dir.join(format!("c{i}.schedule"));
        let schedule =
            Schedule::parse(&read(&sched_path)?).map_err(|e| LoadError(format!("{}: {e}", sched_path.display())))?;
        let down_trace = trace(format!("c{i}.down"))?;
        let up_trace = trace(format!("c{i}.up"))?;
        let seed = 1 + i as u64;
        let config = |t: Trace, seed: u64| LinkConfig {
            service: Service::Trace(t),
            opportunity_bytes: OPPORTUNITY_BYTES as usize,
            buffer_bytes: Some(buffer_bytes),
            schedule: schedule.clone(),
            seed,
            loss_keying: LossKeying::Time,
            event_log: false,
        };
        let up = Link::new(config(up_trace, seed)).map_err(|e| LoadError(format!("carrier {i} up: {e}")))?;
        let down = Link::new(config(down_trace.clone(), seed ^ 0x9E37_79B9_7F4A_7C15))
            .map_err(|e| LoadError(format!("carrier {i} down: {e}")))?;
        let handovers = handovers(&read(&dir.join("events.jsonl"))?, i)?;
        Ok(Carrier { down, up, down_trace, blackouts: schedule.blackouts.clone(), handovers })
    }

    /// Downlink bytes the carrier could carry in `[from, to)`: its trace's
    /// opportunities outside blackouts (as the benchmark's capacity share
    /// counts them).
    pub fn capacity(&self, from: Duration, to: Duration) -> u64 {
        let ms = self.down_trace.millis();
        let period = self.down_trace.period_ms().max(1);
        let (from, to) = (from.as_millis() as u64, to.as_millis() as u64);
        let mut n = 0u64;
        // A line at the period's end is the next period's first instant.
        let mut base = (from / period).saturating_sub(1) * period;
        while base < to {
            for &m in ms {
                let t = base + m;
                if t >= from && t < to && !self.blackouts.iter().any(|b| b.contains(Duration::from_millis(t))) {
                    n += 1;
                }
            }
            base += period;
        }
        n * OPPORTUNITY_BYTES
    }
}

fn handovers(events: &str, carrier: usize) -> Result<Vec<(Duration, Duration)>, LoadError> {
    let mut open: Option<u64> = None;
    let mut out = Vec::new();
    for (n, line) in events.lines().enumerate() {
        if !line.contains("handover_") {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| LoadError(format!("events.jsonl line {}: {e}", n + 1)))?;
        if v["carrier"].as_u64() != Some(carrier as u64) {
            continue;
        }
        let t = v["t_ms"].as_u64().ok_or_else(|| LoadError(format!("events.jsonl line {}: no t_ms", n + 1)))?;
        match v["event"].as_str() {
            Some("handover_start") => open = Some(t),
            Some("handover_end") => {
                if let Some(s) = open.take() {
                    out.push((Duration::from_millis(s), Duration::from_millis(t)));
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// How the replay runs.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// The sender has data from here on (before: keep-alives only) ...
    pub busy_from: Duration,
    /// ... until here, where the replay ends.
    pub until: Duration,
    /// Payload of a full packet, what the controller counts.
    pub payload: u64,
    /// IP and UDP header bytes on the link.
    pub overhead: u64,
    /// Size of an acknowledgement on the uplink.
    pub ack_bytes: u64,
    /// Handover hints reach the controller this long after the radio event;
    /// None: no hints.
    pub hint_delay: Option<Duration>,
    pub keep_alive: Duration,
    /// Record a line per second of the busy time in [`Outcome::timeline`].
    pub timeline: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            busy_from: Duration::from_secs(45),
            until: Duration::from_secs(165),
            // quinn's MTU discovery settles at 1452 bytes of UDP payload on
            // the testbed's 1500-byte carriers.
            payload: 1452,
            overhead: 28,
            ack_bytes: 60,
            hint_delay: None,
            keep_alive: Duration::from_secs(1),
            timeline: false,
        }
    }
}

/// What a replay measured over `[busy_from, until)`.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Bytes the downlink delivered (IP bytes, retransmissions included).
    pub delivered: u64,
    /// What it could have carried (trace opportunities outside blackouts).
    pub capacity: u64,
    /// Payload acknowledged to the sender.
    pub acked: u64,
    /// Quantiles of the time packets spent in the carrier's queue.
    pub sojourn_p50: Duration,
    pub sojourn_p95: Duration,
    pub lost_packets: u64,
    pub probe_timeouts: u64,
    /// Per second: capacity and delivery (Mbit/s), the window, the pace
    /// and the controller's state.
    pub timeline: Vec<String>,
}

impl Outcome {
    pub fn share(&self) -> f64 {
        self.delivered as f64 / self.capacity.max(1) as f64
    }
}

const STEP: Duration = Duration::from_millis(1);
const MAX_ACK_DELAY: Duration = Duration::from_millis(25);
const INITIAL_RTT: Duration = Duration::from_millis(333);
/// quinn's pacer: bursts of 2 ms of the window's rate, 10 to 256 packets.
const QUINN_BURST_INTERVAL: f64 = 0.002;
/// The relay's pacer (`Pacer` in the QUIC shell): 10 ms at the rate, at
/// least 16 KiB.
const SHELL_BURST_S: f64 = 0.01;
const SHELL_MIN_BURST: f64 = 16.0 * 1024.0;
/// ... and hands quinn 16 KiB at a time, which quinn then sends under its
/// own window and pacer.
const SHELL_MIN_WRITE: f64 = 16.0 * 1024.0;
/// Acknowledged-but-unconfirmed packet numbers an ACK carries at most.
const MAX_ACK_RANGE: usize = 8192;

fn quantile(v: &mut [Duration], q: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort_unstable();
    v[((v.len() as f64 * q) as usize).min(v.len() - 1)]
}

struct InFlight {
    sent: Instant,
    bytes: u64,
}

/// Replays `carrier` with `cc` as the downlink sender's controller.
pub fn run(carrier: &mut Carrier, cc: &mut Railway, cfg: &SimConfig) -> Outcome {
    let t0 = Instant::now();
    let mut out = Outcome { capacity: carrier.capacity(cfg.busy_from, cfg.until), ..Outcome::default() };
    let mut hints: Vec<(Duration, Hint)> = match cfg.hint_delay {
        Some(d) => carrier
            .handovers
            .iter()
            .flat_map(|&(s, e)| [(s + d, Hint::HandoverStart), (e + d, Hint::HandoverEnd)])
            .collect(),
        None => Vec::new(),
    };
    hints.sort_by_key(|h| h.0);
    let mut next_hint = 0;

    // Sender.
    let mut in_flight: BTreeMap<u64, InFlight> = BTreeMap::new();
    let mut in_flight_bytes = 0u64;
    let mut next_pn = 0u64;
    let mut largest_acked: Option<u64> = None;
    let mut srtt: Option<Duration> = None;
    let mut rttvar = Duration::ZERO;
    let mut latest_rtt = Duration::ZERO;
    let mut last_eliciting = t0;
    let mut pto_count = 0u32;
    let mut quinn_tokens = 0.0f64;
    let mut shell_tokens = SHELL_MIN_BURST;
    // Bytes the shell has handed quinn and quinn has not sent yet.
    let mut released = 0.0f64;
    let mut last_keep_alive: Option<Duration> = None;
    // Receiver: packet numbers received and not yet known to be
    // acknowledged, and when the first unacknowledged one arrived.
    let mut unconfirmed: BTreeSet<u64> = BTreeSet::new();
    let mut unacked = 0u32;
    let mut first_unacked: Option<Duration> = None;
    let mut acks: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut next_ack_id = 0u64;
    let mut sojourns: Vec<Duration> = Vec::new();

    let mut t = Duration::ZERO;
    let mut second_delivered = 0u64;
    let mut second_max_sojourn = Duration::ZERO;
    while t < cfg.until {
        t += STEP;
        if cfg.timeline && t >= cfg.busy_from && t.subsec_millis() == 0 {
            let s = t - Duration::from_secs(1);
            out.timeline.push(format!(
                "{:>5} cap {:5.1} got {:5.1} | win {:7} KB pace {:5.1} | inflight {:6} KB qmax {:5} ms | {}",
                s.as_secs(),
                carrier.capacity(s, t) as f64 * 8e-6,
                second_delivered as f64 * 8e-6,
                cc.window() / 1000,
                cc.pacing_rate().unwrap_or(0.0) * 8e-6,
                in_flight_bytes / 1000,
                second_max_sojourn.as_millis(),
                describe(cc)
            ));
            second_delivered = 0;
            second_max_sojourn = Duration::ZERO;
        }
        let now = t0 + t;
        let in_window = t >= cfg.busy_from;
        while next_hint < hints.len() && hints[next_hint].0 <= t {
            cc.on_hint(now, hints[next_hint].1);
            next_hint += 1;
        }

        // The downlink delivers to the receiver.
        while let Some(p) = carrier.down.poll_deliver(t) {
            if in_window && p.dequeued >= cfg.busy_from {
                out.delivered += p.data.len() as u64;
                sojourns.push(p.dequeued.saturating_sub(p.arrival));
                second_delivered += p.data.len() as u64;
                second_max_sojourn = second_max_sojourn.max(p.dequeued.saturating_sub(p.arrival));
            }
            let pn = u64::from_le_bytes(p.data[..8].try_into().expect("8 bytes"));
            unconfirmed.insert(pn);
            unacked += 1;
            first_unacked.get_or_insert(t);
        }
        if unacked >= 2 || first_unacked.is_some_and(|f| t.saturating_sub(f) >= MAX_ACK_DELAY) {
            while unconfirmed.len() > MAX_ACK_RANGE {
                unconfirmed.pop_first();
            }
            let id = next_ack_id;
            next_ack_id += 1;
            let mut data = vec![0u8; cfg.ack_bytes as usize];
            data[..8].copy_from_slice(&id.to_le_bytes());
            if carrier.up.push(t, data) == Admission::Queued {
                acks.insert(id, unconfirmed.iter().copied().collect());
            }
            unacked = 0;
            first_unacked = None;
        }

        // The uplink delivers acknowledgements to the sender.
        let mut acked_any = false;
        while let Some(p) = carrier.up.poll_deliver(t) {
            let id = u64::from_le_bytes(p.data[..8].try_into().expect("8 bytes"));
            let Some(pns) = acks.remove(&id) else { continue };
            let mut newest: Option<(u64, Instant)> = None;
            for pn in pns {
                unconfirmed.remove(&pn);
                let Some(f) = in_flight.remove(&pn) else { continue };
                in_flight_bytes -= f.bytes;
                if in_window {
                    out.acked += f.bytes;
                }
                cc.on_ack(now, f.sent, f.bytes);
                if newest.is_none_or(|(n, _)| pn > n) {
                    newest = Some((pn, f.sent));
                }
            }
            if let Some((pn, sent)) = newest {
                acked_any = true;
                if largest_acked.is_none_or(|l| pn > l) {
                    largest_acked = Some(pn);
                    latest_rtt = now - sent;
                    match srtt {
                        None => {
                            srtt = Some(latest_rtt);
                            rttvar = latest_rtt / 2;
                        }
                        Some(s) => {
                            let diff = s.abs_diff(latest_rtt);
                            rttvar = (rttvar * 3 + diff) / 4;
                            srtt = Some((s * 7 + latest_rtt) / 8);
                        }
                    }
                }
            }
        }
        if acked_any {
            pto_count = 0;
        }
        let srtt_now = srtt.unwrap_or(INITIAL_RTT);
        let pto_base = srtt_now + (rttvar * 4).max(Duration::from_millis(1)) + MAX_ACK_DELAY;

        // Loss detection (RFC 9002): packet threshold 3, time threshold 9/8.
        if let Some(largest) = largest_acked {
            let loss_delay = srtt_now.max(latest_rtt) * 9 / 8;
            let mut lost_bytes = 0u64;
            let mut first: Option<Instant> = None;
            let mut last: Option<Instant> = None;
            while let Some((&pn, f)) = in_flight.first_key_value() {
                if pn >= largest || (pn + 3 > largest && now.saturating_duration_since(f.sent) < loss_delay) {
                    break;
                }
                let f = in_flight.remove(&pn).expect("first");
                in_flight_bytes -= f.bytes;
                lost_bytes += f.bytes;
                out.lost_packets += 1;
                first.get_or_insert(f.sent);
                last = Some(f.sent);
            }
            if let (Some(first), Some(last)) = (first, last) {
                let persistent = srtt.is_some() && last - first > pto_base * 3;
                cc.on_loss(now, last, persistent, lost_bytes);
            }
        }

        // Probe timeout.
        let pto = pto_base * 2u32.pow(pto_count.min(10));
        let probe = !in_flight.is_empty() && now.saturating_duration_since(last_eliciting) > pto;
        if probe {
            pto_count += 1;
            out.probe_timeouts += 1;
        }

        // The sender.
        let window = cc.window();
        let quinn_rate = 1.25 * window as f64 / srtt_now.as_secs_f64();
        let quinn_cap = (window as f64 * QUINN_BURST_INTERVAL / srtt_now.as_secs_f64())
            .clamp(10.0 * cfg.payload as f64, 256.0 * cfg.payload as f64);
        quinn_tokens = (quinn_tokens + quinn_rate * STEP.as_secs_f64()).min(quinn_cap);
        let shell_rate = cc.pacing_rate();
        if let Some(r) = shell_rate {
            shell_tokens = (shell_tokens + r * STEP.as_secs_f64()).min((r * SHELL_BURST_S).max(SHELL_MIN_BURST));
            if shell_tokens >= SHELL_MIN_WRITE && released < cfg.payload as f64 {
                released += shell_tokens;
                shell_tokens = 0.0;
            }
        }
        let busy = in_window;
        let keep_alive = !busy && last_keep_alive.is_none_or(|k| t.saturating_sub(k) >= cfg.keep_alive);
        let mut sent_now = 0;
        loop {
            let paced = quinn_tokens >= cfg.payload as f64 && shell_rate.is_none_or(|_| released >= cfg.payload as f64);
            let may = (probe && sent_now < 2)
                || (keep_alive && sent_now < 1)
                || (busy && in_flight_bytes + cfg.payload <= window && paced);
            if !may {
                break;
            }
            let bytes = if busy || probe { cfg.payload } else { 40 };
            if busy && !probe {
                quinn_tokens -= bytes as f64;
                if shell_rate.is_some() {
                    released -= bytes as f64;
                }
            }
            cc.on_sent(now, bytes, in_flight_bytes);
            in_flight.insert(next_pn, InFlight { sent: now, bytes });
            in_flight_bytes += bytes;
            last_eliciting = now;
            let mut data = vec![0u8; (bytes + cfg.overhead) as usize];
            data[..8].copy_from_slice(&next_pn.to_le_bytes());
            carrier.down.push(t, data);
            next_pn += 1;
            sent_now += 1;
            if keep_alive && !busy {
                last_keep_alive = Some(t);
            }
        }
    }
    out.sojourn_p50 = quantile(&mut sojourns, 0.5);
    out.sojourn_p95 = quantile(&mut sojourns, 0.95);
    out
}

#[cfg(test)]
mod tests;
