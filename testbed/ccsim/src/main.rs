//! `polycorn-ccsim`: replays carriers of generated trips with controller
//! variants side by side, in virtual time, and prints one JSON object per
//! run on stdout.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use polycorn_ccsim::{run, Carrier, SimConfig};
use polycorn_core::cc::{Railway, RailwayConfig};
use serde_json::json;

#[derive(Parser)]
#[command(about = "Subflow congestion controllers over generated trips, in virtual time")]
struct Cli {
    /// Trip directories (`polycorn-tracegen generate --out DIR`).
    #[arg(long = "trip", required = true)]
    trips: Vec<PathBuf>,
    /// Carriers of each trip to replay.
    #[arg(long = "carrier", default_values_t = [0usize])]
    carriers: Vec<usize>,
    /// The sender is busy from this second of the trip ...
    #[arg(long, default_value_t = 45.0)]
    from_s: f64,
    /// ... to this one.
    #[arg(long, default_value_t = 165.0)]
    to_s: f64,
    /// The carriers' droptail buffer (the testbed's default).
    #[arg(long, default_value_t = 3_000_000)]
    buffer_bytes: usize,
    /// NAME or NAME:KEY=VALUE,KEY=VALUE: a variant of the railway
    /// controller's configuration (keys: the fields of RailwayConfig,
    /// durations in ms, gain_cycle as a list separated by `/`; and
    /// hint_delay_ms, the handover hints' delay, absent: no hints).
    #[arg(long = "variant", default_values_t = ["railway".to_string()])]
    variants: Vec<String>,
    /// Print a line per second of each run on stderr.
    #[arg(long)]
    timeline: bool,
}

fn ms(v: &str) -> Result<Duration, String> {
    let x: f64 = v.parse().map_err(|e| format!("{v}: {e}"))?;
    if !(x.is_finite() && x >= 0.0) {
        return Err(format!("{v}: not a duration in ms"));
    }
    Ok(Duration::from_secs_f64(x / 1e3))
}

fn num<T: std::str::FromStr>(v: &str) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    v.parse().map_err(|e| format!("{v}: {e}"))
}

fn variant(spec: &str) -> Result<(String, RailwayConfig, Option<Duration>), String> {
    let (name, rest) = spec.split_once(':').unwrap_or((spec, ""));
    let mut cfg = RailwayConfig::default();
    let mut hint_delay = None;
    for kv in rest.split(',').filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=').ok_or_else(|| format!("{kv}: want KEY=VALUE"))?;
        match k {
            "initial_window" => cfg.initial_window = num(v)?,
            "target_queue_delay" => cfg.target_queue_delay = ms(v)?,
            "rtprop_window" => cfg.rtprop_window = ms(v)?,
            "rtprop_floor_window" => cfg.rtprop_floor_window = ms(v)?,
            "rtprop_swing" => cfg.rtprop_swing = num(v)?,
            "bw_rounds" => cfg.bw_rounds = num(v)?,
            "bw_max_age" => cfg.bw_max_age = ms(v)?,
            "loss_tolerance" => cfg.loss_tolerance = num(v)?,
            "outage_queue_delay" => cfg.outage_queue_delay = ms(v)?,
            "max_hold" => cfg.max_hold = ms(v)?,
            "drain_interval" => cfg.drain_interval = if v == "none" { None } else { Some(ms(v)?) },
            "drain_max_rounds" => cfg.drain_max_rounds = num(v)?,
            "slowdown" => cfg.slowdown = num(v)?,
            "max_queue_delay" => cfg.max_queue_delay = ms(v)?,
            "gain_cycle" => cfg.gain_cycle = v.split('/').map(num).collect::<Result<_, _>>()?,
            "surge_queue_delay" => cfg.surge_queue_delay = ms(v)?,
            "variability_lo" => cfg.variability.0 = num(v)?,
            "variability_hi" => cfg.variability.1 = num(v)?,
            "variability_rounds" => cfg.variability_rounds = num(v)?,
            "hint_delay_ms" => hint_delay = Some(ms(v)?),
            _ => return Err(format!("{k}: no such key")),
        }
    }
    Ok((name.to_string(), cfg, hint_delay))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let variants = match cli.variants.iter().map(|v| variant(v)).collect::<Result<Vec<_>, _>>() {
        Ok(v) => v,
        Err(e) => {
            eprintln!("polycorn-ccsim: --variant {e}");
            return ExitCode::from(2);
        }
    };
    if !(cli.from_s >= 0.0 && cli.to_s > cli.from_s) {
        eprintln!("polycorn-ccsim: want 0 <= --from-s < --to-s");
        return ExitCode::from(2);
    }
    for trip in &cli.trips {
        for &c in &cli.carriers {
            for (name, rcfg, hint_delay) in &variants {
                let mut carrier = match Carrier::load(trip, c, cli.buffer_bytes) {
                    Ok(x) => x,
                    Err(e) => {
                        eprintln!("polycorn-ccsim: {e}");
                        return ExitCode::FAILURE;
                    }
                };
                let sim = SimConfig {
                    busy_from: Duration::from_secs_f64(cli.from_s),
                    until: Duration::from_secs_f64(cli.to_s),
                    hint_delay: *hint_delay,
                    timeline: cli.timeline,
                    ..SimConfig::default()
                };
                let mut cc = Railway::new(rcfg.clone(), Instant::now());
                let o = run(&mut carrier, &mut cc, &sim);
                for l in &o.timeline {
                    eprintln!("{name} {l}");
                }
                let st = cc.stats();
                let line = json!({
                    "variant": name,
                    "trip": trip.file_name().map(|n| n.to_string_lossy().into_owned()),
                    "carrier": c,
                    "share": o.share(),
                    "delivered_bytes": o.delivered,
                    "capacity_bytes": o.capacity,
                    "acked_bytes": o.acked,
                    "sojourn_p50_ms": o.sojourn_p50.as_secs_f64() * 1e3,
                    "sojourn_p95_ms": o.sojourn_p95.as_secs_f64() * 1e3,
                    "lost_packets": o.lost_packets,
                    "probe_timeouts": o.probe_timeouts,
                    "stats": {
                        "outages_held": st.outages_held,
                        "outages_congested": st.outages_congested,
                        "loss_backoffs": st.loss_backoffs,
                        "lossy_rounds_tolerated": st.lossy_rounds_tolerated,
                        "handovers_held": st.handovers_held,
                        "slowdowns": st.slowdowns,
                        "queue_ceilings": st.queue_ceilings,
                    },
                });
                println!("{line}");
            }
        }
    }
    ExitCode::SUCCESS
}
