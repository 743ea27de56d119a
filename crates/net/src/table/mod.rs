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
//!   parse is refused (the table in use stays); a parsed table is used only
//!   when its version is higher than the one in use, except from the file,
//!   which may replace the table with any valid version (an operator who
//!   edits the file means it, as before the other sources existed). A
//!   network source may not move the version more than
//!   [`MAX_VERSION_STEP`] past the one in use: one message with version
//!   2^64 − 1 would otherwise freeze every proxy's table for good.
//! - [`Tables`] is the pure state: the version in use and the statistics,
//!   overall and per source.
//! - [`TableHub`] is the shell all sources of a process share: it logs each
//!   verdict and hands every table to use to the data plane
//!   (`Endpoint::set_failure_table`, which never drops a connection).
//! - The sources are thin loops: [`file::FileSource`], [`http::HttpSource`].

pub mod file;
pub mod http;
pub mod signature;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use polycorn_core::sched::FailureTable;
use polycorn_telemetry::failure_table::FailureTableFile;
use polycorn_telemetry::route_match::Routes;
use tracing::{debug, info, warn};

use crate::hof::SharedRoutes;
use crate::metrics::{Source, Writer};
use signature::Verifier;

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

/// What becomes of a table a source delivered.
#[derive(Debug)]
pub enum Verdict {
    /// Use it (and its route lines, for map matching).
    Apply(FailureTable, Routes),
    /// Valid, but its version is not higher than the one in use: ignored.
    NotNewer { offered: u64, in_use: u64 },
    /// Malformed (the reason): refused; the table in use stays.
    Malformed(String),
    /// Not signed, or not by a key of `--failure-table-verify-key` (the
    /// reason): refused unparsed; the table in use stays.
    BadSignature(String),
}

/// The most a table from the network (API, Kafka) may move the version past
/// the one in use; the trainer adds 1 per table it publishes. A larger jump
/// is refused as malformed: a faulty or hostile producer's, or a LinkDB
/// restored from elsewhere, which an operator confirms by putting that
/// table into `--failure-table` (the file may set any version).
pub const MAX_VERSION_STEP: u64 = 10_000;

/// The rule: with a `verifier`, `signature` (as the source carried it,
/// base64) must be one of its keys' over exactly `body`; then parse `body`
/// and use it if it is the first table, comes from the file, or is newer
/// than the table in use (`in_use`, its version) by at most
/// [`MAX_VERSION_STEP`].
pub fn judge(
    in_use: Option<u64>,
    source: SourceKind,
    body: &[u8],
    signature: Option<&[u8]>,
    verifier: Option<&Verifier>,
) -> Verdict {
    if let Some(v) = verifier {
        if let Err(e) = v.verify(body, signature) {
            return Verdict::BadSignature(e.to_string());
        }
    }
    let text = match std::str::from_utf8(body) {
        Ok(t) => t,
        Err(e) => return Verdict::Malformed(format!("not UTF-8 text: {e}")),
    };
    let f = match FailureTableFile::parse(text) {
        Ok(f) => f,
        Err(e) => return Verdict::Malformed(e.to_string()),
    };
    match in_use {
        Some(v) if source != SourceKind::File && f.version <= v => Verdict::NotNewer { offered: f.version, in_use: v },
        Some(v) if source != SourceKind::File && f.version - v > MAX_VERSION_STEP => Verdict::Malformed(format!(
            "version {} is more than {MAX_VERSION_STEP} past the one in use ({v}); \
             to move to it, give it to --failure-table",
            f.version
        )),
        _ => Verdict::Apply(f.to_table(), Routes::new(&f.routes)),
    }
}

