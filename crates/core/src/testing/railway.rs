//! A trip of the emulated railway replayed in virtual time: each carrier's
//! Mahimahi traces (`cN.up`, `cN.down`), its one-way delay schedule and its
//! blackouts (`cN.schedule`) from a `polycorn-tracegen` trip directory, with
//! the bulk downloads of a benchmark run (`bulk.jsonl`) at the same trip
//! times. Each download starts on a fresh harness a few seconds before it,
//! so schemes and downloads do not carry state into each other.
//!
//! Not the emulator: no random loss, no TCP congestion control below the
//! endpoint, a blackout's "flush" treated as "hold" (see [`super`]). It
//! answers "what would this scheduler do on these links" in a second per
//! scheme, deterministically, where the emulated railway takes 20 minutes
//! per trip; the railway's numbers remain the ones to report.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::pipe::{DelaySchedule, DirSpec};
use super::trace::MahimahiTrace;
use super::*;
use crate::sched::{Pipeline, PipelineSpec, Registry, SchedulerletSpec};

/// One carrier of a trip.
fn carrier(dir: &Path, i: usize) -> Result<PathSpec, String> {
    let trace = |name: &str| {
        MahimahiTrace::from_file(&dir.join(format!("c{i}.{name}"))).map(Arc::new).map_err(|e| e.to_string())
    };
    let path = dir.join(format!("c{i}.schedule"));
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut delays = Vec::new();
    let mut blackouts = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let ms = |k: usize| -> Result<Duration, String> {
            let v: f64 =
                f.get(k).and_then(|v| v.parse().ok()).ok_or(format!("{}:{}: {line:?}", path.display(), n + 1))?;
            Ok(Duration::from_secs_f64(v / 1000.0))
        };
        match f.first() {
            Some(&"delay") => delays.push((ms(1)?, ms(2)?)),
            Some(&"blackout") => blackouts.push((ms(1)?, ms(2)?)),
            _ => {}
        }
    }
    let schedule = Some(Arc::new(DelaySchedule::new(delays)));
    let dir_spec = |t| DirSpec {
        delay_schedule: schedule.clone(),
        trace_origin: Some(Duration::ZERO),
        ..DirSpec::trace(t, Duration::ZERO)
    };
    let mut p = PathSpec::new(dir_spec(trace("up")?), dir_spec(trace("down")?));
    for (a, b) in blackouts {
        p = p.with_blackout(a, b);
    }
    Ok(p)
}

/// Every carrier of the trip in `dir` (`c0`, `c1`, … while their files exist).
pub fn trip_paths(dir: &Path) -> Result<Vec<PathSpec>, String> {
    let mut out = Vec::new();
    while dir.join(format!("c{}.down", out.len())).exists() {
        out.push(carrier(dir, out.len())?);
    }
    if out.is_empty() {
        return Err(format!("{}: no carrier traces (c0.down)", dir.display()));
    }
    Ok(out)
}

/// The bulk downloads of a benchmark run's `bulk.jsonl`: (id, start, size).
fn downloads(path: &Path) -> Result<Vec<(u64, Duration, u64)>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(n, l)| {
            let v: serde_json::Value =
                serde_json::from_str(l).map_err(|e| format!("{}:{}: {e}", path.display(), n + 1))?;
            match (v["id"].as_u64(), v["planned_ms"].as_f64(), v["size"].as_u64()) {
                (Some(id), Some(t), Some(size)) => Ok((id, Duration::from_secs_f64(t / 1000.0), size)),
                _ => Err(format!("{}:{}: no id, planned_ms and size", path.display(), n + 1)),
            }
        })
        .collect()
}

/// A built-in pipeline, `single-path-cN` (carrier N alone) or
/// `name:param=v,…,+let,-let` (a built-in composition with those parameters
/// of its `tail-reject`, and schedulerlets added or taken out).
pub(super) fn build(r: &Registry, name: &str) -> Pipeline {
    if let Some(n) = name.strip_prefix("single-path-c") {
        let mut pin = SchedulerletSpec::named("pin-path");
        pin.params.insert("path".into(), n.parse().unwrap());
        let spec = PipelineSpec {
            schedulerlets: vec![pin, SchedulerletSpec::named("minrtt")],
            reinjection: SchedulerletSpec::named("rto-oldest"),
        };
        return r.build_spec(name, &spec).unwrap();
    }
    // `base:param=v,…,+let,-let`: tail-reject's parameters on a built-in
    // composition, schedulerlets appended to it and taken out of it.
    if let Some((base, params)) = name.split_once(':') {
        let mut spec = r.pipeline_spec(base).unwrap().clone();
        for kv in params.split(',') {
            if let Some(extra) = kv.strip_prefix('+') {
                spec.schedulerlets.push(SchedulerletSpec::named(extra));
                continue;
            }
            if let Some(gone) = kv.strip_prefix('-') {
                spec.schedulerlets.retain(|l| l.name != gone);
                continue;
            }
            let (k, v) = kv.split_once('=').unwrap();
            for l in spec.schedulerlets.iter_mut().filter(|l| l.name == "tail-reject") {
                l.params.insert(k.into(), v.parse().unwrap());
            }
        }
        return r.build_spec(name, &spec).unwrap();
    }
    r.build(name).unwrap()
}

