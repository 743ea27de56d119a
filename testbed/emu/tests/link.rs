//! Behavioural tests of the link emulator, all in virtual time.

use std::collections::BTreeMap;
use std::time::Duration;

use polycorn_emu::{
    Admission, Blackout, BlackoutKind, DelaySchedule, EventKind, GeParams, Interpolation, Link, LinkConfig, LossKeying,
    LossSchedule, Packet, Schedule, Service, SplitMix64, Trace, LOSS_SLOT,
};
use proptest::prelude::*;

const ZERO: Duration = Duration::ZERO;

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

fn trace_link(trace: &str) -> LinkConfig {
    LinkConfig::new(Service::Trace(Trace::parse(trace).unwrap()))
}

/// Drives `link` with `arrivals` (time, size) using only `next_event` to decide when to wake,
/// checking its contract on the way, until nothing is left or `end` is passed.
fn run(link: &mut Link, mut arrivals: Vec<(Duration, usize)>, end: Duration) -> Vec<Packet> {
    arrivals.sort_by_key(|a| a.0);
    let mut i = 0;
    let mut now = ZERO;
    let mut out = Vec::new();
    loop {
        while i < arrivals.len() && arrivals[i].0 <= now {
            link.push(now, vec![0xAB; arrivals[i].1]);
            i += 1;
        }
        while let Some(p) = link.poll_deliver(now) {
            assert!(p.departure <= now);
            out.push(p);
        }
        let next_link = link.next_event(now);
        if let Some(t) = next_link {
            assert!(t > now, "next_event returned {t:?} at {now:?} after everything due was polled");
        }
        let next = match (next_link, arrivals.get(i).map(|a| a.0)) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => match a.or(b) {
                Some(t) => t,
                None => break,
            },
        };
        if next > end {
            break;
        }
        now = next;
    }
    out
}

/// A direct transcription of mm-link's `LinkQueue` (integer milliseconds, `rationalize` before
/// every enqueue, `packet_in_transit_` carried across opportunities), returning each packet's
/// departure millisecond by arrival index.
fn mahimahi_reference(
    schedule: &[u64],
    arrivals: &[(u64, usize)],
    packet_size: usize,
    horizon: u64,
) -> Vec<Option<u64>> {
    let mut next_delivery = 0usize;
    let mut base = 0u64;
    let mut queue: std::collections::VecDeque<(usize, usize)> = Default::default();
    let mut in_transit: Option<(usize, usize)> = None;
    let mut out = vec![None; arrivals.len()];
    let mut rationalize = |now: u64,
                           queue: &mut std::collections::VecDeque<(usize, usize)>,
                           in_transit: &mut Option<(usize, usize)>,
                           out: &mut Vec<Option<u64>>| {
        while schedule[next_delivery] + base <= now {
            let this = schedule[next_delivery] + base;
            let mut left = packet_size;
            next_delivery = (next_delivery + 1) % schedule.len();
            if next_delivery == 0 {
                base += schedule[schedule.len() - 1];
            }
            while left > 0 {
                if in_transit.is_none() {
                    match queue.pop_front() {
                        Some(p) => *in_transit = Some(p),
                        None => break,
                    }
                }
                let (idx, bytes) = in_transit.as_mut().unwrap();
                let amount = left.min(*bytes);
                *bytes -= amount;
                left -= amount;
                if *bytes == 0 {
                    out[*idx] = Some(this);
                    *in_transit = None;
                }
            }
        }
    };
    for (idx, &(t, size)) in arrivals.iter().enumerate() {
        rationalize(t, &mut queue, &mut in_transit, &mut out);
        queue.push_back((idx, size));
    }
    rationalize(horizon, &mut queue, &mut in_transit, &mut out);
    out
}

#[test]
fn replays_trace_1_2_3_exactly_like_mm_link_per_period() {
    let mut link = Link::new(trace_link("1\n2\n3\n")).unwrap();
    // Saturate: 30 full-size packets at t = 0; opportunities at 1, 2, 3, 4, ... ms.
    let out = run(&mut link, vec![(ZERO, 1500); 30], ms(1000));
    assert_eq!(out.len(), 30);
    for (k, p) in out.iter().enumerate() {
        assert_eq!(p.id, k as u64);
        assert_eq!(p.dequeued, ms(k as u64 + 1));
    }
    for period in 0..10u64 {
        let bytes: usize = out
            .iter()
            .filter(|p| p.dequeued > ms(3 * period) && p.dequeued <= ms(3 * period + 3))
            .map(|p| p.data.len())
            .sum();
        assert_eq!(bytes, 4500, "period {period}");
    }
}

