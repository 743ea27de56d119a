//! Failure-location tables from their sources (POLYCORN §4.3; the trainer
//! contract): a file (`--failure-table`), the LinkDB API
//! (`--failure-table-url`, [`http`]) and, in the proxy, the trainer's
//! compacted Kafka topic (`--failure-table-topic`, the proxy's
//! `table_topic` module). Several may run at once.
//!
//! - [`judge`] is the pure rule every source obeys: with
//!   `--failure-table-verify-key` ([`signature::Verifier`]), a table whose
//!   detached signature does not verify with one of the trainer's keys is
//!   refused before it is parsed; a table that does not
//!   parse is refused (the table in use stays); a signed table must carry
//!   its issue time and expiry (`issued_unix_s`, `expires_unix_s`, inside
//!   the signed bytes). A network source's table is used only when it is
//!   newer than the one in use and not older than the highest ever
//!   accepted ([`state::Mark`]: version, then issue time; kept per signing
//!   key, across restarts with `--failure-table-state-dir`; a key no longer
//!   trusted binds no more), so a replayed old table is ignored; the file may replace the table with any valid version (an
//!   operator who edits the file means it). A network source may not move
//!   the version more than [`MAX_VERSION_STEP`] past the highest accepted:
//!   one message with version 2^64 − 1 would otherwise freeze every
//!   proxy's table for good. A table past its expiry is refused, from any
//!   source.
//! - [`Tables`] is the pure state: the table in use (version, expiry), the
//!   highest mark, and the statistics, overall and per source. When the
//!   table in use expires, [`Tables::expire`] drops it: the data plane gets
//!   an empty table (plain scheduling, no failure locations) until a valid
//!   one comes, counted in `polycorn_failure_table_expired_total` and
//!   logged; a stale table is worse than none.
//! - [`TableHub`] is the shell all sources of a process share: it logs each
//!   verdict, hands every table to use to the data plane
//!   (`Endpoint::set_failure_table`, which never drops a connection),
//!   writes the state file when the mark rises, and checks the expiry.
//! - The sources are thin loops: [`file::FileSource`], [`http::HttpSource`].

pub mod file;
pub mod http;
pub mod signature;
pub mod state;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use polycorn_core::sched::FailureTable;
use polycorn_telemetry::failure_table::FailureTableFile;
use polycorn_telemetry::route_match::Routes;
use tracing::{debug, info, warn};

use crate::hof::SharedRoutes;
use crate::metrics::{Source, Writer};
use signature::Verifier;
use state::{KeyId, Mark, Marks, StateFile};

/// Where a table came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SourceKind {
    /// `--failure-table FILE`.
    File,
    /// `--failure-table-url URL` (the LinkDB API).
    Http,
    /// `--failure-table-topic TOPIC` (the trainer's Kafka topic; proxy only).
    Kafka,
}

impl SourceKind {
    /// The `source` label value of the per-source metrics.
    pub fn label(self) -> &'static str {
        match self {
            SourceKind::File => "file",
            SourceKind::Http => "http",
            SourceKind::Kafka => "kafka",
        }
    }
}

/// When a table was issued, until when it is valid, and who signed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub mark: Mark,
    /// `expires_unix_s`; `None`: an unsigned table without one never expires.
    pub expires_unix_s: Option<u64>,
    /// The key that signed it; `None` unsigned (no verify key).
    pub key: Option<KeyId>,
}

/// What becomes of a table a source delivered.
#[derive(Debug)]
pub enum Verdict {
    /// Use it (and its route lines, for map matching).
    Apply(FailureTable, Routes, Stamp),
    /// Valid, but not newer than the table in use, or older than the
    /// highest accepted (a replay): ignored.
    NotNewer { offered: u64, in_use: u64 },
    /// Valid and signed, but past its expiry: refused.
    Expired { version: u64, expires_unix_s: u64 },
    /// Malformed (the reason): refused; the table in use stays.
    Malformed(String),
    /// Not signed, or not by a key of `--failure-table-verify-key` (the
    /// reason): refused unparsed; the table in use stays.
    BadSignature(String),
}

/// The most a table from the network (API, Kafka) may move the version past
/// the highest accepted; the trainer adds 1 per table it publishes. A larger jump
/// is refused as malformed: a faulty or hostile producer's, or a LinkDB
/// restored from elsewhere, which an operator confirms by putting that
/// table into `--failure-table` (the file may set any version).
pub const MAX_VERSION_STEP: u64 = 10_000;

/// What a table is judged against: the table in use, the highest mark
/// accepted (persisted), the keys, and the time.
#[derive(Clone, Copy, Debug, Default)]
pub struct Against<'a> {
    pub in_use: Option<Mark>,
    pub highest: Option<Mark>,
    pub verifier: Option<&'a Verifier>,
    pub now_unix_s: u64,
}

/// The rule: with a `verifier`, `signature` (as the source carried it,
/// base64) must be one of its keys' over exactly `body`; then parse `body`;
/// a signed table must carry `issued_unix_s` and `expires_unix_s`; a network
/// source's table is used if it is newer than the table in use, not older
/// than the highest mark, and at most [`MAX_VERSION_STEP`] versions past
/// it; the file's with any version; a table past its expiry is refused.
pub fn judge(a: Against<'_>, source: SourceKind, body: &[u8], signature: Option<&[u8]>) -> Verdict {
    let key = match a.verifier.map(|v| v.verify(body, signature)) {
        None => None,
        Some(Ok(k)) => Some(k),
        Some(Err(e)) => return Verdict::BadSignature(e.to_string()),
    };
    let text = match std::str::from_utf8(body) {
        Ok(t) => t,
        Err(e) => return Verdict::Malformed(format!("not UTF-8 text: {e}")),
    };
    let f = match FailureTableFile::parse(text) {
        Ok(f) => f,
        Err(e) => return Verdict::Malformed(e.to_string()),
    };
    if a.verifier.is_some() && (f.issued_unix_s.is_none() || f.expires_unix_s.is_none()) {
        return Verdict::Malformed(
            "a signed table must carry issued_unix_s and expires_unix_s (a table from before they were signed)".into(),
        );
    }
    let stamp = Stamp {
        mark: Mark { version: f.version, issued_unix_s: f.issued_unix_s.unwrap_or(0) },
        expires_unix_s: f.expires_unix_s,
        key,
    };
    if source != SourceKind::File {
        let older =
            |m: Option<Mark>, or_equal: bool| m.is_some_and(|m| stamp.mark < m || (or_equal && stamp.mark == m));
        // Equal to the highest is taken when nothing is in use: a restarted
        // process's first table is the one it had.
        if older(a.highest, false) || older(a.in_use, true) {
            let in_use = a.highest.max(a.in_use).map_or(0, |m| m.version);
            return Verdict::NotNewer { offered: f.version, in_use };
        }
        if let Some(h) = a.highest.max(a.in_use) {
            if f.version - h.version > MAX_VERSION_STEP {
                return Verdict::Malformed(format!(
                    "version {} is more than {MAX_VERSION_STEP} past the highest accepted ({}); \
                     to move to it, give it to --failure-table",
                    f.version, h.version
                ));
            }
        }
    }
    if let Some(expires_unix_s) = f.expires_unix_s.filter(|&e| e <= a.now_unix_s) {
        return Verdict::Expired { version: f.version, expires_unix_s };
    }
    Verdict::Apply(f.to_table(), Routes::new(&f.routes), stamp)
}

