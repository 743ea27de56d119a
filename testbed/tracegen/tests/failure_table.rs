//! The failure-location table builder on generated development trips, checked against the
//! generator's ground truth (route-fixed cell layout and per-cell failure propensity u_cell).

use std::path::PathBuf;

use polycorn_telemetry::failure_table::{Direction, FailureTableFile};
use polycorn_tracegen::failure_table::{build_table, read_events, score, Thresholds};
use polycorn_tracegen::{events, generate, FailureModel, Preset, Trip, TripConfig};

/// Development route and trips only (route seed 1, trip seeds < 100; hsr bench reports use route 7
/// and trip seeds ≥ 1000).
const ROUTE: u64 = 1;

fn trip(seed: u64, dir: &std::path::Path) -> (Trip, PathBuf) {
    let cfg = TripConfig {
        preset: Preset::pc_gateway_300(),
        route_seed: ROUTE,
        trip_seed: seed,
        duration_s: 600,
        carriers: 2,
    };
    let trip = generate(&cfg);
    let mut text = String::new();
    for e in events(&cfg, &trip) {
        text.push_str(&serde_json::to_string(&e).unwrap());
        text.push('\n');
    }
    let path = dir.join(format!("t{seed}.jsonl"));
    std::fs::write(&path, text).unwrap();
    (trip, path)
}

fn decode(cell: u64) -> (usize, usize) {
    ((cell >> 32) as usize - 1, (cell & 0xffff_ffff) as usize)
}

#[test]
fn tabled_cells_are_where_the_generator_put_failure_propensity() {
    let dir = std::env::temp_dir().join(format!("polycorn-tracegen-ft-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trips: Vec<(Trip, PathBuf)> = (1..=24).map(|s| trip(s, &dir)).collect();
    let (history, eval) = trips.split_at(20);
    let files: Vec<&std::path::Path> = history.iter().map(|t| t.1.as_path()).collect();
    let (table, skipped) = build_table(&files, 3, Thresholds::default()).unwrap();
    assert_eq!(skipped, 0, "every complete handover of a generated trip has a direction");
    assert_eq!(table.version, 3);
    assert!(table.source.contains("20 trip(s)") && table.source.contains("t20.jsonl"), "{}", table.source);
    let table = FailureTableFile::parse(&table.to_json()).unwrap();
    assert!(table.entries.len() >= 5, "{} entries", table.entries.len());

    let layout = |c: usize| &trips[0].0.carriers[c].layout;
    let mut u_tabled = Vec::new();
    for e in &table.entries {
        let (c, k) = decode(e.cell);
        // The generator has one direction of travel; handovers out of cell k trigger at b_k + δ, δ ≥ 0
        // (later if the previous blackout lasts), and too-late failures start at the coverage edge
        // e_k = b_k + w_k: the mean failure position lies past b_k, within the overlap zone.
        assert_eq!(e.direction, Direction::Increasing);
        let b = layout(c).boundaries[k];
        assert!((b..b + 1000.0).contains(&e.position_m), "cell {c}/{k}: position {} vs boundary {b}", e.position_m);
        let (f, n) = (e.failures.unwrap(), e.handovers.unwrap());
        assert!(f >= 3 && f as f64 >= 0.2 * n as f64);
        let sigma = match Preset::pc_gateway_300().failure_model {
            FailureModel::V2(f) => f.sigma_cell[c % 2],
            FailureModel::V1 => Preset::pc_gateway_300().carrier(c).sigma_cell,
        };
        u_tabled.push(layout(c).u_cell[k] / sigma);
    }
    // Ground truth: the route-fixed log-odds u_cell ~ N(0, σ²) of tabled cells (in units of σ) are high.
    // Untabled cells average slightly below 0; a random choice would average 0.
    let mean_u = u_tabled.iter().sum::<f64>() / u_tabled.len() as f64;
    let above = u_tabled.iter().filter(|&&u| u > 0.0).count();
    assert!(mean_u > 0.8, "mean u_cell/σ of tabled cells {mean_u:.2}: {u_tabled:?}");
    assert!(
        above as f64 >= 0.8 * u_tabled.len() as f64,
        "{above} of {} tabled cells above the median propensity",
        u_tabled.len()
    );

    // On trips not used to build it, the generator's own failure probability of handovers out of
    // tabled cells is well above that of all handovers.
    let tabled = |c: usize, k: usize| table.entries.iter().any(|e| decode(e.cell) == (c, k));
    let (mut p_all, mut n_all, mut p_tab, mut n_tab) = (0.0, 0, 0.0, 0);
    for (t, _) in eval {
        for (c, ct) in t.carriers.iter().enumerate() {
            for h in &ct.handovers {
                p_all += h.p_fail;
                n_all += 1;
                if tabled(c, h.from_cell) {
                    p_tab += h.p_fail;
                    n_tab += 1;
                }
            }
        }
    }
    let (p_all, p_tab) = (p_all / n_all as f64, p_tab / n_tab as f64);
    assert!(p_tab > 2.0 * p_all, "true failure probability out of tabled cells {p_tab:.3} vs all {p_all:.3}");

    // And the scorer agrees with the event logs: most failures out of tabled cells lie within ±500 m.
    let mut hos = Vec::new();
    for (_, p) in eval {
        hos.extend(read_events(p).unwrap().handovers);
    }
    let s = score(&table, &hos, 500.0);
    assert_eq!(s.handovers as usize, n_all);
    assert_eq!(s.handovers_in_tabled as usize, n_tab);
    assert!(s.failures_within <= s.failures_in_tabled && s.failures_in_tabled <= s.failures);
    eprintln!("mean u/σ {mean_u:.2}, {above}/{}, p_tab {p_tab:.3} p_all {p_all:.3}\n{s}", u_tabled.len());
    let _ = std::fs::remove_dir_all(&dir);
}
