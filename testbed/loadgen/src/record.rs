//! JSON-lines output: one record per line, each written with one `write` and no user-space
//! buffering, so that every record is on disk (in the page cache) as soon as it is complete and
//! survives a kill.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use serde::Serialize;

/// A shared, line-at-a-time JSONL writer. `-` is standard output.
#[derive(Clone)]
pub struct Sink {
    inner: Arc<Mutex<Box<dyn Write + Send>>>,
    name: String,
}

impl Sink {
    pub fn create(path: &Path) -> Result<Self> {
        let w: Box<dyn Write + Send> = if path == Path::new("-") {
            Box::new(std::io::stdout())
        } else {
            Box::new(File::create(path).with_context(|| format!("cannot create {}", path.display()))?)
        };
        Ok(Self { inner: Arc::new(Mutex::new(w)), name: path.display().to_string() })
    }

    /// Writes one record as a JSON line and flushes it.
    pub fn write<T: Serialize>(&self, rec: &T) -> Result<()> {
        let mut line = serde_json::to_vec(rec).context("cannot serialise a record")?;
        line.push(b'\n');
        let mut w = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        w.write_all(&line).and_then(|()| w.flush()).with_context(|| format!("cannot write to {}", self.name))
    }
}

/// A planned bulk download (`bulk --plan-only`).
#[derive(Debug, Serialize)]
pub struct BulkPlanRecord<'a> {
    pub id: usize,
    pub label: &'a str,
    pub size: u64,
    pub planned_ms: f64,
    pub timeout_ms: f64,
    pub slot_start_ms: f64,
    pub slot_end_ms: f64,
}

/// The result of one bulk download.
#[derive(Debug, Serialize)]
pub struct BulkRecord<'a> {
    pub id: usize,
    pub label: &'a str,
    pub size: u64,
    pub planned_ms: f64,
    pub start_ms: f64,
    pub end_ms: Option<f64>,
    pub bytes: u64,
    pub ok: bool,
    pub timeout: bool,
    pub error: Option<String>,
    /// The planned start had already passed when the download's turn came (it started at once).
    pub late: bool,
    pub timeout_ms: f64,
    /// Cumulative body bytes over the download as `[trip_ms, bytes]`: the start (0 bytes), every
    /// 100 ms of trip time after the start, and the end (see `bulk::Progress`).
    pub progress: Vec<(f64, u64)>,
}

/// The single record of a `backlog` run: one always-busy download flow over a window.
#[derive(Debug, Serialize)]
pub struct BacklogRecord<'a> {
    /// Always `"backlog"` (tells the record apart from bulk records in shared tooling).
    pub kind: &'static str,
    /// 0, or the user in a multi-user run (`--users`).
    pub id: usize,
    /// The user (0..N) in a multi-user run; absent in a single-flow run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<u32>,
    /// The user's source address (`--source-base` + user) in a multi-user run; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Always `"backlog"`.
    pub label: &'static str,
    /// URL path of every request.
    pub path: &'a str,
    /// Expected body size of each request.
    pub size: u64,
    /// Window start A (trip ms).
    pub planned_ms: f64,
    /// Actual start (trip ms, just before the first `connect()`).
    pub start_ms: f64,
    /// Actual end: ≈ window end B, or the time of SIGINT/SIGTERM.
    pub end_ms: f64,
    /// Body bytes over all requests, including partial ones.
    pub bytes: u64,
    /// Requests started.
    pub requests: u64,
    /// Requests with status 200 and exactly `size` body bytes.
    pub completed: u64,
    /// Requests that failed (the one abandoned at the end counts in neither).
    pub failed: u64,
    /// The first errors, each `"<trip ms>: <error>"`.
    pub errors: Vec<String>,
    /// The window had already started when the run began (it started at once).
    pub late: bool,
    /// Cumulative body bytes over the whole run as `[trip_ms, bytes]` on the 100 ms grid from
    /// `start_ms` (see `bulk::Progress`).
    pub progress: Vec<(f64, u64)>,
}

/// One IM message.
#[derive(Debug, Serialize)]
pub struct ImRecord {
    pub user: u32,
    pub msg: u32,
    pub due_ms: f64,
    pub send_ms: Option<f64>,
    pub recv_ms: Option<f64>,
    pub delay_ms: Option<f64>,
    pub ok: bool,
    pub error: Option<String>,
}

/// One IM connection attempt (side file).
#[derive(Debug, Serialize)]
pub struct ConnRecord {
    pub user: u32,
    pub attempt: u32,
    pub start_ms: f64,
    pub end_ms: Option<f64>,
    pub connect_ms: Option<f64>,
    pub ok: bool,
    pub error: Option<String>,
}
