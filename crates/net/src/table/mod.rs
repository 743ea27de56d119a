//! Failure-location tables from their sources (POLYCORN §4.3; the trainer
//! contract, issue 6): a file (`--failure-table`), the LinkDB API
//! (`--failure-table-url`, [`http`]) and, in the proxy, the trainer's
//! compacted Kafka topic (`--failure-table-topic`, the proxy's
//! `table_topic` module). Several may run at once.
//!
//! - [`judge`] is the pure rule every source obeys: a table that does not
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

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use polycorn_core::sched::FailureTable;
use polycorn_telemetry::failure_table::FailureTableFile;
use polycorn_telemetry::route_match::Routes;
use tracing::{debug, info, warn};

use crate::hof::SharedRoutes;
use crate::metrics::{Source, Writer};

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
}

/// The most a table from the network (API, Kafka) may move the version past
/// the one in use; the trainer adds 1 per table it publishes. A larger jump
/// is refused as malformed: a faulty or hostile producer's, or a LinkDB
/// restored from elsewhere, which an operator confirms by putting that
/// table into `--failure-table` (the file may set any version).
pub const MAX_VERSION_STEP: u64 = 10_000;

/// The rule: parse `body`; use it if it is the first table, comes from the
/// file, or is newer than the table in use (`in_use`, its version) by at
/// most [`MAX_VERSION_STEP`].
pub fn judge(in_use: Option<u64>, source: SourceKind, body: &[u8]) -> Verdict {
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
    /// Malformed tables from it refused.
    pub rejected: u64,
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
            "Failure-location tables refused as malformed; the previous table stayed in use.",
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
            w.counter(
                "polycorn_failure_table_source_rejected",
                "Malformed failure-location tables refused, by source.",
                l(),
                s.rejected as f64,
            );
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

/// The pure state: the version in use and the statistics.
#[derive(Debug, Default)]
pub struct Tables {
    stats: TableStats,
}

impl Tables {
    /// Judge a table from `source` and count the verdict.
    pub fn offer(&mut self, source: SourceKind, body: &[u8]) -> Verdict {
        let v = judge(self.stats.version, source, body);
        let s = self.stats.sources.entry(source).or_default();
        match &v {
            Verdict::Apply(t, _) => {
                s.loads += 1;
                self.stats.version = Some(t.version());
                self.stats.entries = t.len() as u64;
            }
            Verdict::NotNewer { .. } => s.not_newer += 1,
            Verdict::Malformed(_) => s.rejected += 1,
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
    pub fn new(apply: impl Fn(FailureTable) + Send + Sync + 'static) -> Arc<TableHub> {
        Self::with_routes(SharedRoutes::default(), apply)
    }

    /// A hub that puts each applied table's route lines into `routes`.
    pub fn with_routes(routes: SharedRoutes, apply: impl Fn(FailureTable) + Send + Sync + 'static) -> Arc<TableHub> {
        Arc::new(TableHub { tables: Mutex::default(), apply: Box::new(apply), routes })
    }

    /// The route lines of the table in use.
    pub fn routes(&self) -> SharedRoutes {
        self.routes.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A table `source` delivered (`origin`: the file, URL or topic
    /// position, for the log): judged, logged, counted, and put in use if
    /// the rule says so.
    pub fn offer(&self, source: SourceKind, origin: &str, body: &[u8]) -> Offered {
        let mut tables = self.lock();
        let src = source.label();
        match tables.offer(source, body) {
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
            let v = judge(Some(5), source, poisoned.as_bytes());
            assert!(matches!(&v, Verdict::Malformed(e) if e.contains("more than 10000 past")), "{v:?}");
            assert_eq!(applied(judge(Some(5), source, table(5 + MAX_VERSION_STEP, 1).as_bytes())), 10_005);
        }
        // The operator's file may move to any version.
        assert_eq!(applied(judge(Some(5), SourceKind::File, poisoned.as_bytes())), u64::MAX);
        // Refused tables leave the one in use.
        let mut t = Tables::default();
        applied(t.offer(SourceKind::Kafka, table(5, 1).as_bytes()));
        assert!(matches!(t.offer(SourceKind::Kafka, poisoned.as_bytes()), Verdict::Malformed(_)));
        assert_eq!(applied(t.offer(SourceKind::Kafka, table(6, 1).as_bytes())), 6);
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
            assert_eq!(applied(judge(None, src, table(5, 1).as_bytes())), 5, "the first table is used");
            assert_eq!(applied(judge(Some(4), src, table(5, 1).as_bytes())), 5);
            assert!(matches!(judge(Some(5), src, table(5, 1).as_bytes()), Verdict::NotNewer { offered: 5, in_use: 5 }));
            assert!(matches!(judge(Some(6), src, table(5, 1).as_bytes()), Verdict::NotNewer { .. }));
        }
    }

    #[test]
    fn the_file_may_replace_the_table_with_any_valid_version() {
        assert_eq!(applied(judge(Some(9), SourceKind::File, table(2, 1).as_bytes())), 2);
        assert!(matches!(judge(Some(9), SourceKind::File, b"{"), Verdict::Malformed(_)));
    }

    #[test]
    fn malformed_tables_are_refused_with_the_reason() {
        let Verdict::Malformed(why) = judge(None, SourceKind::Kafka, b"\xff\xfe") else { panic!() };
        assert!(why.contains("UTF-8"), "{why}");
        let Verdict::Malformed(why) = judge(None, SourceKind::Http, b"{\"format\":\"x\"}") else { panic!() };
        assert!(why.contains("not a failure-location table"), "{why}");
        let wrong = table(3, 1).replace("polycorn-failure-table/1", "other/9");
        let Verdict::Malformed(why) = judge(None, SourceKind::Http, wrong.as_bytes()) else { panic!() };
        assert!(why.contains("other/9"), "{why}");
    }

    #[test]
    fn the_statistics_count_each_verdict_per_source_and_keep_the_table_in_use() {
        let mut t = Tables::default();
        applied(t.offer(SourceKind::File, table(3, 2).as_bytes()));
        applied(t.offer(SourceKind::Kafka, table(4, 5).as_bytes()));
        assert!(matches!(t.offer(SourceKind::Kafka, b"garbage"), Verdict::Malformed(_)));
        assert!(matches!(t.offer(SourceKind::Http, table(4, 1).as_bytes()), Verdict::NotNewer { .. }));
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
        assert_eq!(hub.offer(SourceKind::Kafka, "t:0", table(1, 1).as_bytes()), Offered::Applied(1));
        assert!(matches!(hub.offer(SourceKind::Kafka, "t:1", b"nope"), Offered::Malformed(_)));
        assert_eq!(hub.offer(SourceKind::Http, "u", table(2, 1).as_bytes()), Offered::Applied(2));
        assert_eq!(hub.offer(SourceKind::Kafka, "t:2", table(1, 1).as_bytes()), Offered::NotNewer);
        assert_eq!(*seen.lock().unwrap(), vec![1, 2]);

        let text = crate::metrics::tests::encode(vec![hub.metrics()]);
        for line in [
            // scripts/integration-hsr.sh greps these exact forms.
            "polycorn_failure_table_version{} 2.0",
            "polycorn_failure_table_loads_total{} 2.0",
            "polycorn_failure_table_rejected_total{} 1.0",
            "polycorn_failure_table_source_loads_total{source=\"kafka\"} 1.0",
            "polycorn_failure_table_source_loads_total{source=\"http\"} 1.0",
            "polycorn_failure_table_source_rejected_total{source=\"kafka\"} 1.0",
            "polycorn_failure_table_source_not_newer_total{source=\"kafka\"} 1.0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} missing in\n{text}");
        }
    }
}
