//! What the simulator reports: per-train counters, the fleet's sums on a
//! Prometheus endpoint (under the relay's metric names where a relay has
//! the same counter, so the orchestrator reads one simulator as it reads
//! many relays), and a JSON summary at the end.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use polycorn_core::PathId;
use polycorn_net::metrics::{Source, Writer};
use serde::Serialize;

use crate::fleet::{Fleet, Train};
use crate::passengers;

/// One train's counters.
#[derive(Debug, Default, Serialize, Clone)]
pub struct TrainCounters {
    /// Subflows that came up (TLS handshake and HELLO done).
    pub handshakes: u64,
    /// Subflows that went down after being up (each then dialled again).
    pub reconnects: u64,
    /// Dials that failed or timed out.
    pub connects_failed: u64,
    /// Paths up now.
    pub paths_up: u64,
    /// Telemetry records the radio replay put in the spool.
    pub records_spooled: u64,
    /// ... that the proxy confirmed (Kafka has them).
    pub records_acked: u64,
    /// ... sent again (a timeout, or a path coming up).
    pub records_resent: u64,
    /// Records in the spool not yet confirmed, and of them those in flight.
    pub records_held: u64,
    pub records_in_flight: u64,
    /// How long the record in flight that has waited longest has awaited
    /// its confirmation since first sent (ms; 0: none in flight). The
    /// fleet's figure is the largest train's, not a sum.
    pub oldest_in_flight_ms: u64,
    /// Records the spool's size bound dropped unconfirmed.
    pub records_dropped: u64,
    pub spool_errors: u64,
    pub spool_bytes: u64,
    /// Bytes written to and read from the subflows (the current ones).
    pub subflow_sent_bytes: u64,
    pub subflow_received_bytes: u64,
    /// Passenger bytes into the tunnel and out of it (downloads).
    pub passenger_bytes_up: u64,
    pub passenger_bytes_down: u64,
    /// Connections the endpoint refused or saw reset, frames it could not parse.
    pub conns_refused: u64,
    pub conns_reset: u64,
    pub protocol_errors: u64,
    /// Events the session dropped because its queue to the shell was full.
    pub events_dropped: u64,
    /// Errors of this train: not started, failed dials, spool errors, broken
    /// passenger transfers.
    pub errors: u64,
}

impl TrainCounters {
    fn add(&mut self, o: &TrainCounters) {
        macro_rules! sum {
            ($($f:ident),*) => { $(self.$f += o.$f;)* };
        }
        sum!(
            handshakes,
            reconnects,
            connects_failed,
            paths_up,
            records_spooled,
            records_acked,
            records_resent,
            records_held,
            records_in_flight,
            records_dropped,
            spool_errors,
            spool_bytes,
            subflow_sent_bytes,
            subflow_received_bytes,
            passenger_bytes_up,
            passenger_bytes_down,
            conns_refused,
            conns_reset,
            protocol_errors,
            events_dropped,
            errors
        );
        self.oldest_in_flight_ms = self.oldest_in_flight_ms.max(o.oldest_in_flight_ms);
    }
}

/// A train's counters now, and its error messages.
pub fn counters(t: &Train, paths: usize) -> (TrainCounters, Vec<String>) {
    let mut c = TrainCounters::default();
    let (own_errors, messages) = t.errors();
    let p = &t.pax;
    c.passenger_bytes_up = p.bytes_up.load(Ordering::Relaxed);
    c.passenger_bytes_down = p.bulk_bytes.load(Ordering::Relaxed);
    let pax_failures = p.bulk_failed.load(Ordering::Relaxed) + p.chat_failed.load(Ordering::Relaxed);
    if let Some(r) = t.running.get() {
        let pc = &r.dial.counters;
        c.handshakes = pc.subflows_up.load(Ordering::Relaxed);
        c.reconnects = pc.subflows_down.load(Ordering::Relaxed);
        c.connects_failed = pc.connects_failed.load(Ordering::Relaxed);
        let s = r.spool.stats();
        c.records_spooled = s.next_seq.saturating_sub(r.seq0);
        c.records_acked = s.acked;
        c.records_resent = s.resent;
        c.records_held = s.records;
        c.records_in_flight = s.in_flight;
        c.oldest_in_flight_ms = r.spool.oldest_in_flight_since().map_or(0, |t| t.elapsed().as_millis() as u64);
        c.records_dropped = s.dropped.iter().sum();
        c.spool_errors = r.spool.errors();
        c.spool_bytes = s.bytes;
        r.session.peek(|st, _| {
            c.paths_up = st.ep.up_paths().len() as u64;
            for k in 0..paths {
                if let Some(ps) = st.ep.path_stats(PathId(k as u8)) {
                    c.subflow_sent_bytes += ps.sent_bytes;
                    c.subflow_received_bytes += ps.received_bytes;
                }
            }
            let es = st.ep.stats();
            c.conns_refused = es.conns_refused;
            c.conns_reset = es.conns_reset;
            c.protocol_errors = es.protocol_errors;
            c.events_dropped = st.events_dropped;
        });
    }
    c.errors = own_errors + c.connects_failed + c.spool_errors + pax_failures;
    (c, messages)
}

