//! HRSCH (POLYCORN §4.3–§4.6) end to end, in virtual time: prediction
//! inputs fed as the shells will, both endpoints running the composition.

use std::time::Duration;

use super::*;
use crate::sched::{FailureTable, PipelineSpec, Registry, SchedulerletSpec, TrackDirection};
use crate::wire::LinkState;
use crate::PathId;

const MB: u64 = 1_000_000;

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

fn secs(v: u64) -> Duration {
    Duration::from_secs(v)
}

/// Two unequal paths: 2 MB/s at 20 ms and 1 MB/s at 60 ms one way.
fn two_paths() -> Vec<PathSpec> {
    vec![PathSpec::rate(2 * MB, ms(20)), PathSpec::rate(MB, ms(60))]
}

fn pipelines(name: &str) -> (crate::Pipeline, crate::Pipeline) {
    let r = Registry::with_builtins();
    (r.build(name).unwrap(), r.build(name).unwrap())
}

/// What the proxy's path 0 did around a handover failure at 5 s.
#[derive(Debug, Default)]
struct AroundFailure {
    sent_at_4_8: u64,
    sent_at_7_9: u64,
    in_flight_at_5: u64,
}

/// Path 0 fails a handover at 400 m, which a train at 80 m/s reaches at
/// 5 s: a 3 s blackout, then it reconnects on a new cell. The failure is
/// in the table. A 16 MB download runs from 1 s.
fn handover_failure_run(name: &str) -> (Report, AroundFailure) {
    let mut paths = two_paths();
    paths[0] = paths[0].clone().with_blackout(secs(5), secs(8));
    let (a, b) = pipelines(name);
    let mut h = Harness::with_config(SimConfig::default(), a, b, paths, 11);
    h.set_failure_table(FailureTable::new(1).with(100, TrackDirection::Increasing, 400.0));
    h.set_train(TrainSpec {
        start_m: 0.0,
        speed_mps: 80.0,
        direction: TrackDirection::Increasing,
        report_every: ms(100),
    });
    h.report_link(0, Duration::ZERO, LinkState::Connected, 100);
    h.report_link(1, Duration::ZERO, LinkState::Connected, 200);
    h.report_link(0, secs(8), LinkState::Connected, 101);
    h.open(ConnSpec::new(1).upload(10_000).download(16 * MB).at(secs(1)));
    let mut seen = AroundFailure::default();
    let r = h.run_observed(secs(120), |h| {
        let sent = h.proxy().path_stats(PathId(0)).map_or(0, |s| s.data_bytes_sent);
        if h.now() <= ms(4_800) {
            seen.sent_at_4_8 = sent;
        }
        if h.now() <= ms(7_900) {
            seen.sent_at_7_9 = sent;
        }
        if h.now() <= secs(5) {
            seen.in_flight_at_5 = h.proxy().path_view(PathId(0), h.instant()).unwrap().in_flight_bytes;
        }
    });
    r.assert_all_done();
    (r, seen)
}

#[test]
fn a_predicted_failure_moves_traffic_off_the_path_before_the_blackout() {
    let (hrsch, seen) = handover_failure_run("hrsch");
    let (minrtt, base) = handover_failure_run("minrtt");
    eprintln!(
        "hrsch: {seen:?}, done in {:?}; minrtt: {base:?}, done in {:?}",
        hrsch.conns[0].completion.unwrap(),
        minrtt.conns[0].completion.unwrap()
    );
    assert_eq!(seen.sent_at_4_8, seen.sent_at_7_9, "no passenger data written on path 0 from 4.8 s to 7.9 s");
    assert!(seen.in_flight_at_5 < 16 * 1024, "path 0 was drained when the blackout began: {seen:?}");
    assert!(base.in_flight_at_5 > 64 * 1024, "minRTT had a window's worth stuck in the blackout: {base:?}");
    let after = hrsch.paths[0].proxy.as_ref().unwrap().data_bytes_sent;
    assert!(after > seen.sent_at_7_9, "path 0 carries data again on its new cell");
}

