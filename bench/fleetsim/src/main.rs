//! `polycorn-fleetsim`: many simulated trains against real proxies, from
//! one process.
//!
//! Per train of the plan (JSON, [`plan::Plan`]) it runs the relay-agent's
//! own train side, from polycorn-relay's library: a `Role::Relay` session
//! with the relay's defaults, one TLS subflow per path to the train's proxy
//! with the train's certificate (dial, HELLO, run, back off and dial
//! again: `paths::keep_path`), the durable telemetry spool and its sender,
//! and the radio replay of a polycorn-tracegen trip from the train's own
//! epoch, whose GPS fixes, cell samples and handovers become telemetry
//! records exactly as a relay's do. Optionally, passengers: per train
//! downloads and chat connections through the session to an origin, every
//! byte checked ([`passengers`]). What it does not have: the passengers'
//! sockets and the relay's capture (connections are opened on the session
//! directly), network interfaces (the subflows are loopback TCP, unbound),
//! radio emulation (the links are as good as loopback), gpsd and modems.
//!
//! It counts per train (handshakes, reconnects, records spooled, confirmed
//! and resent, bytes, errors), serves the fleet's sums on `/metrics`, and
//! writes a JSON summary (`--summary`) when it ends: on SIGTERM or SIGINT,
//! or after `--seconds`. A proxy that closes or refuses connections is
//! counted, never fatal.
//!
//! With `--direct-kafka BOOTSTRAP` it is the plane mode ([`plane`]): no
//! proxies, subflows or spools; each train's replayed records go straight
//! to the telemetry topic as its proxy would produce them, and table
//! consumers follow the failure-table topic as the proxies do, so that the
//! shared plane (Kafka, ingest, LinkDB) can be loaded with thousands of
//! trains.

mod fleet;
mod passengers;
mod pattern;
mod plan;
mod plane;
mod report;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::fleet::{now_unix_ms, Fleet};
use crate::passengers::Passengers;
use crate::plan::Plan;
use crate::plane::Plane;

