//! `--failure-table FILE`: loaded at start (a problem is an error: a
//! configuration mistake must not go unnoticed) and re-read when its size
//! or mtime changes. A malformed new file is refused, counted, and skipped
//! until it changes again; any valid version replaces the table.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tracing::warn;

use super::{Offered, SourceKind, TableHub};

/// How often the file is checked for changes.
pub const CHECK_EVERY: Duration = Duration::from_secs(2);

/// A failure-location table file, watched for changes (size or mtime).
#[derive(Debug)]
pub struct FileSource {
    path: PathBuf,
    stamp: Option<(SystemTime, u64)>,
    hub: Arc<TableHub>,
}

fn stamp_of(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

impl FileSource {
    /// Load the file into `hub`; an unreadable or malformed file is an
    /// error naming it.
    pub fn open(path: &Path, hub: Arc<TableHub>) -> Result<FileSource, String> {
        let stamp = stamp_of(path);
        let body = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        let origin = path.display().to_string();
        if let Offered::Malformed(e) = hub.offer(SourceKind::File, &origin, &body) {
            return Err(format!("{origin}: {e}"));
        }
        Ok(FileSource { path: path.to_path_buf(), stamp, hub })
    }

    /// Re-read the file if it changed.
    pub fn check(&mut self) -> Option<Offered> {
        let stamp = stamp_of(&self.path);
        if stamp.is_none() || stamp == self.stamp {
            return None;
        }
        self.stamp = stamp;
        match std::fs::read(&self.path) {
            Ok(body) => Some(self.hub.offer(SourceKind::File, &self.path.display().to_string(), &body)),
            Err(e) => {
                // Vanished between the stat and the read: try again on the next change.
                warn!(path = %self.path.display(), error = %e, "failure-location table file unreadable");
                self.hub.source_error(SourceKind::File);
                None
            }
        }
    }

    /// Check every `every` until `stop`.
    pub async fn run(mut self, every: Duration, mut stop: watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stop.changed() => return,
            }
            self.check();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::tests::table;

    #[test]
    fn a_changed_file_is_reloaded_and_a_malformed_one_keeps_the_previous() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("table.json");
        std::fs::write(&p, table(1, 1)).unwrap();
        let hub = TableHub::new(|_| {});
        let mut w = FileSource::open(&p, hub.clone()).unwrap();
        assert_eq!(hub.stats().version, Some(1));
        assert!(w.check().is_none(), "unchanged");
        std::fs::write(&p, table(22, 2)).unwrap();
        assert_eq!(w.check(), Some(Offered::Applied(22)));
        std::fs::write(&p, "{ not a table").unwrap();
        assert!(matches!(w.check(), Some(Offered::Malformed(_))));
        assert!(w.check().is_none(), "a bad file is counted once, not on every check");
        assert_eq!(hub.stats().rejected(), 1);
        assert_eq!(hub.stats().version, Some(22), "the previous table stays");
        std::fs::write(&p, table(3, 1)).unwrap();
        assert_eq!(w.check(), Some(Offered::Applied(3)), "the file may go back to an older version");
        std::fs::write(&p, "garbage").unwrap();
        let e = FileSource::open(&p, TableHub::new(|_| {})).unwrap_err();
        assert!(e.contains("table.json"), "a bad file at start is an error naming it: {e}");
    }
}
