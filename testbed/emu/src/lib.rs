//! Sans-IO core of Polycorn's user-space link emulator (HSR testbed).
//!
//! A [`Link`] emulates one direction of one carrier. It does no I/O, reads no clock and owns no
//! task: the caller (the TUN shell, or a test in virtual time) passes the current time to every
//! call, as a [`std::time::Duration`] since the link's epoch, the start of the trip; the same
//! offsets are used by [`Trace`] and [`Schedule`]. Randomness comes from SplitMix64 keyed by
//! [`LinkConfig::seed`], so a seed fixes every loss decision.
//!
//! # Model
//!
//! A packet pushed at time `a` goes through, in order:
//!
//! 1. **Blackout check**: during a [`BlackoutKind::Flush`] blackout the arrival is dropped
//!    ([`Admission::DroppedBlackout`]) and does not reach the loss stage.
//! 2. **Loss**: a Gilbert–Elliott chain ([`GeParams`], [`LossSchedule`]). By default
//!    ([`LossKeying::Time`]) the chain steps once per [`LOSS_SLOT`] (1 ms) of link time, its
//!    transitions drawn from a keyed hash of (seed, slot), and the `k`-th packet reaching this
//!    stage in a slot is lost with the slot state's loss probability (parameters in force at
//!    `a`) by a keyed draw of (seed, slot, `k`). A packet's fate is thus a function of the seed,
//!    its arrival time and `k` only: links with the same seed offered different traffic (two
//!    schemes on one emulated trip) share one loss realisation, the common random numbers that
//!    paired comparisons need. [`LossKeying::Packet`] keeps the first versions' chain, stepped
//!    once per packet on one SplitMix64 stream (the first packet draws its state from the
//!    stationary distribution; each packet is lost with the current state's loss probability,
//!    then the chain moves), to reproduce earlier results.
//! 3. **Droptail buffer**: if the queued bytes plus the packet's size exceed
//!    [`LinkConfig::buffer_bytes`], the packet is dropped; otherwise it joins the FIFO queue.
//! 4. **Bottleneck**: the queue is drained by the [`Service`]:
//!    * [`Service::Trace`] follows mm-link's `LinkQueue::rationalize` exactly: each trace line
//!      is an opportunity at `line_ms + k · period` (period = last timestamp, repeated
//!      forever) worth [`LinkConfig::opportunity_bytes`] bytes (1500 by default, so one line
//!      carries one full-size packet; mm-link's `PACKET_SIZE` is
//!      [`MAHIMAHI_OPPORTUNITY_BYTES`] = 1504 because its packets include the TUN header). An
//!      opportunity at time `T` serves only packets that arrived before `T` (a push at `T` first
//!      spends opportunities `<= T`, as mm-link rationalizes before enqueueing). Its budget is
//!      spent on the head of the queue byte by byte: a packet that does not fit in what is left
//!      uses the rest and finishes in the next opportunity(ies) (mm-link's
//!      `packet_in_transit_`); a packet leaves at the opportunity that sends its last byte, and
//!      several small packets can leave in one opportunity. Budget not used because the queue is
//!      empty is wasted, never banked. The partly sent packet is not counted in the queue's
//!      bytes (mm-link's droptail counts only `packet_queue_`). Packets larger than one
//!      opportunity are allowed (mm-link rejects them) and span several.
//!    * [`Service::ConstantRate`]: a work-conserving server; a packet of `n` bytes needs
//!      `n · 8 / rate` of service after `max(arrival, previous completion)`. The packet in
//!      service counts in the queue's bytes until it completes.
//! 5. **Delay**: a packet leaving the queue at `t` leaves the link at
//!    `max(previous departure, t + delay(t))` with `delay` from the [`DelaySchedule`], so a
//!    falling delay never reorders packets (FIFO, like a single radio bearer).
//!
//! **Blackouts** (hsr-facts §15.3 item 5) are half-open intervals `[start, end)`:
//! * [`BlackoutKind::Hold`] (handover types I and II): no service inside the interval — trace
//!   opportunities inside it are wasted, constant-rate service pauses — while arrivals still
//!   queue. Nothing is lost because of the blackout; the backlog leaves at link rate from the
//!   first opportunity at or after `end`. (The optional ≈2× release burst is not modelled.)
//! * [`BlackoutKind::Flush`] (type III): at `start` every queued packet, including a partly
//!   sent one, is dropped ([`LinkStats::flushed`]); arrivals inside are dropped.
//! * In both cases packets already in the delay stage are kept: they left the bottleneck
//!   before the blackout and are in flight. A constant-rate packet whose service ends exactly
//!   at `start` is delivered; a trace opportunity exactly at `start` is inside the blackout,
//!   one exactly at `end` is usable.
//! * Uplink and downlink of a carrier black out together: give both links the same intervals.
//!
//! # Driving a link
//!
//! Call [`Link::push`] for each arriving packet, then loop: [`Link::poll_deliver`] until
//! `None`, sleep until [`Link::next_event`], repeat. Counters are in [`LinkStats`]; with
//! [`LinkConfig::event_log`] set, [`Link::drain_events`] returns a [`LinkEvent`] per packet
//! event and blackout edge.

mod link;
mod rng;
mod schedule;
mod trace;
#[cfg(target_os = "linux")]
pub mod tun;

pub use link::{
    Admission, ConfigError, Counter, EventKind, Link, LinkConfig, LinkEvent, LinkStats, Packet, Service,
    DEFAULT_OPPORTUNITY_BYTES, MAHIMAHI_OPPORTUNITY_BYTES,
};
pub use rng::SplitMix64;
pub use schedule::{
    Blackout, BlackoutKind, DelaySchedule, GeParams, Interpolation, LossKeying, LossSchedule, Schedule, ScheduleError,
    LOSS_SLOT,
};
pub use trace::{Trace, TraceError};
