//! The train's side of a Polycorn session, as the relay-agent runs it: the
//! `polycorn-relay` binary and the fleet simulator (`polycorn-fleetsim`,
//! bench/fleetsim, many trains in one process) share these parts.
//!
//! - [`paths`]: each carrier's subflow to the proxy, kept up (dial, TLS or
//!   QUIC with the train's certificate, HELLO, run, back off, dial again).
//! - [`radio`]: the radio and position sources, and what the relay does
//!   with what they observe (the endpoint's train state, telemetry records).
//! - [`spool`]: the durable telemetry spool's shell: records sent from it
//!   with top priority, removed when the proxy confirms them.

pub mod paths;
pub mod radio;
pub mod spool;
