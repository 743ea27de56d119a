//! Writes a session's segment trace ([`polycorn_core::trace`]) to a JSON
//! Lines file (`--trace-dir`): every record the endpoint queued, plus a
//! sample of every live path's state every [`SAMPLE_EVERY`]
//! (`{"ev":"path", "srtt_us", "cwnd", "in_flight", "queued", "rate_bps",
//! "stale", "avail", "rto_count"}`). Timestamps are Unix milliseconds, so a
//! trace lines up with the load generator's records and the emulator's
//! link files.
//!
//! Bounded twice: the endpoint holds at most [`CAPACITY`] records between
//! two drains, and the file stops at `max_bytes` (the trace is switched
//! off and the cut is logged, so a forgotten flag cannot fill a disk).

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use polycorn_core::{Availability, PathView, TraceRecord};
use tracing::{info, warn};

use crate::session::Session;

/// Records the endpoint keeps between two drains (about 2 s of a 100 Mbit/s
/// download in 16 KiB segments, with its acknowledgements).
pub const CAPACITY: usize = 65_536;
/// How often the queue is drained into the file.
pub const DRAIN_EVERY: Duration = Duration::from_millis(50);
/// How often every live path's state is sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// Where and how much to trace.
#[derive(Clone, Debug)]
pub struct TraceOptions {
    pub dir: PathBuf,
    pub max_bytes: u64,
}

/// Default of `--trace-max-bytes`: about an hour of one busy train's trace.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;

impl TraceOptions {
    /// From `--trace-dir` and `--trace-max-bytes` (both binaries): `None`
    /// without a directory; the directory is created now, so a bad path
    /// fails at start-up rather than at the first session.
    pub fn from_flags(dir: Option<PathBuf>, max_bytes: Option<u64>) -> Result<Option<Self>, crate::Error> {
        let Some(dir) = dir else {
            return match max_bytes {
                Some(_) => Err(crate::Error::option("--trace-max-bytes", "needs --trace-dir")),
                None => Ok(None),
            };
        };
        let max_bytes = max_bytes.unwrap_or(DEFAULT_MAX_BYTES);
        if max_bytes < 4096 {
            return Err(crate::Error::option("--trace-max-bytes", format!("must be at least 4096, got {max_bytes}")));
        }
        std::fs::create_dir_all(&dir).map_err(|source| crate::Error::Io {
            what: "creating --trace-dir",
            path: dir.clone(),
            source,
        })?;
        Ok(Some(TraceOptions { dir, max_bytes }))
    }
}

/// Maps the endpoint's `Instant`s to Unix milliseconds.
#[derive(Clone, Copy, Debug)]
struct Clock {
    base: Instant,
    base_unix_ms: f64,
}

impl Clock {
    fn now() -> Self {
        let unix = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        Clock { base: Instant::now(), base_unix_ms: unix.as_secs_f64() * 1e3 }
    }

    fn unix_ms(&self, at: Instant) -> f64 {
        match at.checked_duration_since(self.base) {
            Some(d) => self.base_unix_ms + d.as_secs_f64() * 1e3,
            None => self.base_unix_ms - self.base.duration_since(at).as_secs_f64() * 1e3,
        }
    }
}

fn avail_str(a: Availability) -> &'static str {
    match a {
        Availability::Down => "down",
        Availability::Full => "full",
        Availability::Available => "available",
    }
}