/// Completion time of one download of `size` bytes at `start` on `paths`,
/// after a 4 MB warm-up from `start - 8 s` (the benchmark's proxy and relay
/// have carried traffic before each download).
fn replay_one(
    cfg: &SimConfig,
    name: &str,
    paths: &[PathSpec],
    start: Duration,
    size: u64,
    detail: bool,
) -> Option<Duration> {
    let r = Registry::with_builtins();
    let warm = start.saturating_sub(Duration::from_secs(8));
    let mut h = Harness::with_config_at(cfg.clone(), build(&r, name), build(&r, name), paths.to_vec(), 7, warm);
    h.open(ConnSpec::new(1).upload(300).download(4_000_000).at(warm));
    h.open(ConnSpec::new(1).upload(300).download(size).at(start));
    let rep = h.run_until(start + Duration::from_secs(60));
    if detail {
        // What the proxy (the downlink's sender) did on each path, and what
        // held the download back, over the warm-up and the download.
        let (p, q) = (&rep.proxy, &rep.relay);
        eprintln!(
            "    {name}: warm-up done {:?}, proxy window-limited {} ms, send-limited {} ms, head reinjections {}, tail reinjections {}, relay hol stalls {} ({} ms), relay window growths {}",
            rep.conns[0].completion,
            p.window_limited_us / 1000,
            p.send_limited_us / 1000,
            p.head_reinjections,
            p.tail_reinjections,
            q.hol_stalls,
            q.hol_stall_us / 1000,
            q.window_growths,
        );
        for path in &rep.paths {
            if let Some(s) = &path.proxy {
                eprintln!(
                    "      path {:?}: data {} B, reinjected {} B, rto {}, stale {}, penalised {}",
                    path.id, s.data_bytes_sent, s.reinjected_bytes, s.rto_events, s.stale_transitions, s.penalisations
                );
            }
        }
    }
    rep.conns[1].completion
}

/// Exploration, printing only: `POLYCORN_TRIP_DIR` (a trip directory) and
/// `POLYCORN_BULK_JSONL` (a benchmark run's `bulk.jsonl` on that trip);
/// `POLYCORN_SCHEMES` (space-separated) and `POLYCORN_UNSENT_INITIAL` (the
/// initial not-sent mark, bytes) optional. Prints each download's time per
/// scheme and the geometric mean ratio to `minrtt` per size.
#[test]
#[ignore = "exploration: replays a trip given by environment variables"]
fn print_railway_replay() {
    let (Ok(trip), Ok(bulk)) = (std::env::var("POLYCORN_TRIP_DIR"), std::env::var("POLYCORN_BULK_JSONL")) else {
        eprintln!("set POLYCORN_TRIP_DIR and POLYCORN_BULK_JSONL to replay a trip");
        return;
    };
    let paths = trip_paths(Path::new(&trip)).unwrap();
    let loads = downloads(Path::new(&bulk)).unwrap();
    let schemes = std::env::var("POLYCORN_SCHEMES")
        .unwrap_or_else(|_| "minrtt single-path-c0 single-path-c1 hrsch hrsch+stale hrsch+stale:strict=1".into());
    let schemes: Vec<&str> = schemes.split_whitespace().collect();
    let mut cfg = SimConfig::default();
    if let Ok(v) = std::env::var("POLYCORN_WINDOW_INITIAL") {
        let v: u64 = v.parse().unwrap();
        cfg.relay.conn_window_initial_bytes = v;
        cfg.proxy.conn_window_initial_bytes = v;
    }
    if let Ok(v) = std::env::var("POLYCORN_UNSENT_INITIAL") {
        let v: u64 = v.parse().unwrap();
        cfg.relay.conn_unsent_initial_bytes = v;
        cfg.proxy.conn_unsent_initial_bytes = v;
    }
    // POLYCORN_DETAIL: download ids whose counters to print, per scheme.
    let detail: Vec<u64> = std::env::var("POLYCORN_DETAIL")
        .map(|v| v.split(',').map(|x| x.trim().parse().unwrap()).collect())
        .unwrap_or_default();
    let mut logs: Vec<Vec<(u64, f64)>> = vec![Vec::new(); schemes.len()];
    for &(id, start, size) in &loads {
        if !detail.is_empty() && !detail.contains(&id) {
            continue;
        }
        let mut line = format!("{id:>3} {size:>8} {:>6.1}s", start.as_secs_f64());
        let mut base = f64::NAN;
        for (k, s) in schemes.iter().enumerate() {
            let t = replay_one(&cfg, s, &paths, start, size, !detail.is_empty()).map_or(f64::NAN, |d| d.as_secs_f64());
            if k == 0 {
                base = t;
            }
            logs[k].push((size, (base / t).ln()));
            line += &format!(" | {s} {t:.2}");
        }
        eprintln!("{line}");
    }
    for (k, s) in schemes.iter().enumerate() {
        let mut line = format!("{s:>22} vs {}:", schemes[0]);
        for size in [262_144u64, 1_048_576, 4_194_304, 0] {
            let v: Vec<f64> =
                logs[k].iter().filter(|(z, x)| (size == 0 || *z == size) && x.is_finite()).map(|p| p.1).collect();
            let g = (v.iter().sum::<f64>() / v.len().max(1) as f64).exp();
            line += &format!(" {}: {g:.2} (n {})", if size == 0 { "all".into() } else { size.to_string() }, v.len());
        }
        eprintln!("{line}");
    }
}
