//! Prometheus metrics and health endpoints.
//!
//! The core keeps plain counters; on every scrape a [`Source`] closure
//! snapshots them into a [`Writer`], and [`SnapshotCollector`] encodes the
//! snapshot with prometheus-client. Names follow
//! `polycorn_<subsystem>_<name>_<unit>[_total]`; labels are bounded (one
//! per configured path, never per flow or per passenger).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use polycorn_core::endpoint::EndpointStats;
use polycorn_core::{
    BudgetStats, Endpoint, FlowStats, MemoryBudget, PathId, PathStats, PathView, Pressure, HOL_STALL_LONG,
    HOL_STALL_VERY_LONG, MAX_PATHS,
};
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

/// A metric family declared as data: its name (a counter's without the
/// `_total` the encoder adds), its help, its type, and how to read its value
/// from a `T` (a snapshot taken once per scrape). Tables of them
/// ([`Writer::table`]) are how the families are declared: each name and help
/// once, beside what it reads.
pub struct Metric<T> {
    pub name: &'static str,
    pub help: &'static str,
    pub counter: bool,
    pub value: fn(&T) -> f64,
}

/// A monotonic counter.
pub const fn counter<T>(name: &'static str, help: &'static str, value: fn(&T) -> f64) -> Metric<T> {
    Metric { name, help, counter: true, value }
}

/// A gauge.
pub const fn gauge<T>(name: &'static str, help: &'static str, value: fn(&T) -> f64) -> Metric<T> {
    Metric { name, help, counter: false, value }
}

#[derive(Debug, Default)]
struct Family {
    help: &'static str,
    counter: bool,
    samples: Vec<(Labels, f64)>,
}

/// Collects one scrape's samples.
#[derive(Debug, Default)]
pub struct Writer {
    families: BTreeMap<&'static str, Family>,
}

impl Writer {
    fn push(&mut self, name: &'static str, help: &'static str, counter: bool, labels: Labels, v: f64) {
        let f = self.families.entry(name).or_insert_with(|| Family { help, counter, samples: Vec::new() });
        f.samples.push((labels, v));
    }
    /// A monotonic counter; `name` without the `_total` suffix (the encoder adds it).
    pub fn counter(&mut self, name: &'static str, help: &'static str, labels: Labels, v: f64) {
        self.push(name, help, true, labels, v);
    }
    pub fn gauge(&mut self, name: &'static str, help: &'static str, labels: Labels, v: f64) {
        self.push(name, help, false, labels, v);
    }
    /// One sample of `m`, read from `from`.
    pub fn metric<T>(&mut self, m: &Metric<T>, labels: Labels, from: &T) {
        self.push(m.name, m.help, m.counter, labels, (m.value)(from));
    }
    /// One sample of each metric of `table`, all with `labels`, read from `from`.
    pub fn table<T>(&mut self, table: &[Metric<T>], labels: impl Fn() -> Labels, from: &T) {
        for m in table {
            self.metric(m, labels(), from);
        }
    }
}

/// Fills a [`Writer`] on each scrape.
pub type Source = Arc<dyn Fn(&mut Writer) + Send + Sync>;

/// Encodes the snapshot a [`Source`] produces.
pub struct SnapshotCollector {
    sources: Vec<Source>,
}

impl std::fmt::Debug for SnapshotCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotCollector").field("sources", &self.sources.len()).finish()
    }
}

impl prometheus_client::collector::Collector for SnapshotCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut w = Writer::default();
        for s in &self.sources {
            s(&mut w);
        }
        for (name, fam) in &w.families {
            let ty = if fam.counter { MetricType::Counter } else { MetricType::Gauge };
            let mut d = encoder.encode_descriptor(name, fam.help, None, ty)?;
            for (labels, v) in &fam.samples {
                let m = d.encode_family(labels)?;
                if fam.counter {
                    ConstCounter::new(*v).encode(m)?;
                } else {
                    ConstGauge::new(*v).encode(m)?;
                }
            }
        }
        Ok(())
    }
}

/// A `bool` as a gauge's 0 or 1.
fn one_if(b: bool) -> f64 {
    f64::from(u8::from(b))
}

const SESSION: &[Metric<crate::session::State>] = &[counter(
    "polycorn_session_events_dropped",
    "Events (new connections, telemetry records) dropped because the queue to the shell was full: connections are reset, records resent by the relay.",
    |st| st.events_dropped as f64,
)];

