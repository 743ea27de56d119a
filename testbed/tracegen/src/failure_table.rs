//! Stand-in failure-location table builder (`polycorn-tracegen failure-table`): what LinkDB and the
//! trainer will publish, built here from the `events.jsonl` of previous trips.
//!
//! Each handover is keyed by ⟨source cell, direction of travel⟩ (PC §2.3 footnote 4): the cell ID is
//! [`polycorn_telemetry::testbed_cell_id`]`(carrier, from_cell)`, the direction comes from the GPS
//! track around the handover's start. A handover failed when its `handover_end` outcome is anything
//! but `success` (the generator writes `success`, `rlf` for type II and `nas` for type III). The
//! predicted failure location of a key is POLYCORN's (§3): the mean track position (`handover_start`
//! `track_m`) of its past failures. A key enters the table when it has at least `min_failures`
//! failures and a failure share of at least `min_failure_rate`, or, with [`Select::EveryHandover`],
//! whenever it was handed over.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use polycorn_telemetry::events::TripEvent;
use polycorn_telemetry::failure_table::{Direction, Entry, FailureTableFile};
use polycorn_telemetry::testbed_cell_id;
use serde::Deserialize;

use crate::Error;

/// Default of `--min-failures`: see the crate README ("Failure-location tables").
pub const DEFAULT_MIN_FAILURES: u64 = 3;
/// Default of `--min-failure-rate`: see the crate README ("Failure-location tables").
pub const DEFAULT_MIN_FAILURE_RATE: f64 = 0.2;
/// Track movement (m) between two GPS fixes that decides the direction of travel; smaller
/// movements (a stopped train) widen the window. The data plane's `TrainTracker` uses the same.
pub const MIN_MOVE_M: f64 = 5.0;
/// GPS fixes further than this (ms) from a handover's start are not used for its direction.
pub const DIRECTION_WINDOW_MS: u64 = 120_000;

/// One past handover, as the table builder sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct PastHandover {
    /// Data-plane cell ID of the source cell ([`testbed_cell_id`]).
    pub cell: u64,
    /// Carrier index in the event log.
    pub carrier: u32,
    /// Source cell index in the event log.
    pub from_cell: u32,
    /// Direction of travel.
    pub direction: Direction,
    /// Start time, ms since the trip's start.
    pub t_ms: u64,
    /// Track position at the start, m.
    pub track_m: f64,
    /// Train speed at the GPS fix nearest to the start, m/s.
    pub speed_mps: f64,
    /// Outcome other than `success`.
    pub failed: bool,
}

/// The handovers of one event log.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TripHandovers {
    /// Complete handovers with a direction.
    pub handovers: Vec<PastHandover>,
    /// Handovers left out: no `handover_end` (trip ended), no matching `handover_start`, or no
    /// direction (no GPS fixes that moved within [`DIRECTION_WINDOW_MS`]).
    pub skipped: usize,
}

#[derive(Deserialize)]
struct Tag {
    event: String,
}

/// A handover start, until its end is read.
struct HoStart {
    t_ms: u64,
    carrier: u32,
    from_cell: u32,
    track_m: f64,
}

fn line_error(file: &str, line: usize, msg: impl fmt::Display) -> Error {
    Error::Invalid(format!("{file}:{line}: {msg}"))
}

/// A JSON error without serde's "at line 1 column N" (the line is the file's), with the column.
fn json_message(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let msg = text.rsplit_once(" at line ").map_or(text.as_str(), |(m, _)| m);
    format!("{msg} (column {})", e.column())
}

fn parse_line<'a, T: Deserialize<'a>>(text: &'a str, file: &str, line: usize, what: &str) -> Result<T, Error> {
    serde_json::from_str(text)
        .map_err(|e| line_error(file, line, format_args!("bad {what} event: {}", json_message(&e))))
}

