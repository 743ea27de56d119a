//! Sans-IO core of Polycorn.
//!
//! Module map, in call order from a shell:
//!
//! - [`wire`]: frames spoken over every subflow, and the stream decoder.
//! - [`endpoint`]: one side of a relay–proxy session; feeds frames to
//!   connections and paths, runs the scheduler, reports [`endpoint::Event`]s.
//! - [`conn`]: a passenger connection's send buffer (data-level sequencing,
//!   reinjection bookkeeping) and reassembly buffer (first copy wins).
//! - [`path`]: per-subflow state measured end to end; path availability.
//! - [`sched`]: the schedulerlet framework, built-in schedulerlets, the
//!   registry of compositions, and multi-user scheduling.
//! - [`trace`]: the opt-in segment trace (what was sent where, what
//!   arrived, which timers fired), for diagnosing stalls.
//!
//! Nothing here performs I/O or reads a clock: every call takes `now`.

pub mod budget;
pub mod cc;
pub mod conn;
pub mod ctrl;
pub mod endpoint;
pub mod ids;
pub mod path;
pub mod sched;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod trace;
pub mod wire;

pub use budget::{BudgetLevels, BudgetStats, MemoryBudget, Pressure};
pub use endpoint::{
    Endpoint, EndpointConfig, Event, FlowStats, InputError, Recv, Role, StreamError, DEFAULT_PROXY_BUDGET,
    DEFAULT_RELAY_BUDGET, HOL_STALL_LONG, HOL_STALL_VERY_LONG,
};
pub use ids::{ConnId, PathId, PathMask, UserId, MAX_PATHS, PASSENGER_V6_PREFIX};
pub use path::{Availability, PathConfig, PathStats, PathView, StaleThreshold};
pub use sched::{FailureTable, Pipeline, Registry, TrackDirection, TrainState, TrainTracker};
pub use trace::{CopyKind, RequeueCause, TraceEvent, TraceRecord};
