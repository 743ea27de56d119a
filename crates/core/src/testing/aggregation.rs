//! Aggregation and memory in virtual time: autotuned windows let a long
//! transfer use every path, the shared budget bounds what the endpoints
//! hold, and memory pressure takes windows back, largest first.

use std::time::Duration;

use super::*;
use crate::budget::MemoryBudget;
use crate::sched::Registry;

const MB: u64 = 1_000_000;

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

/// Two cellular-like carriers: 4 MB/s at 40 ms and 3 MB/s at 70 ms one way
/// (bandwidth-delay products of about 0.3 and 0.4 MB per round trip).
fn carriers() -> Vec<PathSpec> {
    vec![PathSpec::rate(4 * MB, ms(40)), PathSpec::rate(3 * MB, ms(70))]
}

/// Goodput (bytes per second) of one 40 MB download.
fn download_goodput(paths: Vec<PathSpec>, cfg: SimConfig) -> f64 {
    let r = Registry::with_builtins();
    let mut h = Harness::with_config(cfg, r.build("minrtt").unwrap(), r.build("minrtt").unwrap(), paths, 5);
    h.open(ConnSpec::new(1).upload(200).download(40 * MB));
    let rep = h.run_until(Duration::from_secs(600));
    rep.assert_all_done();
    let c = &rep.conns[0];
    40.0 * MB as f64 / c.completion.unwrap().as_secs_f64()
}

/// The buffers before autotuning: 512 KiB send buffer, 1 MiB window.
fn fixed_small() -> SimConfig {
    let mut cfg = SimConfig::default();
    for ep in [&mut cfg.relay, &mut cfg.proxy] {
        ep.set_fixed_window(1 << 20);
        ep.conn_send_buffer_bytes = 512 * 1024;
        ep.conn_unsent_min_bytes = 512 * 1024;
    }
    cfg
}

#[test]
fn a_long_download_over_two_carriers_beats_the_better_one_alone() {
    let best_alone = download_goodput(vec![carriers().remove(0)], SimConfig::default());
    let fixed = download_goodput(carriers(), fixed_small());
    let tuned = download_goodput(carriers(), SimConfig::default());
    eprintln!("best carrier alone {best_alone:.0} B/s, two with fixed buffers {fixed:.0}, two autotuned {tuned:.0}");
    assert!(best_alone > 0.9 * 4.0 * MB as f64, "one carrier alone is not window-limited: {best_alone:.0}");
    assert!(tuned >= 1.6 * best_alone, "autotuned multipath must aggregate: {tuned:.0} vs {best_alone:.0}");
    assert!(tuned >= 0.85 * 7.0 * MB as f64, "close to the sum of the carriers: {tuned:.0}");
    assert!(fixed < 0.8 * tuned, "the fixed buffers were the limit: {fixed:.0} vs {tuned:.0}");
}

#[test]
fn memory_held_never_exceeds_what_the_budget_accounts_nor_the_budget_its_levels() {
    const HIGH: u64 = 2 * 1024 * 1024;
    const CONNS: u64 = 8;
    let mut cfg = SimConfig::default();
    cfg.relay.budget = MemoryBudget::with_high(HIGH);
    cfg.proxy.budget = MemoryBudget::with_high(HIGH);
    // Floors a connection keeps whatever the budget: its minimum window
    // and its unsent floor (on either side of a connection).
    let floors = cfg.relay.conn_window_min_bytes + cfg.relay.conn_unsent_min_bytes;
    let r = Registry::with_builtins();
    let mut h = Harness::with_config(cfg, r.build("minrtt").unwrap(), r.build("minrtt").unwrap(), carriers(), 7);
    for u in 0..CONNS {
        h.open(ConnSpec::new(u as u16).upload(20_000).download(2 * MB).at(ms(u * 30)));
    }
    let (mut worst_gap, mut peak) = (0i64, 0u64);
    let rep = h.run_observed(Duration::from_secs(600), |h| {
        for ep in [h.relay(), h.proxy()] {
            let used = ep.budget().used();
            worst_gap = worst_gap.max(ep.buffered_bytes() as i64 - used as i64);
            peak = peak.max(used);
            assert_eq!(ep.charged_total(), used, "the account is the sum of the connections' charges");
        }
    });
    rep.assert_all_done();
    eprintln!("virtual {:?}, peak {peak}", rep.elapsed);
    assert!(worst_gap <= 0, "an endpoint held {worst_gap} bytes more than its budget accounted");
    assert!(peak <= HIGH + CONNS * floors, "peak {peak} > high {HIGH} + floors");
    assert!(peak > HIGH / 2, "the budget must actually bind in this test (peak {peak})");
    for ep in [h.relay(), h.proxy()] {
        assert_eq!(ep.budget().used(), 0, "every connection closed: nothing held");
        assert!(ep.budget().stats().grants_denied > 0);
    }
}

#[test]
fn a_budget_of_one_frame_still_completes_every_transfer() {
    let mut cfg = SimConfig::default();
    cfg.relay.budget = MemoryBudget::with_high(16 * 1024);
    cfg.proxy.budget = MemoryBudget::with_high(16 * 1024);
    let r = Registry::with_builtins();
    let mut h = Harness::with_config(cfg, r.build("minrtt").unwrap(), r.build("minrtt").unwrap(), carriers(), 8);
    for u in 0..4 {
        h.open(ConnSpec::new(u).upload(300_000).download(2 * MB));
    }
    h.run_until(Duration::from_secs(600)).assert_all_done();
}
