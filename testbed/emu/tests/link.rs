//! Behavioural tests of the link emulator, all in virtual time.

use std::time::Duration;

use polycorn_emu::{
    Admission, Blackout, BlackoutKind, DelaySchedule, EventKind, GeParams, Interpolation, Link, LinkConfig,
    LossSchedule, Packet, Schedule, Service, Trace,
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

fn lost_pattern(seed: u64, params: GeParams, n: usize) -> Vec<bool> {
    let mut cfg = trace_link("1\n");
    cfg.seed = seed;
    cfg.schedule.loss = LossSchedule::constant(params);
    let mut link = Link::new(cfg).unwrap();
    (0..n).map(|_| link.push(ZERO, Vec::new()) == Admission::DroppedLoss).collect()
}

#[test]
fn gilbert_elliott_long_run_mean_and_burst_length_match_and_seed_is_deterministic() {
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

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