/// Turn tracing on for `session` and write its records to
/// `<dir>/<name>-<start, Unix ms>.jsonl` until the session closes or
/// `max_bytes` is reached. Every drain is flushed, and a `dropped` line
/// follows any new drops, so a trace cut short by a kill still says how
/// complete it is; the `end` line comes when the session ends.
/// The file is created (and the directory with it) before this returns, so
/// a bad `--trace-dir` fails at start-up.
pub fn start(session: &Session, opts: &TraceOptions, name: &str) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(&opts.dir)?;
    // The start time in the name: a proxy restarted while its relay keeps
    // its session id must not overwrite the earlier file.
    let started = Clock::now();
    let path = opts.dir.join(format!("{name}-{:.0}.jsonl", started.base_unix_ms));
    let file = std::fs::OpenOptions::new().write(true).create_new(true).open(&path)?;
    session.with(|st, _| st.ep.enable_trace(CAPACITY));
    let weak = session.downgrade();
    let max_bytes = opts.max_bytes;
    let shown = path.clone();
    tokio::spawn(async move {
        let clock = started;
        let mut out = std::io::BufWriter::new(file);
        let mut written: u64 = 0;
        let mut batch = String::with_capacity(64 * 1024);
        let mut records: Vec<TraceRecord> = Vec::with_capacity(1024);
        let mut views: Vec<PathView> = Vec::new();
        let mut next_sample = Instant::now();
        let mut tick = tokio::time::interval(DRAIN_EVERY);
        let (mut dropped, mut dropped_written) = (0, 0);
        loop {
            tick.tick().await;
            let Some(session) = weak.upgrade() else { break };
            records.clear();
            views.clear();
            // Only copies under the lock; formatting and writing after it.
            let now = session.peek(|st, now| {
                while let Some(r) = st.ep.poll_trace() {
                    records.push(r);
                }
                if now >= next_sample {
                    next_sample = now + SAMPLE_EVERY;
                    views.extend(st.ep.up_paths().into_iter().filter_map(|p| st.ep.path_view(p, now)));
                }
                dropped = st.ep.trace_dropped();
                now
            });
            drop(session);
            batch.clear();
            for TraceRecord { at, event } in &records {
                event.write_json(clock.unix_ms(*at), &mut batch);
                batch.push('\n');
            }
            for v in &views {
                use std::fmt::Write as _;
                let _ = writeln!(
                    batch,
                    "{{\"t_ms\":{:.3},\"ev\":\"path\",\"path\":{},\"srtt_us\":{},\"cwnd\":{},\"in_flight\":{},\"queued\":{},\"rate_bps\":{},\"stale\":{},\"avail\":\"{}\",\"rto_count\":{}}}",
                    clock.unix_ms(now),
                    v.id.0,
                    v.srtt_us,
                    v.cwnd_bytes,
                    v.in_flight_bytes,
                    v.queued_bytes,
                    v.delivery_rate_bps,
                    v.stale,
                    avail_str(v.availability),
                    v.rto_count
                );
            }
            if dropped != dropped_written {
                // The count so far, so a trace cut short still says how
                // complete it is.
                use std::fmt::Write as _;
                let _ =
                    writeln!(batch, "{{\"t_ms\":{:.3},\"ev\":\"dropped\",\"total\":{dropped}}}", clock.unix_ms(now));
                dropped_written = dropped;
            }
            if written + batch.len() as u64 > max_bytes {
                warn!(file = %shown.display(), max_bytes, "segment trace reached --trace-max-bytes: tracing stopped");
                if let Some(s) = weak.upgrade() {
                    s.peek(|st, _| st.ep.disable_trace());
                }
                break;
            }
            // Flushed every drain: a process that is killed loses at most
            // one drain interval of records.
            if let Err(e) = out.write_all(batch.as_bytes()).and_then(|()| out.flush()) {
                warn!(file = %shown.display(), error = %e, "segment trace: write failed, tracing stopped");
                if let Some(s) = weak.upgrade() {
                    s.peek(|st, _| st.ep.disable_trace());
                }
                break;
            }
            written += batch.len() as u64;
        }
        // The last line says how complete the trace is.
        let _ = writeln!(out, "{{\"ev\":\"end\",\"dropped\":{dropped},\"bytes\":{written}}}");
        let _ = out.flush();
        if dropped > 0 {
            warn!(file = %shown.display(), dropped, "segment trace: records dropped (the writer fell behind)");
        }
        info!(file = %shown.display(), bytes = written, "segment trace closed");
    });
    Ok(path)
}
