//! Writing a trip: Mahimahi traces, emulator schedules, `events.jsonl`, `trip.json` and
//! `route.geojson` (the route's track as a line, for LinkDB's routes and map matching).

use std::path::Path;
use std::time::Duration;

use polycorn_emu::{Blackout, BlackoutKind, DelaySchedule, GeParams, Interpolation, LossSchedule, Schedule};
use serde::{Deserialize, Serialize};

use crate::model::{gps_error, gps_rng, Outcome, Trip, TripConfig, STEP_MS};

/// A carrier or cell index as the event log writes it.
fn idx(i: usize) -> u32 {
    u32::try_from(i).expect("carrier and cell indices fit in u32")
}
use crate::preset::Preset;
use crate::Error;

/// Bytes per Mahimahi delivery opportunity.
pub const OPPORTUNITY_BYTES: f64 = 1500.0;
/// Origin of the synthetic straight track (Beijing South, roughly) and its heading (towards
/// Shanghai, roughly).
pub const TRACK_ORIGIN: (f64, f64) = (39.865, 116.379);
/// See [`TRACK_ORIGIN`]; degrees clockwise from north.
pub const TRACK_HEADING_DEG: f64 = 160.0;

/// One line of `events.jsonl`: the shared type of `polycorn-telemetry`.
pub use polycorn_telemetry::events::TripEvent as Event;

/// Per-carrier summary in `trip.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CarrierSummary {
    /// Carrier label (A / B).
    pub label: String,
    /// Tuned β0.
    pub beta0: f64,
    /// Handovers.
    pub handovers: usize,
    /// Failed handovers (types II + III).
    pub failures: usize,
    /// Type II count.
    pub type_ii: usize,
    /// Type III count.
    pub type_iii: usize,
    /// Failures / handovers.
    pub failure_share: f64,
    /// Handovers per km travelled.
    pub handovers_per_km: f64,
    /// Share of the trip in blackout.
    pub blackout_share: f64,
    /// Mean downlink capacity including blackouts, Mbit/s.
    pub mean_down_mbps: f64,
    /// Mean one-way delay, ms.
    pub mean_delay_ms: f64,
    /// Mean random loss of the Gilbert–Elliott chain.
    pub loss_rate: f64,
}

/// `trip.json`.
#[derive(Debug, Clone, Serialize)]
pub struct TripInfo<'a> {
    /// Generator name and version.
    pub generator: String,
    /// Full preset.
    pub preset: &'a Preset,
    /// Route seed.
    pub route_seed: u64,
    /// Trip seed.
    pub trip_seed: u64,
    /// Duration, s.
    pub duration_s: u64,
    /// Carrier count.
    pub carriers: usize,
    /// Distance travelled, m.
    pub distance_m: f64,
    /// Per carrier.
    pub summary: Vec<CarrierSummary>,
}

/// Converts per-step capacity (Mbit/s, piecewise constant over 10 ms) to Mahimahi opportunity
/// timestamps: per millisecond, the bytes the capacity allows are added to an accumulator
/// (nothing during a blackout), and each time 1500 bytes are available a timestamp equal to the
/// end of that millisecond is emitted (so no line is 0). The leftover is carried over, never
/// lost. A final line at the trip's end is added if needed so that the trace's period equals the
/// trip's duration (at most one extra opportunity).
pub fn mahimahi(mbps: &[f32], blackouts: &[(u64, u64)], duration_ms: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut acc = 0.0f64;
    let mut b = 0;
    for ms in 0..duration_ms {
        while b < blackouts.len() && blackouts[b].1 <= ms {
            b += 1;
        }
        if b < blackouts.len() && blackouts[b].0 <= ms {
            continue;
        }
        let step = ((ms / STEP_MS) as usize).min(mbps.len().saturating_sub(1));
        acc += f64::from(mbps.get(step).copied().unwrap_or(0.0)) * 1e6 / 8.0 / 1000.0;
        while acc >= OPPORTUNITY_BYTES {
            acc -= OPPORTUNITY_BYTES;
            out.push(ms + 1);
        }
    }
    if out.last().is_none_or(|&l| l < duration_ms) {
        out.push(duration_ms.max(1));
    }
    out
}

fn text_of(ms: &[u64]) -> String {
    let mut s = String::with_capacity(ms.len() * 7);
    for m in ms {
        s.push_str(&m.to_string());
        s.push('\n');
    }
    s
}

