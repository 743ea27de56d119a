//! Two-ended behaviour tests in virtual time.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::sched::{builtin_pipeline_names, PipelineSpec, Registry, SchedulerletSpec};
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

#[test]
fn every_builtin_scheduler_delivers_a_megabyte_each_way_intact() {
    for name in builtin_pipeline_names() {
        let mut h = Harness::new(name, two_paths(), 1);
        h.open(ConnSpec::new(1).upload(MB).download(MB));
        let r = h.run_until(secs(60));
        r.assert_all_done();
        eprintln!("{name}: completed in {:?}", r.conns[0].completion.unwrap());
        if name == "redundant" {
            assert!(r.relay.redundant_bytes > 0 && r.proxy.redundant_bytes > 0, "{name} sends copies");
        }
    }
}

#[test]
fn fifty_connections_from_ten_users_complete_intact() {
    for name in ["minrtt", "single-path"] {
        let mut h = Harness::new(name, two_paths(), 2);
        for i in 0..50u64 {
            let spec =
                ConnSpec::new((i % 10) as u16).upload(10_000 + i * 1000).download(50_000 + i * 3000).at(ms(i * 7));
            h.open(if i % 3 == 0 { spec.request_response() } else { spec });
        }
        let r = h.run_until(secs(120));
        r.assert_all_done();
        assert_eq!(r.relay.conns_closed, 50);
        assert_eq!(r.proxy.conns_closed, 50);
        eprintln!("{name}: 50 connections done at {:?}", r.elapsed);
    }
}

/// An 8 MB download that is well under way at 1 s.
fn bulk_download(h: &mut Harness) {
    h.open(ConnSpec::new(1).upload(100_000).download(8 * MB));
}

#[test]
fn a_three_second_blackout_mid_transfer_only_delays_it() {
    let base = {
        let mut h = Harness::new("minrtt", two_paths(), 3);
        bulk_download(&mut h);
        let r = h.run_until(secs(120));
        r.assert_all_done();
        r.conns[0].completion.unwrap()
    };
    assert!(base > secs(1), "the blackout must fall mid-transfer (took {base:?})");
    for name in builtin_pipeline_names() {
        let mut paths = two_paths();
        paths[0] = paths[0].clone().with_blackout(secs(1), secs(4));
        let mut h = Harness::new(name, paths, 3);
        bulk_download(&mut h);
        let r = h.run_until(secs(120));
        r.assert_all_done();
        let t = r.conns[0].completion.unwrap();
        eprintln!("{name}: {t:?} with a 3 s blackout ({base:?} without, minrtt)");
        if name == "minrtt" {
            assert!(t > base, "a blackout cannot make minrtt faster: {t:?} vs {base:?}");
        }
    }
}

#[test]
fn killing_a_path_mid_transfer_loses_nothing() {
    for name in builtin_pipeline_names() {
        for revive in [None, Some(secs(2))] {
            let mut paths = two_paths();
            paths[0] = paths[0].clone().with_kill(ms(700), revive);
            let mut h = Harness::new(name, paths, 4);
            h.open(ConnSpec::new(1).upload(2 * MB).download(4 * MB));
            h.open(ConnSpec::new(2).upload(MB).download(MB).at(ms(300)));
            let r = h.run_until(secs(120));
            r.assert_all_done();
            let lost = r.paths[0].up.discarded_bytes + r.paths[0].down.discarded_bytes;
            assert!(lost > 0, "{name}: the kill must hit data in the pipe");
            if revive.is_some() {
                assert!(r.path_log.iter().any(|e| e.path == PathId(0) && e.change == PathChange::Revived));
            }
            eprintln!("{name} (revive {revive:?}): {lost} bytes lost in the pipe, done at {:?}", r.elapsed);
        }
    }
}