#[test]
fn matches_mm_link_reference_on_mixed_sizes_and_bursty_traces() {
    for (trace_text, packet_size) in [("1\n2\n3", 1500), ("0\n0\n5\n5\n5\n9\n", 1504), ("2\n2\n2\n7\n20\n", 1500)] {
        let trace = Trace::parse(trace_text).unwrap();
        // Deterministic pseudo-random arrivals: sizes 40..=1500, gaps 0..3 ms.
        let mut rng = polycorn_emu::SplitMix64::new(42);
        let mut t = 0u64;
        let arrivals: Vec<(u64, usize)> = (0..600)
            .map(|_| {
                t += rng.next_u64() % 3;
                (t, 40 + (rng.next_u64() % 1461) as usize)
            })
            .collect();
        let horizon = t + 10_000;
        let expected = mahimahi_reference(trace.millis(), &arrivals, packet_size, horizon);
        let mut cfg = LinkConfig::new(Service::Trace(trace));
        cfg.opportunity_bytes = packet_size;
        let mut link = Link::new(cfg).unwrap();
        let out = run(&mut link, arrivals.iter().map(|&(t, s)| (ms(t), s)).collect(), ms(horizon));
        assert_eq!(out.len(), arrivals.len());
        for p in &out {
            assert_eq!(Some(p.dequeued), expected[p.id as usize].map(ms), "trace {trace_text:?} packet {}", p.id);
        }
    }
}

#[test]
fn one_opportunity_per_ms_carries_exactly_12_mbit_per_s_of_full_size_packets() {
    let mut link = Link::new(trace_link("1\n")).unwrap();
    let out = run(&mut link, vec![(ZERO, 1500); 1200], ms(1000));
    let bytes: usize = out.iter().filter(|p| p.departure <= ms(1000)).map(|p| p.data.len()).sum();
    assert_eq!(bytes, 1500 * 1000);
    assert_eq!(bytes * 8, 12_000_000);
    assert_eq!(link.queue_packets(), 200);
}

#[test]
fn packet_larger_than_remaining_budget_finishes_in_next_opportunity() {
    let mut link = Link::new(trace_link("1\n")).unwrap();
    let out = run(&mut link, vec![(ZERO, 1000), (ZERO, 1000), (ZERO, 1000)], ms(100));
    let times: Vec<Duration> = out.iter().map(|p| p.dequeued).collect();
    // 1000 at 1 ms; 500 + 500 spans 1 and 2 ms; third: 1000 of the 1000 left at 2 ms.
    assert_eq!(times, vec![ms(1), ms(2), ms(2)]);
}

#[test]
fn wasted_opportunities_are_not_banked() {
    let mut link = Link::new(trace_link("1\n")).unwrap();
    // Idle for 50 ms, then a burst: it still leaves at one packet per ms.
    let out = run(&mut link, vec![(ms(50), 1500); 3], ms(100));
    let times: Vec<Duration> = out.iter().map(|p| p.dequeued).collect();
    assert_eq!(times, vec![ms(51), ms(52), ms(53)]);
}

#[test]
fn constant_rate_paces_packets_by_size() {
    let mut link = Link::new(LinkConfig::new(Service::ConstantRate { bits_per_sec: 12_000_000 })).unwrap();
    let mut arrivals = vec![(ZERO, 1500); 10];
    arrivals.push((ms(100), 150));
    arrivals.push((ms(100), 150));
    let out = run(&mut link, arrivals, ms(1000));
    let times: Vec<Duration> = out.iter().map(|p| p.dequeued).collect();
    let mut expected: Vec<Duration> = (1..=10).map(ms).collect();
    expected.push(ms(100) + Duration::from_micros(100));
    expected.push(ms(100) + Duration::from_micros(200));
    assert_eq!(times, expected);
}

#[test]
fn fifo_is_preserved_when_delay_drops() {
    let mut cfg = LinkConfig::new(Service::ConstantRate { bits_per_sec: 12_000_000 });
    cfg.schedule.delay = DelaySchedule::new(vec![(ZERO, ms(100)), (ms(20), ms(5))], Interpolation::Step).unwrap();
    let mut link = Link::new(cfg).unwrap();
    let out = run(&mut link, (0..200).map(|k| (ms(k), 1500)).collect(), ms(10_000));
    assert_eq!(out.len(), 200);
    for w in out.windows(2) {
        assert!(w[0].id < w[1].id);
        assert!(w[0].departure <= w[1].departure);
    }
    // Packets leave the queue at k + 1 ms. The last one under 100 ms leaves the link at 119 ms;
    // every packet after the drop waits behind it until t + 5 ms passes 119 ms.
    let at = |t: u64| out.iter().find(|p| p.dequeued == ms(t)).unwrap().departure;
    assert_eq!(at(19), ms(119));
    assert_eq!(at(20), ms(119));
    assert_eq!(at(114), ms(119));
    assert_eq!(at(115), ms(120));
    assert_eq!(at(150), ms(155));
}