/// Reads the handovers of one `events.jsonl` (see [`parse_events`]).
pub fn read_events(path: &Path) -> Result<TripHandovers, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))?;
    parse_events(&text, &path.display().to_string())
}

/// Extracts the handovers of an event log (`file` names it in errors). Lines that are not JSON
/// objects with a string `event`, and `gps`, `handover_start` and `handover_end` lines without
/// their fields, are errors naming `file` and the line number; other event kinds and unknown fields
/// are ignored; blank lines are allowed.
pub fn parse_events(text: &str, file: &str) -> Result<TripHandovers, Error> {
    let mut gps: Vec<(u64, f64, f64)> = Vec::new();
    // The started, not yet ended handover of each carrier.
    let mut open: BTreeMap<u32, HoStart> = BTreeMap::new();
    let mut done: Vec<(HoStart, bool)> = Vec::new();
    let mut skipped = 0;
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let raw = raw.trim();
        if raw.is_empty() {
            continue;
        }
        let tag: Tag = serde_json::from_str(raw).map_err(|e| {
            line_error(file, line, format_args!("not an event (a JSON object with an \"event\"): {}", json_message(&e)))
        })?;
        // Only the kinds read here are parsed: another kind, even malformed, is not ours to judge.
        if !matches!(tag.event.as_str(), "gps" | "handover_start" | "handover_end") {
            continue;
        }
        let event: TripEvent = parse_line(raw, file, line, &tag.event)?;
        match event {
            TripEvent::Gps { t_ms, track_m, speed_mps, .. } => {
                if !track_m.is_finite() {
                    return Err(line_error(file, line, "gps track_m is not a finite number"));
                }
                gps.push((t_ms, track_m, speed_mps));
            }
            TripEvent::HandoverStart { t_ms, carrier, from_cell, track_m, .. } => {
                if !track_m.is_finite() {
                    return Err(line_error(file, line, "handover_start track_m is not a finite number"));
                }
                if open.insert(carrier, HoStart { t_ms, carrier, from_cell, track_m }).is_some() {
                    // The previous one of this carrier never ended.
                    skipped += 1;
                }
            }
            TripEvent::HandoverEnd { carrier, from_cell, outcome, .. } => match open.remove(&carrier) {
                Some(s) if s.from_cell == from_cell => done.push((s, outcome.failed())),
                // Not the open one's end: both are incomplete.
                Some(_) => skipped += 2,
                None => skipped += 1,
            },
            _ => {}
        }
    }
    skipped += open.len();
    gps.sort_by_key(|g| g.0);
    let mut handovers = Vec::with_capacity(done.len());
    for (s, failed) in done {
        let Some(direction) = direction_at(&gps, s.t_ms) else {
            skipped += 1;
            continue;
        };
        handovers.push(PastHandover {
            cell: testbed_cell_id(s.carrier, s.from_cell),
            carrier: s.carrier,
            from_cell: s.from_cell,
            direction,
            t_ms: s.t_ms,
            track_m: s.track_m,
            speed_mps: speed_at(&gps, s.t_ms),
            failed,
        });
    }
    Ok(TripHandovers { handovers, skipped })
}