#[test]
fn a_path_silent_past_dead_after_is_closed_and_reconnected() {
    let mut paths = two_paths();
    paths[0] = paths[0].clone().with_blackout(ms(500), secs(13));
    let mut h = Harness::new("minrtt", paths, 5);
    h.open(ConnSpec::new(1).upload(MB).download(MB));
    // A second wave after the outage must be able to use path 0 again.
    h.open(ConnSpec::new(2).upload(MB).download(4 * MB).at(secs(16)));
    let r = h.run_until(secs(120));
    r.assert_all_done();
    let log: Vec<&PathChange> = r.path_log.iter().filter(|e| e.path == PathId(0)).map(|e| &e.change).collect();
    assert!(log.iter().any(|c| matches!(c, PathChange::Dead(_))), "{log:?}");
    let back = r.path_log.iter().find(|e| e.path == PathId(0) && e.change == PathChange::Reconnected);
    assert!(back.is_some_and(|e| e.at >= secs(13)), "no reconnection during the outage: {log:?}");
    assert!(r.paths[0].relay.as_ref().unwrap().data_bytes_sent > 0);
}

#[test]
fn lossy_paths_deliver_everything_intact() {
    for name in builtin_pipeline_names() {
        let paths = vec![PathSpec::rate(2 * MB, ms(20)).with_loss(0.02), PathSpec::rate(MB, ms(60)).with_loss(0.05)];
        let mut h = Harness::new(name, paths, 6);
        h.open(ConnSpec::new(1).upload(MB).download(2 * MB));
        h.open(ConnSpec::new(2).upload(300_000).download(300_000).request_response());
        let r = h.run_until(secs(120));
        r.assert_all_done();
        assert!(r.paths.iter().all(|p| p.up.lost_segments + p.down.lost_segments > 0));
    }
}

/// Extended reinjection with k = 3, for both endpoints.
fn extended_pipelines() -> (crate::Pipeline, crate::Pipeline) {
    let r = Registry::with_builtins();
    let mut reinjection = SchedulerletSpec::named("extended");
    reinjection.params.insert("k".into(), 3.0);
    let spec = PipelineSpec { schedulerlets: vec![SchedulerletSpec::named("minrtt")], reinjection };
    (r.build_spec("minrtt-ext", &spec).unwrap(), r.build_spec("minrtt-ext", &spec).unwrap())
}

#[test]
fn extended_reinjection_moves_a_stalled_paths_data_once_and_never_back_onto_it() {
    // Path 0 stalls long enough for three RTOs (about 0.2 + 0.4 + 0.8 s
    // with backoff) but not a fourth, and well short of `dead_after`.
    let run = |extended: bool| {
        let mut paths = two_paths();
        paths[0] = paths[0].clone().with_blackout(ms(500), ms(2300));
        let mut h = if extended {
            let (a, b) = extended_pipelines();
            Harness::with_config(SimConfig::default(), a, b, paths, 7)
        } else {
            Harness::new("minrtt", paths, 7)
        };
        h.open(ConnSpec::new(1).upload(4 * MB));
        let mut stalled_in_flight = 0;
        let r = h.run_observed(secs(120), |h| {
            if h.now() >= ms(500) && h.now() < ms(2300) {
                let v = h.relay().path_view(PathId(0), h.instant()).expect("path 0 exists");
                stalled_in_flight = stalled_in_flight.max(v.in_flight_bytes);
            }
        });
        r.assert_all_done();
        (r, stalled_in_flight)
    };
    let (ext, stalled_in_flight) = run(true);
    let (oldest, _) = run(false);
    let (stalled, other) = (&ext.paths[0], &ext.paths[1]);
    eprintln!(
        "extended: {} B reinjected ({} B were stuck on path 0), done at {:?}; rto-oldest: {} B, done at {:?}",
        ext.relay.reinjected_bytes, stalled_in_flight, ext.elapsed, oldest.relay.reinjected_bytes, oldest.elapsed
    );
    let relay_rtos = stalled.relay.as_ref().unwrap().rto_events;
    assert_eq!(relay_rtos, 3, "the scenario needs exactly three RTOs of the sender on path 0");
    assert!(other.reinjected_bytes() > 0, "path 0's data went to path 1");
    assert_eq!(stalled.reinjected_bytes(), 0, "a reinjection never returns to the path it left");
    assert!(
        ext.relay.reinjected_bytes <= stalled_in_flight,
        "each stalled byte is reinjected at most once: {} reinjected, {stalled_in_flight} were in flight",
        ext.relay.reinjected_bytes
    );
    assert!(
        ext.relay.reinjected_bytes > oldest.relay.reinjected_bytes,
        "at the 3rd RTO everything unacknowledged moves, not just the oldest packet: {} vs {}",
        ext.relay.reinjected_bytes,
        oldest.relay.reinjected_bytes
    );
}

