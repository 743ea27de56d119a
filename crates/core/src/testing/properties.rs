//! Property tests: whatever the losses, outages and path failures, and
//! whichever scheduler, every byte arrives exactly once, in order, intact,
//! in both directions.

use std::time::Duration;

use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;

use super::*;

/// Every built-in composition, picked by its index in the table (whose
/// order the saved regression cases rely on).
const SCHEDULERS: &[crate::sched::BuiltinPipeline] = crate::sched::BUILTIN_PIPELINES;

#[derive(Clone, Debug)]
struct PathParams {
    bytes_per_sec: u64,
    delay_ms: u64,
    loss: f64,
    /// (start, length) in ms; some outlast `dead_after`.
    blackouts: Vec<(u64, u64)>,
    /// (kill at, revive this much later) in ms, in order.
    kills: Vec<(u64, Option<u64>)>,
}

impl PathParams {
    fn spec(&self) -> PathSpec {
        let ms = Duration::from_millis;
        let mut p = PathSpec::rate(self.bytes_per_sec, ms(self.delay_ms)).with_loss(self.loss);
        for &(s, len) in &self.blackouts {
            p = p.with_blackout(ms(s), ms(s + len));
        }
        // Kills are given as gaps so they never overlap: each starts after
        // the previous revive.
        let mut t = 0;
        for &(gap, revive) in &self.kills {
            let at = t + gap;
            p = p.with_kill(ms(at), revive.map(|r| ms(at + r)));
            match revive {
                Some(r) => t = at + r + 1,
                None => break,
            }
        }
        p
    }
}

fn path(killable: bool) -> impl Strategy<Value = PathParams> {
    let kills =
        if killable { vec((0u64..4_000, option::of(1u64..5_000)), 0..3).boxed() } else { Just(Vec::new()).boxed() };
    (
        200_000u64..4_000_000,
        5u64..120,
        prop_oneof![Just(0.0), 0.0..0.05f64],
        vec((0u64..6_000, prop_oneof![4 => 100u64..4_000, 1 => 10_000u64..13_000]), 0..3),
        kills,
    )
        .prop_map(|(bytes_per_sec, delay_ms, loss, blackouts, kills)| PathParams {
            bytes_per_sec,
            delay_ms,
            loss,
            blackouts,
            kills,
        })
}

/// Path 0 is never killed and its blackouts end, so one path always comes
/// back; the others may die for good.
fn paths() -> impl Strategy<Value = Vec<PathParams>> {
    (path(false), vec(path(true), 1..3)).prop_map(|(first, rest)| std::iter::once(first).chain(rest).collect())
}

fn conns(n: std::ops::Range<usize>) -> impl Strategy<Value = Vec<ConnSpec>> {
    vec((0u16..4, 0u64..400_000, 0u64..400_000, 0u64..3_000, any::<bool>()), n).prop_map(|v| {
        v.into_iter()
            .map(|(user, up, down, start, rr)| {
                let c = ConnSpec::new(user).upload(up).download(down).at(Duration::from_millis(start));
                if rr {
                    c.request_response()
                } else {
                    c
                }
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: super::cases(48), ..ProptestConfig::default() })]

    #[test]
    fn every_byte_arrives_once_in_order_and_intact_whatever_happens_to_the_paths(
        sched in 0..SCHEDULERS.len(),
        seed in any::<u64>(),
        paths in paths(),
        conns in conns(1..4),
    ) {
        let mut h = Harness::new(SCHEDULERS[sched].name, paths.iter().map(PathParams::spec).collect(), seed);
        for c in conns {
            h.open(c);
        }
        let r = h.run_until(Duration::from_secs(900));
        prop_assert!(r.all_done(), "{}: {:#?}\n{:?}\n{:?}", SCHEDULERS[sched].name, r.conns, r.input_errors, r.path_log);
        prop_assert_eq!(r.relay.protocol_errors + r.proxy.protocol_errors, 0);
    }
}

/// Small and odd tunables: tiny windows, buffers and segments make flow
/// control, partial frames and the kernel-buffer limit bite constantly.
/// The floors keep the slowest case (1 KiB of send buffer per RTT) well
/// inside the deadline; below them a transfer is correct but takes hours.
fn tunables() -> impl Strategy<Value = SimConfig> {
    let windows = (1_000u64..1 << 20, 1u64..8).prop_map(|(initial, growth)| (initial, initial * growth));
    // Budgets from one frame up: above `high` a connection keeps only its
    // floors, and must still finish.
    let budget = prop_oneof![Just(None), (16u64 * 1024..4 << 20).prop_map(Some)];
    (64u64..128 * 1024, windows, 1024u64..256 * 1024, 64u32..16 * 1024, 1u64..3_000, budget).prop_map(
        |(kernel, (w_init, w_max), send_buf, segment, reconnect_ms, budget)| {
            let mut cfg = SimConfig { kernel_buffer_bytes: kernel, ..SimConfig::default() };
            cfg.reconnect_after = Duration::from_millis(reconnect_ms);
            for ep in [&mut cfg.relay, &mut cfg.proxy] {
                ep.conn_window_initial_bytes = w_init;
                ep.conn_window_max_bytes = w_max;
                ep.conn_window_min_bytes = w_init.min(crate::conn::INITIAL_MAX_DATA);
                ep.conn_send_buffer_bytes = send_buf;
                ep.conn_unsent_min_bytes = send_buf.min(32 * 1024);
                ep.segment_bytes = segment;
                if let Some(high) = budget {
                    ep.budget = crate::budget::MemoryBudget::with_high(high);
                }
            }
            cfg
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: super::cases(48), ..ProptestConfig::default() })]

    #[test]
    fn every_byte_arrives_intact_with_any_tunables(
        sched in 0..SCHEDULERS.len(),
        seed in any::<u64>(),
        cfg in tunables(),
        paths in paths(),
        conns in conns(1..6),
    ) {
        let r = crate::sched::Registry::with_builtins();
        let build = || r.build(SCHEDULERS[sched].name).unwrap();
        let mut h = Harness::with_config(cfg, build(), build(), paths.iter().map(PathParams::spec).collect(), seed);
        for c in conns {
            h.open(c);
        }
        let r = h.run_until(Duration::from_secs(1800));
        prop_assert!(r.all_done(), "{}: {:#?}\n{:?}\n{:?}", SCHEDULERS[sched].name, r.conns, r.input_errors, r.path_log);
    }
}