#[test]
fn linear_delay_interpolates() {
    let d = DelaySchedule::new(vec![(ZERO, ms(10)), (ms(100), ms(30))], Interpolation::Linear).unwrap();
    assert_eq!(d.at(ms(50)), ms(20));
    assert_eq!(d.at(ms(500)), ms(30));
}

#[test]
fn droptail_drops_exactly_the_overflow_bytes() {
    let mut cfg = trace_link("1000\n");
    cfg.buffer_bytes = Some(10_000);
    let mut link = Link::new(cfg).unwrap();
    let mut admissions = Vec::new();
    for _ in 0..10 {
        admissions.push(link.push(ZERO, vec![0; 1500]));
    }
    assert_eq!(admissions.iter().filter(|a| **a == Admission::Queued).count(), 6);
    assert!(admissions[6..].iter().all(|a| *a == Admission::DroppedBuffer));
    // 9000 queued: 1000 more fits exactly, one byte more does not.
    assert_eq!(link.push(ZERO, vec![0; 1001]), Admission::DroppedBuffer);
    assert_eq!(link.push(ZERO, vec![0; 1000]), Admission::Queued);
    assert_eq!(link.push(ZERO, vec![0; 1]), Admission::DroppedBuffer);
    let s = *link.stats();
    assert_eq!(s.max_queue_bytes, 10_000);
    assert_eq!(s.dropped_buffer.bytes, s.arrived.bytes - 10_000);
    assert_eq!(s.dropped_buffer.packets, 6);
    // After the opportunity at 1000 ms frees 1500 bytes, a full-size packet fits again.
    assert_eq!(link.push(ms(1000), vec![0; 1500]), Admission::Queued);
    assert_eq!(link.queue_bytes(), 10_000);
}

/// A link with one 1500-byte opportunity per ms, an unbounded buffer and constant loss.
fn lossy_link(seed: u64, params: GeParams, keying: LossKeying) -> Link {
    let mut cfg = trace_link("1\n");
    cfg.seed = seed;
    cfg.loss_keying = keying;
    cfg.schedule.loss = LossSchedule::constant(params);
    Link::new(cfg).unwrap()
}

/// Per-packet keying, `n` packets pushed at time 0: which were lost.
fn lost_pattern(seed: u64, params: GeParams, n: usize) -> Vec<bool> {
    let mut link = lossy_link(seed, params, LossKeying::Packet);
    (0..n).map(|_| link.push(ZERO, Vec::new()) == Admission::DroppedLoss).collect()
}

#[test]
fn packet_keyed_gilbert_elliott_long_run_mean_and_burst_length_match_and_seed_is_deterministic() {
    let params = GeParams::from_mean(0.05, 5.0).unwrap();
    let n = 400_000;
    let a = lost_pattern(1, params, n);
    let rate = a.iter().filter(|&&l| l).count() as f64 / n as f64;
    assert!((rate - 0.05).abs() < 0.005, "loss rate {rate}");
    let runs: Vec<usize> = a.split(|l| !l).map(<[bool]>::len).filter(|&l| l > 0).collect();
    let mean_run = runs.iter().sum::<usize>() as f64 / runs.len() as f64;
    assert!((mean_run - 5.0).abs() < 0.3, "mean bad run {mean_run}");
    assert_eq!(a, lost_pattern(1, params, n));
    assert_ne!(a, lost_pattern(2, params, n));
    // Loss in the good state too: mean = π_G·l_G + π_B·l_B.
    let p = GeParams::new(0.01, 0.1, 0.01, 0.5).unwrap();
    let b = lost_pattern(3, p, n);
    let rate = b.iter().filter(|&&l| l).count() as f64 / n as f64;
    assert!((rate - p.mean_loss()).abs() < 0.01, "{rate} vs {}", p.mean_loss());
}

#[test]
fn packet_keyed_loss_reproduces_the_first_versions_decisions() {
    // Recorded with the emulator before time keying existed (the per-packet chain was then the
    // only one): seed 42, 512 packets one per ms, bit i of word i / 64 = packet i lost.
    const OLD: [u64; 8] = [
        0x0000_0000_3000_0000,
        0x2000_1800_002D_010F,
        0x0040_0000_2088_0001,
        0x0700_1660_0208_0000,
        0x0400_0040_0000_0470,
        0x0020_0E00_8338_0604,
        0x0000_0000_5F80_0000,
        0x0000_0040_00C0_8000,
    ];
    let mut link = lossy_link(42, GeParams::new(0.05, 0.3, 0.02, 0.6).unwrap(), LossKeying::Packet);
    let mut words = [0u64; 8];
    for i in 0..512u64 {
        if link.push(ms(i), vec![0; 100]) == Admission::DroppedLoss {
            words[(i / 64) as usize] |= 1 << (i % 64);
        }
    }
    assert_eq!(words, OLD);
}