/// Direction of travel at `t_ms` from GPS fixes `(t_ms, track_m, speed)` sorted by time: the
/// sign of the track movement over the smallest window of fixes around `t_ms` (widened one fix at
/// a time, on the side whose next fix is nearer in time) that moved at least [`MIN_MOVE_M`],
/// using fixes within [`DIRECTION_WINDOW_MS`] of `t_ms`.
pub fn direction_at(gps: &[(u64, f64, f64)], t_ms: u64) -> Option<Direction> {
    let near = |k: usize| gps[k].0.abs_diff(t_ms) <= DIRECTION_WINDOW_MS;
    let split = gps.partition_point(|g| g.0 <= t_ms);
    // Window [lo, hi] of fix indices, starting with the fixes just before and after t_ms.
    let (mut lo, mut hi) = match (split.checked_sub(1), split < gps.len()) {
        (Some(b), true) => (b, split),
        (Some(b), false) => (b, b),
        (None, true) => (split, split),
        (None, false) => return None,
    };
    if !near(lo) && !near(hi) {
        return None;
    }
    loop {
        let moved = gps[hi].1 - gps[lo].1;
        if moved.abs() >= MIN_MOVE_M {
            return Some(if moved > 0.0 { Direction::Increasing } else { Direction::Decreasing });
        }
        let can_lo = lo > 0 && near(lo - 1);
        let can_hi = hi + 1 < gps.len() && near(hi + 1);
        match (can_lo, can_hi) {
            (false, false) => return None,
            (true, false) => lo -= 1,
            (false, true) => hi += 1,
            (true, true) => {
                if gps[lo - 1].0.abs_diff(t_ms) <= gps[hi + 1].0.abs_diff(t_ms) {
                    lo -= 1;
                } else {
                    hi += 1;
                }
            }
        }
    }
}

/// Speed of the GPS fix nearest in time to `t_ms` (0 without fixes).
fn speed_at(gps: &[(u64, f64, f64)], t_ms: u64) -> f64 {
    gps.iter().min_by_key(|g| g.0.abs_diff(t_ms)).map_or(0.0, |g| g.2)
}

/// Inclusion thresholds of a key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    /// At least this many failures (≥ 1: a location needs one).
    pub min_failures: u64,
    /// And at least this share of its handovers failed.
    pub min_failure_rate: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds { min_failures: DEFAULT_MIN_FAILURES, min_failure_rate: DEFAULT_MIN_FAILURE_RATE }
    }
}

/// Per-key counts over past handovers.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct KeyStats {
    /// All handovers.
    pub handovers: u64,
    /// Failed ones.
    pub failures: u64,
    /// Sum of the failures' track positions, m.
    pub failure_track_sum_m: f64,
    /// Sum of every handover's track position, m.
    pub track_sum_m: f64,
}

/// A ⟨cell, direction⟩ key that orders (`Direction` is not `Ord`): increasing first.
fn key(cell: u64, d: Direction) -> (u64, u8) {
    (cell, u8::from(d == Direction::Decreasing))
}

fn direction_of(k: u8) -> Direction {
    if k == 0 {
        Direction::Increasing
    } else {
        Direction::Decreasing
    }
}

/// Counts per ⟨cell, direction⟩, in (cell, direction) order.
pub fn key_stats<'a>(handovers: impl IntoIterator<Item = &'a PastHandover>) -> Vec<((u64, Direction), KeyStats)> {
    let mut m: BTreeMap<(u64, u8), KeyStats> = BTreeMap::new();
    for h in handovers {
        let s = m.entry(key(h.cell, h.direction)).or_default();
        s.handovers += 1;
        s.track_sum_m += h.track_m;
        if h.failed {
            s.failures += 1;
            s.failure_track_sum_m += h.track_m;
        }
    }
    m.into_iter().map(|((c, d), s)| ((c, direction_of(d)), s)).collect()
}

/// Which keys enter a table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Select {
    /// Keys that pass both thresholds, at the mean position of their failures.
    Thresholds(Thresholds),
    /// Every key handed over: one with failures at their mean position, one without at the mean
    /// position of its handovers. Built from a trip's own events, this is the oracle table plus a
    /// hold before every handover that succeeds: what holding costs when nothing is missed
    /// (`make bench-hsr PROFILE=costs`).
    EveryHandover,
}

impl From<Thresholds> for Select {
    fn from(th: Thresholds) -> Self {
        Select::Thresholds(th)
    }
}

/// Rounded to 0.1 m, as every table position.
fn decimetre(m: f64) -> f64 {
    (m * 10.0).round() / 10.0
}

