//! `--failure-table FILE`: loaded at start (a problem is an error: a
//! configuration mistake must not go unnoticed) and re-read when its size
//! or mtime changes, or its signature's. A malformed new file is refused,
//! counted, and skipped until it changes again; any valid version replaces
//! the table. Its signature, when `--failure-table-verify-key` asks for one,
//! is the sidecar `FILE.sig` ([`super::signature::sidecar`]): write the
//! table, then its signature (a table checked in between is refused, and
//! taken once the signature follows).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tracing::warn;

use super::{Offered, SourceKind, TableHub};

/// How often the file is checked for changes.
pub const CHECK_EVERY: Duration = Duration::from_secs(2);

/// A file's mtime and size.
type Stamp = Option<(SystemTime, u64)>;

/// A failure-location table file, watched for changes (size or mtime).
#[derive(Debug)]
pub struct FileSource {
    path: PathBuf,
    /// `FILE.sig`.
    sig_path: PathBuf,
    /// Of the file and its signature.
    stamp: (Stamp, Stamp),
    hub: Arc<TableHub>,
}

fn stamp_of(path: &Path) -> Stamp {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// The signature file's content; `None` when there is none.
fn read_sig(sig_path: &Path) -> Result<Option<Vec<u8>>, std::io::Error> {
    match std::fs::read(sig_path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

impl FileSource {
    /// Load the file into `hub`; an unreadable, malformed or (with a verify
    /// key) unsigned file is an error naming it.
    pub fn open(path: &Path, hub: Arc<TableHub>) -> Result<FileSource, crate::Error> {
        let sig_path = super::signature::sidecar(path);
        let stamp = (stamp_of(path), stamp_of(&sig_path));
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| crate::Error::Io { what: "reading", path, source }
        };
        let body = std::fs::read(path).map_err(io(path))?;
        let sig = read_sig(&sig_path).map_err(io(&sig_path))?;
        let origin = path.display().to_string();
        if let Some(reason) = hub.offer(SourceKind::File, &origin, &body, sig.as_deref()).refusal() {
            return Err(crate::Error::TableRefused { origin, reason: reason.to_string() });
        }
        Ok(FileSource { path: path.to_path_buf(), sig_path, stamp, hub })
    }

    /// Re-read the file if it or its signature changed.
    pub fn check(&mut self) -> Option<Offered> {
        let stamp = (stamp_of(&self.path), stamp_of(&self.sig_path));
        if stamp.0.is_none() || stamp == self.stamp {
            return None;
        }
        self.stamp = stamp;
        let read = std::fs::read(&self.path).and_then(|body| Ok((body, read_sig(&self.sig_path)?)));
        match read {
            Ok((body, sig)) => {
                Some(self.hub.offer(SourceKind::File, &self.path.display().to_string(), &body, sig.as_deref()))
            }
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
        let e = FileSource::open(&p, TableHub::new(|_| {})).unwrap_err().to_string();
        assert!(e.contains("table.json"), "a bad file at start is an error naming it: {e}");
    }

    /// With a verify key the file needs its `.sig`: refused at start
    /// without it; later a table whose signature comes a moment after it is
    /// refused, then taken when the `.sig` changes; a forged `.sig` is
    /// refused and the table in use stays.
    #[test]
    fn with_a_verify_key_the_file_needs_its_signature_beside_it() {
        use crate::table::signature::tests::Signer;
        let (trainer, forger) = (Signer::new(1), Signer::new(2));
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("table.json");
        let sig = dir.path().join("table.json.sig");
        let hub = || TableHub::build(Default::default(), Some(trainer.verifier()), |_| {});
        std::fs::write(&p, table(1, 1)).unwrap();
        let e = FileSource::open(&p, hub()).unwrap_err().to_string();
        assert!(e.contains("table.json") && e.contains("not signed"), "{e}");
        std::fs::write(&sig, forger.sign(table(1, 1).as_bytes())).unwrap();
        assert!(FileSource::open(&p, hub()).unwrap_err().to_string().contains("does not verify"));

        std::fs::write(&sig, trainer.sign(table(1, 1).as_bytes())).unwrap();
        let hub = hub();
        let mut w = FileSource::open(&p, hub.clone()).unwrap();
        assert_eq!(hub.stats().version, Some(1));
        // The new table first, its signature a moment later.
        std::fs::write(&p, table(2, 3)).unwrap();
        assert!(matches!(w.check(), Some(Offered::BadSignature(_))));
        assert_eq!(hub.stats().version, Some(1), "the table in use stays");
        std::fs::write(&sig, format!("{}\n", String::from_utf8(trainer.sign(table(2, 3).as_bytes())).unwrap()))
            .unwrap();
        assert_eq!(w.check(), Some(Offered::Applied(2)), "taken when its signature arrives");
        std::fs::write(&sig, forger.sign(table(2, 3).as_bytes())).unwrap();
        assert!(matches!(w.check(), Some(Offered::BadSignature(_))));
        std::fs::remove_file(&sig).unwrap();
        std::fs::write(&p, table(3, 1)).unwrap();
        assert!(matches!(w.check(), Some(Offered::BadSignature(e)) if e.contains("not signed")));
        assert_eq!((hub.stats().version, hub.stats().source(SourceKind::File).unverified), (Some(2), 3));
    }
}
