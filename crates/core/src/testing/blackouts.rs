//! Unpredicted blackouts in virtual time: a carrier goes dark under a
//! download with nothing in the failure table to warn of it. What decides
//! the outcome is what the sender does with the dark path: whether it goes
//! on filling it, and how soon what it holds is sent elsewhere.

use std::time::Duration;

use super::*;
use crate::sched::Registry;
use crate::PathId;

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

/// Path 0: 8 Mbit/s at 60 ms one way; path 1: 24 Mbit/s at 50 ms, dark
/// over `blackout`. A 4 MB download from 0 s warms both paths' estimates;
/// the measured one (`size` bytes) starts at 10 s. Returns the harness
/// after the run (tracing on at the proxy) and the measured download's
/// completion time.
fn run(name: &str, size: u64, blackout: Option<(Duration, Duration)>) -> (Harness, Option<Duration>) {
    let r = Registry::with_builtins();
    run_with(|| r.build(name).unwrap(), size, blackout)
}

/// [`run`] with both endpoints' pipelines from `pipeline`.
fn run_with(
    pipeline: impl Fn() -> crate::Pipeline,
    size: u64,
    blackout: Option<(Duration, Duration)>,
) -> (Harness, Option<Duration>) {
    let mut p1 = PathSpec::mbit(24.0, ms(50));
    if let Some((a, b)) = blackout {
        p1 = p1.with_blackout(a, b);
    }
    let paths = vec![PathSpec::mbit(8.0, ms(60)), p1];
    let mut h = Harness::with_config(SimConfig::default(), pipeline(), pipeline(), paths, 7);
    h.proxy_mut().enable_trace(1 << 20);
    h.open(ConnSpec::new(1).upload(300).download(4_000_000).at(Duration::ZERO));
    h.open(ConnSpec::new(1).upload(300).download(size).at(Duration::from_secs(10)));
    let rep = h.run_until(Duration::from_secs(120));
    let done = rep.conns[1].completion;
    (h, done)
}

const START: Duration = Duration::from_secs(10);

#[test]
fn a_path_in_timeout_takes_only_a_probe_until_it_answers() {
    // Path 1 goes dark 200 ms into a 4 MB download, for 3 s. Halfway
    // through the blackout it has timed out: its window is down to a probe
    // and nothing new has been placed on it since; after the blackout it
    // carries a full window again.
    let r = Registry::with_builtins();
    let paths = vec![
        PathSpec::mbit(8.0, ms(60)),
        PathSpec::mbit(24.0, ms(50)).with_blackout(START + ms(200), START + ms(3200)),
    ];
    let mut h =
        Harness::with_config(SimConfig::default(), r.build("minrtt").unwrap(), r.build("minrtt").unwrap(), paths, 7);
    h.open(ConnSpec::new(1).upload(300).download(4_000_000).at(Duration::ZERO));
    h.open(ConnSpec::new(1).upload(300).download(8_000_000).at(START));
    let (mut dark, mut after) = (None, None);
    let rep = h.run_observed(Duration::from_secs(120), |h| {
        let v = h.proxy().path_view(PathId(1), h.instant());
        if h.now() <= START + ms(1700) {
            dark = v;
        }
        if h.now() <= START + ms(5000) {
            after = v;
        }
    });
    rep.assert_all_done();
    let (dark, after) = (dark.unwrap(), after.unwrap());
    let probe = h.config().proxy.path.min_cwnd_bytes;
    assert!(dark.rto_count > 0, "path 1 timed out in its blackout: {dark:?}");
    assert!(dark.cwnd_bytes <= probe, "a path in timeout takes only a probe: {dark:?}");
    assert!(dark.idle_us >= 1_000_000, "nothing new was placed on it for a second: {dark:?}");
    assert!(after.rto_count == 0 && after.cwnd_bytes > 4 * probe, "its window came back with its acks: {after:?}");
}

#[test]
fn extended_reinjection_rescues_a_download_from_an_unpredicted_blackout() {
    // A 1 MB download whose faster path goes dark as it starts, for 3 s.
    // minRTT reinjects one segment per timeout and waits for the blackout;
    // HRSCH's extended reinjection gives everything back at the third
    // timeout, and the path in timeout takes nothing new meanwhile.
    let blackout = Some((START, START + ms(3000)));
    let (_, clear) = run("hrsch", 1_000_000, None);
    let (_, hrsch) = run("hrsch", 1_000_000, blackout);
    let (_, minrtt) = run("minrtt", 1_000_000, blackout);
    let (clear, hrsch, minrtt) = (clear.unwrap(), hrsch.unwrap(), minrtt.unwrap());
    eprintln!("1 MB: no blackout {clear:?}, hrsch {hrsch:?}, minrtt {minrtt:?}");
    assert!(minrtt > ms(3000), "minRTT waits for the blackout's end: {minrtt:?}");
    assert!(hrsch < ms(2000), "HRSCH finishes on the other path well before the blackout ends: {hrsch:?}");
}