/// The table entries for past handovers: one per key that `select` admits, in (cell, direction)
/// order.
pub fn build_entries<'a>(
    handovers: impl IntoIterator<Item = &'a PastHandover>,
    select: impl Into<Select>,
) -> Vec<Entry> {
    let select = select.into();
    key_stats(handovers)
        .into_iter()
        .filter_map(|((cell, direction), s)| {
            let position_m = match select {
                Select::Thresholds(th) => {
                    let passes = s.failures >= th.min_failures.max(1)
                        && s.failures as f64 >= th.min_failure_rate * s.handovers as f64;
                    passes.then(|| s.failure_track_sum_m / s.failures as f64)?
                }
                Select::EveryHandover if s.failures > 0 => s.failure_track_sum_m / s.failures as f64,
                Select::EveryHandover => s.track_sum_m / s.handovers as f64,
            };
            Some(Entry {
                cell,
                direction,
                position_m: decimetre(position_m),
                failures: Some(s.failures),
                handovers: Some(s.handovers),
                route: None,
                lat: None,
                lon: None,
            })
        })
        .collect()
}

/// Builds the table file from event logs (`failure-table` subcommand). Returns it with the number
/// of handovers skipped.
pub fn build_table(
    events: &[&Path],
    version: u64,
    select: impl Into<Select>,
) -> Result<(FailureTableFile, usize), Error> {
    let select = select.into();
    if let Select::Thresholds(th) = select {
        if th.min_failures == 0 {
            return Err(Error::Invalid("--min-failures must be at least 1 (a location needs a failure)".into()));
        }
        if !(0.0..=1.0).contains(&th.min_failure_rate) {
            return Err(Error::Invalid("--min-failure-rate must be in [0, 1]".into()));
        }
    }
    let mut all = Vec::new();
    let mut skipped = 0;
    for p in events {
        let t = read_events(p)?;
        all.extend(t.handovers);
        skipped += t.skipped;
    }
    let failures = all.iter().filter(|h| h.failed).count();
    let entries = build_entries(&all, select);
    let files: Vec<String> = events.iter().map(|p| p.display().to_string()).collect();
    let rule = match select {
        Select::Thresholds(th) => format!(
            "min_failures {}, min_failure_rate {}; mean failure position per (cell, direction)",
            th.min_failures, th.min_failure_rate
        ),
        Select::EveryHandover => "every handover; mean failure position per (cell, direction), \
                                  else mean handover position"
            .to_string(),
    };
    let source = format!(
        "polycorn-tracegen {} failure-table: {} trip(s), {} handovers, {} failures, {rule}; events: {}",
        env!("CARGO_PKG_VERSION"),
        events.len(),
        all.len(),
        failures,
        files.join(", ")
    );
    let mut f = FailureTableFile::new(version, source);
    f.entries = entries;
    Ok((f, skipped))
}

/// How a table fares on other trips' handovers (`failure-table-score`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Score {
    /// Handovers scored.
    pub handovers: u64,
    /// Failures among them.
    pub failures: u64,
    /// Failures out of a tabled key.
    pub failures_in_tabled: u64,
    /// Failures out of a tabled key within ± `window_m` of its position.
    pub failures_within: u64,
    /// Successful handovers out of a tabled key.
    pub successes_in_tabled: u64,
    /// All handovers out of a tabled key.
    pub handovers_in_tabled: u64,
    /// Window, m.
    pub window_m: f64,
    /// Failures in tabled keys by the paper's timing (PC §3, Fig. 6): Δ = t_HO − t̂_HOF, the time
    /// from passing the predicted location to the handover's start at the handover's speed;
    /// late: Δ < 0, correct: 0 ≤ Δ ≤ 2.5 s, early: Δ > 2.5 s.
    pub late: u64,
    /// See [`Self::late`].
    pub correct: u64,
    /// See [`Self::late`].
    pub early: u64,
}

impl Score {
    /// Window of the paper's "correct" prediction, s (PC §3: t1 = 0, t2 = 2.5 s).
    pub const PAPER_T2_S: f64 = 2.5;
}