/// The Mahimahi LTE traces carried in the repository (`testbed/traces/mahimahi`).
fn mahimahi_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testbed/traces/mahimahi")
}

fn load(name: &str) -> Arc<MahimahiTrace> {
    let p = mahimahi_dir().join(name);
    Arc::new(MahimahiTrace::from_file(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
}

#[test]
fn real_mahimahi_traces_carry_every_byte_within_their_capacity() {
    let names = ["TMobile-LTE-short", "Verizon-LTE-short"];
    let traces: Vec<(Arc<MahimahiTrace>, Arc<MahimahiTrace>)> =
        names.iter().map(|n| (load(&format!("{n}.up")), load(&format!("{n}.down")))).collect();
    for name in ["minrtt", "blest", "redundant"] {
        let paths: Vec<PathSpec> = traces
            .iter()
            .zip([ms(25), ms(45)])
            .map(|((up, down), d)| PathSpec::trace(up.clone(), down.clone(), d))
            .collect();
        let mut h = Harness::new(name, paths, 8);
        for u in 0..3 {
            h.open(ConnSpec::new(u).upload(300_000).download(2 * MB).at(ms(u64::from(u) * 200)));
        }
        let r = h.run_until(secs(300));
        r.assert_all_done();
        let elapsed_ms = r.elapsed.as_millis() as u64;
        for ((up, down), p) in traces.iter().zip(&r.paths) {
            for (t, got) in [(up, p.up.serialized_bytes), (down, p.down.serialized_bytes)] {
                let cap = capacity(t, elapsed_ms);
                assert!(got <= cap, "{name}: {got} bytes through a trace offering {cap}");
            }
        }
        eprintln!("{name}: 3 x (0.3 MB up, 2 MB down) over LTE traces in {:?}", r.elapsed);
    }
}

/// Bytes a trace may carry in its first `until_ms` milliseconds.
fn capacity(t: &Arc<MahimahiTrace>, until_ms: u64) -> u64 {
    let mut c = TraceCursor::new(t.clone(), 0);
    let mut n = 0;
    while c.peek() <= until_ms * 1_000_000 {
        n += 1500;
        c.advance();
    }
    n
}

#[test]
fn a_synthetic_trace_paces_a_transfer_exactly() {
    // One 1500-byte opportunity per ms each way (1.5 MB/s): 3 MB down takes
    // at least 2 s of opportunities.
    let t = Arc::new(MahimahiTrace::parse("1\n2\n3\n").unwrap());
    let mut h = Harness::new("minrtt", vec![PathSpec::trace(t.clone(), t.clone(), ms(10))], 9);
    h.open(ConnSpec::new(1).download(3 * MB));
    let r = h.run_until(secs(60));
    r.assert_all_done();
    let done = r.conns[0].download.done_at.unwrap();
    assert!(done >= ms(2000), "{done:?}");
    assert!(done < ms(2600), "the link should stay busy: {done:?}");
    assert!(r.paths[0].down.serialized_bytes <= capacity(&t, r.elapsed.as_millis() as u64));
}

#[test]
fn a_slow_reader_never_lets_buffers_exceed_the_window() {
    let mut cfg = SimConfig::default();
    for ep in [&mut cfg.relay, &mut cfg.proxy] {
        ep.set_fixed_window(128 * 1024);
        ep.conn_send_buffer_bytes = 64 * 1024;
    }
    cfg.relay_read_rate = Some(200_000);
    let (window, send_buf) = (cfg.relay.conn_window_max_bytes, cfg.relay.conn_send_buffer_bytes);
    let r = Registry::with_builtins();
    let mut h = Harness::with_config(cfg, r.build("minrtt").unwrap(), r.build("minrtt").unwrap(), two_paths(), 10);
    let conns = 4u64;
    for u in 0..conns {
        h.open(ConnSpec::new(u as u16).download(MB));
    }
    let mut worst_readable = 0;
    let report = h.run_observed(secs(300), |h| {
        for k in 0..conns as usize {
            if let Some(id) = h.conn_id(k) {
                worst_readable = worst_readable.max(h.relay().readable_bytes(id) as u64);
            }
        }
    });
    report.assert_all_done();
    let bound = conns * (send_buf + window);
    assert!(report.max_buffered_relay <= bound, "relay held {} > {bound}", report.max_buffered_relay);
    assert!(report.max_buffered_proxy <= bound, "proxy held {} > {bound}", report.max_buffered_proxy);
    assert!(worst_readable <= window, "a connection buffered {worst_readable} unread bytes > window {window}");
    assert!(worst_readable > window / 2, "the reader must actually fall behind ({worst_readable})");
    // 4 MB at 200 kB/s: the reader, not the network, sets the pace.
    assert!(report.elapsed >= secs(19), "{:?}", report.elapsed);
}

fn eventful(seed: u64) -> Report {
    let paths = vec![
        PathSpec::rate(2 * MB, ms(20)).with_loss(0.01).with_blackout(ms(800), ms(1900)),
        PathSpec::rate(MB, ms(60)).with_loss(0.03).with_kill(ms(600), Some(ms(2500))),
        PathSpec::mbit(5.0, ms(35)).with_loss(0.02),
    ];
    let mut h = Harness::new("blest", paths, seed);
    for u in 0..6 {
        h.open(ConnSpec::new(u).upload(200_000).download(900_000).at(ms(u64::from(u) * 150)));
    }
    h.run_until(secs(120))
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let a = eventful(11);
    a.assert_all_done();
    let b = eventful(11);
    assert_eq!(format!("{a:?}"), format!("{b:?}"));
    let c = eventful(12);
    c.assert_all_done();
    assert_ne!(format!("{a:?}"), format!("{c:?}"), "the seed drives the losses");
}

#[test]
fn an_outage_does_not_poison_the_rtt_estimate_of_the_path() {
    // Frames stuck through a blackout return with multi-second RTTs. Were
    // they sampled, srtt would stay inflated for dozens of samples, and
    // BLEST and ECF (which compare srtts) would shun the recovered fast
    // path for the rest of the transfer.
    for name in ["blest", "ecf"] {
        let mut paths = two_paths();
        paths[0] = paths[0].clone().with_blackout(secs(1), secs(4));
        let mut h = Harness::new(name, paths, 3);
        bulk_download(&mut h);
        let (mut before, mut after) = (0, 0);
        // Data bytes each path had sent when the outage was over.
        let mut at_recovery = [0u64; 2];
        let sent = |h: &Harness, p: u8| h.proxy().path_stats(PathId(p)).map_or(0, |s| s.data_bytes_sent);
        let r = h.run_observed(secs(120), |h| {
            let srtt = h.proxy().path_view(PathId(0), h.instant()).expect("path 0").srtt_us;
            if h.now() < secs(1) {
                before = srtt;
            } else if h.now() < ms(4500) {
                after = srtt;
                at_recovery = [sent(h, 0), sent(h, 1)];
            }
        });
        r.assert_all_done();
        assert!(after < 2 * before, "{name}: srtt of path 0 went from {before} us to {after} us after the outage");
        // After the outage the faster path carries most of the rest again.
        let [fast, slow] = [0, 1].map(|p| r.paths[p].proxy.as_ref().unwrap().data_bytes_sent - at_recovery[p]);
        assert!(fast > slow, "{name}: after the outage path 0 sent {fast} B and the slower path 1 {slow} B");
    }
}

#[test]
fn a_window_update_lost_with_its_subflow_is_announced_again() {
    // Found by the property tests. Connection B needs one byte more than
    // the initial credit. Single-path pins user 0 (connection A) to path 0
    // and user 1 (B) to path 1, so B's data arrives quickly over path 1;
    // the proxy reads all of it and sends its WINDOWs on path 0, the first
    // healthy path, whose long delay keeps them in the pipe when the path
    // dies. The relay must still get the credit for the last byte.
    let window = crate::conn::INITIAL_MAX_DATA;
    let mut cfg = SimConfig::default();
    for ep in [&mut cfg.relay, &mut cfg.proxy] {
        ep.set_fixed_window(window);
    }
    let paths = vec![PathSpec::rate(2 * MB, ms(300)).with_kill(ms(150), None), PathSpec::rate(2 * MB, ms(5))];
    let r = Registry::with_builtins();
    let mut h = Harness::with_config(cfg, r.build("single-path").unwrap(), r.build("single-path").unwrap(), paths, 1);
    h.open(ConnSpec::new(0).upload(1));
    h.open(ConnSpec::new(1).upload(window + 1));
    let r = h.run_until(secs(60));
    r.assert_all_done();
    assert!(r.paths[0].down.discarded_bytes > 0, "the proxy's frames died with path 0");
    assert!(r.conns[1].completion.unwrap() < secs(1), "credit came with the re-announcement");
}

#[test]
fn a_fin_delivered_before_the_gap_below_it_still_completes_the_stream() {
    // Found by the property tests: the proxy's FIN segment is path-acked
    // while an earlier segment is still stuck behind a loss; a stale
    // data-level ACK then moves the cumulative point up to the FIN segment
    // but not over it, and the relay, done with the connection, never
    // acknowledges again. The proxy kept the connection forever.
    let paths = vec![
        PathSpec::rate(1_758_488, ms(5)).with_loss(0.024_443_189_957_789_855),
        PathSpec::rate(765_647, ms(33)),
        PathSpec::rate(969_008, ms(5)).with_loss(0.016_408_053_712_893_462),
    ];
    let mut h = Harness::new("blest", paths, 441_584_994_702_254_898);
    h.open(ConnSpec::new(0).upload(148_883).download(229_818));
    h.run_until(secs(60)).assert_all_done();

    // The same at the send stream, without the network.
    use crate::conn::SendStream;
    use crate::ids::PathMask;
    let mut s = SendStream::new(crate::conn::SendLimits { cap: 100, min_unsent: 100, initial_unsent: 100 }, 1000);
    s.write(&[0; 20]);
    s.finish();
    let a = s.next_packet(10).unwrap();
    s.on_scheduled(&a, PathMask(1));
    let b = s.next_packet(10).unwrap();
    assert!(b.fin);
    s.on_scheduled(&b, PathMask(1));
    s.on_delivered(b.offset); // FIN first, above the gap
    s.on_ack(10, false, &[]).unwrap(); // a stale ACK fills the gap
    assert!(s.is_done(), "the delivered FIN segment completes the stream");
}

#[test]
fn a_peer_that_closes_before_its_last_ack_goes_out_still_lets_the_other_end_close() {
    // Found by the property test with the redundant scheduler: the proxy
    // read the upload's FIN and closed at once, dropping the queued ACK;
    // the relay had skipped sending copies an older SACK covered, so no
    // path-level acknowledgement told it either, and it never closed.
    let paths = vec![
        PathSpec::rate(913_242, ms(95)).with_blackout(ms(367), ms(2_517)),
        PathSpec::rate(2_495_056, ms(47)).with_loss(0.044_488_557_545_180_55),
        PathSpec::rate(983_736, ms(115)).with_kill(ms(3_240), Some(ms(4_676))),
    ];
    let mut h = Harness::new("redundant", paths, 12_992_116_246_425_834_592);
    h.open(ConnSpec::new(2).upload(297_643).download(217_354).at(ms(2_076)).request_response());
    h.open(ConnSpec::new(2).upload(336_798).download(69_580).at(ms(2_039)));
    h.open(ConnSpec::new(0).upload(201_887).download(310_064).at(ms(2_200)));
    h.run_until(secs(900)).assert_all_done();
}