/// Nanoseconds of the loss slot.
fn slot_ns() -> u64 {
    u64::try_from(LOSS_SLOT.as_nanos()).unwrap()
}

/// Pushes `arrivals` (non-decreasing times) into `link` and returns each packet's
/// `(slot, index in its slot)` with whether it was lost.
fn keyed_decisions(link: &mut Link, arrivals: &[Duration]) -> BTreeMap<(u64, u64), bool> {
    let mut out = BTreeMap::new();
    let mut last_slot = None;
    let mut k = 0;
    for &t in arrivals {
        let slot = u64::try_from(t.as_nanos()).unwrap() / slot_ns();
        k = if last_slot == Some(slot) { k + 1 } else { 0 };
        last_slot = Some(slot);
        let lost = match link.push(t, vec![0; 100]) {
            Admission::DroppedLoss => true,
            Admission::Queued => false,
            other => panic!("unexpected {other:?}"),
        };
        out.insert((slot, k), lost);
    }
    out
}

/// The decisions of `a` and `b` where both have a packet at the same slot and index:
/// (number of such packets, number lost in `a`, number on which `a` and `b` disagree).
fn compare_common(a: &BTreeMap<(u64, u64), bool>, b: &BTreeMap<(u64, u64), bool>) -> (usize, usize, usize) {
    let (mut common, mut lost, mut differ) = (0, 0, 0);
    for (key, la) in a {
        if let Some(lb) = b.get(key) {
            common += 1;
            lost += usize::from(*la);
            differ += usize::from(la != lb);
        }
    }
    (common, lost, differ)
}

/// Three traffic patterns over `slots` slots: one packet per slot (early in it); the same plus
/// 1–3 extra packets later in a third of the slots (index ≥ 1), with the first packet at
/// another offset in the slot; and one packet every 7th slot with 1–2 extra ones (idle gaps).
fn crn_streams(slots: u64) -> [Vec<Duration>; 3] {
    let ns = slot_ns();
    let at = |slot: u64, frac: f64| Duration::from_nanos(slot * ns + (frac * ns as f64) as u64);
    let mut g = SplitMix64::new(99);
    let one: Vec<Duration> = (0..slots).map(|s| at(s, 0.1)).collect();
    let mut busy = Vec::new();
    let mut sparse = Vec::new();
    for s in 0..slots {
        busy.push(at(s, 0.3));
        if g.below(3) == 0 {
            for j in 0..1 + g.below(3) {
                busy.push(at(s, 0.5 + 0.1 * j as f64));
            }
        }
        if s % 7 == 0 {
            for j in 0..1 + g.below(3) {
                sparse.push(at(s, 0.2 * j as f64));
            }
        }
    }
    [one, busy, sparse]
}

#[test]
fn time_keyed_loss_is_the_same_for_different_traffic_at_the_same_slot_and_index() {
    // Loss in both states, so that the per-index draws matter as well as the state.
    let params = GeParams::new(0.02, 0.25, 0.01, 0.7).unwrap();
    let run = |keying: LossKeying, seed: u64| -> Vec<BTreeMap<(u64, u64), bool>> {
        crn_streams(20_000)
            .iter()
            .map(|arrivals| keyed_decisions(&mut lossy_link(seed, params, keying), arrivals))
            .collect()
    };
    let time = run(LossKeying::Time, 5);
    for (a, b) in [(0, 1), (0, 2), (1, 2)] {
        let (common, lost, differ) = compare_common(&time[a], &time[b]);
        assert!(common > 2_500, "streams {a} and {b} share only {common} (slot, index) pairs");
        // Not trivially equal: a good share of the shared instants lose their packet.
        assert!(lost as f64 > 0.5 * params.mean_loss() * common as f64, "{lost} of {common} lost");
        assert_eq!(differ, 0, "streams {a} and {b}: {differ} of {common} shared decisions differ");
    }
    // Another seed is another realisation.
    let (common, _, differ) = compare_common(&time[0], &run(LossKeying::Time, 6)[0]);
    assert!(differ as f64 > 0.02 * common as f64, "seeds 5 and 6 differ on only {differ} of {common}");
    // The per-packet chain has no such property: the extra packets shift its draws.
    let packet = run(LossKeying::Packet, 5);
    let (common, _, differ) = compare_common(&packet[0], &packet[1]);
    assert!(differ as f64 > 0.02 * common as f64, "packet keying: only {differ} of {common} differ");
}

