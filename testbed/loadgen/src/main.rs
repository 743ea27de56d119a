//! `polycorn-loadgen` command line.

use std::future::Future;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use polycorn_loadgen::bulk::BulkRun;
use polycorn_loadgen::clock::TripClock;
use polycorn_loadgen::im::{default_conn_out, run_im, serve, ImConfig};
use polycorn_loadgen::plan::{
    bulk_plan, check_path_template, parse_seconds, parse_sizes, parse_window, us_to_ms, SizeClass,
};
use polycorn_loadgen::record::{BulkPlanRecord, Sink};

#[derive(Parser)]
#[command(
    name = "polycorn-loadgen",
    version,
    about = "Workload generator of the HSR benchmark (bulk downloads, instant messaging)",
    long_about = "Workload generator of the HSR benchmark. All times are trip time: milliseconds since \
                  --epoch-unix-ms (UNIX wall clock, ms). The same --seed gives the same plan in every copy."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Sequential HTTP/1.1 downloads, one per equal slot of a trip-time window (see README.md).
    Bulk(BulkArgs),
    /// Instant-messaging users: 100-byte messages with exponential gaps, each answered by 4 bytes.
    Im(ImArgs),
    /// The IM peer: answers every 100-byte message with its bytes 4..8 (the message index).
    ImServer {
        /// Address to listen on (port 0: any free port; the bound address is printed on stdout).
        #[arg(long, value_name = "ADDR:PORT")]
        listen: String,
    },
}

#[derive(clap::Args)]
struct BulkArgs {
    /// Origin server to download from.
    #[arg(long, value_name = "HOST:PORT", required_unless_present = "plan_only")]
    origin: Option<String>,
    /// Trip time 0 as UNIX wall-clock milliseconds (shared by all copies).
    #[arg(long, value_name = "E", required_unless_present = "plan_only", value_parser = epoch_arg())]
    epoch_unix_ms: Option<i64>,
    /// Seed of the plan (download order and start offsets).
    #[arg(long, value_name = "S")]
    seed: u64,
    /// Window of trip time, in seconds, that the downloads are spread over.
    #[arg(long, value_name = "A:B", value_parser = window_arg)]
    window_s: (i64, i64),
    /// Downloads of each size.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    per_size: u32,
    /// Size classes, LABEL=BYTES separated by commas; their order is part of the plan.
    #[arg(long, value_name = "LIST", default_value = "256KB=262144,1MB=1048576,4MB=4194304", value_parser = sizes_arg)]
    sizes: Sizes,
    /// URL path of a download; {label} and {size} are replaced.
    #[arg(long, value_name = "PATH", default_value = "/files/bench-{label}.bin")]
    path_template: String,
    /// Output JSONL file ("-": standard output). With --plan-only it defaults to standard output.
    #[arg(long, value_name = "FILE.jsonl", required_unless_present = "plan_only")]
    out: Option<PathBuf>,
    /// Print the plan (one line per download) and exit without network I/O.
    #[arg(long)]
    plan_only: bool,
}

#[derive(clap::Args)]
struct ImArgs {
    /// IM server (polycorn-loadgen im-server).
    #[arg(long, value_name = "HOST:PORT")]
    server: String,
    /// Trip time 0 as UNIX wall-clock milliseconds (shared by all copies).
    #[arg(long, value_name = "E", value_parser = epoch_arg())]
    epoch_unix_ms: i64,
    /// Seed of the message schedule (user u uses its own stream derived from seed and u).
    #[arg(long, value_name = "S")]
    seed: u64,
    /// Number of users, one long-lived TCP connection each.
    #[arg(long, value_name = "U", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    users: u32,
    /// Messages per user.
    #[arg(long, value_name = "M", value_parser = clap::value_parser!(u32).range(1..))]
    messages: u32,
    /// Mean of the exponential gaps between a user's due times, in ms.
    #[arg(long, value_name = "G", value_parser = mean_gap_arg)]
    mean_gap_ms: f64,
    /// Trip time (s) at which the users connect; the first messages are due 1 s later plus a gap.
    #[arg(long, value_name = "T", value_parser = seconds_arg)]
    start_s: i64,
    /// Trip time (s) at which to stop; unsent or unanswered messages get error "deadline".
    #[arg(long, value_name = "D", value_parser = seconds_arg)]
    deadline_s: Option<i64>,
    /// Output JSONL file, one line per message ("-": standard output).
    #[arg(long, value_name = "FILE.jsonl")]
    out: PathBuf,
    /// Connection log, one line per connection attempt [default: OUT with .jsonl -> .conn.jsonl].
    #[arg(long, value_name = "FILE.jsonl")]
    conn_out: Option<PathBuf>,
    /// Bind user u's connections to this IPv4 address + u, so that every user is a distinct
    /// passenger to the relay (which tells passengers apart by source address). The addresses
    /// must exist on the host.
    #[arg(long, value_name = "IPV4")]
    source_base: Option<std::net::Ipv4Addr>,
}