/// One source's statistics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SourceStats {
    /// Tables from it put in use.
    pub loads: u64,
    /// Tables from it refused: malformed, or (of these) [`Self::unverified`]
    /// or [`Self::expired`].
    pub rejected: u64,
    /// Of the refused, those without a signature that verifies.
    pub unverified: u64,
    /// Of the refused, those past their expiry.
    pub expired: u64,
    /// Valid tables from it not newer than the one in use.
    pub not_newer: u64,
    /// Failed fetches: HTTP errors and bad statuses, Kafka errors.
    pub errors: u64,
    /// When the source last answered (an HTTP response that is not an
    /// error, a Kafka message), Unix seconds.
    pub last_ok_unix_s: Option<f64>,
}

/// Statistics of the tables of one process: plain data, turned into
/// Prometheus metrics by [`TableStats::write`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TableStats {
    /// Version of the table in use.
    pub version: Option<u64>,
    /// Its failure locations.
    pub entries: u64,
    /// Its expiry, Unix seconds.
    pub expires_unix_s: Option<u64>,
    /// Tables in use dropped because they expired.
    pub expired: u64,
    /// Failed writes of the `--failure-table-state-dir` file.
    pub state_errors: u64,
    /// Per source that has reported anything.
    pub sources: BTreeMap<SourceKind, SourceStats>,
}

impl TableStats {
    /// Tables put in use, all sources.
    pub fn loads(&self) -> u64 {
        self.sources.values().map(|s| s.loads).sum()
    }

    /// Malformed tables refused, all sources.
    pub fn rejected(&self) -> u64 {
        self.sources.values().map(|s| s.rejected).sum()
    }

    pub fn source(&self, k: SourceKind) -> SourceStats {
        self.sources.get(&k).cloned().unwrap_or_default()
    }

    /// The totals keep the names (and no labels) they had before there were
    /// several sources; the per-source families carry a `source` label.
    pub fn write(&self, w: &mut Writer) {
        w.gauge(
            "polycorn_failure_table_version",
            "Version of the failure-location table in use (0: none yet).",
            vec![],
            self.version.unwrap_or(0) as f64,
        );
        w.gauge(
            "polycorn_failure_table_entries",
            "Failure locations in the table in use.",
            vec![],
            self.entries as f64,
        );
        w.gauge(
            "polycorn_failure_table_expires_timestamp_seconds",
            "When the failure-location table in use expires, Unix time (0: none in use, or it never expires).",
            vec![],
            self.expires_unix_s.unwrap_or(0) as f64,
        );
        w.counter(
            "polycorn_failure_table_expired",
            "Failure-location tables in use dropped at their expiry (plain scheduling until a valid one comes).",
            vec![],
            self.expired as f64,
        );
        w.counter(
            "polycorn_failure_table_state_errors",
            "Failed writes of the highest accepted table's version to --failure-table-state-dir.",
            vec![],
            self.state_errors as f64,
        );
        w.counter("polycorn_failure_table_loads", "Failure-location tables put in use.", vec![], self.loads() as f64);
        w.counter(
            "polycorn_failure_table_rejected",
            "Failure-location tables refused (malformed, expired, or unsigned with --failure-table-verify-key); the previous table stayed in use.",
            vec![],
            self.rejected() as f64,
        );
        for (k, s) in &self.sources {
            let l = || vec![("source".to_string(), k.label().to_string())];
            w.counter(
                "polycorn_failure_table_source_loads",
                "Failure-location tables put in use, by source (file, http, kafka).",
                l(),
                s.loads as f64,
            );
            for (reason, n) in [
                ("malformed", s.rejected - s.unverified - s.expired),
                ("signature", s.unverified),
                ("expired", s.expired),
            ] {
                let mut l = l();
                l.push(("reason".to_string(), reason.to_string()));
                w.counter(
                    "polycorn_failure_table_source_rejected",
                    "Failure-location tables refused, by source and reason: malformed (or under another Kafka key), \
                     signature (none, or none that --failure-table-verify-key verifies), expired.",
                    l,
                    n as f64,
                );
            }
            w.counter(
                "polycorn_failure_table_source_not_newer",
                "Valid failure-location tables ignored because they were not newer than the one in use or older than the highest accepted, by source.",
                l(),
                s.not_newer as f64,
            );
            w.counter(
                "polycorn_failure_table_source_errors",
                "Failed fetches of failure-location tables (HTTP errors and statuses, Kafka errors), by source.",
                l(),
                s.errors as f64,
            );
            if let Some(t) = s.last_ok_unix_s {
                w.gauge(
                    "polycorn_failure_table_source_last_ok_timestamp_seconds",
                    "When the source last answered (HTTP: a 200, 304 or 404; Kafka: a message), Unix time.",
                    l(),
                    t,
                );
            }
        }
    }
}

/// The pure state: the table in use, the highest mark accepted, the
/// statistics, and the keys tables must be signed with (none: unsigned
/// tables are accepted).
#[derive(Debug, Default)]
pub struct Tables {
    stats: TableStats,
    verifier: Option<Verifier>,
    /// The table in use.
    in_use: Option<Stamp>,
    /// The highest table ever accepted under each key (from the state
    /// file at start); those of trusted keys bind ([`Tables::highest`]).
    marks: Marks,
}

