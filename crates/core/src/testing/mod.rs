//! Test doubles: a two-ended, virtual-time network simulator for the
//! sans-IO core (compiled for the crate's own tests and with the `testing`
//! feature, for the testbed and other crates).
//!
//! # The model
//!
//! Two [`Endpoint`](crate::Endpoint)s, a relay and a proxy, are joined by
//! paths. Each direction of a path is a TCP subflow seen from above: an
//! in-order byte pipe ([`pipe::Pipe`]). Bytes the shell writes wait in an
//! unsent queue (the kernel send buffer), leave it in segments of at most
//! 1500 bytes at a fixed rate or at the delivery opportunities of a
//! Mahimahi trace ([`trace`]), and arrive a one-way delay later. A lost
//! segment arrives one retransmission delay late (max(200 ms, 2 × delay)
//! by default) and holds back everything behind it. Blackouts stop
//! serialization and delivery with the queues held; a killed path loses
//! its subflow and everything in it, and both endpoints are told
//! (`path_down`); a revived path gets a fresh subflow (`path_up`).
//!
//! The [`harness::Harness`] plays both shells and a test application, and
//! jumps virtual time from event to event; it never sleeps and reads the
//! wall clock once, for a base `Instant`. Runs are deterministic: losses
//! come from a hand-rolled seeded PRNG ([`rng`]) and nothing iterates a
//! hash map.
//!
//! # Fidelity limits
//!
//! - No TCP congestion control, slow start or receive window below the
//!   endpoint: a subflow sends at the link's full pace as soon as bytes are
//!   queued, and the only queue is the unsent one (no bufferbloat in the
//!   network). The endpoint's own window (`PathConfig`) is what limits
//!   bytes in flight.
//! - Loss is modelled only as its effect above TCP: delay, never missing
//!   bytes. Retransmission delay is fixed, not an RTO that backs off, and
//!   consecutive losses add up only through head-of-line blocking.
//! - Links are point to point: paths share no bottleneck and the two
//!   directions of a path are independent (ACKs do not compete with data
//!   for a shared medium beyond their own direction's rate).
//! - A subflow comes up at both ends at the same instant, with no HELLO
//!   exchange and no handshake delay; reconnection after `PathDead` waits
//!   a fixed backoff and the end of any blackout.
//! - Trace opportunities carry 1500 bytes of the byte stream, as Mahimahi
//!   does for packets; TCP/IP header overhead is not counted.
//! - Kernel-buffer accounting is exact (the shell knows the unsent bytes at
//!   every instant), which real shells only approximate.

pub mod harness;
pub mod pipe;
pub mod rng;
pub mod trace;

pub use harness::{
    ConnReport, ConnSpec, Harness, Kill, PathChange, PathLogEntry, PathReport, PathSpec, Report, Side, SimConfig,
    StreamReport, TrainSpec,
};
pub use pipe::{Blackouts, DirSpec, Link, Pipe, PipeStats};
pub use rng::SplitMix64;
pub use trace::{MahimahiTrace, TraceCursor, TraceError};

/// The number of cases a property test runs: `ci` in `make test`, `ci` times
/// `POLYCORN_TEST_DEPTH` when that is set (`make test-deep` sets 20).
///
/// # Panics
/// When `POLYCORN_TEST_DEPTH` is not a positive integer.
pub fn cases(ci: u32) -> u32 {
    ci * depth()
}

fn depth() -> u32 {
    match std::env::var("POLYCORN_TEST_DEPTH") {
        Err(_) => 1,
        Ok(v) => v.parse().ok().filter(|&d| d > 0).unwrap_or_else(|| {
            panic!("POLYCORN_TEST_DEPTH must be a positive integer (a multiple of the cases), got {v:?}")
        }),
    }
}

#[cfg(test)]
mod aggregation;
#[cfg(test)]
mod blackouts;
#[cfg(test)]
mod hetero;
#[cfg(test)]
mod hrsch_scenarios;
#[cfg(test)]
mod properties;
#[cfg(test)]
mod railway;
#[cfg(test)]
mod scenarios;
#[cfg(test)]
mod sched_fuzz;