/// Write a session's statistics: its endpoint's ([`write_endpoint`]) and the
/// shell's event queue's.
pub fn write_session(
    w: &mut Writer,
    st: &crate::session::State,
    path_names: &[(PathId, String)],
    now: std::time::Instant,
) {
    write_endpoint(w, &st.ep, path_names, now);
    w.table(SESSION, Labels::new, st);
}

/// What one scrape reads of an endpoint, once.
struct EndpointScrape {
    conns: usize,
    users: usize,
    buffered: u64,
    s: EndpointStats,
    f: FlowStats,
    rtt_max: Duration,
}

/// The endpoint's families without labels: connections, scheduling, the
/// wire, and flow control (the connections' windows and buffers, and the
/// round trip autotuning measures over: docs/architecture.md, "Flow control
/// and memory").
const ENDPOINT: &[Metric<EndpointScrape>] = &[
    gauge("polycorn_conn_active", "Passenger connections open.", |e| e.conns as f64),
    gauge("polycorn_sched_users_active", "Passengers with data waiting to be scheduled.", |e| e.users as f64),
    gauge("polycorn_conn_buffered_bytes", "Bytes held in connection send and receive buffers.", |e| e.buffered as f64),
    counter("polycorn_conn_opened", "Passenger connections opened.", |e| e.s.conns_opened as f64),
    counter("polycorn_conn_closed", "Passenger connections closed cleanly.", |e| e.s.conns_closed as f64),
    counter("polycorn_conn_reset", "Passenger connections reset.", |e| e.s.conns_reset as f64),
    counter("polycorn_sched_decisions", "Scheduling decisions made.", |e| e.s.decisions as f64),
    counter("polycorn_sched_reinjected_bytes", "Passenger bytes sent again as reinjections.", |e| {
        e.s.reinjected_bytes as f64
    }),
    counter(
        "polycorn_sched_tail_reinjections",
        "Segments of a flow's tail sent again from a slower path (tail-reinject).",
        |e| e.s.tail_reinjections as f64,
    ),
    counter(
        "polycorn_sched_head_reinjections",
        "Window heads sent again for head-of-line recovery (opp-reinject).",
        |e| e.s.head_reinjections as f64,
    ),
    counter("polycorn_conn_hol_stall_seconds", "Summed length of the head-of-line stalls that ended.", |e| {
        e.s.hol_stall_us as f64 / 1e6
    }),
    counter("polycorn_sched_redundant_bytes", "Passenger bytes sent as redundant copies.", |e| {
        e.s.redundant_bytes as f64
    }),
    counter("polycorn_recv_duplicate_bytes", "Received passenger bytes dropped as duplicates.", |e| {
        e.s.duplicate_bytes_received as f64
    }),
    counter("polycorn_wire_protocol_errors", "Subflows closed for breaking the protocol.", |e| {
        e.s.protocol_errors as f64
    }),
    counter(
        "polycorn_conns_refused",
        "Passenger connections refused because a connection cap was reached (per passenger on the relay, per train on the proxy).",
        |e| e.s.conns_refused as f64,
    ),
    counter(
        "polycorn_wire_input_pauses",
        "Times a subflow was not read until its queue of control frames (answers to the peer) drained: a peer asking faster than it reads.",
        |e| e.s.input_pauses as f64,
    ),
    counter(
        "polycorn_wire_ctrl_overflows",
        "Subflows declared dead because their peer read none of a full queue of control frames.",
        |e| e.s.ctrl_overflows as f64,
    ),
    counter("polycorn_telemetry_received_records", "Telemetry records received.", |e| {
        e.s.telemetry_received as f64
    }),
    gauge("polycorn_conn_window_bytes", "Sum of the connections' receive windows.", |e| e.f.window_sum_bytes as f64),
    gauge("polycorn_conn_window_max_bytes", "Largest receive window of a connection.", |e| {
        e.f.window_max_bytes as f64
    }),
    gauge("polycorn_conn_out_of_order_bytes", "Received bytes held above a gap in reassembly buffers.", |e| {
        e.f.out_of_order_bytes as f64
    }),
    gauge("polycorn_conn_unsent_bytes", "Bytes written by passengers and not yet placed on a path.", |e| {
        e.f.unsent_bytes as f64
    }),
    gauge("polycorn_conn_in_flight_bytes", "Bytes placed on paths and not yet acknowledged by the peer.", |e| {
        e.f.in_flight_bytes as f64
    }),
    counter(
        "polycorn_conn_window_limited_seconds",
        "Time new data waited only for the peer's receive window, summed over connections.",
        |e| e.f.window_limited_us as f64 / 1e6,
    ),
    counter(
        "polycorn_conn_send_limited_seconds",
        "Time passengers' writes waited for send room (the not-sent low-water mark, the connection cap or the memory budget), summed over connections.",
        |e| e.f.send_limited_us as f64 / 1e6,
    ),
    counter("polycorn_conn_window_growths", "Receive windows grown by autotuning.", |e| e.s.window_growths as f64),
    counter("polycorn_conn_window_growth_bytes", "Bytes receive windows grew by through autotuning.", |e| {
        e.s.window_growth_bytes as f64
    }),
    gauge(
        "polycorn_path_rtt_max_seconds",
        "Largest smoothed RTT of the live paths (the round trip window autotuning measures over).",
        |e| e.rtt_max.as_secs_f64(),
    ),
];