#[test]
fn hpr_makes_traffic_wait_when_every_path_is_about_to_fail() {
    // Both paths' cells fail at 400 m; only path 1 comes back, on a new
    // cell, at 6 s. Nothing may be placed in between (the packets wait).
    let mut paths = two_paths();
    paths[0] = paths[0].clone().with_blackout(secs(5), secs(7));
    paths[1] = paths[1].clone().with_blackout(secs(5), secs(6));
    let (a, b) = pipelines("hrsch");
    let mut h = Harness::with_config(SimConfig::default(), a, b, paths, 12);
    h.set_failure_table(FailureTable::new(1).with(100, TrackDirection::Increasing, 400.0).with(
        200,
        TrackDirection::Increasing,
        400.0,
    ));
    h.set_train(TrainSpec {
        start_m: 0.0,
        speed_mps: 80.0,
        direction: TrackDirection::Increasing,
        report_every: ms(100),
    });
    h.report_link(0, Duration::ZERO, LinkState::Connected, 100);
    h.report_link(1, Duration::ZERO, LinkState::Connected, 200);
    h.report_link(1, secs(6), LinkState::Connected, 201);
    h.report_link(0, secs(7), LinkState::Connected, 101);
    h.open(ConnSpec::new(1).download(20 * MB).at(secs(1)));
    let sent =
        |h: &Harness| -> u64 { (0..2).map(|i| h.proxy().path_stats(PathId(i)).map_or(0, |s| s.data_bytes_sent)).sum() };
    let (mut at_4_8, mut at_5_9) = (0, 0);
    let r = h.run_observed(secs(120), |h| {
        if h.now() <= ms(4_800) {
            at_4_8 = sent(h);
        }
        if h.now() <= ms(5_900) {
            at_5_9 = sent(h);
        }
    });
    r.assert_all_done();
    assert_eq!(at_4_8, at_5_9, "every path rejected: the download waited");
}

#[test]
fn a_path_with_three_rtos_has_its_in_flight_data_reinjected_once_never_onto_itself() {
    // As the extended-reinjection scenario, with all of HRSCH: path 0
    // stalls long enough for three RTOs, not four.
    let mut paths = two_paths();
    paths[0] = paths[0].clone().with_blackout(ms(500), ms(2300));
    let (a, b) = pipelines("hrsch");
    let mut h = Harness::with_config(SimConfig::default(), a, b, paths, 7);
    h.open(ConnSpec::new(1).upload(4 * MB));
    let mut stalled_in_flight = 0;
    let r = h.run_observed(secs(120), |h| {
        if h.now() >= ms(500) && h.now() < ms(2300) {
            let v = h.relay().path_view(PathId(0), h.instant()).expect("path 0 exists");
            stalled_in_flight = stalled_in_flight.max(v.in_flight_bytes);
        }
    });
    r.assert_all_done();
    let (stalled, other) = (&r.paths[0], &r.paths[1]);
    eprintln!("hrsch: {} B reinjected, {stalled_in_flight} B were stuck on path 0", r.relay.reinjected_bytes);
    assert_eq!(stalled.relay.as_ref().unwrap().rto_events, 3, "the scenario needs exactly three RTOs");
    assert!(other.reinjected_bytes() > 0, "path 0's data went to path 1");
    assert_eq!(stalled.reinjected_bytes(), 0, "a reinjection never returns to the path it left");
    assert!(
        r.relay.reinjected_bytes <= stalled_in_flight,
        "each stalled byte is reinjected at most once: {} reinjected, {stalled_in_flight} were in flight",
        r.relay.reinjected_bytes
    );
    assert!(r.relay.reinjected_bytes > 2 * 16 * 1024, "at the 3rd RTO everything unacknowledged moved");
}

/// `n` passengers each upload 1000 bytes (one packet, FIN included), one
/// every 30 ms from 2 s, while path 1 has been idle since the start.
fn small_uploads(name: &str, n: u64) -> Report {
    let (a, b) = pipelines(name);
    small_uploads_with(a, b, n)
}

fn small_uploads_with(a: crate::Pipeline, b: crate::Pipeline, n: u64) -> Report {
    let mut h = Harness::with_config(SimConfig::default(), a, b, two_paths(), 13);
    for i in 0..n {
        h.open(ConnSpec::new(i as u16).upload(1000).at(ms(2_000 + 30 * i)));
    }
    let r = h.run_until(secs(60));
    r.assert_all_done();
    r
}

/// HRSCH's pipeline with `idle-inject`'s β set.
fn hrsch_with_beta(beta: f64) -> crate::Pipeline {
    let r = Registry::with_builtins();
    let mut ori = SchedulerletSpec::named("idle-inject");
    ori.params = [("beta".to_string(), beta)].into();
    let mut ext = SchedulerletSpec::named("extended");
    ext.params = [("k".to_string(), 3.0)].into();
    let spec = PipelineSpec {
        schedulerlets: vec![
            SchedulerletSpec::named("hof-reject"),
            SchedulerletSpec::named("minrtt"),
            SchedulerletSpec::named("tail-reject"),
            ori,
        ],
        reinjection: ext,
    };
    r.build_spec("hrsch-beta", &spec).unwrap()
}