impl Tables {
    /// Tables that must be signed by one of `verifier`'s keys (if any),
    /// none older than what `marks` binds while their keys are trusted.
    pub fn new(verifier: Option<Verifier>, marks: Marks) -> Tables {
        Tables { verifier, marks, ..Tables::default() }
    }

    /// Tables that must be signed by one of `verifier`'s keys.
    pub fn verified(verifier: Verifier) -> Tables {
        Tables::new(Some(verifier), Marks::default())
    }

    /// The highest table accepted that binds: unsigned, or signed by a key
    /// still trusted (a revoked key's tables bind no more).
    pub fn highest(&self) -> Option<Mark> {
        self.marks.binding(|k| self.verifier.as_ref().is_some_and(|v| v.trusts(k)))
    }

    /// The marks per key, as the state file keeps them.
    pub fn marks(&self) -> &Marks {
        &self.marks
    }

    /// Judge a table from `source` (with its signature, if it came with
    /// one) at `now_unix_s` and count the verdict.
    pub fn offer(&mut self, source: SourceKind, body: &[u8], signature: Option<&[u8]>, now_unix_s: u64) -> Verdict {
        let against = Against {
            in_use: self.in_use.map(|s| s.mark),
            highest: self.highest(),
            verifier: self.verifier.as_ref(),
            now_unix_s,
        };
        let v = judge(against, source, body, signature);
        let s = self.stats.sources.entry(source).or_default();
        match &v {
            Verdict::Apply(t, _, stamp) => {
                s.loads += 1;
                self.stats.version = Some(t.version());
                self.stats.entries = t.len() as u64;
                self.stats.expires_unix_s = stamp.expires_unix_s;
                self.in_use = Some(*stamp);
                self.marks.raise(stamp.key, stamp.mark);
            }
            Verdict::NotNewer { .. } => s.not_newer += 1,
            Verdict::Malformed(_) => s.rejected += 1,
            Verdict::Expired { .. } => {
                s.rejected += 1;
                s.expired += 1;
            }
            Verdict::BadSignature(_) => {
                s.rejected += 1;
                s.unverified += 1;
            }
        }
        v
    }

    /// At `now_unix_s`: if the table in use has expired, drop it and return
    /// its version and expiry.
    pub fn expire(&mut self, now_unix_s: u64) -> Option<(u64, u64)> {
        let stamp = self.in_use?;
        let expires = stamp.expires_unix_s.filter(|&e| e <= now_unix_s)?;
        self.in_use = None;
        self.stats.version = None;
        self.stats.entries = 0;
        self.stats.expires_unix_s = None;
        self.stats.expired += 1;
        Some((stamp.mark.version, expires))
    }

    /// `source` failed to fetch.
    pub fn source_error(&mut self, source: SourceKind) {
        self.stats.sources.entry(source).or_default().errors += 1;
    }

    /// `source` answered at `now_unix_s`.
    pub fn source_ok(&mut self, source: SourceKind, now_unix_s: f64) {
        self.stats.sources.entry(source).or_default().last_ok_unix_s = Some(now_unix_s);
    }

    pub fn stats(&self) -> &TableStats {
        &self.stats
    }
}

/// What [`TableHub::offer`] did with a table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Offered {
    /// In use now, this version.
    Applied(u64),
    /// Ignored: not newer than the table in use.
    NotNewer,
    /// Refused as malformed, with the reason.
    Malformed(String),
    /// Refused: no signature that `--failure-table-verify-key` verifies.
    BadSignature(String),
    /// Refused: past its expiry.
    Expired(String),
}

impl Offered {
    /// Refused (malformed or unverified): the reason.
    pub fn refusal(&self) -> Option<&str> {
        match self {
            Offered::Malformed(e) | Offered::BadSignature(e) | Offered::Expired(e) => Some(e),
            Offered::Applied(_) | Offered::NotNewer => None,
        }
    }
}

type Apply = Box<dyn Fn(FailureTable) + Send + Sync>;

/// How often the hub checks whether the table in use has expired.
pub const EXPIRY_CHECK_EVERY: Duration = Duration::from_secs(5);

fn unix_now() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The tables of one process, shared by its sources.
pub struct TableHub {
    tables: Mutex<Tables>,
    /// `--failure-table-state-dir`'s file: the highest mark, written when it rises.
    state: Option<StateFile>,
    /// Puts a table in use in the data plane. Called with the hub locked,
    /// so tables reach the data plane in the order they were judged; it must
    /// not call back into the hub.
    apply: Apply,
    /// The route lines of the table in use (map matching of live fixes).
    routes: SharedRoutes,
}

impl std::fmt::Debug for TableHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableHub").field("tables", &self.tables).finish_non_exhaustive()
    }
}

impl TableHub {
    /// A hub that accepts unsigned tables (tests).
    pub fn new(apply: impl Fn(FailureTable) + Send + Sync + 'static) -> Arc<TableHub> {
        Self::build(SharedRoutes::default(), None, apply)
    }

    /// A hub that puts each applied table's route lines into `routes`
    /// and, with a `verifier` (`--failure-table-verify-key`), takes only
    /// tables signed by one of its keys. Without one it warns, once, that
    /// tables are accepted unsigned. It keeps no state across restarts
    /// ([`TableHub::open`] does).
    pub fn build(
        routes: SharedRoutes,
        verifier: Option<Verifier>,
        apply: impl Fn(FailureTable) + Send + Sync + 'static,
    ) -> Arc<TableHub> {
        Self::with_state(routes, verifier, None, Marks::default(), apply)
    }

    /// [`TableHub::build`], and with `state_dir`
    /// (`--failure-table-state-dir`) the highest table accepted is read
    /// from its file and kept there, so that no restart reopens the process
    /// to older tables. An unreadable or damaged state file is an error.
    pub fn open(
        routes: SharedRoutes,
        verifier: Option<Verifier>,
        state_dir: Option<&std::path::Path>,
        apply: impl Fn(FailureTable) + Send + Sync + 'static,
    ) -> Result<Arc<TableHub>, crate::Error> {
        let Some(dir) = state_dir else {
            return Ok(Self::with_state(routes, verifier, None, Marks::default(), apply));
        };
        let (file, mut marks) = StateFile::open(dir)?;
        let trusted = |k: &KeyId| verifier.as_ref().is_some_and(|v| v.trusts(k));
        for (key, m) in marks.forget_untrusted(trusted) {
            warn!(
                state = %file.path().display(),
                %key,
                version = m.version,
                "the highest table accepted under a key that is no longer trusted binds no more (a revoked key)"
            );
        }
        match marks.binding(trusted) {
            Some(m) => info!(
                state = %file.path().display(),
                version = m.version,
                issued_unix_s = m.issued_unix_s,
                "failure-location tables older than the highest accepted before are refused"
            ),
            None => info!(
                state = %file.path().display(),
                "no failure-location table accepted before: the first valid one is taken, whatever its version"
            ),
        }
        Ok(Self::with_state(routes, verifier, Some(file), marks, apply))
    }

