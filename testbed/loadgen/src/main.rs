//! `polycorn-loadgen` command line.

use std::future::Future;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use polycorn_loadgen::backlog::{check_path, run_users, BacklogRun, MAX_SIZE, MAX_USERS};
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
    about = "Workload generator of the HSR benchmark (bulk and backlogged downloads, instant messaging)",
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
    /// One always-busy download flow: back-to-back HTTP/1.1 requests over a trip-time window, one
    /// record for the whole run (see README.md).
    Backlog(BacklogArgs),
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
struct BacklogArgs {
    /// Origin server to download from.
    #[arg(long, value_name = "HOST:PORT")]
    origin: String,
    /// Trip time 0 as UNIX wall-clock milliseconds (shared by all copies).
    #[arg(long, value_name = "E", value_parser = epoch_arg())]
    epoch_unix_ms: i64,
    /// Window of trip time, in seconds, during which a download is always in flight.
    #[arg(long, value_name = "A:B", value_parser = window_arg)]
    window_s: (i64, i64),
    /// URL path of every request.
    #[arg(long, value_name = "PATH", default_value = "/files/100MiB.bin", value_parser = path_arg)]
    path: String,
    /// Expected body size of each request (the Content-Length must match).
    #[arg(long, value_name = "BYTES", default_value_t = 104_857_600, value_parser = clap::value_parser!(u64).range(1..=MAX_SIZE))]
    size: u64,
    /// Output JSONL file, one line for the whole run ("-": standard output); with --users or
    /// --source-base, one line per user, written together at the end in user order.
    #[arg(long, value_name = "FILE.jsonl")]
    out: PathBuf,
    /// Concurrent users, each its own always-busy flow (the records gain `user` and `source`).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=MAX_USERS as i64))]
    users: Option<u32>,
    /// Bind user u's connections to this IPv4 address + u, so that every user is a distinct
    /// passenger to the relay. The addresses must exist on the host.
    #[arg(long, value_name = "IPV4")]
    source_base: Option<std::net::Ipv4Addr>,
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

fn path_arg(s: &str) -> Result<String, String> {
    check_path(s).map(|()| s.to_owned()).map_err(|e| format!("{e:#}"))
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
        Cmd::Backlog(a) => backlog(a),
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
    rt.block_on(async {
        let stop = stop_signal()?;
        tokio::select! {
            r = work => r,
            () = stop => Ok(()),
        }
    })
}

/// A future that resolves at the first SIGINT or SIGTERM (reporting it on stderr). The handlers are
/// installed at once, so this must be called inside the runtime.
fn stop_signal() -> Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => eprintln!("polycorn-loadgen: stopped by SIGINT"),
            _ = term.recv() => eprintln!("polycorn-loadgen: stopped by SIGTERM"),
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

/// Each user's source address (`None` for all without a base); a single-flow run (neither
/// `--users` nor `--source-base`) is the one user `None`.
fn backlog_users(
    users: Option<u32>,
    base: Option<std::net::Ipv4Addr>,
) -> Result<Vec<(Option<u32>, Option<std::net::Ipv4Addr>)>> {
    if users.is_none() && base.is_none() {
        return Ok(vec![(None, None)]);
    }
    (0..users.unwrap_or(1))
        .map(|u| Ok((Some(u), base.map(|b| polycorn_loadgen::im::source_addr(b, u)).transpose()?)))
        .collect()
}

fn backlog(a: BacklogArgs) -> Result<()> {
    // --path, --size and --users were checked by their value parsers.
    let users = backlog_users(a.users, a.source_base)?;
    let rt = current_thread()?;
    let origin = rt.block_on(resolve(&a.origin))?;
    let sink = Sink::create(&a.out)?;
    let clock = TripClock::new(a.epoch_unix_ms)?;
    let runs: Vec<BacklogRun<'_>> = users
        .into_iter()
        .map(|(user, source)| BacklogRun {
            clock,
            origin,
            host: &a.origin,
            path: &a.path,
            size: a.size,
            window: a.window_s,
            source,
            user,
        })
        .collect();
    // A signal ends the run early; the records are written either way.
    rt.block_on(async {
        match &runs[..] {
            [run] if run.user.is_none() => run.run(&sink, stop_signal()?).await,
            _ => run_users(&runs, &sink, stop_signal()?).await,
        }
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn backlog_args(extra: &[&str]) -> Result<BacklogArgs, clap::Error> {
        let base = ["polycorn-loadgen", "backlog", "--origin", "127.0.0.1:8080", "--epoch-unix-ms", "1000"];
        match Cli::try_parse_from(base.iter().chain(extra)) {
            Ok(Cli { cmd: Cmd::Backlog(a) }) => Ok(a),
            Ok(_) => unreachable!(),
            Err(e) => Err(e),
        }
    }

    #[test]
    fn backlog_flags() {
        let a = backlog_args(&["--window-s", "60:600.5", "--out", "x.jsonl"]).unwrap();
        assert_eq!(a.window_s, (60_000_000, 600_500_000));
        assert_eq!((a.path.as_str(), a.size), ("/files/100MiB.bin", 104_857_600));
        assert_eq!(a.out, PathBuf::from("x.jsonl"));
        assert_eq!(a.origin, "127.0.0.1:8080");
        assert_eq!(a.epoch_unix_ms, 1000);
        let a =
            backlog_args(&["--window-s", "0:1", "--path", "/f/1MB.bin", "--size", "1048576", "--out", "-"]).unwrap();
        assert_eq!((a.path.as_str(), a.size), ("/f/1MB.bin", 1_048_576));
        for bad in [
            &["--window-s", "10:5", "--out", "-"][..],
            &["--window-s", "5", "--out", "-"],
            &["--window-s", "-1:5", "--out", "-"],
            &["--window-s", "0:5"],
            &["--out", "-"],
            &["--window-s", "0:5", "--out", "-", "--size", "0"],
            &["--window-s", "0:5", "--out", "-", "--size", "1MB"],
            &["--window-s", "0:5", "--out", "-", "--size", "1099511627777"],
            &["--window-s", "0:5", "--out", "-", "--path", "files/x"],
            &["--window-s", "0:5", "--out", "-", "--path", "/a b"],
            &["--window-s", "0:5", "--out", "-", "--seed", "1"],
        ] {
            assert!(backlog_args(bad).is_err(), "accepted {bad:?}");
        }
        // Users: 1..=MAX_USERS, an IPv4 source base.
        let a = backlog_args(&["--window-s", "0:5", "--out", "-", "--users", "100", "--source-base", "10.66.0.100"])
            .unwrap();
        assert_eq!((a.users, a.source_base), (Some(100), Some(std::net::Ipv4Addr::new(10, 66, 0, 100))));
        let a = backlog_args(&["--window-s", "0:5", "--out", "-"]).unwrap();
        assert_eq!((a.users, a.source_base), (None, None));
        for bad in [
            &["--window-s", "0:5", "--out", "-", "--users", "0"][..],
            &["--window-s", "0:5", "--out", "-", "--users", "1001"],
            &["--window-s", "0:5", "--out", "-", "--users", "-1"],
            &["--window-s", "0:5", "--out", "-", "--source-base", "10.66.0"],
            &["--window-s", "0:5", "--out", "-", "--source-base", "::1"],
        ] {
            assert!(backlog_args(bad).is_err(), "accepted {bad:?}");
        }
        // --origin and --epoch-unix-ms are required.
        assert!(Cli::try_parse_from(["polycorn-loadgen", "backlog", "--window-s", "0:5", "--out", "-"]).is_err());
        assert!(Cli::try_parse_from([
            "polycorn-loadgen",
            "backlog",
            "--origin",
            "h:1",
            "--epoch-unix-ms",
            "-5",
            "--window-s",
            "0:5",
            "--out",
            "-"
        ])
        .is_err());
    }

    #[test]
    fn backlog_user_addresses() {
        use std::net::Ipv4Addr;
        // Neither flag: one flow, no user (the single-flow record).
        assert_eq!(backlog_users(None, None).unwrap(), vec![(None, None)]);
        // --users alone: users without a bound address.
        assert_eq!(backlog_users(Some(2), None).unwrap(), vec![(Some(0), None), (Some(1), None)]);
        // --source-base alone: one user from the base address.
        let base = Ipv4Addr::new(10, 66, 0, 100);
        assert_eq!(backlog_users(None, Some(base)).unwrap(), vec![(Some(0), Some(base))]);
        let v = backlog_users(Some(100), Some(base)).unwrap();
        assert_eq!(v.len(), 100);
        assert_eq!(v[99], (Some(99), Some(Ipv4Addr::new(10, 66, 0, 199))));
        // Past 255.255.255.255.
        assert!(backlog_users(Some(2), Some(Ipv4Addr::new(255, 255, 255, 255))).is_err());
    }
}