/// By schedulerlet and event ([`polycorn_core::Pipeline::counters`]).
const SCHEDULERLET_EVENTS: Metric<u64> = counter(
    "polycorn_sched_schedulerlet_events",
    "Schedulerlet events: hof-reject rejections (and those released by max_hold, and the milliseconds paths were held: held_ms), tail-reject deselections, idle-inject bursts.",
    |v| *v as f64,
);

/// By least length (`at_least`).
const HOL_STALLS: Metric<u64> = counter(
    "polycorn_conn_hol_stalls",
    "Head-of-line stalls that ended: periods in which received bytes waited above a gap while the in-order point stood still, by least length.",
    |v| *v as f64,
);

/// Labelled by path (id and name); written for every configured path.
const PATH_UP: Metric<bool> = gauge("polycorn_path_up", "1 when the subflow is established.", |up| one_if(*up));

/// Labelled by path; written for the paths that are up.
const PATH: &[Metric<(PathView, PathStats)>] = &[
    gauge("polycorn_path_srtt_seconds", "Smoothed RTT measured at the data level.", |(v, _)| v.srtt_us as f64 / 1e6),
    gauge("polycorn_path_rttvar_seconds", "RTT variation.", |(v, _)| v.rttvar_us as f64 / 1e6),
    gauge("polycorn_path_in_flight_bytes", "Bytes sent and not yet acknowledged.", |(v, _)| v.in_flight_bytes as f64),
    gauge("polycorn_path_cwnd_bytes", "Window the scheduler allows in flight.", |(v, _)| v.cwnd_bytes as f64),
    gauge("polycorn_path_queued_bytes", "Send-buffer occupancy.", |(v, _)| v.queued_bytes as f64),
    gauge("polycorn_path_delivery_rate_bytes_per_second", "Delivery-rate estimate.", |(v, _)| {
        v.delivery_rate_bps as f64
    }),
    gauge("polycorn_path_consecutive_rtos", "RTOs of the oldest unacknowledged data.", |(v, _)| f64::from(v.rto_count)),
    counter("polycorn_path_sent_bytes", "Bytes written to the subflow.", |(_, st)| st.sent_bytes as f64),
    counter("polycorn_path_received_bytes", "Bytes read from the subflow.", |(_, st)| st.received_bytes as f64),
    counter("polycorn_path_data_bytes", "Passenger bytes sent on the path.", |(_, st)| st.data_bytes_sent as f64),
    counter("polycorn_path_reinjected_bytes", "Reinjected passenger bytes sent on the path.", |(_, st)| {
        st.reinjected_bytes as f64
    }),
    counter("polycorn_path_redundant_bytes", "Redundant passenger bytes sent on the path.", |(_, st)| {
        st.redundant_bytes as f64
    }),
    counter("polycorn_path_rto", "Retransmission timeouts.", |(_, st)| st.rto_events as f64),
    counter(
        "polycorn_path_stale_transitions",
        "Times the path became stale: data outstanding and no acknowledgement progress, or no service.",
        |(_, st)| st.stale_transitions as f64,
    ),
    counter(
        "polycorn_path_penalisations",
        "Times the path's window was halved for holding a connection's window head (penalise).",
        |(_, st)| st.penalisations as f64,
    ),
    counter("polycorn_path_state_changes", "Subflow up/down transitions.", |(_, st)| st.state_changes as f64),
];