    fn with_state(
        routes: SharedRoutes,
        verifier: Option<Verifier>,
        state: Option<StateFile>,
        marks: Marks,
        apply: impl Fn(FailureTable) + Send + Sync + 'static,
    ) -> Arc<TableHub> {
        match &verifier {
            Some(v) => info!(
                keys = v.keys(),
                verify_key = v.origin(),
                "failure-location tables must be signed by the trainer's key"
            ),
            None => warn!(
                "no --failure-table-verify-key: failure-location tables are accepted unsigned, from anyone \
                 who can write the table's file, topic or API"
            ),
        }
        let tables = Tables::new(verifier, marks);
        Arc::new(TableHub { tables: Mutex::new(tables), state, apply: Box::new(apply), routes })
    }

    /// The route lines of the table in use.
    pub fn routes(&self) -> SharedRoutes {
        self.routes.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A table `source` delivered (`origin`: the file, URL or topic
    /// position, for the log) with its `signature` if it carried one:
    /// judged, logged, counted, and put in use if the rule says so.
    pub fn offer(&self, source: SourceKind, origin: &str, body: &[u8], signature: Option<&[u8]>) -> Offered {
        let mut tables = self.lock();
        let src = source.label();
        let marks = tables.marks().clone();
        match tables.offer(source, body, signature, unix_now()) {
            Verdict::Apply(t, routes, stamp) => {
                let version = t.version();
                info!(
                    source = src,
                    origin,
                    version,
                    issued_unix_s = stamp.mark.issued_unix_s,
                    expires_unix_s = stamp.expires_unix_s,
                    entries = t.len(),
                    routes = routes.len(),
                    "failure-location table in use"
                );
                self.routes.set(routes);
                (self.apply)(t);
                if let (Some(file), true) = (&self.state, *tables.marks() != marks) {
                    if let Err(e) = file.store(tables.marks()) {
                        tables.stats.state_errors += 1;
                        warn!(state = %file.path().display(), error = %e, "could not write the failure-table state: a restart may take an older table");
                    }
                }
                Offered::Applied(version)
            }
            Verdict::Expired { version, expires_unix_s } => {
                let e = format!("version {version} expired at {expires_unix_s} (Unix seconds)");
                warn!(source = src, origin, error = %e, "expired failure-location table refused; keeping the previous one");
                Offered::Expired(e)
            }
            Verdict::NotNewer { offered, in_use } => {
                debug!(
                    source = src,
                    origin, offered, in_use, "failure-location table not newer than the one in use: ignored"
                );
                Offered::NotNewer
            }
            Verdict::Malformed(e) => {
                warn!(source = src, origin, error = %e, "malformed failure-location table refused; keeping the previous one");
                Offered::Malformed(e)
            }
            Verdict::BadSignature(e) => {
                warn!(source = src, origin, error = %e, "failure-location table without a valid signature refused; keeping the previous one");
                Offered::BadSignature(e)
            }
        }
    }

    /// Refuse what `source` delivered without judging a table (not one:
    /// a Kafka message under another key): counted and logged like a
    /// malformed table.
    pub fn refuse(&self, source: SourceKind, origin: &str, reason: &str) {
        self.lock().stats.sources.entry(source).or_default().rejected += 1;
        warn!(source = source.label(), origin, reason, "failure-location table refused; keeping the previous one");
    }

    /// Drop the table in use if it has expired: the data plane gets an
    /// empty table (no failure locations: plain scheduling) until a valid
    /// one comes. True when it did.
    pub fn check_expiry(&self) -> bool {
        self.check_expiry_at(unix_now())
    }

    fn check_expiry_at(&self, now_unix_s: u64) -> bool {
        let mut tables = self.lock();
        let Some((version, expires_unix_s)) = tables.expire(now_unix_s) else {
            return false;
        };
        warn!(
            version,
            expires_unix_s,
            "the failure-location table in use expired: dropped, plain scheduling until the trainer's next table"
        );
        self.routes.set(Routes::new(&[]));
        (self.apply)(FailureTable::new(version));
        true
    }

    /// Check the expiry every `every` until `stop`.
    pub async fn watch_expiry(self: Arc<Self>, every: Duration, mut stop: tokio::sync::watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stop.changed() => return,
            }
            self.check_expiry();
        }
    }

    /// `source` failed to fetch (the caller logs why).
    pub fn source_error(&self, source: SourceKind) {
        self.lock().source_error(source);
    }

    /// `source` answered.
    pub fn source_ok(&self, source: SourceKind) {
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        self.lock().source_ok(source, now);
    }

    /// A snapshot of the statistics.
    pub fn stats(&self) -> TableStats {
        self.lock().stats().clone()
    }

    /// The metrics source for [`crate::metrics::serve`].
    pub fn metrics(self: &Arc<Self>) -> Source {
        let me = self.clone();
        Arc::new(move |w: &mut Writer| me.lock().stats().write(w))
    }
}

/// The sources both binaries share, `--failure-table` (a file) and
/// `--failure-table-url` (the LinkDB API), opened and ready to run; the
/// proxy adds its Kafka topic itself.
pub struct FileAndApi {
    hub: Arc<TableHub>,
    file: Option<file::FileSource>,
    api: Option<(http::HttpSource, std::time::Duration)>,
}

impl FileAndApi {
    /// Open the file (an unreadable, malformed or unsigned file at start is
    /// an error naming it) and the API client, both feeding `hub`.
    pub fn open(
        hub: &Arc<TableHub>,
        file: Option<&std::path::Path>,
        api: Option<&http::HttpOpts>,
    ) -> Result<FileAndApi, crate::Error> {
        let file = file.map(|path| file::FileSource::open(path, hub.clone())).transpose()?;
        let api = match api {
            Some(o) => {
                let src = http::HttpSource::new(&o.url, o.api_key.as_deref(), hub.clone())?;
                info!(url = %src.uri(), every_s = o.every.as_secs_f64(), "failure-location table: polling the LinkDB API");
                Some((src, o.every))
            }
            None => None,
        };
        Ok(FileAndApi { hub: hub.clone(), file, api })
    }