/// The emulator schedule of carrier `i`: one-way delay per 10 ms step (step interpolation,
/// rounded to 0.1 ms, repeated values skipped), the carrier's Gilbert–Elliott chain with the
/// preset's loss windows around handovers ([`crate::HandoverLoss`]), and one blackout per
/// handover (hold for types I/II, flush for III).
pub fn schedule(cfg: &TripConfig, trip: &Trip, i: usize) -> Result<Schedule, Error> {
    let ct = &trip.carriers[i];
    let c = cfg.preset.carrier(i);
    let mut points: Vec<(Duration, Duration)> = Vec::new();
    let mut last = None;
    for (k, d) in ct.delay_ms.iter().enumerate() {
        let us = (f64::from(*d) * 10.0).round() as u64 * 100;
        if last != Some(us) {
            points.push((Duration::from_millis(k as u64 * STEP_MS), Duration::from_micros(us)));
            last = Some(us);
        }
    }
    let delay = DelaySchedule::new(points, Interpolation::Step)?;
    let base = GeParams::from_mean(c.loss_rate, cfg.preset.mean_bad_run)?;
    let mut loss_points = vec![(Duration::ZERO, base)];
    if let Some(hl) = cfg.preset.handover_loss {
        // Independent loss at `rate` inside a window: the chain stays in its good state there.
        let window = GeParams::new(0.0, 1.0, hl.rate, hl.rate)?;
        let duration_ms = cfg.duration_s * 1000;
        for (a, b) in hl.windows(&blackouts(trip, i), duration_ms) {
            let (a, b) = (Duration::from_millis(a), Duration::from_millis(b));
            match loss_points.last_mut() {
                Some(last) if last.0 == a => last.1 = window,
                _ => loss_points.push((a, window)),
            }
            loss_points.push((b, base));
        }
    }
    let loss = LossSchedule::new(loss_points)?;
    let blackouts = ct
        .handovers
        .iter()
        .map(|h| Blackout {
            start: Duration::from_millis(h.start_ms),
            end: Duration::from_millis(h.end_ms),
            kind: if h.flush { BlackoutKind::Flush } else { BlackoutKind::Hold },
        })
        .collect();
    let s = Schedule { delay, loss, blackouts };
    s.validate()?;
    Ok(s)
}

/// Blackout intervals of carrier `i`, ms.
pub fn blackouts(trip: &Trip, i: usize) -> Vec<(u64, u64)> {
    trip.carriers[i].handovers.iter().map(|h| (h.start_ms, h.end_ms)).collect()
}

/// The WGS 84 (lat, lon) of track position `x` m, moved `east`/`north` m (GPS error):
/// a straight track from [`TRACK_ORIGIN`] along [`TRACK_HEADING_DEG`], on a local flat
/// approximation (111,320 m per degree of latitude).
pub fn track_point(x: f64, east: f64, north: f64) -> (f64, f64) {
    let h = TRACK_HEADING_DEG.to_radians();
    let m_per_deg_lat = 111_320.0;
    let m_per_deg_lon = m_per_deg_lat * TRACK_ORIGIN.0.to_radians().cos();
    (TRACK_ORIGIN.0 + (x * h.cos() + north) / m_per_deg_lat, TRACK_ORIGIN.1 + (x * h.sin() + east) / m_per_deg_lon)
}

/// The route's track as GeoJSON (`route.geojson`): the same straight line for every trip of
/// a route seed (id `r<route seed>`), a vertex every kilometre from the origin to past the
/// trip's end (rounded up to 10 km), drawn in the direction of increasing track position.
/// `polycorn-ingest import-routes` stores it; LinkDB's measures along it are geodesic, within
/// about 0.3 % of the generator's `track_m` (its flat approximation).
pub fn route_geojson(cfg: &TripConfig, distance_m: f64) -> serde_json::Value {
    let end_km = ((distance_m + 2000.0) / 10_000.0).ceil() as usize * 10;
    let coords: Vec<[f64; 2]> = (0..=end_km)
        .map(|k| {
            let (lat, lon) = track_point(k as f64 * 1000.0, 0.0, 0.0);
            [lon, lat]
        })
        .collect();
    serde_json::json!({
        "type": "FeatureCollection",
        "features": [{
            "type": "Feature",
            "properties": {
                "route": format!("r{}", cfg.route_seed),
                "name": format!("polycorn-tracegen route {}", cfg.route_seed),
                "generator": format!("polycorn-tracegen {}", env!("CARGO_PKG_VERSION")),
            },
            "geometry": {"type": "LineString", "coordinates": coords},
        }],
    })
}

