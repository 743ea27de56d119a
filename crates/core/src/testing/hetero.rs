//! Carriers of equal rate and unequal delay in virtual time: when does
//! using the slower one delay a download past what the faster one alone
//! would take? (On the railway a single carrier sometimes beats
//! multipath on 1 MB downloads; the per-download curves show the first
//! 64 KB, then a stall until a packet on the slower carrier arrives.)

use std::time::Duration;

use super::*;
use crate::sched::Registry;

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

/// Completion time of a `size`-byte download at 10 s after a 4 MB warm-up,
/// over path 0 (`fast_ms` one way) and path 1 (`slow_ms`), both at `mbit`.
fn completion(name: &str, size: u64, mbit: f64, fast_ms: u64, slow_ms: u64) -> Option<Duration> {
    let d = |a, b| vec![PathSpec::mbit(mbit, ms(a)), PathSpec::mbit(mbit, ms(b))];
    completion_over(name, size, d(fast_ms, slow_ms))
}

fn completion_over(name: &str, size: u64, paths: Vec<PathSpec>) -> Option<Duration> {
    let r = Registry::with_builtins();
    let build = || super::railway::build(&r, name);
    let mut h = Harness::with_config(SimConfig::default(), build(), build(), paths, 7);
    h.open(ConnSpec::new(1).upload(300).download(4_000_000).at(Duration::ZERO));
    h.open(ConnSpec::new(1).upload(300).download(size).at(Duration::from_secs(10)));
    let rep = h.run_until(Duration::from_secs(120));
    rep.conns[1].completion
}

#[test]
fn a_path_slower_than_the_first_timer_learns_its_rtt_and_is_used() {
    // Path 1's RTT (600 ms) is longer than the timer before any sample.
    // Its first flight times out; Karn's rule fences those frames off as
    // RTT samples, so the timer must stay backed off until a frame sent
    // after the timeout is acknowledged. Reset on the first acknowledgement
    // instead, it fired on every flight, fenced every sample away and kept
    // the path at its initial 100 ms estimate, in timeout and stale, for
    // ever: 4 MB took 2.52 s against 2.86 s on the fast path alone.
    let r = Registry::with_builtins();
    let paths = vec![PathSpec::mbit(12.0, ms(30)), PathSpec::mbit(12.0, ms(300))];
    let mut h =
        Harness::with_config(SimConfig::default(), r.build("minrtt").unwrap(), r.build("minrtt").unwrap(), paths, 7);
    h.open(ConnSpec::new(1).upload(300).download(4_000_000).at(Duration::ZERO));
    h.open(ConnSpec::new(1).upload(300).download(4_194_304).at(Duration::from_secs(10)));
    let rep = h.run_until(Duration::from_secs(60));
    let slow = h.proxy().path_view(crate::PathId(1), h.instant()).unwrap();
    let stale = h.proxy().path_stats(crate::PathId(1)).unwrap().stale_transitions;
    assert!(
        (500_000..800_000).contains(&slow.srtt_us),
        "the slow path's smoothed RTT is its own, not the initial guess: {} us",
        slow.srtt_us
    );
    assert_eq!(stale, 0, "a healthy slow path never goes stale");
    let both = rep.conns[1].completion.unwrap();
    let alone = completion("single-path-c0", 4_194_304, 12.0, 30, 300).unwrap();
    eprintln!("4 MB over 30/300 ms: both paths {both:?}, the fast one alone {alone:?}");
    assert!(both.as_secs_f64() < 0.75 * alone.as_secs_f64(), "both carriers carry it: {both:?} vs {alone:?}");
}