    /// The sources' tasks and the hub's expiry check, each running until
    /// `stop`: the caller spawns them where its other tasks run.
    pub fn tasks(
        self,
        stop: &tokio::sync::watch::Receiver<bool>,
    ) -> Vec<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> {
        let mut out: Vec<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> =
            vec![Box::pin(self.hub.clone().watch_expiry(EXPIRY_CHECK_EVERY, stop.clone()))];
        if let Some(f) = self.file {
            out.push(Box::pin(f.run(file::CHECK_EVERY, stop.clone())));
        }
        if let Some((src, every)) = self.api {
            out.push(Box::pin(src.run(every, stop.clone())));
        }
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use polycorn_telemetry::failure_table::{Direction, Entry};

    /// The issue time of [`table`]'s tables.
    pub(crate) const ISSUED: u64 = 1_800_000_000;
    /// Their expiry: far in the future.
    pub(crate) const EXPIRES: u64 = 4_000_000_000;
    /// The time the pure tests judge at.
    const NOW: u64 = ISSUED + 3600;

    /// A valid table file of `version` with `entries` entries, issued at
    /// [`ISSUED`], expiring at [`EXPIRES`].
    pub(crate) fn table(version: u64, entries: usize) -> String {
        stamped(version, entries, ISSUED, EXPIRES)
    }

    /// A valid table file of `version` issued at `issued`, expiring at `expires`.
    pub(crate) fn stamped(version: u64, entries: usize, issued: u64, expires: u64) -> String {
        let mut f = FailureTableFile::new(version, "test");
        f.issued_unix_s = Some(issued);
        f.expires_unix_s = Some(expires);
        for i in 0..entries {
            f.entries.push(Entry {
                cell: 9 + i as u64,
                direction: Direction::Increasing,
                position_m: 100.0,
                failures: None,
                handovers: None,
                route: None,
                lat: None,
                lon: None,
            });
        }
        f.to_json()
    }

    /// [`judge`] with `in_use` (a version of [`table`]), nothing persisted,
    /// unsigned, now.
    fn j(in_use: Option<u64>, source: SourceKind, body: &[u8]) -> Verdict {
        let in_use = in_use.map(|version| Mark { version, issued_unix_s: ISSUED });
        judge(Against { in_use, now_unix_s: unix_now(), ..Against::default() }, source, body, None)
    }

    #[test]
    fn a_network_source_cannot_jump_the_version_out_of_reach() {
        let poisoned = table(u64::MAX, 1);
        for source in [SourceKind::Http, SourceKind::Kafka] {
            let v = j(Some(5), source, poisoned.as_bytes());
            assert!(matches!(&v, Verdict::Malformed(e) if e.contains("more than 10000 past")), "{v:?}");
            assert_eq!(applied(j(Some(5), source, table(5 + MAX_VERSION_STEP, 1).as_bytes())), 10_005);
        }
        // The operator's file may move to any version.
        assert_eq!(applied(j(Some(5), SourceKind::File, poisoned.as_bytes())), u64::MAX);
        // Refused tables leave the one in use.
        let mut t = Tables::default();
        applied(t.offer(SourceKind::Kafka, table(5, 1).as_bytes(), None, NOW));
        assert!(matches!(t.offer(SourceKind::Kafka, poisoned.as_bytes(), None, NOW), Verdict::Malformed(_)));
        assert_eq!(applied(t.offer(SourceKind::Kafka, table(6, 1).as_bytes(), None, NOW)), 6);
        assert_eq!(t.stats().source(SourceKind::Kafka).rejected, 1);
    }

    fn applied(v: Verdict) -> u64 {
        match v {
            Verdict::Apply(t, ..) => t.version(),
            other => panic!("expected a table to apply, got {other:?}"),
        }
    }

    #[test]
    fn only_a_newer_version_replaces_the_table_from_the_network_sources() {
        for src in [SourceKind::Http, SourceKind::Kafka] {
            assert_eq!(applied(j(None, src, table(5, 1).as_bytes())), 5, "the first table is used");
            assert_eq!(applied(j(Some(4), src, table(5, 1).as_bytes())), 5);
            assert!(matches!(j(Some(5), src, table(5, 1).as_bytes()), Verdict::NotNewer { offered: 5, in_use: 5 }));
            assert!(matches!(j(Some(6), src, table(5, 1).as_bytes()), Verdict::NotNewer { .. }));
        }
    }

    #[test]
    fn the_file_may_replace_the_table_with_any_valid_version() {
        assert_eq!(applied(j(Some(9), SourceKind::File, table(2, 1).as_bytes())), 2);
        assert!(matches!(j(Some(9), SourceKind::File, b"{"), Verdict::Malformed(_)));
    }

    #[test]
    fn malformed_tables_are_refused_with_the_reason() {
        let Verdict::Malformed(why) = j(None, SourceKind::Kafka, b"\xff\xfe") else { panic!() };
        assert!(why.contains("UTF-8"), "{why}");
        let Verdict::Malformed(why) = j(None, SourceKind::Http, b"{\"format\":\"x\"}") else { panic!() };
        assert!(why.contains("not a failure-location table"), "{why}");
        let wrong = table(3, 1).replace("polycorn-failure-table/1", "other/9");
        let Verdict::Malformed(why) = j(None, SourceKind::Http, wrong.as_bytes()) else { panic!() };
        assert!(why.contains("other/9"), "{why}");
    }

    #[test]
    fn the_statistics_count_each_verdict_per_source_and_keep_the_table_in_use() {
        let mut t = Tables::default();
        applied(t.offer(SourceKind::File, table(3, 2).as_bytes(), None, NOW));
        applied(t.offer(SourceKind::Kafka, table(4, 5).as_bytes(), None, NOW));
        assert!(matches!(t.offer(SourceKind::Kafka, b"garbage", None, NOW), Verdict::Malformed(_)));
        assert!(matches!(t.offer(SourceKind::Http, table(4, 1).as_bytes(), None, NOW), Verdict::NotNewer { .. }));
        t.source_error(SourceKind::Http);
        t.source_ok(SourceKind::Http, 17.5);
        let s = t.stats();
        assert_eq!((s.version, s.entries), (Some(4), 5), "the malformed and the stale table changed nothing");
        assert_eq!((s.loads(), s.rejected()), (2, 1));
        assert_eq!(s.source(SourceKind::Kafka), SourceStats { loads: 1, rejected: 1, ..Default::default() });
        assert_eq!(
            s.source(SourceKind::Http),
            SourceStats { not_newer: 1, errors: 1, last_ok_unix_s: Some(17.5), ..Default::default() }
        );
    }

    #[test]
    fn the_hub_applies_in_order_and_the_metrics_keep_their_names() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        let hub = TableHub::new(move |t| s2.lock().unwrap().push(t.version()));
        assert_eq!(hub.offer(SourceKind::Kafka, "t:0", table(1, 1).as_bytes(), None), Offered::Applied(1));
        assert!(matches!(hub.offer(SourceKind::Kafka, "t:1", b"nope", None), Offered::Malformed(_)));
        assert_eq!(hub.offer(SourceKind::Http, "u", table(2, 1).as_bytes(), None), Offered::Applied(2));
        assert_eq!(hub.offer(SourceKind::Kafka, "t:2", table(1, 1).as_bytes(), None), Offered::NotNewer);
        assert_eq!(*seen.lock().unwrap(), vec![1, 2]);

        let text = crate::metrics::tests::encode(vec![hub.metrics()]);
        for line in [
            // scripts/integration-hsr.sh greps these exact forms.
            "polycorn_failure_table_version{} 2.0",
            "polycorn_failure_table_loads_total{} 2.0",
            "polycorn_failure_table_rejected_total{} 1.0",
            "polycorn_failure_table_source_loads_total{source=\"kafka\"} 1.0",
            "polycorn_failure_table_source_loads_total{source=\"http\"} 1.0",
            "polycorn_failure_table_source_rejected_total{source=\"kafka\",reason=\"malformed\"} 1.0",
            "polycorn_failure_table_source_rejected_total{source=\"kafka\",reason=\"signature\"} 0.0",
            "polycorn_failure_table_source_not_newer_total{source=\"kafka\"} 1.0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} missing in\n{text}");
        }
    }

    /// With `--failure-table-verify-key`, from every source: the trainer's
    /// signature over the exact bytes is taken; no signature, another
    /// key's, another table's, or a flipped byte of the body is refused
    /// (counted as `reason="signature"`) and the table in use stays.
    #[test]
    fn with_a_verify_key_only_tables_signed_by_the_trainer_are_used() {
        use signature::tests::Signer;
        let (trainer, forger) = (Signer::new(1), Signer::new(2));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        let hub = TableHub::build(SharedRoutes::default(), Some(trainer.verifier()), move |t| {
            s2.lock().unwrap().push(t.version())
        });
        for (i, source) in [SourceKind::Kafka, SourceKind::Http, SourceKind::File].into_iter().enumerate() {
            let v = 1 + 10 * i as u64;
            let good = table(v, 1);
            let sig = trainer.sign(good.as_bytes());
            assert_eq!(hub.offer(source, "o", good.as_bytes(), Some(&sig)), Offered::Applied(v), "{source:?}");

            let next = table(v + 1, 2);
            let mut flipped = next.clone().into_bytes();
            let at = next.find("\"cell\": 9").unwrap() + "\"cell\": ".len();
            flipped[at] = b'8'; // cell 9 -> 8: still a valid table
            let refused = [
                (next.as_bytes().to_vec(), None, "not signed"),
                (next.as_bytes().to_vec(), Some(forger.sign(next.as_bytes())), "does not verify"),
                (next.as_bytes().to_vec(), Some(sig.clone()), "does not verify"), // another table's
                (flipped.clone(), Some(trainer.sign(next.as_bytes())), "does not verify"),
                (b"garbage".to_vec(), None, "not signed"), // refused before it is parsed
            ];
            for (body, s, why) in &refused {
                let o = hub.offer(source, "o", body, s.as_deref());
                assert!(matches!(&o, Offered::BadSignature(e) if e.contains(why)), "{source:?} {why}: {o:?}");
                assert_eq!(hub.stats().version, Some(v), "{source:?}: the table in use stays");
            }
            let st = hub.stats().source(source);
            assert_eq!((st.loads, st.rejected, st.unverified), (1, 5, 5), "{source:?}");
            // The signed next table is taken after all that.
            let o = hub.offer(source, "o", next.as_bytes(), Some(&trainer.sign(next.as_bytes())));
            assert_eq!(o, Offered::Applied(v + 1));
        }
        assert_eq!(*seen.lock().unwrap(), vec![1, 2, 11, 12, 21, 22]);
        // A signed but malformed table is malformed, not unverified.
        let o = hub.offer(SourceKind::Http, "o", b"{}", Some(&trainer.sign(b"{}")));
        assert!(matches!(o, Offered::Malformed(_)), "{o:?}");
        let text = crate::metrics::tests::encode(vec![hub.metrics()]);
        for line in [
            "polycorn_failure_table_rejected_total{} 16.0",
            "polycorn_failure_table_source_rejected_total{source=\"http\",reason=\"signature\"} 5.0",
            "polycorn_failure_table_source_rejected_total{source=\"http\",reason=\"malformed\"} 1.0",
            "polycorn_failure_table_source_rejected_total{source=\"kafka\",reason=\"signature\"} 5.0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} missing in\n{text}");
        }
    }

    /// A signed table as the trainer makes it: its bytes and signature.
    fn signed(by: &signature::tests::Signer, version: u64, issued: u64, expires: u64) -> (String, Vec<u8>) {
        let t = stamped(version, 1, issued, expires);
        let sig = by.sign(t.as_bytes());
        (t, sig)
    }

    fn offer_signed(t: &mut Tables, source: SourceKind, (body, sig): &(String, Vec<u8>), now: u64) -> Verdict {
        t.offer(source, body.as_bytes(), Some(sig), now)
    }

    /// A replay: a genuine, signed, unexpired table older than the highest
    /// accepted is ignored, from every network source, even when no table
    /// is in use (a restarted process); the table it had is taken again, a
    /// newer one and a re-issue of the same version (later issue time) too.
    #[test]
    fn a_replayed_older_table_is_refused_even_with_none_in_use() {
        use signature::tests::Signer;
        let trainer = Signer::new(1);
        for source in [SourceKind::Kafka, SourceKind::Http] {
            let mut t = Tables::new(
                Some(trainer.verifier()),
                [(None, Mark { version: 7, issued_unix_s: ISSUED })].into_iter().collect(),
            );
            for (v, issued) in [(5, ISSUED + 10), (7, ISSUED - 1)] {
                let old = signed(&trainer, v, issued, EXPIRES);
                let r = offer_signed(&mut t, source, &old, NOW);
                assert!(
                    matches!(r, Verdict::NotNewer { offered, in_use: 7 } if offered == v),
                    "{source:?} v{v}: {r:?}"
                );
            }
            assert_eq!(t.stats().version, None, "nothing in use after the replays");
            assert_eq!(applied(offer_signed(&mut t, source, &signed(&trainer, 7, ISSUED, EXPIRES), NOW)), 7);
            let again = offer_signed(&mut t, source, &signed(&trainer, 7, ISSUED, EXPIRES), NOW);
            assert!(matches!(again, Verdict::NotNewer { .. }), "the same table twice: {again:?}");
            let reissued = signed(&trainer, 7, ISSUED + 3000, EXPIRES);
            assert_eq!(applied(offer_signed(&mut t, source, &reissued, NOW)), 7, "a re-issue of the same version");
            let r = offer_signed(&mut t, source, &signed(&trainer, 7, ISSUED, EXPIRES), NOW);
            assert!(matches!(r, Verdict::NotNewer { .. }), "the earlier issue of v7 after its re-issue: {r:?}");
            assert_eq!(applied(offer_signed(&mut t, source, &signed(&trainer, 8, ISSUED, EXPIRES), NOW)), 8);
            assert_eq!(t.highest(), Some(Mark { version: 8, issued_unix_s: ISSUED }));
            assert_eq!(t.stats().source(source).not_newer, 4, "{source:?}");
        }
    }

    /// `--failure-table-state-dir`: the highest table accepted survives a
    /// restart (a new hub reading the state file), so the restarted process
    /// refuses an older table that it would otherwise take as its first.
    #[test]
    fn the_highest_accepted_table_survives_a_restart() {
        use signature::tests::Signer;
        let trainer = Signer::new(1);
        let dir = tempfile::tempdir().unwrap();
        let open =
            || TableHub::open(SharedRoutes::default(), Some(trainer.verifier()), Some(dir.path()), |_| {}).unwrap();
        let offer = |hub: &TableHub, v: u64, issued: u64| {
            let (body, sig) = signed(&trainer, v, issued, EXPIRES);
            hub.offer(SourceKind::Kafka, "t", body.as_bytes(), Some(&sig))
        };
        let hub = open();
        assert_eq!(offer(&hub, 2, ISSUED), Offered::Applied(2), "first start: any version");
        assert_eq!(offer(&hub, 3, ISSUED), Offered::Applied(3));
        drop(hub);
        let text = std::fs::read_to_string(dir.path().join(state::FILE)).unwrap();
        assert_eq!(text, format!("key={} version=3 issued_unix_s={ISSUED}\n", trainer.key_id()));

        let hub = open();
        assert_eq!(offer(&hub, 2, ISSUED + 100), Offered::NotNewer, "after the restart, v2 is a replay");
        assert_eq!(hub.stats().version, None);
        assert_eq!(offer(&hub, 3, ISSUED), Offered::Applied(3), "the table it had is taken again");
        assert_eq!(offer(&hub, 4, ISSUED), Offered::Applied(4));
        drop(hub);
        let hub = open();
        assert_eq!(offer(&hub, 3, ISSUED), Offered::NotNewer);

        // A damaged state file stops the start rather than forget the mark.
        std::fs::write(dir.path().join(state::FILE), "garbage").unwrap();
        assert!(TableHub::open(SharedRoutes::default(), None, Some(dir.path()), |_| {}).is_err());
    }

    /// A table past its expiry is refused from every source (the file
    /// too); a table in use is dropped when it expires: the data plane gets
    /// an empty table (plain scheduling) and the metrics say so; a valid
    /// table afterwards is taken.
    #[test]
    fn an_expired_table_is_refused_and_the_one_in_use_dropped_at_its_expiry() {
        use signature::tests::Signer;
        let trainer = Signer::new(1);
        let mut t = Tables::new(Some(trainer.verifier()), Marks::default());
        for source in [SourceKind::Kafka, SourceKind::Http, SourceKind::File] {
            let r = offer_signed(&mut t, source, &signed(&trainer, 5, NOW - 100, NOW), NOW);
            assert!(matches!(r, Verdict::Expired { version: 5, expires_unix_s: NOW }), "{source:?}: {r:?}");
            assert_eq!(t.stats().source(source).expired, 1);
        }
        assert_eq!(applied(offer_signed(&mut t, SourceKind::Kafka, &signed(&trainer, 6, NOW - 10, NOW + 100), NOW)), 6);
        assert_eq!(t.expire(NOW + 99), None, "not yet");
        assert_eq!(t.expire(NOW + 100), Some((6, NOW + 100)));
        assert_eq!((t.stats().version, t.stats().expired), (None, 1));
        assert_eq!(t.expire(NOW + 200), None, "dropped once");

        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        let hub = TableHub::build(SharedRoutes::default(), Some(trainer.verifier()), move |t| {
            s2.lock().unwrap().push((t.version(), t.len()))
        });
        let now = unix_now();
        let (body, sig) = signed(&trainer, 9, now - 10, now + 3600);
        assert_eq!(hub.offer(SourceKind::Kafka, "t", body.as_bytes(), Some(&sig)), Offered::Applied(9));
        assert!(!hub.check_expiry(), "valid for an hour");
        assert!(hub.check_expiry_at(now + 3600));
        assert_eq!(*seen.lock().unwrap(), vec![(9, 1), (9, 0)], "the data plane got an empty table");
        let text = crate::metrics::tests::encode(vec![hub.metrics()]);
        for line in ["polycorn_failure_table_version{} 0.0", "polycorn_failure_table_expired_total{} 1.0"] {
            assert!(text.lines().any(|l| l == line), "{line:?} missing in\n{text}");
        }
        let (body, sig) = signed(&trainer, 10, now - 5, now + 7200);
        assert_eq!(hub.offer(SourceKind::Kafka, "t", body.as_bytes(), Some(&sig)), Offered::Applied(10));
        let (body, sig) = signed(&trainer, 11, now - 7200, now - 1);
        let o = hub.offer(SourceKind::Kafka, "t", body.as_bytes(), Some(&sig));
        assert!(matches!(&o, Offered::Expired(e) if e.contains("expired")), "{o:?}");
        let text = crate::metrics::tests::encode(vec![hub.metrics()]);
        let line = "polycorn_failure_table_source_rejected_total{source=\"kafka\",reason=\"expired\"} 1.0";
        assert!(text.lines().any(|l| l == line), "{line:?} missing in\n{text}");
        assert_eq!(hub.stats().version, Some(10), "the table in use stays");
    }

    /// A signed table must carry its issue time and expiry: a table signed
    /// before they were part of the signed bytes is refused.
    #[test]
    fn a_signed_table_without_issue_time_or_expiry_is_refused() {
        use signature::tests::Signer;
        let trainer = Signer::new(1);
        let mut t = Tables::new(Some(trainer.verifier()), Marks::default());
        let mut f = FailureTableFile::parse(&table(3, 1)).unwrap();
        for strip in
            [|f: &mut FailureTableFile| f.issued_unix_s = None, |f: &mut FailureTableFile| f.expires_unix_s = None]
        {
            let mut g = f.clone();
            strip(&mut g);
            let body = g.to_json();
            let r = t.offer(SourceKind::Kafka, body.as_bytes(), Some(&trainer.sign(body.as_bytes())), NOW);
            assert!(matches!(&r, Verdict::Malformed(e) if e.contains("issued_unix_s and expires_unix_s")), "{r:?}");
        }
        // Unsigned tables (no verify key) may go without them and never expire.
        f.issued_unix_s = None;
        f.expires_unix_s = None;
        assert_eq!(applied(Tables::default().offer(SourceKind::Kafka, f.to_json().as_bytes(), None, NOW)), 3);
    }

    /// A hub with the verify keys of the file `keys` and its state in `state`
    /// (a process started with them).
    fn keyed_hub(keys: &std::path::Path, state: &std::path::Path) -> Arc<TableHub> {
        let v = Verifier::load(keys).unwrap();
        TableHub::open(SharedRoutes::default(), Some(v), Some(state), |_| {}).unwrap()
    }

    /// Version `v`, signed by `by`, offered to `hub` from `source`.
    fn offer_by(hub: &TableHub, source: SourceKind, by: &signature::tests::Signer, v: u64) -> Offered {
        let (body, sig) = signed(by, v, ISSUED, EXPIRES);
        hub.offer(source, source.label(), body.as_bytes(), Some(&sig))
    }

    /// Rotating the table-signing key: while the verify-key file holds the
    /// old and the new public key, tables signed by either are taken; once
    /// the old key is removed from the file (and the process restarted with
    /// its state), the old key's tables are refused and the new key's taken.
    #[test]
    fn a_key_rotation_takes_both_keys_during_the_overlap_and_only_the_new_after() {
        use signature::tests::Signer;
        let (old, new) = (Signer::new(1), Signer::new(2));
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("table-signing.pub");
        let state = dir.path().join("state");
        let open = || keyed_hub(&keys, &state);
        let offer = |hub: &TableHub, by: &Signer, v: u64| offer_by(hub, SourceKind::Http, by, v);
        std::fs::write(&keys, old.public_pem()).unwrap();
        let hub = open();
        assert_eq!(offer(&hub, &old, 1), Offered::Applied(1));
        assert!(matches!(offer(&hub, &new, 2), Offered::BadSignature(_)), "the new key before it is listed");
        drop(hub);
        // The overlap: both keys listed.
        std::fs::write(&keys, format!("{}{}", old.public_pem(), new.public_pem())).unwrap();
        let hub = open();
        assert_eq!(offer(&hub, &old, 2), Offered::Applied(2));
        assert_eq!(offer(&hub, &new, 3), Offered::Applied(3));
        assert_eq!(offer(&hub, &old, 4), Offered::Applied(4), "the old key still counts during the overlap");
        drop(hub);
        // The old key removed (rotation done, or the old key revoked).
        std::fs::write(&keys, new.public_pem()).unwrap();
        let hub = open();
        let o = offer(&hub, &old, 5);
        assert!(matches!(&o, Offered::BadSignature(e) if e.contains("does not verify")), "{o:?}");
        assert_eq!(offer(&hub, &new, 5), Offered::Applied(5));
        assert_eq!(hub.stats().source(SourceKind::Http).unverified, 1);
    }

    /// A leaked key: its holder pushes the version as far ahead as the
    /// step allows, again and again, so every proxy refuses the trainer's
    /// tables as replays. Revoking it (taking it out of the verify-key file
    /// and restarting) lets the trainer's next table in at once, without
    /// deleting the state file, while the trainer's own mark still refuses
    /// replays of its older tables.
    #[test]
    fn a_revoked_keys_marks_bind_no_more() {
        use signature::tests::Signer;
        let (trainer, leaked) = (Signer::new(1), Signer::new(2));
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("table-signing.pub");
        let state = dir.path().join("state");
        let open = || keyed_hub(&keys, &state);
        let offer = |hub: &TableHub, by: &Signer, v: u64| offer_by(hub, SourceKind::Kafka, by, v);
        std::fs::write(&keys, format!("{}{}", trainer.public_pem(), leaked.public_pem())).unwrap();
        let hub = open();
        assert_eq!(offer(&hub, &trainer, 10), Offered::Applied(10));
        assert_eq!(offer(&hub, &trainer, 11), Offered::Applied(11));
        let mut v = 11;
        for _ in 0..3 {
            v += MAX_VERSION_STEP;
            assert_eq!(offer(&hub, &leaked, v), Offered::Applied(v), "the leaked key's jump");
        }
        assert_eq!(offer(&hub, &trainer, 12), Offered::NotNewer, "the trainer is locked out");
        drop(hub);
        let hub = open();
        assert_eq!(offer(&hub, &trainer, 12), Offered::NotNewer, "a restart alone changes nothing");
        drop(hub);

        // Revoked: the leaked key is out of the file.
        std::fs::write(&keys, trainer.public_pem()).unwrap();
        let hub = open();
        assert_eq!(offer(&hub, &trainer, 10), Offered::NotNewer, "the trainer's own mark still binds");
        assert!(matches!(offer(&hub, &leaked, v + 1), Offered::BadSignature(_)));
        assert_eq!(offer(&hub, &trainer, 12), Offered::Applied(12), "the trainer's next table is taken");
        drop(hub);
        let text = std::fs::read_to_string(state.join(state::FILE)).unwrap();
        assert_eq!(text, format!("key={} version=12 issued_unix_s={ISSUED}\n", trainer.key_id()));
    }
}