/// What a path's radio does on a trip: cells it moves to (at ms, state;
/// each report after the first names a new cell unless it is "no
/// service"), and failure locations of its cells in the table
/// (cell index, position in m).
#[derive(Clone, Debug)]
struct Radio {
    reports: Vec<(u64, u8)>,
    failures: Vec<(usize, f64)>,
}

fn radio() -> impl Strategy<Value = Radio> {
    (vec((0u64..10_000, 0u8..3), 0..5), vec((0usize..3, -300.0f64..800.0), 0..6))
        .prop_map(|(reports, failures)| Radio { reports, failures })
}

/// The HRSCH pipelines, one of them with idle-inject reviving rejected
/// paths and copying every packet (α = 0).
fn hsr_pipeline(i: usize) -> (String, crate::Pipeline) {
    use crate::sched::{PipelineSpec, Registry, SchedulerletSpec};
    let r = Registry::with_builtins();
    match i {
        0 => ("hrsch".into(), r.build("hrsch").unwrap()),
        1 => ("minrtt+hpr".into(), r.build("minrtt+hpr").unwrap()),
        _ => {
            let mut spec = r.pipeline_spec("hrsch").unwrap().clone();
            let ori: &mut SchedulerletSpec = &mut spec.schedulerlets[3];
            ori.params = [("revive_unavailable".to_string(), 1.0), ("alpha".to_string(), 0.0)].into();
            let spec = PipelineSpec { ..spec };
            ("hrsch-revive".into(), r.build_spec("hrsch-revive", &spec).unwrap())
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: super::cases(48), ..ProptestConfig::default() })]

    /// HRSCH with its prediction inputs live: a moving train, cells that
    /// change (or drop to no service), failure locations ahead, behind and
    /// on the way, blackouts and kills. Rejections and waiting must never
    /// lose, duplicate or reorder a byte, nor stall a connection for good.
    #[test]
    fn hrsch_delivers_every_byte_once_in_order_whatever_the_handover_predictions(
        sched in 0usize..3,
        seed in any::<u64>(),
        paths in paths(),
        radios in vec(radio(), 3),
        speed in prop_oneof![Just(0.0f64), 1.0f64..120.0],
        decreasing in any::<bool>(),
        conns in conns(1..4),
    ) {
        use crate::sched::{FailureTable, TrackDirection};
        use crate::wire::LinkState;
        let (name, relay) = hsr_pipeline(sched);
        let (_, proxy) = hsr_pipeline(sched);
        let mut h = Harness::with_config(SimConfig::default(), relay, proxy, paths.iter().map(PathParams::spec).collect(), seed);
        let direction = if decreasing { TrackDirection::Decreasing } else { TrackDirection::Increasing };
        let cell = |path: usize, k: usize| 1_000 * (path as u64 + 1) + k as u64;
        let mut table = FailureTable::new(1);
        for (i, radio) in radios.iter().enumerate().take(paths.len()) {
            h.report_link(i, Duration::ZERO, LinkState::Connected, cell(i, 0));
            let mut k = 0;
            let mut reports = radio.reports.clone();
            reports.sort();
            for (at, state) in reports {
                let (state, c) = match state {
                    0 => { k += 1; (LinkState::Connected, cell(i, k)) }
                    1 => (LinkState::HandoverStarted, cell(i, k)),
                    _ => (LinkState::NoService, 0),
                };
                h.report_link(i, Duration::from_millis(at), state, c);
            }
            for &(k, pos) in &radio.failures {
                // Positions relative to where the train is at 1 s.
                let at = if decreasing { -speed - pos } else { speed + pos };
                table.insert(cell(i, k), direction, at);
            }
        }
        h.set_failure_table(table);
        h.set_train(TrainSpec { start_m: 0.0, speed_mps: speed, direction, report_every: Duration::from_millis(200) });
        for c in conns {
            h.open(c);
        }
        let r = h.run_until(Duration::from_secs(900));
        prop_assert!(r.all_done(), "{}: {:#?}\n{:?}\n{:?}", name, r.conns, r.input_errors, r.path_log);
        prop_assert_eq!(r.relay.protocol_errors + r.proxy.protocol_errors, 0);
    }
}
