//! `polycorn-loadgen`: the workload generator of the HSR benchmark.
//!
//! * `bulk`: scheduled sequential HTTP/1.1 downloads of fixed sizes (one per slot of a window);
//! * `backlog`: one always-busy download flow (back-to-back HTTP/1.1 requests) over a window;
//! * `im`: instant-messaging users exchanging 100-byte messages and 4-byte replies;
//! * `im-server`: the IM peer at the origin.
//!
//! Every time is trip time, measured from the shared `--epoch-unix-ms`, and every plan derives from
//! `--seed` alone, so the copies that run side by side (one per scheduling scheme) offer exactly
//! the same load at the same moments of the trip. See README.md for the record formats.

pub mod backlog;
pub mod bulk;
pub mod clock;
pub mod im;
pub mod plan;
pub mod record;
pub mod rng;
