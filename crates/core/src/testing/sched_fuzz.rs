//! Fuzz-style property test of every built-in pipeline: whatever the path
//! states and the packet, a decision only places a packet on paths that
//! are live and have room, and never sends a reinjection back to a path it
//! already used.
//!
//! Views carry random handover-failure forecasts (none, ahead, passed, a
//! stopped train, NaN), so HRSCH's `hof-reject` acts on them.

use std::time::{Duration, Instant};

use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use proptest::sample::subsequence;

use crate::ids::{ConnId, PathId, PathMask, UserId};
use crate::path::{Availability, FailureForecast, PathView};
use crate::sched::{Context, PacketInfo, Pipeline, PipelineSpec, Registry, SchedulerletSpec};
use crate::wire::LinkState;

fn pipelines() -> Vec<Pipeline> {
    let r = Registry::with_builtins();
    let mut v: Vec<Pipeline> = r.pipeline_names().iter().map(|n| r.build(n).unwrap()).collect();
    // Every schedulerlet at least once with extended reinjection, and the
    // selection filters behind a selector that picks several paths.
    let compositions: [&[&str]; 8] = [
        &["pin-user", "roundrobin"],
        &["all-paths", "blest"],
        &["all-paths", "ecf"],
        &["roundrobin", "blest", "ecf"],
        // HRSCH's schedulerlets behind selectors that pick several paths,
        // and idle-inject alone (no primary: it must not place anything).
        &["hof-reject", "all-paths", "tail-reject", "idle-inject"],
        &["pin-user", "roundrobin", "tail-reject", "idle-inject", "hof-reject"],
        &["idle-inject"],
        &["hof-reject", "blest", "idle-inject", "tail-reject"],
    ];
    for lets in compositions {
        let spec = PipelineSpec {
            schedulerlets: lets.iter().map(|n| SchedulerletSpec::named(n)).collect(),
            reinjection: SchedulerletSpec::named("extended"),
        };
        v.push(r.build_spec(&lets.join("+"), &spec).unwrap());
    }
    // idle-inject allowed to revive rejected paths, copying every packet.
    let mut ori = SchedulerletSpec::named("idle-inject");
    ori.params = [("revive_unavailable".to_string(), 1.0), ("alpha".to_string(), 0.0)].into();
    let spec = PipelineSpec {
        schedulerlets: vec![SchedulerletSpec::named("hof-reject"), SchedulerletSpec::named("minrtt"), ori],
        reinjection: SchedulerletSpec::named("extended"),
    };
    v.push(r.build_spec("hpr+minrtt+ori-revive", &spec).unwrap());
    v
}

fn availability() -> impl Strategy<Value = Availability> {
    prop_oneof![Just(Availability::Down), Just(Availability::Full), Just(Availability::Available)]
}

fn link_state() -> impl Strategy<Value = LinkState> {
    prop_oneof![Just(LinkState::Connected), Just(LinkState::HandoverStarted), Just(LinkState::NoService)]
}

/// A handover-failure forecast: none, or anywhere around the location,
/// at any speed including a stopped train and nonsense values.
fn forecast() -> impl Strategy<Value = Option<FailureForecast>> {
    option::of(
        (prop_oneof![-2_000.0f64..2_000.0, Just(0.0), Just(f64::NAN)], prop_oneof![0.0f64..120.0, Just(0.0)])
            .prop_map(|(distance_m, speed_mps)| FailureForecast { distance_m, speed_mps }),
    )
}

/// A view of path `id`, in any state a real path can be in (and some it
/// hardly can: zero RTTs and windows).
fn view(id: u8) -> impl Strategy<Value = PathView> {
    (
        availability(),
        (0u64..2_000_000, 0u64..500_000, 0u64..2_000_000),
        (0u64..1 << 24, 0u64..1 << 24, 0u64..1 << 20, 0u64..1 << 28),
        (0u32..6, 0u64..10_000_000, 0u64..1 << 24, link_state(), prop_oneof![Just(0u64), 1u64..4, any::<u64>()]),
        (forecast(), any::<bool>()),
    )
        .prop_map(move |(availability, rtt, win, misc, (failure, stale))| PathView {
            id: PathId(id),
            availability,
            srtt_us: rtt.0,
            rttvar_us: rtt.1,
            min_rtt_us: rtt.2.min(rtt.0),
            in_flight_bytes: win.0,
            cwnd_bytes: win.1,
            queued_bytes: win.2,
            delivery_rate_bps: win.3,
            rto_count: misc.0,
            idle_us: misc.1,
            bytes_since_use: misc.2,
            link_state: misc.3,
            cell: misc.4,
            stale,
            failure,
        })
}

/// Live paths as the endpoint passes them: distinct ids in order, never
/// `Down` (the Context contract).
fn live_paths() -> impl Strategy<Value = Vec<PathView>> {
    subsequence((0u8..32).collect::<Vec<u8>>(), 0..=8)
        .prop_flat_map(|ids| ids.into_iter().map(view).collect::<Vec<_>>())
        .prop_map(|v| v.into_iter().filter(|p| p.availability != Availability::Down).collect())
}

fn packet() -> impl Strategy<Value = PacketInfo> {
    (
        (1u32..50, 0u8..6, any::<u64>(), 0u32..16_384),
        (any::<bool>(), any::<bool>(), any::<u32>(), any::<bool>()),
        (0u64..1 << 30, 0u64..1 << 24),
    )
        .prop_map(|(a, b, c)| PacketInfo {
            conn: ConnId(a.0),
            user: UserId([a.1; 16]),
            offset: a.2 >> 8,
            len: a.3,
            is_tail: b.0,
            is_burst_tail: b.3 && !b.0,
            is_reinjection: b.1,
            // Only reinjections have been placed before.
            paths_used: if b.1 { PathMask(b.2) } else { PathMask::EMPTY },
            remaining_bytes: c.0,
            send_window_bytes: c.1,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: super::cases(256), ..ProptestConfig::default() })]

    #[test]
    fn no_pipeline_places_a_packet_on_a_path_without_room_or_back_on_a_used_one(
        decisions in vec((live_paths(), packet(), 0u64..10_000), 1..24),
    ) {
        let t0 = Instant::now();
        for mut p in pipelines() {
            // One pipeline instance across decisions: round robin, pins and
            // ECF's hysteresis keep state between them.
            for (paths, pkt, at_ms) in &decisions {
                let ctx = Context { now: t0 + Duration::from_millis(*at_ms), paths, packet: pkt };
                let placed = p.select(&ctx);
                for id in placed.iter() {
                    let Some(v) = paths.iter().find(|v| v.id == id) else {
                        return Err(TestCaseError::fail(format!("{}: placed on {id}, which is not live", p.name())));
                    };
                    prop_assert_eq!(v.availability, Availability::Available, "{}: {} has no room", p.name(), id);
                    prop_assert!(
                        !(pkt.is_reinjection && pkt.paths_used.contains(id)),
                        "{}: reinjection sent back to {id}", p.name()
                    );
                }
            }
        }
    }
}