#[test]
fn the_stale_filter_moves_a_download_off_a_dark_path_before_its_third_timeout() {
    // The faster path goes dark 200 ms into a 1 MB download, for 3 s, with
    // nothing in the table to warn of it. HRSCH alone waits for extended
    // reinjection's third timeout; with the stale filter (`hrsch+stale`)
    // the path is stale after max(2 x SRTT, 300 ms) without progress and
    // everything on it goes back to the other path at once.
    let blackout = Some((START + ms(200), START + ms(3200)));
    let (_, hrsch) = run("hrsch", 1_000_000, blackout);
    let (h, stale) = run("hrsch+stale", 1_000_000, blackout);
    let (hrsch, stale) = (hrsch.unwrap(), stale.unwrap());
    eprintln!("1 MB through a blackout from 200 ms: hrsch {hrsch:?}, hrsch+stale {stale:?}");
    let stale_events =
        h.proxy().pipeline().counters().iter().find(|c| c.0 == "stale-filter" && c.1 == "stale_paths").map(|c| c.2);
    assert!(stale_events.unwrap_or(0) > 0, "the dark path was marked stale: {stale_events:?}");
    assert!(stale < ms(1200), "hrsch+stale finishes on the other path within the blackout: {stale:?}");
    assert!(hrsch > stale + ms(500), "HRSCH alone waits for its third timeout: {hrsch:?} vs {stale:?}");
}

#[test]
fn the_stale_threshold_is_the_stale_filters_parameter() {
    // The blackout above. With `min_ms` = 2500 the dark path turns stale
    // only 2.5 s after its last progress, and the download waits for it
    // about as long as HRSCH alone; the default (300 ms) moves it at once.
    let blackout = Some((START + ms(200), START + ms(3200)));
    let r = Registry::with_builtins();
    let mut spec = r.pipeline_spec("hrsch+stale").unwrap().clone();
    let filter = spec.schedulerlets.iter_mut().find(|s| s.name == "stale-filter").unwrap();
    filter.params.insert("min_ms".into(), 2500.0);
    let (h, late) = run_with(|| r.build_spec("hrsch+stale-2500", &spec).unwrap(), 1_000_000, blackout);
    let (d, quick) = run("hrsch+stale", 1_000_000, blackout);
    let (late, quick) = (late.unwrap(), quick.unwrap());
    eprintln!("1 MB through a blackout: stale after 300 ms {quick:?}, after 2500 ms {late:?}");
    assert_eq!(h.proxy().config().path.stale_after_min, ms(2500), "the pipeline's threshold reaches the paths");
    assert_eq!(d.proxy().config().path.stale_after_min, ms(300), "without parameters the path default holds");
    assert!(late > quick + ms(1000), "a later threshold keeps the download waiting: {late:?} vs {quick:?}");
}

/// Exploration, printing only: completion times (s) without / with a 3 s
/// blackout of the faster path, by download size and onset.
#[test]
#[ignore = "exploration: prints a table"]
fn print_blackout_study() {
    let schemes =
        ["minrtt", "minrtt+stale", "minrtt+opp", "minrtt+er", "hrsch", "hrsch+stale", "hrsch+hol", "minrtt+hol"];
    for size in [1_000_000u64, 4_000_000] {
        for onset in [0u64, 200, 500, 1000] {
            let b = (START + ms(onset), START + ms(onset + 3000));
            let mut line = format!("size {size} onset {onset} ms:");
            for s in schemes {
                let secs = |d: Option<Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64());
                let clear = secs(run(s, size, None).1);
                let dark = secs(run(s, size, Some(b)).1);
                line += &format!(" {s} {clear:.2}/{dark:.2}");
            }
            eprintln!("{line}");
        }
    }
}

#[test]
#[ignore = "exploration: prints"]
fn print_window_update_study() {
    let r = Registry::with_builtins();
    for fixed in [512 * 1024u64, 1 << 20, 2 << 20] {
        let mut cfg = SimConfig::default();
        for ep in [&mut cfg.relay, &mut cfg.proxy] {
            ep.set_fixed_window(fixed);
        }
        let paths = vec![PathSpec::mbit(8.0, ms(120)), PathSpec::mbit(24.0, ms(100))];
        let mut h = Harness::with_config(cfg, r.build("minrtt").unwrap(), r.build("minrtt").unwrap(), paths, 7);
        h.open(ConnSpec::new(1).upload(300).download(8_000_000).at(Duration::ZERO));
        let rep = h.run_until(Duration::from_secs(120));
        eprintln!("window {fixed}: 8 MB in {:?}", rep.conns[0].completion);
    }
}

/// Exploration, printing only: completion of 1 and 4 MB downloads with the
/// default autotuning from different initial windows, over 8 + 24 Mbit/s
/// carriers at 120 and 100 ms one way.
#[test]
#[ignore = "exploration: prints"]
fn print_initial_window_study() {
    let r = Registry::with_builtins();
    for initial in [512 * 1024u64, 1 << 20, 2 << 20, 4 << 20] {
        let mut line = format!("initial {initial}:");
        for size in [1_000_000u64, 4_000_000] {
            let mut cfg = SimConfig::default();
            for ep in [&mut cfg.relay, &mut cfg.proxy] {
                ep.conn_window_initial_bytes = initial;
            }
            let paths = vec![PathSpec::mbit(8.0, ms(120)), PathSpec::mbit(24.0, ms(100))];
            let mut h = Harness::with_config(cfg, r.build("minrtt").unwrap(), r.build("minrtt").unwrap(), paths, 7);
            h.open(ConnSpec::new(1).upload(300).download(4_000_000).at(Duration::ZERO));
            h.open(ConnSpec::new(1).upload(300).download(size).at(Duration::from_secs(10)));
            let rep = h.run_until(Duration::from_secs(120));
            line += &format!(" {size} B in {:?};", rep.conns[1].completion);
        }
        eprintln!("{line}");
    }
}