#[test]
fn a_short_download_stays_off_a_carrier_whose_packets_would_arrive_last() {
    // 256 KB over carriers of 30 and 300 ms one way. The fast carrier alone
    // delivers it in about 235 ms; a packet on the slow one arrives after
    // 300 ms. Tail-packet rejection keeps the tail off the slow carrier,
    // but only for bytes it knows to be the tail: when a new connection
    // could hold only 128 KiB unsent, the first 128 KiB were scheduled
    // before the end of the response (and its FIN) was in the buffer, and
    // two of their packets went to the slow carrier (374 ms). With the
    // initial low-water mark at the peer's initial window the whole
    // response and its FIN are in the buffer at once.
    let alone = completion("single-path-c0", 262_144, 12.0, 30, 300).unwrap();
    let hrsch = completion("hrsch", 262_144, 12.0, 30, 300).unwrap();
    let minrtt = completion("minrtt", 262_144, 12.0, 30, 300).unwrap();
    eprintln!("256 KB over 30/300 ms: fast alone {alone:?}, hrsch {hrsch:?}, minrtt {minrtt:?}");
    assert!(hrsch.as_secs_f64() <= 1.05 * alone.as_secs_f64(), "hrsch {hrsch:?} vs the fast carrier alone {alone:?}");
    // The check can fail: minrtt, which has no tail rule, spills onto the
    // slow carrier and finishes later.
    assert!(minrtt.as_secs_f64() > 1.2 * alone.as_secs_f64(), "minrtt {minrtt:?} vs {alone:?}");
    // And a 1 MB one, which the slow carrier does help, still uses it.
    let alone = completion("single-path-c0", 1_048_576, 12.0, 30, 300).unwrap();
    let hrsch = completion("hrsch", 1_048_576, 12.0, 30, 300).unwrap();
    assert!(
        hrsch.as_secs_f64() < 0.85 * alone.as_secs_f64(),
        "1 MB: hrsch {hrsch:?} vs the fast carrier alone {alone:?}"
    );
}

#[test]
fn acknowledgements_take_the_quicker_carrier_whichever_path_it_is() {
    // Data-level ACKs and window updates rode on whichever healthy path
    // asked for frames first, path 0 in the harness: with the slow carrier
    // as path 0, a 4 MB download took 2.07 s with minrtt against 1.79 s
    // with the carriers the other way round. Now on the quicker one either
    // way.
    let paths = |a, b| vec![PathSpec::mbit(12.0, ms(a)), PathSpec::mbit(12.0, ms(b))];
    let fast_first = completion_over("minrtt", 4_194_304, paths(30, 300)).unwrap().as_secs_f64();
    let slow_first = completion_over("minrtt", 4_194_304, paths(300, 30)).unwrap().as_secs_f64();
    eprintln!("4 MB, minrtt: fast carrier as path 0 {fast_first:.3} s, as path 1 {slow_first:.3} s");
    assert!(slow_first < 1.05 * fast_first, "slow carrier first {slow_first:.3} s vs fast first {fast_first:.3} s");
}

#[test]
fn a_short_download_does_not_wait_for_a_slow_carriers_share() {
    // Carriers of 40 and 1 Mbit/s, the slow one with the lower RTT (25 vs
    // 35 ms one way), so minrtt fills it first. A 256 KB download then
    // waits for the 16 KB frames queued on the slow carrier (0.31 s against
    // 0.11 s on the fast one alone). Tail reinjection copies them onto the
    // fast carrier once the last packet is placed.
    let paths = || vec![PathSpec::mbit(40.0, ms(35)), PathSpec::mbit(1.0, ms(25))];
    let alone = completion_over("single-path-c0", 262_144, paths()).unwrap().as_secs_f64();
    let minrtt = completion_over("minrtt", 262_144, paths()).unwrap().as_secs_f64();
    let tail = completion_over("minrtt:+tail-reinject", 262_144, paths()).unwrap().as_secs_f64();
    eprintln!("256 KB over 40/1 Mbit/s: fast alone {alone:.3} s, minrtt {minrtt:.3} s, with tail-reinject {tail:.3} s");
    assert!(minrtt > 1.5 * alone, "the case needs the slow carrier to hurt: {minrtt:.3} vs {alone:.3}");
    assert!(tail <= 1.05 * alone, "with tail-reinject {tail:.3} s vs the fast carrier alone {alone:.3} s");
    // A 4 MB download over 40 and 10 Mbit/s still uses both.
    let paths = || vec![PathSpec::mbit(40.0, ms(35)), PathSpec::mbit(10.0, ms(25))];
    let alone = completion_over("single-path-c0", 4_194_304, paths()).unwrap().as_secs_f64();
    let tail = completion_over("minrtt:+tail-reinject", 4_194_304, paths()).unwrap().as_secs_f64();
    assert!(tail < 0.9 * alone, "4 MB: with tail-reinject {tail:.3} s vs the fast carrier alone {alone:.3} s");
}