#[test]
fn an_idle_path_gets_exactly_tau_copies() {
    // Path 1 idle for 2 s (α = 1 s): copies of the next 16 packets, the
    // last at 2.45 s. It is idle again by α 1 s later (the 50th packet, at
    // 3.47 s), long before β = 96 KiB of packets went elsewhere.
    let redundant = |r: &Report, i: usize| r.paths[i].relay.as_ref().unwrap().redundant_bytes;
    let r = small_uploads("hrsch", 25);
    assert_eq!(redundant(&r, 1), 16 * 1000, "τ = 16 copies of 1000-byte packets");
    assert_eq!(redundant(&r, 0), 0, "path 0 carried the packets themselves");
    assert_eq!(r.relay.redundant_bytes, 16 * 1000);
    assert_eq!(redundant(&small_uploads("hrsch", 49), 1), 16 * 1000, "not idle again before α");
    assert_eq!(redundant(&small_uploads("hrsch", 52), 1), 19 * 1000, "α: a second burst from the 50th packet");
    // β: with the paper's 8 KiB, idle again after 9 packets elsewhere.
    let r = small_uploads_with(hrsch_with_beta(8192.0), hrsch_with_beta(8192.0), 27);
    assert_eq!(redundant(&r, 1), 18 * 1000, "β: a second burst from the 26th packet");
    let r = small_uploads("minrtt", 25);
    assert_eq!(r.relay.redundant_bytes, 0);
}

#[test]
fn copies_are_counted_on_the_idle_path_even_when_it_has_the_lower_id() {
    // Path 0 is the slow, idle one here: its copies are the redundant
    // bytes, not the packets on path 1.
    let (a, b) = pipelines("hrsch");
    let mut paths = two_paths();
    paths.reverse();
    let mut h = Harness::with_config(SimConfig::default(), a, b, paths, 13);
    for i in 0..25u64 {
        h.open(ConnSpec::new(i as u16).upload(1000).at(ms(2_000 + 30 * i)));
    }
    let r = h.run_until(secs(60));
    r.assert_all_done();
    assert_eq!(r.paths[0].relay.as_ref().unwrap().redundant_bytes, 16 * 1000);
    assert_eq!(r.paths[1].relay.as_ref().unwrap().redundant_bytes, 0);
}

#[test]
fn idle_inject_parameters_change_the_copies() {
    let r = Registry::with_builtins();
    let mut ori = SchedulerletSpec::named("idle-inject");
    ori.params = [("tau".to_string(), 4.0), ("beta".to_string(), 1e9)].into();
    let spec = PipelineSpec {
        schedulerlets: vec![SchedulerletSpec::named("minrtt"), ori],
        reinjection: SchedulerletSpec::named("rto-oldest"),
    };
    let build = || r.build_spec("ori4", &spec).unwrap();
    let mut h = Harness::with_config(SimConfig::default(), build(), build(), two_paths(), 14);
    for i in 0..25u64 {
        h.open(ConnSpec::new(i as u16).upload(1000).at(ms(2_000 + 30 * i)));
    }
    let rep = h.run_until(secs(60));
    rep.assert_all_done();
    assert_eq!(rep.paths[1].relay.as_ref().unwrap().redundant_bytes, 4 * 1000);
}

#[test]
fn every_hrsch_composition_moves_a_megabyte_each_way_over_a_lossy_handover() {
    for name in ["hrsch", "minrtt+hpr", "minrtt+tpr", "minrtt+ori", "minrtt+er", "minrtt"] {
        let mut paths = two_paths();
        paths[0] = paths[0].clone().with_loss(0.01).with_blackout(secs(2), secs(4));
        paths[1] = paths[1].clone().with_loss(0.02);
        let (a, b) = pipelines(name);
        let mut h = Harness::with_config(SimConfig::default(), a, b, paths, 15);
        h.set_failure_table(FailureTable::new(1).with(100, TrackDirection::Decreasing, 5_000.0));
        h.set_train(TrainSpec {
            start_m: 5_160.0,
            speed_mps: 80.0,
            direction: TrackDirection::Decreasing,
            report_every: ms(250),
        });
        h.report_link(0, Duration::ZERO, LinkState::Connected, 100);
        h.report_link(0, secs(2), LinkState::NoService, 0);
        h.report_link(0, secs(4), LinkState::Connected, 102);
        h.report_link(1, Duration::ZERO, LinkState::Connected, 200);
        for i in 0..6u64 {
            h.open(ConnSpec::new(i as u16).upload(MB / 4).download(MB / 2).at(ms(300 * i)));
        }
        let r = h.run_until(secs(120));
        r.assert_all_done();
        eprintln!("{name}: done at {:?}, {} B redundant", r.elapsed, r.relay.redundant_bytes + r.proxy.redundant_bytes);
    }
}