/// UNIX milliseconds between 1970 and 2286 (keeps all µs arithmetic far from overflow).
fn epoch_arg() -> clap::builder::RangedI64ValueParser<i64> {
    clap::value_parser!(i64).range(0..=10_000_000_000_000)
}

fn window_arg(s: &str) -> Result<(i64, i64), String> {
    parse_window(s).map_err(|e| format!("{e:#}"))
}

/// The parsed `--sizes` list (a newtype: clap would take a bare `Vec` for a repeated flag).
#[derive(Clone)]
struct Sizes(Vec<SizeClass>);

fn sizes_arg(s: &str) -> Result<Sizes, String> {
    parse_sizes(s).map(Sizes).map_err(|e| format!("{e:#}"))
}

fn seconds_arg(s: &str) -> Result<i64, String> {
    parse_seconds(s).map_err(|e| format!("{e:#}"))
}

fn mean_gap_arg(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 1e9 => Ok(v),
        _ => Err(format!("{s:?} must be a positive number of milliseconds")),
    }
}

fn main() -> ExitCode {
    let result = match Cli::parse().cmd {
        Cmd::Bulk(a) => bulk(a),
        Cmd::Im(a) => im(a),
        Cmd::ImServer { listen } => im_server(&listen),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("polycorn-loadgen: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs `work` on a runtime until it ends or SIGINT/SIGTERM arrives; a signal is a clean stop.
fn run_until_signal(rt: tokio::runtime::Runtime, work: impl Future<Output = Result<()>>) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    rt.block_on(async {
        let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
        let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
        tokio::select! {
            r = work => r,
            _ = int.recv() => { eprintln!("polycorn-loadgen: stopped by SIGINT"); Ok(()) }
            _ = term.recv() => { eprintln!("polycorn-loadgen: stopped by SIGTERM"); Ok(()) }
        }
    })
}

fn current_thread() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start the runtime")
}

fn bulk(a: BulkArgs) -> Result<()> {
    check_path_template(&a.path_template)?;
    let plan = bulk_plan(a.seed, a.window_s, a.per_size as usize, &a.sizes.0)?;
    if a.plan_only {
        let sink = Sink::create(a.out.as_deref().unwrap_or("-".as_ref()))?;
        for d in &plan {
            sink.write(&BulkPlanRecord {
                id: d.id,
                label: &d.label,
                size: d.size,
                planned_ms: us_to_ms(d.planned_us),
                timeout_ms: us_to_ms(d.timeout_us),
                slot_start_ms: us_to_ms(d.slot_start_us),
                slot_end_ms: us_to_ms(d.slot_end_us),
            })?;
        }
        return Ok(());
    }
    let (Some(origin), Some(epoch), Some(out)) = (a.origin, a.epoch_unix_ms, a.out) else {
        bail!("--origin, --epoch-unix-ms and --out are required unless --plan-only");
    };
    let rt = current_thread()?;
    let addr = rt.block_on(resolve(&origin))?;
    let sink = Sink::create(&out)?;
    let clock = TripClock::new(epoch)?;
    let run = BulkRun { clock, origin: addr, host: &origin, path_template: &a.path_template, sink };
    run_until_signal(rt, run.run(&plan))
}

fn im(a: ImArgs) -> Result<()> {
    if let Some(d) = a.deadline_s {
        if d <= a.start_s {
            bail!("--deadline-s must be after --start-s");
        }
    }
    if let Some(base) = a.source_base {
        polycorn_loadgen::im::source_addr(base, a.users - 1)?;
    }
    let rt = current_thread()?;
    let server = rt.block_on(resolve(&a.server))?;
    let conn_out = a.conn_out.clone().unwrap_or_else(|| default_conn_out(&a.out));
    let sink = Sink::create(&a.out)?;
    let conn_sink = Sink::create(&conn_out)?;
    let cfg = ImConfig {
        server,
        seed: a.seed,
        users: a.users,
        messages: a.messages,
        mean_gap_ms: a.mean_gap_ms,
        start_us: a.start_s,
        deadline_us: a.deadline_s,
        source_base: a.source_base,
    };
    let clock = TripClock::new(a.epoch_unix_ms)?;
    run_until_signal(rt, run_im(clock, cfg, sink, conn_sink))
}

fn im_server(listen: &str) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the runtime")?;
    run_until_signal(
        rt,
        serve(listen, |addr| {
            let mut out = std::io::stdout();
            let _ = writeln!(out, "listening on {addr}");
            let _ = out.flush();
        }),
    )
}

async fn resolve(hostport: &str) -> Result<std::net::SocketAddr> {
    let mut addrs =
        tokio::net::lookup_host(hostport).await.with_context(|| format!("cannot resolve {hostport:?} (HOST:PORT)"))?;
    addrs.next().with_context(|| format!("{hostport:?} resolves to no address"))
}