/// Scores `table` on `handovers` (of trips not used to build it).
pub fn score(table: &FailureTableFile, handovers: &[PastHandover], window_m: f64) -> Score {
    let pos: BTreeMap<(u64, u8), f64> =
        table.entries.iter().map(|e| (key(e.cell, e.direction), e.position_m)).collect();
    let mut s = Score { window_m, ..Score::default() };
    for h in handovers {
        s.handovers += 1;
        s.failures += u64::from(h.failed);
        let Some(&p) = pos.get(&key(h.cell, h.direction)) else { continue };
        s.handovers_in_tabled += 1;
        if !h.failed {
            s.successes_in_tabled += 1;
            continue;
        }
        s.failures_in_tabled += 1;
        if (h.track_m - p).abs() <= window_m {
            s.failures_within += 1;
        }
        // Distance travelled from the predicted location to the handover.
        let ahead = match h.direction {
            Direction::Increasing => h.track_m - p,
            Direction::Decreasing => p - h.track_m,
        };
        let dt = if h.speed_mps > 0.0 { ahead / h.speed_mps } else { ahead.signum() * f64::INFINITY };
        if dt < 0.0 {
            s.late += 1;
        } else if dt <= Score::PAPER_T2_S {
            s.correct += 1;
        } else {
            s.early += 1;
        }
    }
    s
}

impl fmt::Display for Score {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pct = |a: u64, b: u64| if b == 0 { 0.0 } else { 100.0 * a as f64 / b as f64 };
        writeln!(f, "handovers {}, failures {}", self.handovers, self.failures)?;
        writeln!(
            f,
            "failures in a tabled cell within ±{} m of its position: {} of {} ({:.1}%) [in a tabled cell at all: {}]",
            self.window_m,
            self.failures_within,
            self.failures,
            pct(self.failures_within, self.failures),
            self.failures_in_tabled
        )?;
        writeln!(
            f,
            "handovers out of tabled cells: {} ({} failed = {:.1}%, {} successful)",
            self.handovers_in_tabled,
            self.failures_in_tabled,
            pct(self.failures_in_tabled, self.handovers_in_tabled),
            self.successes_in_tabled
        )?;
        writeln!(
            f,
            "paper timing of failures in tabled cells (PC §3; Δ = t_HO − t_HOF): late (Δ < 0) {}, correct (0–2.5 s) {}, \
             early (> 2.5 s) {}",
            self.late, self.correct, self.early
        )
    }
}