/// The fleet's sums.
pub fn totals(fleet: &Fleet) -> TrainCounters {
    let mut sum = TrainCounters::default();
    for t in &fleet.trains {
        sum.add(&counters(t, fleet.plan.paths).0);
    }
    sum
}

/// The metrics of `/metrics`: the fleet's sums, no per-train labels (a
/// thousand trains would make a page nobody scrapes every second).
pub fn metrics_source(fleet: Arc<Fleet>) -> Source {
    Arc::new(move |w: &mut Writer| {
        let s = totals(&fleet);
        let (started, connected_once) = fleet.started_and_connected();
        let all_up = fleet
            .trains
            .iter()
            .filter(|t| {
                t.running.get().is_some_and(|r| r.session.peek(|st, _| st.ep.up_paths().len()) >= fleet.plan.paths)
            })
            .count();
        let l = Vec::new;
        // The relay's names, summed over the trains.
        w.gauge(
            "polycorn_telemetry_spool_records",
            "Telemetry records spooled and not yet confirmed.",
            l(),
            s.records_held as f64,
        );
        w.gauge(
            "polycorn_telemetry_spool_in_flight",
            "Telemetry records sent and awaiting confirmation.",
            l(),
            s.records_in_flight as f64,
        );
        w.gauge(
            "polycorn_telemetry_spool_oldest_in_flight_seconds",
            "The longest any train's record in flight has awaited its confirmation since first sent (0: none in flight).",
            l(),
            s.oldest_in_flight_ms as f64 / 1000.0,
        );
        w.gauge("polycorn_telemetry_spool_bytes", "Telemetry spool segment bytes on disk.", l(), s.spool_bytes as f64);
        w.counter(
            "polycorn_telemetry_spool_acked",
            "Telemetry records the proxy confirmed (Kafka has them).",
            l(),
            s.records_acked as f64,
        );
        w.counter(
            "polycorn_telemetry_spool_resent",
            "Telemetry records sent again (timeout or a path coming up).",
            l(),
            s.records_resent as f64,
        );
        w.counter(
            "polycorn_telemetry_spool_errors",
            "Telemetry spool appends, reads and fsyncs that failed.",
            l(),
            s.spool_errors as f64,
        );
        w.counter(
            "polycorn_telemetry_spool_dropped",
            "Telemetry records dropped unconfirmed by the spool's size bound.",
            l(),
            s.records_dropped as f64,
        );
        w.counter(
            "polycorn_conns_refused",
            "Passenger connections refused because a cap was reached.",
            l(),
            s.conns_refused as f64,
        );
        w.counter("polycorn_conn_reset", "Passenger connections reset.", l(), s.conns_reset as f64);
        w.counter(
            "polycorn_session_events_dropped",
            "Events dropped because the queue to the shell was full.",
            l(),
            s.events_dropped as f64,
        );
        // The simulator's own.
        let trains = fleet.trains.len() as f64;
        w.gauge("polycorn_fleetsim_trains", "Trains in the plan.", l(), trains);
        w.gauge("polycorn_fleetsim_trains_started", "Trains started.", l(), started as f64);
        w.gauge(
            "polycorn_fleetsim_trains_connected_once",
            "Trains that have had every path up at once, at least once.",
            l(),
            connected_once as f64,
        );
        w.gauge("polycorn_fleetsim_trains_connected", "Trains with every path up now.", l(), all_up as f64);
        w.gauge("polycorn_fleetsim_paths_up", "Subflows up, over every train.", l(), s.paths_up as f64);
        w.counter(
            "polycorn_fleetsim_handshakes",
            "Subflows that came up (TLS handshake and HELLO done).",
            l(),
            s.handshakes as f64,
        );
        w.counter("polycorn_fleetsim_reconnects", "Subflows that went down after being up.", l(), s.reconnects as f64);
        w.counter(
            "polycorn_fleetsim_connects_failed",
            "Subflow dials that failed or timed out.",
            l(),
            s.connects_failed as f64,
        );
        w.counter(
            "polycorn_fleetsim_records_spooled",
            "Telemetry records the radio replays spooled.",
            l(),
            s.records_spooled as f64,
        );
        w.counter(
            "polycorn_fleetsim_subflow_sent_bytes",
            "Bytes written to the current subflows.",
            l(),
            s.subflow_sent_bytes as f64,
        );
        w.counter(
            "polycorn_fleetsim_subflow_received_bytes",
            "Bytes read from the current subflows.",
            l(),
            s.subflow_received_bytes as f64,
        );
        w.counter(
            "polycorn_fleetsim_passenger_up_bytes",
            "Passenger bytes into the tunnels.",
            l(),
            s.passenger_bytes_up as f64,
        );
        w.counter(
            "polycorn_fleetsim_passenger_down_bytes",
            "Download bytes out of the tunnels, checked.",
            l(),
            s.passenger_bytes_down as f64,
        );
        w.counter(
            "polycorn_fleetsim_errors",
            "Errors: trains not started, failed dials, spool errors, broken passenger transfers.",
            l(),
            s.errors as f64,
        );
        let (pax_state, pax_running) = match fleet.passengers.get() {
            None => (0.0, 0.0),
            Some(p) => (if p.stopped() { 2.0 } else { 1.0 }, p.running.load(Ordering::Relaxed) as f64),
        };
        w.gauge(
            "polycorn_fleetsim_passengers_state",
            "Passengers: 0 not started, 1 running, 2 time up.",
            l(),
            pax_state,
        );
        w.gauge(
            "polycorn_fleetsim_passenger_workers",
            "Passenger connections' workers still running.",
            l(),
            pax_running,
        );
    })
}