/// Write the endpoint's statistics. `path_names` labels each path.
pub fn write_endpoint(w: &mut Writer, ep: &Endpoint, path_names: &[(PathId, String)], now: std::time::Instant) {
    let s = ep.stats().clone();
    let scrape = EndpointScrape {
        conns: ep.conn_count(),
        users: ep.active_users(),
        buffered: ep.buffered_bytes(),
        f: ep.flow_stats(),
        rtt_max: ep.rtt_max(),
        s,
    };
    w.table(ENDPOINT, Labels::new, &scrape);
    for (schedulerlet, event, v) in ep.pipeline().counters() {
        let labels = vec![("schedulerlet".into(), schedulerlet.into()), ("event".into(), event.into())];
        w.metric(&SCHEDULERLET_EVENTS, labels, &v);
    }
    let s = &scrape.s;
    for (at_least, v) in [
        (Duration::ZERO, s.hol_stalls),
        (HOL_STALL_LONG, s.hol_stalls_long),
        (HOL_STALL_VERY_LONG, s.hol_stalls_very_long),
    ] {
        w.metric(&HOL_STALLS, vec![("at_least".into(), format!("{}s", at_least.as_secs_f64()))], &v);
    }
    // A proxy's budget is shared by its sessions: its gauges are the whole
    // account, not this endpoint's share of it.
    write_budget(w, ep.budget());
    for (id, name) in path_names {
        let l = || vec![("path".to_string(), id.0.to_string()), ("name".to_string(), name.clone())];
        w.metric(&PATH_UP, l(), &ep.is_path_up(*id));
        let (Some(v), Some(st)) = (ep.path_view(*id, now), ep.path_stats(*id)) else { continue };
        w.table(PATH, l, &(v, st.clone()));
    }
}

/// The memory budget's figures and its pressure level, read once.
const BUDGET: &[Metric<(BudgetStats, Pressure)>] = &[
    gauge(
        "polycorn_mem_budget_used_bytes",
        "Memory budget in use: connections' send buffers plus receive windows (held or promised).",
        |(b, _)| b.used as f64,
    ),
    gauge("polycorn_mem_budget_peak_bytes", "Most of the memory budget ever in use at once.", |(b, _)| b.peak as f64),
    gauge(
        "polycorn_mem_budget_pressure",
        "Where the memory budget stands: 0 below low, 1 below pressure, 2 below high, 3 at or above high.",
        |(_, p)| f64::from(p.level()),
    ),
    counter(
        "polycorn_mem_budget_grants_denied",
        "Window growths and writes refused or cut for lack of memory budget.",
        |(b, _)| b.grants_denied as f64,
    ),
    counter(
        "polycorn_mem_budget_reclaimed_bytes",
        "Receive-window bytes taken back under memory pressure.",
        |(b, _)| b.reclaimed_bytes as f64,
    ),
];

/// By level (`low`, `pressure`, `high`).
const BUDGET_LEVELS: Metric<u64> = gauge(
    "polycorn_mem_budget_bytes",
    "Levels of the memory budget: windows grow freely below low, to a fair share below pressure, shrink above; high is --mem-budget.",
    |v| *v as f64,
);

/// The memory budget's account and levels. The proxy writes them with no
/// session too (its sessions share the budget it configured), so the
/// budget alert and panels have data on an idle proxy.
pub fn write_budget(w: &mut Writer, budget: &MemoryBudget) {
    w.table(BUDGET, Labels::new, &(budget.stats(), budget.pressure()));
    let levels = budget.levels();
    for (level, v) in [("low", levels.low), ("pressure", levels.pressure), ("high", levels.high)] {
        w.metric(&BUDGET_LEVELS, vec![("level".into(), level.into())], &v);
    }
}

/// What `/readyz` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    /// 200 when set, 503 otherwise.
    pub ready: bool,
    pub body: String,
}