/// Loss indicators of one packet every `every` slots, `n` packets, time-keyed.
fn probe(seed: u64, params: GeParams, every: u64, n: u64) -> Vec<bool> {
    let mut link = lossy_link(seed, params, LossKeying::Time);
    (0..n)
        .map(|i| link.push(LOSS_SLOT * u32::try_from(i * every).unwrap(), vec![0]) == Admission::DroppedLoss)
        .collect()
}

/// Standard deviation of the mean of `n` loss indicators of a stationary Gilbert–Elliott chain
/// sampled once every `every` steps: the indicators' variance `m(1 − m)` plus their
/// autocovariances `(l_B − l_G)² π_G π_B λ^(j·every)` at lag `j`, `λ = 1 − p_GB − p_BG`.
fn sd_of_mean_loss(p: &GeParams, every: u64, n: u64) -> f64 {
    let m = p.mean_loss();
    let pi_b = p.stationary_bad();
    let c = (p.loss_bad - p.loss_good).powi(2) * pi_b * (1.0 - pi_b);
    let lambda = (1.0 - p.p_good_to_bad - p.p_bad_to_good).powi(i32::try_from(every).unwrap());
    ((m * (1.0 - m) + 2.0 * c * lambda / (1.0 - lambda)) / n as f64).sqrt()
}

#[test]
fn time_keyed_long_run_loss_is_the_stationary_mean_for_dense_and_sparse_traffic() {
    let cases = [
        // Both states lossy; the tracegen's carrier B (1.35 %, mean bad run 4) and A (0.21 %).
        (GeParams::new(0.01, 0.1, 0.01, 0.5).unwrap(), 1, 1_000_000),
        (GeParams::from_mean(0.0135, 4.0).unwrap(), 1, 1_000_000),
        // The tracegen's validation probe: one packet every 50 ms.
        (GeParams::from_mean(0.0135, 4.0).unwrap(), 50, 200_000),
        (GeParams::from_mean(0.0021, 4.0).unwrap(), 50, 200_000),
    ];
    for (seed, (p, every, n)) in cases.into_iter().enumerate() {
        let lost = probe(seed as u64 + 10, p, every, n);
        let rate = lost.iter().filter(|&&l| l).count() as f64 / n as f64;
        let tol = 5.0 * sd_of_mean_loss(&p, every, n);
        assert!(
            (rate - p.mean_loss()).abs() < tol,
            "{p:?} every {every}: rate {rate} vs {} (tolerance {tol})",
            p.mean_loss()
        );
    }
}

#[test]
fn time_keyed_bad_runs_last_one_over_p_bad_to_good_slots() {
    // Gilbert model (loss iff bad) probed once per slot: runs of losses are the bad runs.
    for (seed, p_bg) in [(1, 0.25), (2, 0.5), (3, 0.1)] {
        let p = GeParams::new(0.01, p_bg, 0.0, 1.0).unwrap();
        let lost = probe(seed, p, 1, 1_000_000);
        let runs: Vec<usize> = lost.split(|l| !l).map(<[bool]>::len).filter(|&l| l > 0).collect();
        let mean = runs.iter().sum::<usize>() as f64 / runs.len() as f64;
        // Bad runs are geometric: mean 1/p, standard deviation √(1 − p)/p.
        let tol = 5.0 * (1.0 - p_bg).sqrt() / p_bg / (runs.len() as f64).sqrt();
        assert!((mean - 1.0 / p_bg).abs() < tol, "p_bg {p_bg}: mean bad run {mean} slots (tolerance {tol})");
    }
    // With ten packets per slot a bad run of 4 slots takes ≈ 40 packets in a row.
    let mut link = lossy_link(4, GeParams::from_mean(0.0135, 4.0).unwrap(), LossKeying::Time);
    let lost: Vec<bool> = (0..2_000_000u64)
        .map(|i| link.push(Duration::from_micros(i * 100), vec![0]) == Admission::DroppedLoss)
        .collect();
    let runs: Vec<usize> = lost.split(|l| !l).map(<[bool]>::len).filter(|&l| l > 0).collect();
    let mean = runs.iter().sum::<usize>() as f64 / runs.len() as f64;
    let tol = 5.0 * 10.0 * 0.75f64.sqrt() / 0.25 / (runs.len() as f64).sqrt();
    assert!((mean - 40.0).abs() < tol, "mean run at 10 packets per slot: {mean} packets (tolerance {tol})");
}

