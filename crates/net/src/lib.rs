//! The tokio shell shared by `relay-agent` and `proxy`.
//!
//! - [`session`]: drives a sans-IO [`polycorn_core::Endpoint`] with one task per
//!   subflow and a timer; passenger connections as byte streams.
//! - [`subflow`]: socket options (TCP_NOTSENT_LOWAT, SO_BINDTODEVICE, MPTCP),
//!   the HELLO handshake.
//! - [`link`]: a carrier interface's link state, so a subflow ends when its
//!   modem goes down instead of when the dead-path timer fires.
//! - [`mptcp_conn`]: the `kernel-mptcp-conn` transport, one kernel MPTCP
//!   connection per passenger connection (header, relay dial, proxy accept).
//! - [`metrics`]: Prometheus metrics from the endpoint's plain statistics, and
//!   the health endpoint.
//! - [`table`]: the failure-location table from its sources (file, LinkDB
//!   API; the proxy adds Kafka), hot-reloaded under one version rule.
//! - [`hof`]: train positions from telemetry, for handover-failure prediction.
//! - [`segtrace`]: the opt-in segment trace written to a file (`--trace-dir`).
//! - [`logging`]: logging set-up shared by both binaries.
//! - [`backoff`]: the reconnect loops' doubling backoff (sans-IO).
//! - [`options`]: the options both binaries share, and how they are read
//!   (flags, `POLYCORN_<BINARY>_*` variables, the config file).
//! - [`error`]: the typed start-up errors ([`Error`]) of options, config
//!   files and table sources.
//! - [`panics`]: a panic anywhere becomes a logged, counted, clean shutdown
//!   that `/healthz` reports.

pub mod backoff;
pub mod config;
pub mod error;
pub mod hof;
pub mod link;
pub mod logging;
pub mod lograte;
pub mod metrics;
pub mod mptcp_conn;
pub mod options;
pub mod panics;
pub mod quic;
pub mod relay;
pub mod segtrace;
pub mod session;
pub mod subflow;
pub mod table;

pub use error::Error;
pub use session::{ConnStream, Events, Session, SessionEvent};
pub use subflow::Transport;

/// Resolves on SIGINT or SIGTERM, or once a task panicked
/// ([`panics::install`]): the shells' graceful-shutdown trigger.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
                _ = panics::panicked() => {}
            }
        }
        // Without a SIGTERM handler, Ctrl-C still works.
        Err(_) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = panics::panicked() => {}
            }
        }
    }
}