/// All events, sorted by time (stable: equal times keep generation order).
pub fn events(cfg: &TripConfig, trip: &Trip) -> Vec<Event> {
    let p = &cfg.preset;
    let mut ev = Vec::new();
    let mut gps = gps_rng(cfg.trip_seed);
    let per_s = (1000 / STEP_MS) as usize;
    for k in (0..trip.x_m.len()).step_by(per_s) {
        let x = trip.x_m[k];
        let (ee, en) = gps_error(&mut gps, p.gps_error_max_m);
        let (lat, lon) = track_point(x, ee, en);
        ev.push(Event::Gps {
            t_ms: k as u64 * STEP_MS,
            lat,
            lon,
            speed_mps: trip.v_mps[k],
            heading_deg: TRACK_HEADING_DEG,
            accuracy_m: p.gps_error_max_m,
            track_m: x,
        });
    }
    for (i, ct) in trip.carriers.iter().enumerate() {
        for r in &ct.rsrp {
            ev.push(Event::Rsrp {
                t_ms: r.reported_ms,
                measured_ms: r.measured_ms,
                carrier: idx(i),
                cell: idx(r.cell),
                rsrp_dbm: r.rsrp_dbm,
            });
        }
        for ho in &ct.handovers {
            let to_cell = ho.from_cell + 1;
            ev.push(Event::HandoverStart {
                t_ms: ho.start_ms,
                carrier: idx(i),
                from_cell: idx(ho.from_cell),
                to_cell: idx(to_cell),
                track_m: ho.x_m,
                delta_m: ho.delta_m,
                rsrp_dbm: (ho.rsrp_dbm * 10.0).round() / 10.0,
                trigger_track_m: ho.trigger_m.map(|x| (x * 10.0).round() / 10.0),
                too_late: ho.too_late,
            });
            ev.push(Event::HandoverEnd {
                t_ms: ho.end_ms,
                carrier: idx(i),
                from_cell: idx(ho.from_cell),
                to_cell: idx(to_cell),
                outcome: ho.outcome,
                ho_type: ho.outcome.ho_type(),
                duration_ms: ho.end_ms - ho.start_ms,
                blackout: if ho.flush { "flush" } else { "hold" }.into(),
                track_m: ho.x_m,
            });
            ev.push(Event::CellChange { t_ms: ho.end_ms, carrier: idx(i), cell: idx(to_cell) });
        }
    }
    ev.sort_by_key(Event::t_ms);
    ev
}

/// Summary statistics of carrier `i`.
pub fn summary(cfg: &TripConfig, trip: &Trip, i: usize) -> CarrierSummary {
    let ct = &trip.carriers[i];
    let c = cfg.preset.carrier(i);
    let dur_ms = cfg.duration_s * 1000;
    let failures = ct.handovers.iter().filter(|h| h.outcome.failed()).count();
    let count = |o| ct.handovers.iter().filter(|h| h.outcome == o).count();
    let dark: u64 = ct.handovers.iter().map(|h| h.end_ms.min(dur_ms) - h.start_ms.min(dur_ms)).sum();
    let dist_km = trip.x_m.last().copied().unwrap_or(0.0) / 1000.0;
    let n = ct.down_mbps.len().max(1) as f64;
    let trace = mahimahi(&ct.down_mbps, &blackouts(trip, i), dur_ms);
    CarrierSummary {
        label: c.label.into(),
        beta0: ct.beta0,
        handovers: ct.handovers.len(),
        failures,
        type_ii: count(Outcome::Rlf),
        type_iii: count(Outcome::Nas),
        failure_share: if ct.handovers.is_empty() { 0.0 } else { failures as f64 / ct.handovers.len() as f64 },
        handovers_per_km: if dist_km > 0.0 { ct.handovers.len() as f64 / dist_km } else { 0.0 },
        blackout_share: dark as f64 / dur_ms.max(1) as f64,
        mean_down_mbps: trace.len() as f64 * OPPORTUNITY_BYTES * 8.0 / 1e6 / cfg.duration_s.max(1) as f64,
        mean_delay_ms: ct.delay_ms.iter().map(|&d| f64::from(d)).sum::<f64>() / n,
        loss_rate: c.loss_rate,
    }
}

/// Writes the trip's files into `dir` (created if missing).
pub fn write(cfg: &TripConfig, trip: &Trip, dir: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(dir)?;
    let dur_ms = cfg.duration_s * 1000;
    for i in 0..trip.carriers.len() {
        let bo = blackouts(trip, i);
        let ct = &trip.carriers[i];
        std::fs::write(dir.join(format!("c{i}.down")), text_of(&mahimahi(&ct.down_mbps, &bo, dur_ms)))?;
        std::fs::write(dir.join(format!("c{i}.up")), text_of(&mahimahi(&ct.up_mbps, &bo, dur_ms)))?;
        let mut text = format!(
            "# polycorn-tracegen {} preset={} route_seed={} trip_seed={} carrier={i}\n",
            env!("CARGO_PKG_VERSION"),
            cfg.preset.name,
            cfg.route_seed,
            cfg.trip_seed
        );
        text.push_str(&schedule(cfg, trip, i)?.to_string());
        std::fs::write(dir.join(format!("c{i}.schedule")), text)?;
    }
    let mut lines = String::new();
    for e in events(cfg, trip) {
        lines.push_str(&serde_json::to_string(&e)?);
        lines.push('\n');
    }
    std::fs::write(dir.join("events.jsonl"), lines)?;
    let info = TripInfo {
        generator: format!("polycorn-tracegen {}", env!("CARGO_PKG_VERSION")),
        preset: &cfg.preset,
        route_seed: cfg.route_seed,
        trip_seed: cfg.trip_seed,
        duration_s: cfg.duration_s,
        carriers: trip.carriers.len(),
        distance_m: trip.x_m.last().copied().unwrap_or(0.0),
        summary: (0..trip.carriers.len()).map(|i| summary(cfg, trip, i)).collect(),
    };
    std::fs::write(dir.join("trip.json"), serde_json::to_string_pretty(&info)? + "\n")?;
    let route = route_geojson(cfg, info.distance_m);
    std::fs::write(dir.join("route.geojson"), serde_json::to_string(&route)? + "\n")?;
    Ok(())
}
