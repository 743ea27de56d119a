//! `polycorn-tracegen`: generate synthetic HSR link traces (hsr-facts §15) and validate them.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use polycorn_telemetry::failure_table::FailureTableFile;
use polycorn_tracegen::failure_table::{self as ft, Select, Thresholds};
use polycorn_tracegen::validate::{report, report_per_trip, validate};
use polycorn_tracegen::{generate, write, Error, FailureModel, HandoverLoss, Preset, TripConfig};

#[derive(Parser)]
#[command(name = "polycorn-tracegen", version, about = "Synthetic HSR multi-carrier link traces (hsr-facts §15)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate one trip into a directory.
    Generate {
        /// Preset: pc-gateway-300, m19-phone-300, m19-phone-350, static, or a `-v1` variant of the
        /// first three (the first failure model).
        #[arg(long, default_value = "pc-gateway-300")]
        preset: String,
        /// Seed of the route-fixed randomness (cell layout, per-cell failure propensity).
        #[arg(long, default_value_t = 1)]
        route_seed: u64,
        /// Seed of the per-trip randomness.
        #[arg(long, default_value_t = 1)]
        trip_seed: u64,
        /// Trip length in seconds.
        #[arg(long, default_value_t = 600)]
        duration_s: u64,
        /// Number of carriers (even-numbered use carrier A's parameters, odd ones B's).
        #[arg(long, default_value_t = 2)]
        carriers: usize,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
        /// Override a parameter of failure model v2 (KEY=JSON value, e.g. `overlap_mean_m=300` or
        /// `sigma_cell=[1.0,1.3]`) or of the loss around handovers (`handover_loss.rate=0.7`,
        /// `handover_loss.before_ms=150`, `handover_loss.after_ms=150`, starting from 70 % and
        /// 150 ms); for fitting experiments on development routes. trip.json records the
        /// parameters used.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
    },
    /// Compare generated trips with published numbers (hsr-facts §15.8 items 1–11).
    Validate {
        /// Trip directories.
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
        /// Print the numbers as JSON (fractions, not percentages) instead of the text report.
        #[arg(long)]
        json: bool,
        /// With --json: also each trip alone (`{"pooled": ..., "per_trip": [...]}`).
        #[arg(long, requires = "json")]
        per_trip: bool,
    },
    /// Build a failure-location table (mean failure position per cell and direction) from the
    /// event logs of previous trips.
    FailureTable {
        /// An `events.jsonl`, or a trip directory containing one; repeat for more trips.
        #[arg(long = "events", required = true, value_name = "FILE")]
        events: Vec<PathBuf>,
        /// Output table (JSON, polycorn-failure-table/1).
        #[arg(long)]
        out: PathBuf,
        /// Table version.
        #[arg(long, default_value_t = 1)]
        version: u64,
        /// A trip's route.geojson: put the route's line into the table and every entry on
        /// it, so GPS-only fixes can be placed (relay --replay-gps-only).
        #[arg(long)]
        route: Option<PathBuf>,
        /// A cell and direction needs at least this many past failures.
        #[arg(long, default_value_t = ft::DEFAULT_MIN_FAILURES)]
        min_failures: u64,
        /// ... and at least this share of its past handovers failed.
        #[arg(long, default_value_t = ft::DEFAULT_MIN_FAILURE_RATE)]
        min_failure_rate: f64,
        /// Every cell and direction handed over instead, without thresholds: one with failures
        /// at their mean position, one without at the mean position of its handovers (from a
        /// trip's own events: the oracle table plus a hold before every handover that succeeds).
        #[arg(long, conflicts_with_all = ["min_failures", "min_failure_rate"])]
        every_handover: bool,
    },
    /// Write a trip's GPS fixes as an NMEA log (GPRMC + GPGGA per fix) for gpsd's gpsfake,
    /// stamped with their UTC time from the trip's epoch.
    Nmea {
        /// The trip's `events.jsonl`, or its directory.
        #[arg(long)]
        events: PathBuf,
        /// Unix ms of the trip's time zero (the link emulator's epoch).
        #[arg(long)]
        epoch_unix_ms: i64,
        /// Leave out fixes before this Unix ms (gpsfake plays a log from its first line).
        #[arg(long)]
        from_unix_ms: Option<i64>,
        /// Output file.
        #[arg(long)]
        out: PathBuf,
    },
    /// Score a failure-location table on the handovers of other trips.
    FailureTableScore {
        /// The table.
        #[arg(long)]
        table: PathBuf,
        /// An `events.jsonl`, or a trip directory containing one; repeat for more trips.
        #[arg(long = "events", required = true, value_name = "FILE")]
        events: Vec<PathBuf>,
        /// A failure counts as located when it starts within this distance of the table's position, m.
        #[arg(long, default_value_t = 500.0)]
        window_m: f64,
    },
}

/// An `events.jsonl` path, or a trip directory's.
fn events_file(p: PathBuf) -> PathBuf {
    if p.is_dir() {
        p.join("events.jsonl")
    } else {
        p
    }
}