#[test]
fn time_keyed_loss_is_deterministic_and_independent_of_polling() {
    let params = GeParams::new(0.02, 0.25, 0.01, 0.7).unwrap();
    let arrivals = &crn_streams(5_000)[1];
    let decide = |seed: u64, poll: bool| -> Vec<Admission> {
        let mut link = lossy_link(seed, params, LossKeying::Time);
        arrivals
            .iter()
            .map(|&t| {
                if poll {
                    while link.poll_deliver(t).is_some() {}
                    let _ = link.next_event(t);
                }
                link.push(t, vec![0; 100])
            })
            .collect()
    };
    let a = decide(7, false);
    assert_eq!(a, decide(7, false));
    assert_eq!(a, decide(7, true));
    assert_ne!(a, decide(8, false));
    assert!(a.contains(&Admission::DroppedLoss) && a.contains(&Admission::Queued));
}

#[test]
fn loss_schedule_switches_parameters_at_their_time() {
    let mut cfg = trace_link("1\n");
    cfg.schedule.loss =
        LossSchedule::new(vec![(ZERO, GeParams::NONE), (ms(10), GeParams::new(0.0, 0.0, 1.0, 1.0).unwrap())]).unwrap();
    let mut link = Link::new(cfg).unwrap();
    assert_eq!(link.push(ms(9), vec![0; 10]), Admission::Queued);
    assert_eq!(link.push(ms(10), vec![0; 10]), Admission::DroppedLoss);
}

#[test]
fn hold_blackout_loses_nothing_and_releases_at_link_rate_after_the_end() {
    let mut cfg = trace_link("1\n");
    cfg.schedule.blackouts = vec![Blackout { start: ms(10), end: ms(110), kind: BlackoutKind::Hold }];
    cfg.schedule.delay = DelaySchedule::constant(ms(20));
    let mut link = Link::new(cfg).unwrap();
    let out = run(&mut link, (0..200).map(|k| (ms(k), 1500)).collect(), ms(10_000));
    assert_eq!(out.len(), 200);
    let s = link.stats();
    assert_eq!(s.delivered.packets, 200);
    assert_eq!(s.dropped_blackout.packets + s.flushed.packets + s.dropped_buffer.packets, 0);
    assert!(out.iter().all(|p| p.dequeued < ms(10) || p.dequeued >= ms(110)));
    // Packets 0..=8 left at 1..=9 ms; packet 9 (pushed at 9 ms) was held until 110 ms, then
    // one per opportunity (1 ms) until the 100-packet backlog has drained.
    let held: Vec<&Packet> = out.iter().filter(|p| p.dequeued >= ms(110)).collect();
    assert_eq!(held[0].id, 9);
    for (k, p) in held.iter().enumerate() {
        assert_eq!(p.dequeued, ms(110 + k as u64));
        assert_eq!(p.departure, p.dequeued + ms(20));
    }
}

#[test]
fn hold_blackout_pauses_constant_rate_service() {
    let mut cfg = LinkConfig::new(Service::ConstantRate { bits_per_sec: 1_200_000 }); // 10 ms per 1500 B
    cfg.schedule.blackouts = vec![Blackout { start: ms(15), end: ms(40), kind: BlackoutKind::Hold }];
    let mut link = Link::new(cfg).unwrap();
    let out = run(&mut link, vec![(ZERO, 1500); 3], ms(1000));
    let times: Vec<Duration> = out.iter().map(|p| p.dequeued).collect();
    // Second packet: 5 ms of service before the blackout, 5 ms after it.
    assert_eq!(times, vec![ms(10), ms(45), ms(55)]);
}