/// Put a generated route (`route.geojson` as [`crate::output::route_geojson`] writes it)
/// into a table: its line in `routes`, each vertex's measure the generator's own flat
/// distance along it (so equal to the trips' `track_m`), and every entry on it. A relay or
/// proxy can then place GPS-only fixes on the table's scale.
pub fn with_route(table: &mut FailureTableFile, route: &serde_json::Value) -> Result<(), Error> {
    let bad = |why: &str| Error::Invalid(format!("route: {why}"));
    let f = &route["features"][0];
    let id = f["properties"]["route"].as_str().ok_or_else(|| bad("no features[0].properties.route"))?;
    let coords: Vec<[f64; 2]> = f["geometry"]["coordinates"]
        .as_array()
        .ok_or_else(|| bad("no LineString coordinates"))?
        .iter()
        .map(|c| Some([c.get(0)?.as_f64()?, c.get(1)?.as_f64()?]))
        .collect::<Option<_>>()
        .ok_or_else(|| bad("a vertex is not [lon, lat]"))?;
    if coords.len() < 2 {
        return Err(bad("fewer than 2 vertices"));
    }
    let m_per_deg_lat = 111_320.0;
    let m_per_deg_lon = m_per_deg_lat * coords[0][1].to_radians().cos();
    let mut measures = vec![0.0];
    for w in coords.windows(2) {
        let (dx, dy) = ((w[1][0] - w[0][0]) * m_per_deg_lon, (w[1][1] - w[0][1]) * m_per_deg_lat);
        measures.push(measures.last().copied().unwrap_or(0.0) + dx.hypot(dy));
    }
    for e in &mut table.entries {
        e.route = Some(id.to_string());
    }
    table.routes = vec![polycorn_telemetry::failure_table::RouteLine { id: id.to_string(), coords, measures }];
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gps(t_s: u64, track_m: f64) -> String {
        format!(
            r#"{{"event":"gps","t_ms":{},"lat":0,"lon":0,"speed_mps":80,"heading_deg":0,"accuracy_m":20,"track_m":{track_m}}}"#,
            t_s * 1000
        )
    }

    /// A handover of `carrier` out of `cell` at `t_s` and `track_m`, ending 100 ms later.
    fn ho(t_s: u64, carrier: u32, cell: u32, track_m: f64, outcome: &str) -> [String; 2] {
        let t = t_s * 1000;
        [
            format!(
                r#"{{"event":"handover_start","t_ms":{t},"carrier":{carrier},"from_cell":{cell},"to_cell":{},"track_m":{track_m},"delta_m":10,"rsrp_dbm":-90}}"#,
                cell + 1
            ),
            format!(
                r#"{{"event":"handover_end","t_ms":{},"carrier":{carrier},"from_cell":{cell},"to_cell":{},"outcome":"{outcome}","ho_type":1,"duration_ms":100,"blackout":"hold","track_m":{track_m}}}"#,
                t + 100,
                cell + 1
            ),
        ]
    }

    /// A trip along the track in `dir` at 100 m/s, GPS at 1 Hz for 100 s, from `x0`, with the given
    /// handovers (time s, carrier, cell, outcome); positions follow from the time.
    fn trip(x0: f64, dir: f64, hos: &[(u64, u32, u32, &str)]) -> String {
        let mut lines: Vec<(u64, String)> = (0..100).map(|t| (t * 1000, gps(t, x0 + dir * 100.0 * t as f64))).collect();
        for &(t, c, cell, o) in hos {
            let [s, e] = ho(t, c, cell, x0 + dir * 100.0 * t as f64 + 0.5, o);
            lines.push((t * 1000 + 1, s));
            lines.push((t * 1000 + 101, e));
        }
        lines.sort_by_key(|l| l.0);
        lines.into_iter().map(|l| l.1 + "\n").collect()
    }

    #[test]
    fn a_key_is_its_failures_mean_position_if_it_passes_both_thresholds() {
        let mut all = Vec::new();
        // Cell 3 of carrier 0: failures at 1000.5, 1300.5 and 1000.5 m and one success, over four trips.
        // Cell 5 of carrier 1: one failure in four. Cell 7 of carrier 0: successes only.
        let passes = [
            (10, "rlf", 20, "nas"),
            (11, "success", 20, "success"),
            (13, "nas", 20, "success"),
            (10, "rlf", 20, "success"),
        ];
        for (t3, o3, t5, o5) in passes {
            let text = trip(0.0, 1.0, &[(t3, 0, 3, o3), (t5, 1, 5, o5), (40, 0, 7, "success")]);
            all.extend(parse_events(&text, "t").unwrap().handovers);
        }
        assert_eq!(all.len(), 12);
        assert!(all.iter().all(|h| h.direction == Direction::Increasing));
        let entries = build_entries(&all, Thresholds { min_failures: 1, min_failure_rate: 0.0 });
        let cells: Vec<u64> = entries.iter().map(|e| e.cell).collect();
        assert_eq!(cells, [testbed_cell_id(0, 3), testbed_cell_id(1, 5)], "the successful-only cell is left out");
        let e3 = &entries[0];
        assert_eq!((e3.failures, e3.handovers), (Some(3), Some(4)));
        assert!((e3.position_m - (1000.5 + 1300.5 + 1000.5) / 3.0).abs() < 0.06, "{}", e3.position_m);
        assert_eq!(entries[1].position_m, 2000.5);

        // Thresholds: cell 5 has 1 failure in 4 (25%), cell 3 has 3 in 4 (75%).
        let only3 = |th| build_entries(&all, th).iter().map(|e| e.cell).collect::<Vec<_>>();
        assert_eq!(only3(Thresholds { min_failures: 2, min_failure_rate: 0.0 }), [testbed_cell_id(0, 3)]);
        assert_eq!(only3(Thresholds { min_failures: 1, min_failure_rate: 0.5 }), [testbed_cell_id(0, 3)]);
        assert_eq!(
            only3(Thresholds { min_failures: 1, min_failure_rate: 0.25 }).len(),
            2,
            "the rate bound is inclusive"
        );
        assert!(only3(Thresholds { min_failures: 4, min_failure_rate: 0.0 }).is_empty());
    }

    #[test]
    fn every_handover_tables_each_key_at_its_failures_else_at_its_handovers() {
        let mut all = Vec::new();
        // Cell 3 of carrier 0 fails twice (1000.5 and 1300.5 m) and succeeds once (1100.5 m);
        // cell 7 only succeeds (4000.5 and 4100.5 m).
        for (t3, o3, t7) in [(10, "rlf", 40), (13, "nas", 41), (11, "success", 40)] {
            all.extend(parse_events(&trip(0.0, 1.0, &[(t3, 0, 3, o3), (t7, 0, 7, "success")]), "t").unwrap().handovers);
        }
        let entries = build_entries(&all, Select::EveryHandover);
        let got: Vec<(u64, f64, Option<u64>)> = entries.iter().map(|e| (e.cell, e.position_m, e.failures)).collect();
        assert_eq!(
            got,
            [(testbed_cell_id(0, 3), 1150.5, Some(2)), (testbed_cell_id(0, 7), 4033.8, Some(0))],
            "failures place a key that has them; a key without is at its handovers' mean"
        );
        let thresholded: Vec<u64> =
            build_entries(&all, Thresholds { min_failures: 1, min_failure_rate: 0.0 }).iter().map(|e| e.cell).collect();
        assert_eq!(thresholded, [testbed_cell_id(0, 3)], "thresholds still need a failure");
    }

    #[test]
    fn direction_comes_from_the_track_and_keys_the_table() {
        // The same cell passed in both directions: separate keys, each with its own position.
        let up = trip(0.0, 1.0, &[(10, 0, 3, "rlf")]);
        let down = trip(20_000.0, -1.0, &[(50, 0, 3, "nas"), (60, 0, 3, "success")]);
        let mut all = parse_events(&up, "up").unwrap().handovers;
        let d = parse_events(&down, "down").unwrap().handovers;
        assert!(d.iter().all(|h| h.direction == Direction::Decreasing));
        all.extend(d);
        let entries = build_entries(&all, Thresholds { min_failures: 1, min_failure_rate: 0.0 });
        assert_eq!(entries.len(), 2);
        assert_eq!((entries[0].direction, entries[0].position_m), (Direction::Increasing, 1000.5));
        assert_eq!(
            (entries[1].direction, entries[1].position_m, entries[1].handovers),
            (Direction::Decreasing, 15000.5, Some(2))
        );
    }

    #[test]
    fn a_stopped_train_takes_its_direction_from_the_nearest_movement() {
        // Stopped at 5000 m from 40 s to 60 s, then moving backwards: a handover at 45 s is still
        // "increasing" (the nearest movement is the arrival), one at 57 s "decreasing".
        let at = |t: u64| {
            if t <= 40 {
                125.0 * t as f64
            } else if t <= 60 {
                5000.0
            } else {
                5000.0 - 100.0 * (t - 60) as f64
            }
        };
        let fixes: Vec<(u64, f64, f64)> = (0..100).map(|t| (t * 1000, at(t), 0.0)).collect();
        assert_eq!(direction_at(&fixes, 45_000), Some(Direction::Increasing));
        assert_eq!(direction_at(&fixes, 57_000), Some(Direction::Decreasing));
        assert_eq!(direction_at(&fixes, 10_500), Some(Direction::Increasing));
        assert_eq!(direction_at(&fixes, 200_000), Some(Direction::Decreasing), "after the last fix");
        // Never moving, or no fix near the handover: no direction.
        let still: Vec<(u64, f64, f64)> = (0..100).map(|t| (t * 1000, 7.0, 0.0)).collect();
        assert_eq!(direction_at(&still, 50_000), None);
        assert_eq!(direction_at(&fixes, 100_000 + DIRECTION_WINDOW_MS), None);
        assert_eq!(direction_at(&[], 0), None);
    }

    #[test]
    fn incomplete_handovers_are_skipped_and_bad_lines_name_file_and_line() {
        let mut text = trip(0.0, 1.0, &[(10, 0, 3, "rlf")]);
        // A start whose end is beyond the log (the trip ended during the blackout).
        text.push_str(&ho(99, 0, 9, 9900.0, "rlf")[0]);
        text.push('\n');
        let t = parse_events(&text, "x").unwrap();
        assert_eq!((t.handovers.len(), t.skipped), (1, 1));

        let good = trip(0.0, 1.0, &[]);
        let n = good.lines().count();
        for (bad, want) in [
            ("{\"event\":\"gps\",\"t_ms\":5}", "bad gps event"),
            ("not json", "not an event"),
            ("{\"t_ms\":5}", "not an event"),
            ("{\"event\":\"handover_end\",\"carrier\":0,\"from_cell\":1}", "bad handover_end event"),
            (
                "{\"event\":\"handover_start\",\"t_ms\":5,\"carrier\":0,\"from_cell\":1,\"track_m\":\"x\"}",
                "bad handover_start",
            ),
        ] {
            let e = parse_events(&format!("{good}{bad}\n"), "trips/t1/events.jsonl").unwrap_err().to_string();
            assert!(e.starts_with(&format!("trips/t1/events.jsonl:{}: ", n + 1)) && e.contains(want), "{e}");
        }
        // Other event kinds, extra fields and blank lines are fine.
        let extra = "{\"event\":\"rsrp\",\"t_ms\":1}\n\n{\"event\":\"future\",\"x\":[1]}\n";
        assert!(parse_events(&format!("{good}{extra}"), "x").is_ok());
    }

    #[test]
    fn the_score_counts_located_failures_and_tabled_successes() {
        let mut f = FailureTableFile::new(1, "t");
        f.entries = build_entries(
            &parse_events(&trip(0.0, 1.0, &[(10, 0, 3, "rlf")]), "a").unwrap().handovers,
            Thresholds { min_failures: 1, min_failure_rate: 0.0 },
        );
        // Position 1000.5. Evaluation: a failure 100 m after it (correct), one 800 m after it (outside ±500 m,
        // early), one in an untabled cell, and a success in the tabled cell.
        let mut eval = Vec::new();
        for (t, cell, o) in [(11, 3, "nas"), (18, 3, "rlf"), (30, 4, "rlf"), (12, 3, "success")] {
            eval.extend(parse_events(&trip(0.0, 1.0, &[(t, 0, cell, o)]), "e").unwrap().handovers);
        }
        let s = score(&f, &eval, 500.0);
        assert_eq!((s.handovers, s.failures, s.failures_in_tabled, s.failures_within), (4, 3, 2, 1));
        assert_eq!((s.handovers_in_tabled, s.successes_in_tabled), (3, 1));
        assert_eq!((s.late, s.correct, s.early), (0, 1, 1));
        assert!(s.to_string().contains("1 of 3"));
    }
}
