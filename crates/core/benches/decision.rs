//! Cost of scheduling decisions.
//!
//! - `select/<pipeline>/<paths>`: one `Pipeline::select` call, with path 0
//!   (the fastest) out of window so that selection filters have work to do.
//! - `schedule/<pipeline>/<paths>`: `Endpoint::schedule` per packet placed,
//!   with 1 MB queued on one connection and windows large enough that one
//!   call places all of it; the user scheduler, the send buffer and view
//!   refreshes are included.
//!
//! Run: `cargo bench -p polycorn-core --bench decision -- --quick`; results
//! land in `target/criterion/<group>/<pipeline>/<paths>/new/estimates.json`.

use std::hint::black_box;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use polycorn_core::sched::{Context, PacketInfo, DEFAULT_PIPELINE};
use polycorn_core::wire::{Frame, LinkState};
use polycorn_core::{
    Availability, ConnId, Endpoint, EndpointConfig, PathId, PathMask, PathView, Registry, Role, UserId,
};

/// MPTCP's schedulers and the pipeline the relay and proxy run by default.
const PIPELINES: [&str; 5] = ["minrtt", "blest", "ecf", "redundant", DEFAULT_PIPELINE];
const PATHS: [usize; 3] = [2, 4, 8];

fn srtt_ms(i: usize) -> u64 {
    20 + 15 * i as u64
}

fn views(n: usize) -> Vec<PathView> {
    (0..n)
        .map(|i| PathView {
            id: PathId(i as u8),
            availability: if i == 0 { Availability::Full } else { Availability::Available },
            srtt_us: srtt_ms(i) * 1000,
            rttvar_us: srtt_ms(i) * 250,
            min_rtt_us: srtt_ms(i) * 900,
            in_flight_bytes: if i == 0 { 256 * 1024 } else { 32 * 1024 },
            cwnd_bytes: 256 * 1024,
            queued_bytes: 0,
            delivery_rate_bps: 2_000_000,
            rto_count: 0,
            idle_us: 0,
            bytes_since_use: 0,
            link_state: LinkState::Connected,
            cell: 0,
            stale: false,
            failure: None,
        })
        .collect()
}

fn select(c: &mut Criterion) {
    let registry = Registry::with_builtins();
    let mut g = c.benchmark_group("select");
    g.warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(2));
    let packet = PacketInfo {
        conn: ConnId(1),
        user: UserId([1; 16]),
        offset: 0,
        len: 16_366,
        is_tail: false,
        is_burst_tail: false,
        is_reinjection: false,
        paths_used: PathMask::EMPTY,
        remaining_bytes: 1_000_000,
        send_window_bytes: 1 << 20,
    };
    let now = Instant::now();
    for name in PIPELINES {
        for n in PATHS {
            let paths = views(n);
            let mut p = registry.build(name).expect("built-in pipeline");
            g.bench_with_input(BenchmarkId::new(name, n), &paths, |b, paths| {
                b.iter(|| p.select(black_box(&Context { now, paths, packet: &packet })))
            });
        }
    }
    g.finish();
}

/// A relay endpoint with `n` paths of distinct RTTs and 1 MB queued on one
/// connection, windows wide open.
fn loaded_endpoint(name: &str, n: usize, registry: &Registry) -> (Endpoint, Instant) {
    let t0 = Instant::now();
    let mut cfg = EndpointConfig::new(Role::Relay);
    cfg.conn_send_buffer_bytes = 2 << 20;
    let big = 1 << 30;
    cfg.path.initial_cwnd_bytes = big;
    cfg.path.min_cwnd_bytes = big;
    cfg.path.max_cwnd_bytes = big;
    cfg.path.queue_limit_bytes = big;
    let mut ep = Endpoint::new(cfg, registry.build(name).expect("built-in pipeline"), t0);
    let dst: SocketAddr = ([192, 0, 2, 80], 80).into();
    let conn = ep.open(UserId([1; 16]), dst, t0).expect("relay opens");
    // One RTT sample per path: the OPEN goes out, its PATH_ACK comes back.
    let mut out = Vec::new();
    for i in 0..n {
        ep.path_up(PathId(i as u8), t0);
        out.clear();
        let sent = ep.poll_transmit(PathId(i as u8), t0, &mut out, usize::MAX) as u64;
        let mut ack = Vec::new();
        Frame::PathAck { received: sent, delay_us: 0 }.encode(&mut ack);
        let at = t0 + Duration::from_millis(srtt_ms(i));
        ep.handle_input(PathId(i as u8), &ack, at).expect("valid PATH_ACK");
    }
    let now = t0 + Duration::from_millis(srtt_ms(n));
    let data = vec![0x5a; 1_000_000];
    assert_eq!(ep.send(conn, &data, now).expect("open"), data.len());
    (ep, now)
}

fn schedule(c: &mut Criterion) {
    let registry = Registry::with_builtins();
    let mut g = c.benchmark_group("schedule");
    g.warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(2));
    for name in PIPELINES {
        for n in PATHS {
            g.bench_function(BenchmarkId::new(name, n), |b| {
                // One "iteration" is one packet placed; setting up a loaded
                // endpoint is not timed.
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    let mut packets = 0u64;
                    while packets < iters {
                        let (mut ep, now) = loaded_endpoint(name, n, &registry);
                        let before = ep.stats().decisions;
                        let start = Instant::now();
                        ep.schedule(black_box(now));
                        total += start.elapsed();
                        packets += ep.stats().decisions - before;
                    }
                    total.mul_f64(iters as f64 / packets as f64)
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, select, schedule);
criterion_main!(benches);