/// One source's statistics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SourceStats {
    /// Tables from it put in use.
    pub loads: u64,
    /// Tables from it refused: malformed, or (of these) [`Self::unverified`].
    pub rejected: u64,
    /// Of the refused, those without a signature that verifies.
    pub unverified: u64,
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
        w.counter("polycorn_failure_table_loads", "Failure-location tables put in use.", vec![], self.loads() as f64);
        w.counter(
            "polycorn_failure_table_rejected",
            "Failure-location tables refused (malformed, or unsigned with --failure-table-verify-key); the previous table stayed in use.",
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
            for (reason, n) in [("malformed", s.rejected - s.unverified), ("signature", s.unverified)] {
                let mut l = l();
                l.push(("reason".to_string(), reason.to_string()));
                w.counter(
                    "polycorn_failure_table_source_rejected",
                    "Failure-location tables refused, by source and reason: malformed (or under another Kafka key), \
                     signature (none, or none that --failure-table-verify-key verifies).",
                    l,
                    n as f64,
                );
            }
            w.counter(
                "polycorn_failure_table_source_not_newer",
                "Valid failure-location tables ignored because their version was not higher than the one in use, by source.",
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

/// The pure state: the version in use, the statistics, and the keys
/// tables must be signed with (none: unsigned tables are accepted).
#[derive(Debug, Default)]
pub struct Tables {
    stats: TableStats,
    verifier: Option<Verifier>,
}

impl Tables {
    /// Tables that must be signed by one of `verifier`'s keys.
    pub fn verified(verifier: Verifier) -> Tables {
        Tables { verifier: Some(verifier), ..Tables::default() }
    }

    /// Judge a table from `source` (with its signature, if it came with
    /// one) and count the verdict.
    pub fn offer(&mut self, source: SourceKind, body: &[u8], signature: Option<&[u8]>) -> Verdict {
        let v = judge(self.stats.version, source, body, signature, self.verifier.as_ref());
        let s = self.stats.sources.entry(source).or_default();
        match &v {
            Verdict::Apply(t, _) => {
                s.loads += 1;
                self.stats.version = Some(t.version());
                self.stats.entries = t.len() as u64;
            }
            Verdict::NotNewer { .. } => s.not_newer += 1,
            Verdict::Malformed(_) => s.rejected += 1,
            Verdict::BadSignature(_) => {
                s.rejected += 1;
                s.unverified += 1;
            }
        }
        v
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
}

impl Offered {
    /// Refused (malformed or unverified): the reason.
    pub fn refusal(&self) -> Option<&str> {
        match self {
            Offered::Malformed(e) | Offered::BadSignature(e) => Some(e),
            Offered::Applied(_) | Offered::NotNewer => None,
        }
    }
}

type Apply = Box<dyn Fn(FailureTable) + Send + Sync>;

/// The tables of one process, shared by its sources.
pub struct TableHub {
    tables: Mutex<Tables>,
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
    /// tables are accepted unsigned.
    pub fn build(
        routes: SharedRoutes,
        verifier: Option<Verifier>,
        apply: impl Fn(FailureTable) + Send + Sync + 'static,
    ) -> Arc<TableHub> {
        let tables = match verifier {
            Some(v) => {
                info!(
                    keys = v.keys(),
                    verify_key = v.origin(),
                    "failure-location tables must be signed by the trainer's key"
                );
                Tables::verified(v)
            }
            None => {
                warn!(
                    "no --failure-table-verify-key: failure-location tables are accepted unsigned, from anyone \
                     who can write the table's file, topic or API"
                );
                Tables::default()
            }
        };
        Arc::new(TableHub { tables: Mutex::new(tables), apply: Box::new(apply), routes })
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
        match tables.offer(source, body, signature) {
            Verdict::Apply(t, routes) => {
                let version = t.version();
                info!(
                    source = src,
                    origin,
                    version,
                    entries = t.len(),
                    routes = routes.len(),
                    "failure-location table in use"
                );
                self.routes.set(routes);
                (self.apply)(t);
                Offered::Applied(version)
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
        Ok(FileAndApi { file, api })
    }

    /// The sources' tasks, each running until `stop`: the caller spawns
    /// them where its other tasks run.
    pub fn tasks(
        self,
        stop: &tokio::sync::watch::Receiver<bool>,
    ) -> Vec<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> {
        let mut out: Vec<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> = Vec::new();
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

    /// A valid table file of `version` with `entries` entries.
    pub(crate) fn table(version: u64, entries: usize) -> String {
        let mut f = FailureTableFile::new(version, "test");
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

    #[test]
    fn a_network_source_cannot_jump_the_version_out_of_reach() {
        let poisoned = table(u64::MAX, 1);
        for source in [SourceKind::Http, SourceKind::Kafka] {
            let v = judge(Some(5), source, poisoned.as_bytes(), None, None);
            assert!(matches!(&v, Verdict::Malformed(e) if e.contains("more than 10000 past")), "{v:?}");
            assert_eq!(applied(judge(Some(5), source, table(5 + MAX_VERSION_STEP, 1).as_bytes(), None, None)), 10_005);
        }
        // The operator's file may move to any version.
        assert_eq!(applied(judge(Some(5), SourceKind::File, poisoned.as_bytes(), None, None)), u64::MAX);
        // Refused tables leave the one in use.
        let mut t = Tables::default();
        applied(t.offer(SourceKind::Kafka, table(5, 1).as_bytes(), None));
        assert!(matches!(t.offer(SourceKind::Kafka, poisoned.as_bytes(), None), Verdict::Malformed(_)));
        assert_eq!(applied(t.offer(SourceKind::Kafka, table(6, 1).as_bytes(), None)), 6);
        assert_eq!(t.stats().source(SourceKind::Kafka).rejected, 1);
    }

    fn applied(v: Verdict) -> u64 {
        match v {
            Verdict::Apply(t, _) => t.version(),
            other => panic!("expected a table to apply, got {other:?}"),
        }
    }

    #[test]
    fn only_a_newer_version_replaces_the_table_from_the_network_sources() {
        for src in [SourceKind::Http, SourceKind::Kafka] {
            assert_eq!(applied(judge(None, src, table(5, 1).as_bytes(), None, None)), 5, "the first table is used");
            assert_eq!(applied(judge(Some(4), src, table(5, 1).as_bytes(), None, None)), 5);
            assert!(matches!(
                judge(Some(5), src, table(5, 1).as_bytes(), None, None),
                Verdict::NotNewer { offered: 5, in_use: 5 }
            ));
            assert!(matches!(judge(Some(6), src, table(5, 1).as_bytes(), None, None), Verdict::NotNewer { .. }));
        }
    }

    #[test]
    fn the_file_may_replace_the_table_with_any_valid_version() {
        assert_eq!(applied(judge(Some(9), SourceKind::File, table(2, 1).as_bytes(), None, None)), 2);
        assert!(matches!(judge(Some(9), SourceKind::File, b"{", None, None), Verdict::Malformed(_)));
    }

    #[test]
    fn malformed_tables_are_refused_with_the_reason() {
        let Verdict::Malformed(why) = judge(None, SourceKind::Kafka, b"\xff\xfe", None, None) else { panic!() };
        assert!(why.contains("UTF-8"), "{why}");
        let Verdict::Malformed(why) = judge(None, SourceKind::Http, b"{\"format\":\"x\"}", None, None) else {
            panic!()
        };
        assert!(why.contains("not a failure-location table"), "{why}");
        let wrong = table(3, 1).replace("polycorn-failure-table/1", "other/9");
        let Verdict::Malformed(why) = judge(None, SourceKind::Http, wrong.as_bytes(), None, None) else { panic!() };
        assert!(why.contains("other/9"), "{why}");
    }

    #[test]
    fn the_statistics_count_each_verdict_per_source_and_keep_the_table_in_use() {
        let mut t = Tables::default();
        applied(t.offer(SourceKind::File, table(3, 2).as_bytes(), None));
        applied(t.offer(SourceKind::Kafka, table(4, 5).as_bytes(), None));
        assert!(matches!(t.offer(SourceKind::Kafka, b"garbage", None), Verdict::Malformed(_)));
        assert!(matches!(t.offer(SourceKind::Http, table(4, 1).as_bytes(), None), Verdict::NotNewer { .. }));
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
}