#[test]
fn flush_blackout_drops_queued_and_arriving_packets_but_keeps_those_in_flight() {
    let mut cfg = LinkConfig::new(Service::ConstantRate { bits_per_sec: 1_200_000 }); // 10 ms per 1500 B
    cfg.schedule.blackouts = vec![Blackout { start: ms(50), end: ms(100), kind: BlackoutKind::Flush }];
    cfg.schedule.delay = DelaySchedule::constant(ms(30));
    cfg.event_log = true;
    let mut link = Link::new(cfg).unwrap();
    let mut arrivals = vec![(ZERO, 1500); 20];
    arrivals.push((ms(60), 1500)); // inside: dropped
    arrivals.push((ms(99), 1500)); // inside: dropped
    arrivals.push((ms(100), 1500)); // at the end: queued
    let out = run(&mut link, arrivals, ms(10_000));
    let ids: Vec<u64> = out.iter().map(|p| p.id).collect();
    // Completions at 10..=50 ms (the one ending exactly at the start is delivered), then the
    // flush drops the 15 still queued; the packets in the delay stage (departures 60..80 ms,
    // inside the blackout) still arrive.
    assert_eq!(ids, vec![0, 1, 2, 3, 4, 22]);
    assert_eq!(out[4].departure, ms(80));
    assert_eq!(out[5].dequeued, ms(110));
    let s = link.stats();
    assert_eq!(s.flushed.packets, 15);
    assert_eq!(s.flushed.bytes, 15 * 1500);
    assert_eq!(s.dropped_blackout.packets, 2);
    let events = link.drain_events();
    assert_eq!(events.iter().filter(|e| e.kind == EventKind::Flush).count(), 15);
    assert!(events.iter().all(|e| e.kind != EventKind::Flush || e.time == ms(50)));
    assert!(events.iter().any(|e| e.kind == EventKind::BlackoutStart(BlackoutKind::Flush) && e.time == ms(50)));
    assert!(events.iter().any(|e| e.kind == EventKind::BlackoutEnd(BlackoutKind::Flush) && e.time == ms(100)));
    assert!(link.drain_events().is_empty());
}

#[test]
fn flush_blackout_drops_a_partly_sent_trace_packet() {
    let mut cfg = trace_link("1\n");
    cfg.schedule.blackouts =
        vec![Blackout { start: Duration::from_micros(1500), end: ms(5), kind: BlackoutKind::Flush }];
    let mut link = Link::new(cfg).unwrap();
    link.push(ZERO, vec![0; 1000]);
    link.push(ZERO, vec![0; 1000]); // 500 bytes sent at 1 ms, rest pending
    link.push(ZERO, vec![0; 1000]);
    let out = run(&mut link, Vec::new(), ms(100));
    assert_eq!(out.len(), 1);
    assert_eq!(link.stats().flushed.packets, 2);
    assert_eq!(link.queue_packets(), 0);
}

#[test]
fn event_log_is_self_describing() {
    let mut cfg = trace_link("1\n");
    cfg.event_log = true;
    cfg.schedule.delay = DelaySchedule::constant(ms(2));
    let mut link = Link::new(cfg).unwrap();
    run(&mut link, vec![(ZERO, 100)], ms(100));
    let lines: Vec<String> = link.drain_events().iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        vec![
            "0.000000 enqueue id=0 size=100 queue=100",
            "1.000000 dequeue id=0 size=100 queue=0",
            "3.000000 deliver id=0 size=100 queue=0",
        ]
    );
}

#[test]
fn schedule_file_drives_a_link() {
    let schedule = Schedule::parse("delay 0 10\nblackout 5 8 hold\n").unwrap();
    let mut cfg = trace_link("1\n");
    cfg.schedule = schedule;
    let mut link = Link::new(cfg).unwrap();
    let out = run(&mut link, (0..6).map(|k| (ms(k), 1500)).collect(), ms(100));
    let times: Vec<u64> = out.iter().map(|p| p.departure.as_millis() as u64).collect();
    assert_eq!(times, vec![11, 12, 13, 14, 18, 19]);
}

#[test]
fn real_mahimahi_traces_deliver_1500_bytes_per_line_per_period() {
    // The Mahimahi LTE traces carried in the repository (`testbed/traces/mahimahi`).
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces/mahimahi");
    let names = ["TMobile-LTE-short.down", "TMobile-LTE-short.up", "Verizon-LTE-short.down", "Verizon-LTE-short.up"];
    for name in names {
        let path = dir.join(name);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let trace = Trace::parse(&text).unwrap();
        let lines = trace.len();
        let period = trace.period();
        let mut link = Link::new(LinkConfig::new(Service::Trace(trace))).unwrap();
        // Keep the queue saturated from t = 0: opportunities in (0, P] number exactly `lines`
        // (the lines at 0 ms of the second repetition stand in for those of the first).
        let mut now = ZERO;
        let mut bytes = 0usize;
        loop {
            while let Some(p) = link.poll_deliver(now) {
                assert!(p.dequeued <= period);
                bytes += p.data.len();
            }
            if link.queue_packets() < 1000 {
                for _ in 0..2000 {
                    link.push(now, vec![0; 1500]);
                }
            }
            let t = link.next_event(now).unwrap();
            if t > period {
                break;
            }
            now = t;
        }
        assert_eq!(bytes, 1500 * lines, "{name}");
    }
}