#[test]
fn a_tail_takes_the_fast_carrier_when_minrtt_prefers_the_slow_one() {
    // Carriers of 40 and 10 Mbit/s, the slow one with the lower RTT. With
    // the paper's tail-reject after minrtt, a tail packet for which minrtt
    // picked the slow carrier waits, although the fast one has room, and
    // minrtt picks the slow one again next round: 256 KB took 0.30 s
    // against 0.155 s with minrtt alone and 0.113 s on the fast carrier
    // alone. The rule as a candidate filter before minrtt leaves it the
    // fast carrier.
    let paths = || vec![PathSpec::mbit(40.0, ms(35)), PathSpec::mbit(10.0, ms(25))];
    let alone = completion_over("single-path-c0", 262_144, paths()).unwrap().as_secs_f64();
    let tpr = completion_over("minrtt+tpr", 262_144, paths()).unwrap().as_secs_f64();
    let filter = completion_over("minrtt:-minrtt,+tail-filter,+minrtt", 262_144, paths()).unwrap().as_secs_f64();
    eprintln!("256 KB over 40/10 Mbit/s: fast alone {alone:.3} s, minrtt+tpr {tpr:.3} s, tail-filter {filter:.3} s");
    assert!(tpr > 1.5 * alone, "the case needs tail-reject to wait: {tpr:.3} vs {alone:.3}");
    assert!(filter <= 1.05 * alone, "tail-filter {filter:.3} s vs the fast carrier alone {alone:.3} s");
}

/// Exploration, printing only.
#[test]
#[ignore = "exploration: prints a table"]
fn print_unequal_delay_study() {
    let schemes = [
        "minrtt",
        "blest",
        "ecf",
        "minrtt+tpr",
        "hrsch",
        "hrsch+stale",
        "hrsch+stale:strict=1",
        "minrtt:+tail-reinject",
        "redundant",
    ];
    for (fast, slow) in [(30u64, 30u64), (30, 60), (30, 150), (30, 300)] {
        for size in [262_144u64, 1_048_576, 4_194_304] {
            let one = completion("single-path-c0", size, 12.0, fast, slow).map_or(f64::NAN, |d| d.as_secs_f64());
            let mut line = format!("owd {fast}/{slow} ms, {size} B: fast path alone {one:.3}");
            for s in schemes {
                let t = completion(s, size, 12.0, fast, slow).map_or(f64::NAN, |d| d.as_secs_f64());
                line += &format!(" | {s} {t:.3}");
            }
            eprintln!("{line}");
        }
    }
}

#[test]
fn a_weak_carrier_holding_the_head_does_not_starve_the_window_s_growth() {
    // 4 MB over a strong carrier (40 Mbit/s, 20 ms one way) and a weak one
    // (3 Mbit/s, 250 ms). Every packet placed on the weak carrier holds the
    // window's head for half a second while the strong one fills the rest
    // of the window and waits. Autotuning that counted only bytes read saw
    // nothing to grow for (the reader was starved by the gap) and measured
    // once per slowest round trip: `hrsch+stale` took 1.46 s, 1.66x the
    // strong carrier alone (0.88 s). Counting what arrives above the gap,
    // measured per quickest round trip: 1.07 s (1.21x); a 2 MiB start as
    // well: 0.88 s, but on the emulated railway that start gained nothing
    // (docs/results.md, "The receive window's start and growth on the
    // railway"), so windows still start at 1 MiB.
    let paths = || vec![PathSpec::mbit(40.0, ms(20)), PathSpec::mbit(3.0, ms(250))];
    let alone = completion_over("single-path-c0", 4_194_304, paths()).unwrap();
    for name in ["hrsch+stale", "hrsch+"] {
        let both = completion_over(name, 4_194_304, paths()).unwrap();
        eprintln!("4 MB over 40/3 Mbit/s: {name} {both:?}, the strong carrier alone {alone:?}");
        assert!(
            both.as_secs_f64() <= alone.as_secs_f64() * 1.3,
            "{name} {both:?} vs the strong carrier alone {alone:?}"
        );
    }
}