fn failure_table(
    events: Vec<PathBuf>,
    out: PathBuf,
    version: u64,
    route: Option<PathBuf>,
    select: Select,
) -> Result<(), Error> {
    let files: Vec<PathBuf> = events.into_iter().map(events_file).collect();
    let refs: Vec<&std::path::Path> = files.iter().map(PathBuf::as_path).collect();
    let (mut table, skipped) = ft::build_table(&refs, version, select)?;
    if let Some(r) = route {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&r)?)?;
        ft::with_route(&mut table, &v)?;
    }
    std::fs::write(&out, table.to_json() + "\n")?;
    eprintln!(
        "polycorn-tracegen: {} entries from {} trip(s) into {}{}",
        table.entries.len(),
        files.len(),
        out.display(),
        if skipped > 0 {
            format!(" ({skipped} incomplete or direction-less handovers skipped)")
        } else {
            String::new()
        }
    );
    Ok(())
}

fn failure_table_score(table: PathBuf, events: Vec<PathBuf>, window_m: f64) -> Result<(), Error> {
    let text = std::fs::read_to_string(&table)?;
    let table = FailureTableFile::parse(&text).map_err(|e| Error::Invalid(format!("{}: {e}", table.display())))?;
    let mut all = Vec::new();
    for p in events.into_iter().map(events_file) {
        all.extend(ft::read_events(&p)?.handovers);
    }
    print!("{}", ft::score(&table, &all, window_m));
    Ok(())
}

fn nmea(events: PathBuf, epoch_unix_ms: i64, from_unix_ms: Option<i64>, out: PathBuf) -> Result<(), Error> {
    let file = events_file(events);
    let text = std::fs::read_to_string(&file)?;
    let ev = polycorn_telemetry::events::parse_events(&text)
        .map_err(|e| Error::Invalid(format!("{}: {e}", file.display())))?;
    let log = polycorn_tracegen::nmea::nmea_log(&ev, epoch_unix_ms, from_unix_ms.unwrap_or(i64::MIN))
        .map_err(Error::Invalid)?;
    if log.is_empty() {
        return Err(Error::Invalid(format!("{}: no GPS fix at or after the start", file.display())));
    }
    std::fs::write(&out, log)?;
    Ok(())
}

fn validate_cmd(dirs: &[PathBuf], json: bool, per_trip: bool) -> Result<(), Error> {
    let out = match (json, per_trip) {
        (false, _) => validate(dirs)?,
        (true, false) => serde_json::to_string(&report(dirs)?)? + "\n",
        (true, true) => serde_json::to_string(&report_per_trip(dirs)?)? + "\n",
    };
    print!("{out}");
    Ok(())
}

fn main() -> ExitCode {
    let result = match Cli::parse().cmd {
        Cmd::Generate { preset, route_seed, trip_seed, duration_s, carriers, out, set } => {
            let Some(mut preset) = Preset::by_name(&preset) else {
                eprintln!("unknown preset {preset:?}; known: {}", Preset::NAMES.join(", "));
                return ExitCode::from(2);
            };
            for kv in &set {
                let hl = kv.strip_prefix("handover_loss.").and_then(|kv| kv.split_once('='));
                let r = match (&mut preset.failure_model, kv.split_once('=')) {
                    _ if hl.is_some() => {
                        hl.map_or(Ok(()), |(k, v)| preset.handover_loss.get_or_insert(HandoverLoss::DEFAULT).set(k, v))
                    }
                    (FailureModel::V2(f), Some((k, v))) => f.set(k, v),
                    (FailureModel::V2(_), None) => Err(format!("--set {kv:?}: expected KEY=VALUE")),
                    (FailureModel::V1, _) => {
                        Err(format!("--set {kv:?}: preset {} has no v2 failure model", preset.name))
                    }
                };
                if let Err(e) = r {
                    eprintln!("{e}");
                    return ExitCode::from(2);
                }
            }
            if duration_s == 0 || carriers == 0 {
                eprintln!("--duration-s and --carriers must be positive");
                return ExitCode::from(2);
            }
            let cfg = TripConfig { preset, route_seed, trip_seed, duration_s, carriers };
            write(&cfg, &generate(&cfg), &out)
        }
        Cmd::Validate { dirs, json, per_trip } => validate_cmd(&dirs, json, per_trip),
        Cmd::FailureTable { events, out, version, route, min_failures, min_failure_rate, every_handover } => {
            let select = if every_handover {
                Select::EveryHandover
            } else {
                Select::Thresholds(Thresholds { min_failures, min_failure_rate })
            };
            failure_table(events, out, version, route, select)
        }
        Cmd::FailureTableScore { table, events, window_m } => failure_table_score(table, events, window_m),
        Cmd::Nmea { events, epoch_unix_ms, from_unix_ms, out } => nmea(events, epoch_unix_ms, from_unix_ms, out),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("polycorn-tracegen: {e}");
            ExitCode::FAILURE
        }
    }
}