/// A property test's number of cases: `ci`, times `POLYCORN_TEST_DEPTH` when
/// set (`make test-deep`; polycorn_core::testing::cases says more).
fn cases(ci: u32) -> u32 {
    std::env::var("POLYCORN_TEST_DEPTH")
        .map_or(ci, |v| ci * v.parse::<std::num::NonZeroU32>().expect("POLYCORN_TEST_DEPTH: a positive integer").get())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(64)))]

    #[test]
    fn next_event_never_goes_back_and_the_link_drains_completely(
        arrivals in prop::collection::vec((0u64..3_000, 0usize..3_000), 0..150),
        trace in prop::collection::vec(0u64..40, 1..20),
        rate in prop::option::of(100_000u64..50_000_000),
        blackouts in prop::collection::vec((1u64..400, 1u64..400, any::<bool>()), 0..4),
        delays in prop::collection::vec((0u64..3_000, 0u64..200), 0..5),
        buffer in prop::option::of(1_000usize..30_000),
        seed in any::<u64>(),
        lossy in any::<bool>(),
    ) {
        let mut trace = trace;
        trace.sort_unstable();
        if *trace.last().unwrap() == 0 {
            trace.push(1);
        }
        let service = match rate {
            Some(bits_per_sec) => Service::ConstantRate { bits_per_sec },
            None => Service::Trace(Trace::from_millis(trace).unwrap()),
        };
        let mut cfg = LinkConfig::new(service);
        cfg.buffer_bytes = buffer;
        cfg.seed = seed;
        let mut t = 0;
        cfg.schedule.blackouts = blackouts
            .into_iter()
            .map(|(gap, len, hold)| {
                t += gap;
                let b = Blackout {
                    start: ms(t),
                    end: ms(t + len),
                    kind: if hold { BlackoutKind::Hold } else { BlackoutKind::Flush },
                };
                t += len;
                b
            })
            .collect();
        let mut delays = delays;
        delays.sort_unstable();
        delays.dedup_by_key(|d| d.0);
        cfg.schedule.delay =
            DelaySchedule::new(delays.into_iter().map(|(t, d)| (ms(t), ms(d))).collect(), Interpolation::Linear).unwrap();
        if lossy {
            cfg.schedule.loss = LossSchedule::constant(GeParams::from_mean(0.1, 3.0).unwrap());
        }
        let mut link = Link::new(cfg).unwrap();
        let out = run(&mut link, arrivals.iter().map(|&(t, s)| (ms(t), s)).collect(), Duration::MAX);
        prop_assert_eq!(link.queue_packets(), 0);
        prop_assert_eq!(link.in_flight(), 0);
        let s = *link.stats();
        prop_assert_eq!(s.arrived.packets, arrivals.len() as u64);
        prop_assert_eq!(
            s.arrived.bytes,
            s.delivered.bytes + s.dropped_loss.bytes + s.dropped_buffer.bytes + s.dropped_blackout.bytes + s.flushed.bytes
        );
        prop_assert_eq!(out.len() as u64, s.delivered.packets);
        for w in out.windows(2) {
            prop_assert!(w[0].id < w[1].id);
            prop_assert!(w[0].departure <= w[1].departure);
        }
        for p in &out {
            prop_assert!(p.arrival <= p.dequeued && p.dequeued <= p.departure);
        }
    }
}

#[test]
fn next_event_wakes_for_a_flush_start_behind_a_hold_blackout() {
    let mut cfg = trace_link("1000\n");
    cfg.schedule.blackouts = vec![
        Blackout { start: ms(5), end: ms(8), kind: BlackoutKind::Hold },
        Blackout { start: ms(10), end: ms(20), kind: BlackoutKind::Flush },
    ];
    let mut link = Link::new(cfg).unwrap();
    assert_eq!(link.next_event(ZERO), None);
    link.push(ZERO, vec![0; 100]);
    assert_eq!(link.next_event(ZERO), Some(ms(10)));
    assert_eq!(link.poll_deliver(ms(10)), None);
    assert_eq!(link.stats().flushed.packets, 1);
    assert_eq!(link.next_event(ms(10)), None);
}

/// The queueing-time quantiles follow the packets' time in the queue: ten
/// full-size packets at once on a 1 ms-per-packet link wait 1..=10 ms.
#[test]
fn sojourn_quantiles_are_the_packets_time_in_the_queue() {
    let mut link = Link::new(LinkConfig::new(Service::ConstantRate { bits_per_sec: 12_000_000 })).unwrap();
    assert_eq!(link.sojourn_quantile(0.5), None);
    let out = run(&mut link, vec![(ZERO, 1500); 10], ms(1000));
    assert_eq!(out.len(), 10);
    assert_eq!(link.sojourn_quantile(0.5), Some(ms(5)));
    assert_eq!(link.sojourn_quantile(0.95), Some(ms(10)));
    assert_eq!(link.sojourn_quantile(0.0), Some(ms(1)));
}
