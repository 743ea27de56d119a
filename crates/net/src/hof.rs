//! Handover-failure prediction inputs in the shells (POLYCORN §3, §4.3):
//! the failure-location table file, loaded at start and hot-reloaded when
//! it changes (a malformed new file is refused and the previous table
//! kept), and train positions from telemetry records.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use polycorn_core::sched::{FailureTable, TrainState, TrainTracker};
use polycorn_telemetry::failure_table::FailureTableFile;
use polycorn_telemetry::v1;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::metrics::Writer;

/// What the table watcher did, for metrics.
#[derive(Debug, Default)]
pub struct TableStats {
    version: AtomicU64,
    entries: AtomicU64,
    loads: AtomicU64,
    rejected: AtomicU64,
}

impl TableStats {
    fn loaded(&self, t: &FailureTable) {
        self.version.store(t.version(), Ordering::Relaxed);
        self.entries.store(t.len() as u64, Ordering::Relaxed);
        self.loads.fetch_add(1, Ordering::Relaxed);
    }

    pub fn write(&self, w: &mut Writer) {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        w.gauge(
            "polycorn_failure_table_version",
            "Version of the failure-location table in use.",
            vec![],
            g(&self.version),
        );
        w.gauge("polycorn_failure_table_entries", "Failure locations in the table in use.", vec![], g(&self.entries));
        w.counter("polycorn_failure_table_loads", "Failure-location tables loaded.", vec![], g(&self.loads));
        w.counter(
            "polycorn_failure_table_rejected",
            "Failure-location table files refused (malformed); the previous table stayed in use.",
            vec![],
            g(&self.rejected),
        );
    }
}

/// A failure-location table file, watched for changes (size or mtime).
#[derive(Debug)]
pub struct TableWatch {
    path: PathBuf,
    stamp: Option<(SystemTime, u64)>,
    pub stats: Arc<TableStats>,
}

fn read_table(path: &Path) -> Result<FailureTable, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let f = FailureTableFile::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(f.to_table())
}

fn stamp_of(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

impl TableWatch {
    /// Load the table at start; any problem is an error (a configuration
    /// mistake must not go unnoticed).
    pub fn open(path: &Path) -> Result<(TableWatch, FailureTable), String> {
        let stamp = stamp_of(path);
        let t = read_table(path)?;
        let w = TableWatch { path: path.to_path_buf(), stamp, stats: Arc::default() };
        w.stats.loaded(&t);
        info!(path = %path.display(), version = t.version(), entries = t.len(), "failure-location table loaded");
        Ok((w, t))
    }

    /// A new table if the file changed and parses; otherwise `None` (a bad
    /// file is logged, counted and skipped until it changes again).
    pub fn poll(&mut self) -> Option<FailureTable> {
        let stamp = stamp_of(&self.path);
        if stamp.is_none() || stamp == self.stamp {
            return None;
        }
        self.stamp = stamp;
        match read_table(&self.path) {
            Ok(t) => {
                self.stats.loaded(&t);
                info!(path = %self.path.display(), version = t.version(), entries = t.len(), "failure-location table reloaded");
                Some(t)
            }
            Err(e) => {
                self.stats.rejected.fetch_add(1, Ordering::Relaxed);
                warn!(error = %e, "new failure-location table refused; keeping the previous one");
                None
            }
        }
    }

    /// Poll every `every` until `stop`, handing each new table to `apply`.
    pub async fn run(mut self, every: Duration, apply: impl Fn(FailureTable), mut stop: watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stop.changed() => return,
            }
            if let Some(t) = self.poll() {
                apply(t);
            }
        }
    }
}

/// Current Unix time in ms.
pub fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// The instant (on this host's monotonic clock) a record stamped
/// `time_unix_ms` by the train was measured: now minus its age, the age
/// clamped to [0, 10 s] so a train clock that is off cannot push it far.
pub fn measured_at(time_unix_ms: i64, now: Instant, now_unix: SystemTime) -> Instant {
    let age_ms = (unix_ms(now_unix) - time_unix_ms).clamp(0, 10_000) as u64;
    now.checked_sub(Duration::from_millis(age_ms)).unwrap_or(now)
}

/// The train state a telemetry record implies, if it is a GPS fix with a
/// track position.
pub fn train_state_of(
    record: &v1::Record,
    tracker: &mut TrainTracker,
    now: Instant,
    now_unix: SystemTime,
) -> Option<TrainState> {
    let Some(v1::record::Body::Gps(fix)) = &record.body else { return None };
    let track = fix.track_m?;
    tracker.update(measured_at(record.time_unix_ms, now, now_unix), track, Some(fix.speed_mps))
}

#[cfg(test)]
mod tests {
    use super::*;
    use polycorn_core::sched::TrackDirection;
    use polycorn_telemetry::failure_table::{Direction, Entry};

    fn table(version: u64) -> String {
        let mut f = FailureTableFile::new(version, "test");
        f.entries.push(Entry {
            cell: 9,
            direction: Direction::Increasing,
            position_m: 100.0,
            failures: None,
            handovers: None,
        });
        f.to_json()
    }

    #[test]
    fn a_changed_table_is_reloaded_and_a_malformed_one_keeps_the_previous() {
        let dir = std::env::temp_dir().join(format!("polycorn-hof-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("table.json");
        std::fs::write(&p, table(1)).unwrap();
        let (mut w, t) = TableWatch::open(&p).unwrap();
        assert_eq!(t.version(), 1);
        assert!(w.poll().is_none(), "unchanged");
        std::fs::write(&p, table(22)).unwrap();
        assert_eq!(w.poll().map(|t| t.version()), Some(22));
        std::fs::write(&p, "{ not a table").unwrap();
        assert!(w.poll().is_none());
        assert_eq!(w.stats.rejected.load(Ordering::Relaxed), 1);
        assert_eq!(w.stats.version.load(Ordering::Relaxed), 22, "the previous table stays");
        std::fs::write(&p, "garbage").unwrap();
        assert!(TableWatch::open(&p).unwrap_err().contains("table.json"), "a bad file at start is an error naming it");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn gps_records_become_train_states_measured_when_the_train_says() {
        let now = Instant::now();
        let now_unix = SystemTime::now();
        let mut tr = TrainTracker::new();
        let rec = |t: i64, track: Option<f64>| v1::Record {
            train_id: "t".into(),
            time_unix_ms: t,
            body: Some(v1::record::Body::Gps(v1::GpsFix { speed_mps: 80.0, track_m: track, ..Default::default() })),
        };
        let s = train_state_of(&rec(unix_ms(now_unix) - 300, Some(500.0)), &mut tr, now, now_unix).unwrap();
        assert_eq!(now - s.at, Duration::from_millis(300));
        assert_eq!((s.position_m, s.speed_mps, s.direction), (500.0, 80.0, TrackDirection::Increasing));
        assert!(train_state_of(&rec(0, None), &mut tr, now, now_unix).is_none(), "no track position");
        let far_future = unix_ms(now_unix) + 60_000;
        let s = train_state_of(&rec(far_future, Some(600.0)), &mut tr, now, now_unix).unwrap();
        assert_eq!(s.at, now, "a train clock ahead does not date fixes in the future");
    }
}