impl From<bool> for Readiness {
    /// Where there are no paths to list (kernel-mptcp-conn).
    fn from(ready: bool) -> Self {
        Readiness { ready, body: if ready { "ready\n" } else { "no path up\n" }.into() }
    }
}

/// Readiness as the shell sees it.
pub type Ready = Arc<dyn Fn() -> Readiness + Send + Sync>;

/// What carries each path now, by path index: 0 none, [`ON_TLS`] or
/// [`ON_QUIC`].
pub type PathTransports = Arc<[std::sync::atomic::AtomicU8; MAX_PATHS]>;
/// A TLS subflow (over TCP, or over MPTCP with `--transport kernel-mptcp`).
pub const ON_TLS: u8 = 1;
pub const ON_QUIC: u8 = 2;

/// Ready when at least one of `paths` is in `up`. The body lists every
/// path and, for those up, the transport carrying it (`transports`); a path
/// on TLS where `configured` is QUIC is named a fallback: the path works,
/// so the status stays 200, but UDP does not get through on that carrier
/// and its rate is the kernel's TCP's, not the railway controller's, which
/// the status alone would hide.
pub fn path_readiness(
    paths: &[(PathId, String)],
    up: &[PathId],
    transports: &[std::sync::atomic::AtomicU8],
    configured: crate::subflow::Transport,
) -> Readiness {
    use std::fmt::Write;
    let n_up = paths.iter().filter(|(p, _)| up.contains(p)).count();
    if n_up == 0 {
        return false.into();
    }
    let mut body = format!("ready: {n_up}/{} paths up", paths.len());
    // The proxy learns its paths in the order their subflows arrive.
    let mut paths: Vec<_> = paths.iter().collect();
    paths.sort_by_key(|(p, _)| p.0);
    for (p, name) in paths {
        let state = if !up.contains(p) {
            "down"
        } else {
            match transports.get(p.index()).map(|t| t.load(std::sync::atomic::Ordering::Relaxed)) {
                Some(ON_QUIC) => "on quic",
                Some(ON_TLS) if configured == crate::subflow::Transport::Quic => "on tls (quic fallback)",
                Some(ON_TLS) if configured == crate::subflow::Transport::KernelMptcp => "on kernel-mptcp",
                Some(ON_TLS) => "on tls",
                _ => "up",
            }
        };
        let _ = write!(body, "; path {} ({name}) {state}", p.0);
    }
    body.push('\n');
    Readiness { ready: true, body }
}

const PANICS: &[Metric<u64>] = &[counter(
    "polycorn_panics",
    "Tasks that panicked (the process then shuts down for its supervisor to restart it).",
    |n| *n as f64,
)];

/// Serve `/metrics`, `/healthz` (liveness: 503 once a task panicked) and
/// `/readyz` (at least one path up; the body says which, and on what) on
/// `addr` until `shutdown` resolves.
pub async fn serve(
    addr: SocketAddr,
    sources: Vec<Source>,
    ready: Ready,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let mut sources = sources;
    sources.push(Arc::new(|w: &mut Writer| w.table(PANICS, Labels::new, &crate::panics::count())));
    let mut reg = Registry::default();
    reg.register_collector(Box::new(SnapshotCollector { sources }));
    let reg = Arc::new(reg);
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let reg = reg.clone();
                async move {
                    let mut body = String::new();
                    match prometheus_client::encoding::text::encode(&mut body, &reg) {
                        Ok(()) => (
                            StatusCode::OK,
                            [("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")],
                            body,
                        ),
                        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, [("content-type", "text/plain")], String::new()),
                    }
                }
            }),
        )
        .route(
            "/healthz",
            get(|| async {
                if crate::panics::count() > 0 {
                    (StatusCode::SERVICE_UNAVAILABLE, "a task panicked: shutting down\n")
                } else {
                    (StatusCode::OK, "ok\n")
                }
            }),
        )
        .route(
            "/readyz",
            get(move || {
                let ready = ready.clone();
                async move {
                    let r = ready();
                    (if r.ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }, r.body)
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("binding metrics endpoint {addr}: {e}")))?;
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}

/// Labelled by path and transport.
const SUBFLOW_TRANSPORT: Metric<bool> = gauge(
    "polycorn_subflow_transport",
    "1 for the transport carrying the path now (quic, or tls after a fallback); 0 for the others.",
    |on| one_if(*on),
);