#[derive(Parser, Debug)]
#[command(
    name = "polycorn-fleetsim",
    version,
    about = "Many simulated trains' relay sides against real proxies, from one process"
)]
struct Cli {
    /// The plan: trains, their proxies and certificates, the trip, the passengers (JSON; see plan.rs).
    #[arg(long)]
    plan: PathBuf,
    /// Where to write the JSON summary when the run ends.
    #[arg(long)]
    summary: Option<PathBuf>,
    /// Prometheus metrics (the fleet's sums) and /readyz (every train connected).
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// End after this many seconds [default: at SIGTERM or SIGINT].
    #[arg(long)]
    seconds: Option<f64>,
    /// Runtime worker threads [default: one per core].
    #[arg(long)]
    threads: Option<usize>,
    /// Log filter, overridden by RUST_LOG [default: warn: a thousand trains' info lines drown the rest].
    #[arg(long, default_value = "warn")]
    log: String,
    /// Log in JSON.
    #[arg(long)]
    log_json: bool,
    /// The plane mode: produce every train's records straight to Kafka at
    /// BOOTSTRAP as its proxy would, without proxies, subflows or spools.
    #[arg(long, value_name = "BOOTSTRAP")]
    direct_kafka: Option<String>,
    /// The telemetry topic (plane mode).
    #[arg(long, default_value = polycorn_telemetry::kafka::TELEMETRY_TOPIC)]
    kafka_topic: String,
    /// The dead-letter topic (plane mode).
    #[arg(long, default_value = polycorn_telemetry::kafka::DLQ_TOPIC)]
    kafka_dlq_topic: String,
    /// The failure-table topic, followed by the table consumers (plane
    /// mode) [default: no table consumers].
    #[arg(long)]
    failure_table_topic: Option<String>,
    /// The key tables must be signed with, as the proxies'
    /// `--failure-table-verify-key` (plane mode).
    #[arg(long)]
    failure_table_verify_key: Option<PathBuf>,
    /// Trains per Kafka producer and per table consumer (plane mode; a
    /// real proxy has one of each, so 1 models the fleet's connections).
    #[arg(long, default_value_t = 1)]
    trains_per_client: usize,
    /// Faults to seed, for the orchestrator's own tests (plane mode; repeatable).
    #[arg(long, value_enum, hide = true)]
    fault: Vec<plane::Fault>,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    polycorn_net::logging::init(&cli.log, cli.log_json);
    polycorn_net::panics::install("fleetsim");
    raise_open_files();
    let threads = cli.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(threads).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("polycorn-fleetsim: starting the runtime: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    match rt.block_on(run(cli, threads)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("polycorn-fleetsim: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

/// A train holds its subflows' sockets, its spool's files and its
/// passengers' nothing (no sockets): raise the soft limit to the hard one.
fn raise_open_files() {
    // SAFETY: getrlimit and setrlimit read and write only the struct given.
    unsafe {
        let mut l: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < l.rlim_max {
            l.rlim_cur = l.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
    }
}

/// Serve `sources` on `/metrics` at `addr` until `stop`.
async fn serve_metrics(
    addr: SocketAddr,
    sources: Vec<polycorn_net::metrics::Source>,
    ready: polycorn_net::metrics::Ready,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
    drop(listener); // bound once to fail early; serve binds it again
    tokio::spawn(async move {
        let shutdown = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        if let Err(e) = polycorn_net::metrics::serve(addr, sources, ready, shutdown).await {
            warn!(error = %e, "metrics endpoint failed");
        }
    });
    Ok(())
}

/// Until SIGTERM or SIGINT, or `--seconds`.
async fn wait_end(seconds: Option<f64>) {
    let end = async {
        match seconds {
            Some(s) => tokio::time::sleep(Duration::from_secs_f64(s)).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = polycorn_net::shutdown_signal() => info!("signalled: stopping"),
        _ = end => info!("--seconds elapsed: stopping"),
    }
}

/// Write `summary` to `path` (through a temporary file and a rename).
fn write_summary(path: Option<&std::path::Path>, summary: &impl serde::Serialize) -> anyhow::Result<()> {
    let Some(path) = path else { return Ok(()) };
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(summary)?).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

async fn run(cli: Cli, threads: usize) -> anyhow::Result<()> {
    let plan = Plan::load(&cli.plan, cli.direct_kafka.is_some())?;
    if let Some(bootstrap) = cli.direct_kafka.clone() {
        return run_plane(cli, plan, bootstrap, threads).await;
    }
    let started_unix_ms = now_unix_ms();
    let (stop_tx, stop_rx) = watch::channel(false);
    let fleet = Arc::new(Fleet::new(plan, stop_rx.clone())?);
    info!(trains = fleet.trains.len(), paths = fleet.plan.paths, "fleet starting");

    if let Some(addr) = cli.metrics_listen {
        let f = fleet.clone();
        let ready: polycorn_net::metrics::Ready = Arc::new(move || f.all_connected().into());
        serve_metrics(addr, vec![report::metrics_source(fleet.clone())], ready, stop_rx.clone()).await?;
    }
    tokio::spawn(fleet.clone().start_all());
    tokio::spawn(fleet.clone().watch_connections());
    let lags = Arc::new(std::sync::Mutex::new(Vec::<f32>::new()));
    let f = fleet.clone();
    tokio::spawn(lag_loop(stop_rx.clone(), lags.clone(), move |lag| {
        if let Some(p) = f.passengers.get().filter(|p| !p.stopped()) {
            p.loop_lags_ms.lock().unwrap_or_else(|e| e.into_inner()).push(lag);
        }
    }));
    if let Some(pp) = fleet.plan.passengers.clone().filter(|p| p.conns > 0) {
        // Listening before anyone could send it (its default action ends the process).
        let mut usr1 = if pp.start_on_sigusr1 {
            Some(signal(SignalKind::user_defined1()).context("listening for SIGUSR1")?)
        } else {
            None
        };
        let f = fleet.clone();
        tokio::spawn(async move {
            let go = match &mut usr1 {
                Some(usr1) => {
                    let mut stop = f.stop.clone();
                    tokio::select! {
                        r = usr1.recv() => r.is_some(),
                        _ = stop.wait_for(|s| *s) => false,
                    }
                }
                None => f.wait_connected(Duration::from_secs_f64(pp.start_within_s)).await,
            };
            if go {
                let (started, connected) = f.started_and_connected();
                info!(started, connected, "passengers starting");
                let _ = f.passengers.set(Passengers::start(&f, pp));
            }
        });
    }

    wait_end(cli.seconds).await;
    let _ = stop_tx.send(true);
    // Let the tasks see the stop (a subflow loop that sees its session
    // closed first counts a subflow lost), and the passengers count what
    // was cut; then end the sessions.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let give_up = Instant::now() + Duration::from_secs(2);
    while fleet.passengers.get().is_some_and(|p| p.running.load(Ordering::Relaxed) > 0) && Instant::now() < give_up {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let summary = summarize(&fleet, started_unix_ms, threads, &lags);
    fleet.close();
    let tasks = fleet.take_tasks();
    let _ = tokio::time::timeout(Duration::from_secs(3), async {
        for t in tasks {
            let _ = t.await;
        }
    })
    .await;
    let t = &summary.totals;
    println!(
        "fleetsim: {}/{} trains started, {} connected; handshakes {}, reconnects {}, records spooled {} acked {}, errors {}",
        summary.trains_started,
        summary.trains_planned,
        summary.trains_connected,
        t.handshakes,
        t.reconnects,
        t.records_spooled,
        t.records_acked,
        t.errors
    );
    write_summary(cli.summary.as_deref(), &summary)
}

/// The plane mode: the trains' records straight to Kafka, table consumers
/// on the table topic ([`plane`]).
async fn run_plane(cli: Cli, plan: Plan, bootstrap: String, threads: usize) -> anyhow::Result<()> {
    let (started_unix_ms, started) = (now_unix_ms(), Instant::now());
    let (stop_tx, stop_rx) = watch::channel(false);
    let opts = plane::Opts {
        bootstrap,
        topic: cli.kafka_topic.clone(),
        dlq_topic: cli.kafka_dlq_topic.clone(),
        table_topic: cli.failure_table_topic.clone(),
        verify_key: cli.failure_table_verify_key.clone(),
        trains_per_client: cli.trains_per_client,
        faults: cli.fault.clone(),
    };
    let p = Arc::new(Plane::new(plan, opts, stop_rx.clone())?);
    if let Some(addr) = cli.metrics_listen {
        let q = p.clone();
        let ready: polycorn_net::metrics::Ready = Arc::new(move || q.all_connected().into());
        serve_metrics(addr, vec![p.metrics_source()], ready, stop_rx.clone()).await?;
    }
    tokio::spawn(p.clone().start_all());
    let lags = Arc::new(std::sync::Mutex::new(Vec::<f32>::new()));
    tokio::spawn(lag_loop(stop_rx.clone(), lags.clone(), |_| {}));
    wait_end(cli.seconds).await;
    let _ = stop_tx.send(true);
    // What Kafka has not confirmed yet: awaited, up to the delivery timeout.
    p.settle(polycorn_telemetry::kafka::DELIVERY_TIMEOUT + Duration::from_secs(5)).await;
    p.finish();
    let lags = lags.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let summary = p.summary(started_unix_ms, started.elapsed().as_secs_f64(), threads, &lags);
    let t = &summary.totals;
    println!(
        "fleetsim (plane): {}/{} trains started, {} producers, {} table consumers; records made {} confirmed {} failed {} in flight {}",
        summary.trains_started,
        summary.trains_planned,
        summary.producers,
        summary.table_consumers,
        t.records_made,
        t.records_confirmed,
        t.records_failed,
        t.in_flight
    );
    write_summary(cli.summary.as_deref(), &summary)
}

/// How late the runtime wakes a 100 ms sleep (a starved load generator
/// cannot offer its load): every sample in `all`, and each to `also`.
async fn lag_loop(
    mut stop: watch::Receiver<bool>,
    all: Arc<std::sync::Mutex<Vec<f32>>>,
    also: impl Fn(f32) + Send + 'static,
) {
    loop {
        let t = Instant::now();
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let lag = (t.elapsed().as_secs_f32() - 0.1) * 1000.0;
        all.lock().unwrap_or_else(|e| e.into_inner()).push(lag);
        also(lag);
    }
}

fn summarize(
    fleet: &Fleet,
    started_unix_ms: i64,
    threads: usize,
    lags: &std::sync::Mutex<Vec<f32>>,
) -> report::Summary {
    let paths = fleet.plan.paths;
    let trains: Vec<report::TrainSummary> = fleet
        .trains
        .iter()
        .map(|t| {
            let (counters, error_messages) = report::counters(t, paths);
            report::TrainSummary {
                id: t.plan.id.clone(),
                started_unix_ms: t.started_unix_ms.load(Ordering::Relaxed),
                epoch_unix_ms: t.plan.epoch_unix_ms,
                connected: t.connected_once.load(Ordering::Relaxed),
                counters,
                error_messages,
            }
        })
        .collect();
    let (trains_started, trains_connected) = fleet.started_and_connected();
    let (cpu_s, max_rss_kib) = report::self_usage();
    let lags = lags.lock().unwrap_or_else(|e| e.into_inner()).clone();
    report::Summary {
        trains_planned: fleet.trains.len(),
        trains_started,
        trains_connected,
        paths_per_train: paths,
        started_unix_ms,
        seconds: fleet.started.elapsed().as_secs_f64(),
        cpu_s,
        max_rss_kib,
        threads,
        loop_lag_ms_p50: report::quantile(&lags, 0.5),
        loop_lag_ms_p99: report::quantile(&lags, 0.99),
        loop_lag_ms_max: f64::from(lags.iter().copied().fold(0.0f32, f32::max)),
        totals: report::totals(fleet),
        trains,
        passengers: fleet.passengers.get().map(|p| p.report(fleet)),
    }
}
