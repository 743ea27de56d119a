//! What a panic in a shell does: logged, counted, reported by `/healthz`,
//! and turned into a clean shutdown.
//!
//! A panic unwinds only its task: a subflow task that panicked would leave
//! its path down for good while `/readyz` stayed green on the others, and a
//! panic under the session's lock leaves the endpoint in a state no one
//! checked. So after [`install`], any panic in the process makes
//! [`crate::shutdown_signal`] resolve (the binary shuts down as on SIGTERM:
//! interception rules removed, Kafka flushed), `/healthz` answer 503 from
//! then on, `polycorn_panics_total` count it, and [`exit_code`] give 70
//! (`EX_SOFTWARE`), so the supervisor (systemd, Kubernetes) restarts the
//! process with clean state. Nothing in the code panics on purpose on what
//! a peer or a passenger sends; this is the net under that rule.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use tokio::sync::Notify;

static PANICS: AtomicU64 = AtomicU64::new(0);

fn notify() -> &'static Notify {
    static N: OnceLock<Notify> = OnceLock::new();
    N.get_or_init(Notify::new)
}

/// Exit status of a process that shut down after a panic.
pub const EXIT_PANICKED: i32 = 70;

/// Install the panic hook (once, at start-up, after logging is set up). The
/// default hook still prints the panic and its backtrace to stderr.
pub fn install(component: &'static str) {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        let location = info.location().map(|l| format!("{}:{}", l.file(), l.line())).unwrap_or_default();
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let thread = std::thread::current().name().unwrap_or("unnamed").to_string();
        tracing::error!(component, %location, %message, %thread, "a task panicked: shutting down so that the supervisor restarts this process");
        note();
    }));
}

/// Record a panic (the hook does; tests call it directly).
pub fn note() {
    PANICS.fetch_add(1, Ordering::SeqCst);
    notify().notify_waiters();
}

/// Panics in this process so far.
pub fn count() -> u64 {
    PANICS.load(Ordering::SeqCst)
}

/// Resolves once a panic has been recorded.
pub async fn panicked() {
    loop {
        let n = notify().notified();
        tokio::pin!(n);
        n.as_mut().enable();
        if count() > 0 {
            return;
        }
        n.await;
    }
}

/// The process's exit status: 70 after a panic, else `ok`.
pub fn exit_code(ok: i32) -> i32 {
    if count() > 0 {
        EXIT_PANICKED
    } else {
        ok
    }
}

/// A binary's `main` ends with this: after a panic the shutdown was its
/// doing, so the process exits with status 70 (printing `r`'s error, if
/// any, as `component: error`) for the supervisor to restart it; otherwise
/// `r` is returned as it is.
pub fn finish<E: std::fmt::Display>(component: &str, r: Result<(), E>) -> Result<(), E> {
    let code = exit_code(0);
    if code != 0 {
        if let Err(e) = &r {
            eprintln!("{component}: {e:#}");
        }
        std::process::exit(code);
    }
    r
}
