//! Structured logging for both binaries: `RUST_LOG`-style filters, JSON or
//! human-readable output.

use tracing_subscriber::EnvFilter;

/// Initialise logging once. `json` selects one JSON object per line.
pub fn init(default_filter: &str, json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    use std::io::IsTerminal;
    // Colour only on a terminal: log files and journald get plain text.
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = if json { b.json().try_init() } else { b.try_init() };
}