const QUIC_CC: &[Metric<crate::quic::CcStats>] = &[
    counter(
        "polycorn_quic_cc_outages_held",
        "Losses of a whole period the railway controller took for an interruption (model kept).",
        |c| c.outages_held.load(Relaxed) as f64,
    ),
    counter(
        "polycorn_quic_cc_outages_congested",
        "Losses of a whole period the railway controller took for congestion (model reset).",
        |c| c.outages_congested.load(Relaxed) as f64,
    ),
    counter("polycorn_quic_cc_loss_backoffs", "Rounds whose loss exceeded the railway controller's tolerance.", |c| {
        c.loss_backoffs.load(Relaxed) as f64
    }),
    counter("polycorn_quic_cc_handovers_held", "Handover hints that held a railway controller's model.", |c| {
        c.handovers_held.load(Relaxed) as f64
    }),
];

/// Which transport carries each path (`transports[i]`: 0 none, [`ON_TLS`],
/// [`ON_QUIC`]) and the railway controllers' counters: over `--transport
/// quic` a carrier that fell back to TLS shows here.
pub fn write_subflow_transports(
    w: &mut Writer,
    path_names: &[(PathId, String)],
    transports: &[std::sync::atomic::AtomicU8],
    cc: &crate::quic::CcStats,
) {
    for (p, name) in path_names {
        let now = transports.get(p.index()).map_or(0, |t| t.load(Relaxed));
        for (v, transport) in [(ON_TLS, "tls"), (ON_QUIC, "quic")] {
            let labels = vec![
                ("path".into(), p.0.to_string()),
                ("name".into(), name.clone()),
                ("transport".into(), transport.into()),
            ];
            w.metric(&SUBFLOW_TRANSPORT, labels, &(now == v));
        }
    }
    w.table(QUIC_CC, Labels::new, cc);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The text `/metrics` serves for `sources`.
    pub(crate) fn encode(sources: Vec<Source>) -> String {
        let mut reg = Registry::default();
        reg.register_collector(Box::new(SnapshotCollector { sources }));
        let mut body = String::new();
        prometheus_client::encoding::text::encode(&mut body, &reg).expect("encodes");
        body
    }

    #[test]
    fn each_family_is_declared_once() {
        let mut names: Vec<&str> = Vec::new();
        names.extend(SESSION.iter().map(|m| m.name));
        names.extend(ENDPOINT.iter().map(|m| m.name));
        names.extend(PATH.iter().map(|m| m.name));
        names.extend(BUDGET.iter().map(|m| m.name));
        names.extend(QUIC_CC.iter().map(|m| m.name));
        names.extend(PANICS.iter().map(|m| m.name));
        names.extend(
            [SCHEDULERLET_EVENTS.name, HOL_STALLS.name, BUDGET_LEVELS.name, SUBFLOW_TRANSPORT.name, PATH_UP.name]
                .iter(),
        );
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "a name in two tables: {names:?}");
        for n in names {
            assert!(n.starts_with("polycorn_") && !n.ends_with("_total"), "{n}: the encoder adds _total");
        }
    }

    #[test]
    fn readyz_names_each_paths_transport_and_a_quic_fallback() {
        use crate::subflow::Transport;
        use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
        let paths = [(PathId(1), "c1".to_string()), (PathId(0), "c0".to_string())];
        let transports: [AtomicU8; MAX_PATHS] = Default::default();
        transports[0].store(ON_QUIC, Relaxed);
        transports[1].store(ON_TLS, Relaxed);
        let both = [PathId(0), PathId(1)];
        let r = path_readiness(&paths, &both, &transports, Transport::Quic);
        assert_eq!(
            r,
            Readiness {
                ready: true,
                body: "ready: 2/2 paths up; path 0 (c0) on quic; path 1 (c1) on tls (quic fallback)\n".into()
            }
        );
        // Configured for TLS, TLS is no fallback.
        transports[0].store(ON_TLS, Relaxed);
        let r = path_readiness(&paths, &both, &transports, Transport::Tls);
        assert_eq!(r.body, "ready: 2/2 paths up; path 0 (c0) on tls; path 1 (c1) on tls\n");
        // A fallback alone still leaves the end ready: degraded, not unready.
        let r = path_readiness(&paths, &[PathId(1)], &transports, Transport::Quic);
        assert_eq!(
            r,
            Readiness {
                ready: true,
                body: "ready: 1/2 paths up; path 0 (c0) down; path 1 (c1) on tls (quic fallback)\n".into()
            }
        );
        let r = path_readiness(&paths, &[], &transports, Transport::Quic);
        assert_eq!(r, Readiness { ready: false, body: "no path up\n".into() });
    }

    #[test]
    fn the_budget_alone_is_written_as_with_an_endpoint() {
        let b = MemoryBudget::with_high(8 << 20);
        let text = encode(vec![Arc::new(move |w: &mut Writer| write_budget(w, &b)) as Source]);
        for line in [
            "polycorn_mem_budget_bytes{level=\"high\"} 8388608.0",
            "polycorn_mem_budget_used_bytes{} 0.0",
            "polycorn_mem_budget_pressure{} 0.0",
            "polycorn_mem_budget_reclaimed_bytes_total{} 0.0",
        ] {
            assert!(text.lines().any(|l| l == line), "no line {line:?} in\n{text}");
        }
        assert!(!text.contains("polycorn_conn_"), "no connection families without an endpoint");
    }

    #[test]
    fn the_endpoint_exports_its_budget_and_flow_control() {
        use polycorn_core::{EndpointConfig, MemoryBudget, Role, UserId};
        let now = std::time::Instant::now();
        let mut cfg = EndpointConfig::new(Role::Relay);
        cfg.budget = MemoryBudget::with_high(4 << 20);
        cfg.conn_window_initial_bytes = 1 << 20;
        let pipeline = crate::config::build_pipeline("minrtt", &BTreeMap::new()).expect("built-in");
        let mut ep = Endpoint::new(cfg, pipeline, now);
        let conn = ep.open(UserId([7; 16]), "192.0.2.1:443".parse().expect("address"), now).expect("relay opens");
        // No path is up: the bytes stay unsent.
        assert_eq!(ep.send(conn, &[0; 1000], now).expect("open"), 1000);
        let ep = Arc::new(std::sync::Mutex::new(ep));
        let source: Source = Arc::new(move |w| {
            let ep = ep.lock().expect("not poisoned");
            write_endpoint(w, &ep, &[], now);
        });
        let text = encode(vec![source]);
        for line in [
            "polycorn_mem_budget_bytes{level=\"low\"} 2097152.0",
            "polycorn_mem_budget_bytes{level=\"pressure\"} 3145728.0",
            "polycorn_mem_budget_bytes{level=\"high\"} 4194304.0",
            // The initial window (1 MiB) and the unsent bytes, twice: the
            // send buffer's capacity and the segment each is copied into.
            "polycorn_mem_budget_used_bytes{} 1050576.0",
            "polycorn_mem_budget_peak_bytes{} 1050576.0",
            "polycorn_mem_budget_pressure{} 0.0",
            "polycorn_mem_budget_grants_denied_total{} 0.0",
            "polycorn_mem_budget_reclaimed_bytes_total{} 0.0",
            "polycorn_conn_window_bytes{} 1048576.0",
            "polycorn_conn_window_max_bytes{} 1048576.0",
            "polycorn_conn_out_of_order_bytes{} 0.0",
            "polycorn_conn_unsent_bytes{} 1000.0",
            "polycorn_conn_in_flight_bytes{} 0.0",
            "polycorn_conn_window_limited_seconds_total{} 0.0",
            "polycorn_conn_send_limited_seconds_total{} 0.0",
            "polycorn_conn_window_growths_total{} 0.0",
            "polycorn_conn_window_growth_bytes_total{} 0.0",
            "polycorn_conn_hol_stalls_total{at_least=\"0s\"} 0.0",
            "polycorn_conn_hol_stalls_total{at_least=\"0.2s\"} 0.0",
            "polycorn_conn_hol_stalls_total{at_least=\"1s\"} 0.0",
            "polycorn_conn_hol_stall_seconds_total{} 0.0",
            // No path up: the configured initial RTT.
            "polycorn_path_rtt_max_seconds{} 0.1",
            "# TYPE polycorn_mem_budget_pressure gauge",
            "# TYPE polycorn_conn_window_limited_seconds counter",
        ] {
            assert!(text.lines().any(|l| l == line), "no line {line:?} in\n{text}");
        }
    }
}