/// One train in the summary.
#[derive(Debug, Serialize)]
pub struct TrainSummary {
    pub id: String,
    pub started_unix_ms: i64,
    pub epoch_unix_ms: i64,
    pub connected: bool,
    #[serde(flatten)]
    pub counters: TrainCounters,
    pub error_messages: Vec<String>,
}

/// The JSON written at the end.
#[derive(Debug, Serialize)]
pub struct Summary {
    pub trains_planned: usize,
    pub trains_started: usize,
    pub trains_connected: usize,
    pub paths_per_train: usize,
    pub started_unix_ms: i64,
    pub seconds: f64,
    /// The process's CPU time (user + system), seconds, and its peak RSS
    /// (VmHWM), KiB.
    pub cpu_s: f64,
    pub max_rss_kib: u64,
    pub threads: usize,
    /// How late the runtime woke a 100 ms sleep, over the whole run.
    pub loop_lag_ms_p50: f64,
    pub loop_lag_ms_p99: f64,
    pub loop_lag_ms_max: f64,
    pub totals: TrainCounters,
    pub trains: Vec<TrainSummary>,
    /// `fleet_traffic passengers`' report; absent without passengers.
    pub passengers: Option<passengers::Report>,
}

/// The `q` quantile of `xs` (nearest rank, as the orchestrator's).
pub fn quantile(xs: &[f32], q: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut s = xs.to_vec();
    s.sort_by(f32::total_cmp);
    let i = ((q * (s.len() - 1) as f64).round() as usize).min(s.len() - 1);
    f64::from(s[i])
}

/// CPU seconds (user + system) and peak RSS (KiB) of this process. The
/// peak is /proc's VmHWM: getrusage's ru_maxrss keeps the high-water mark
/// of whatever ran before the exec (the orchestrator's Python).
pub fn self_usage() -> (f64, u64) {
    // SAFETY: getrusage writes the struct it is given and nothing else.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is always valid.
    let cpu = if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } == 0 {
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        tv(ru.ru_utime) + tv(ru.ru_stime)
    } else {
        0.0
    };
    let hwm = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .unwrap_or(0);
    (cpu, hwm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_rss_is_this_process_own() {
        let (cpu, hwm) = self_usage();
        assert!(cpu >= 0.0);
        assert!(hwm > 0 && hwm < 10 << 20, "{hwm} KiB");
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let xs: Vec<f32> = (0..=100).map(|x| x as f32).collect();
        assert_eq!((quantile(&xs, 0.5), quantile(&xs, 0.99), quantile(&[], 0.5)), (50.0, 99.0, 0.0));
    }

    #[test]
    fn totals_add_every_counter() {
        let one = TrainCounters { handshakes: 2, records_acked: 5, errors: 1, ..Default::default() };
        let mut sum = TrainCounters::default();
        sum.add(&one);
        sum.add(&one);
        assert_eq!((sum.handshakes, sum.records_acked, sum.errors), (4, 10, 2));
    }
}
