//! Synthetic HSR multi-carrier link-trace generator implementing the model of hsr-facts §15
//! (see the crate README for what is implemented and what is simplified).
//!
//! [`generate`] runs the model for a [`TripConfig`] in memory; [`write`] writes a trip's
//! directory (Mahimahi traces, polycorn-emu schedules, `events.jsonl`, `trip.json`);
//! [`validate`] compares generated trips with published numbers (§15.8); [`failure_table`] builds
//! a stand-in failure-location table from previous trips' event logs.

pub mod failure_table;
mod model;
pub mod nmea;
mod output;
mod preset;
mod random;
pub mod validate;

pub use model::{
    generate, kinematics, tune_beta0, CarrierTrip, Handover, Layout, Outcome, RsrpSample, Trip, TripConfig,
    RSRP_LOW_DBM, STEP_MS,
};
pub use output::{
    blackouts, events, mahimahi, route_geojson, schedule, summary, track_point, write, CarrierSummary, Event,
    OPPORTUNITY_BYTES,
};
pub use preset::{CarrierParams, FailureModel, FailureV2, HandoverLoss, Preset};
pub use random::{erfc, normal_sf, GammaQuantile, Rng};

/// Anything that can go wrong while writing or validating trips.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// File system.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// JSON encoding or decoding.
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// A schedule the emulator would reject.
    #[error("schedule: {0}")]
    Schedule(#[from] polycorn_emu::ScheduleError),
    /// A trace the emulator would reject.
    #[error("trace: {0}")]
    Trace(#[from] polycorn_emu::TraceError),
    /// Bad input.
    #[error("{0}")]
    Invalid(String),
}
