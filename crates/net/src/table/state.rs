//! `--failure-table-state-dir DIR`: the highest table a process has
//! accepted ([`Mark`]: its version and issue time), kept in `DIR/`[`FILE`]
//! so that a restarted proxy or relay still refuses tables older than
//! the ones it had already taken (a replay of an old signed table from the
//! topic, the API or a man in the middle). Written atomically (a temporary
//! file in `DIR`, synced, renamed over the old one, the directory synced)
//! each time the mark rises; read once at start.
//!
//! Without the file (first start, or a new volume) there is no mark: the
//! first valid, unexpired table is accepted, whatever its version, and its
//! mark is written. An unreadable or malformed file is an error at start,
//! not a silent reset: a reset would reopen the process to replays.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::Error;

/// The state file's name in `--failure-table-state-dir`.
pub const FILE: &str = "failure-table.state";

/// The highest table accepted: ordered by version, then issue time (the
/// trainer re-issues an unchanged table under the same version with a later
/// issue time, so that it does not expire).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Mark {
    pub version: u64,
    /// 0 for a table without `issued_unix_s` (unsigned tables may lack it).
    pub issued_unix_s: u64,
}

/// The state file of one process.
#[derive(Debug, Clone)]
pub struct StateFile {
    path: PathBuf,
}

impl StateFile {
    /// The state file in `dir` (created if missing) and the mark it holds
    /// (`None`: no file yet).
    pub fn open(dir: &Path) -> Result<(StateFile, Option<Mark>), Error> {
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            what: "creating --failure-table-state-dir",
            path: dir.to_path_buf(),
            source,
        })?;
        let path = dir.join(FILE);
        let mark = match std::fs::read_to_string(&path) {
            Ok(text) => Some(parse(&text).map_err(|reason| {
                Error::option(
                    "--failure-table-state-dir",
                    format!("{}: {reason} (remove it only if you accept tables of any version again)", path.display()),
                )
            })?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => return Err(Error::Io { what: "reading failure-table state", path, source }),
        };
        Ok((StateFile { path }, mark))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Replace the file with `mark`, atomically.
    pub fn store(&self, mark: Mark) -> std::io::Result<()> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let tmp = dir.join(format!(".{FILE}.tmp"));
        {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(format!("version={}\nissued_unix_s={}\n", mark.version, mark.issued_unix_s).as_bytes())?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &self.path)?;
        std::fs::File::open(dir)?.sync_all()
    }
}

fn parse(text: &str) -> Result<Mark, String> {
    let (mut version, mut issued) = (None, None);
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (k, v) = line.split_once('=').ok_or_else(|| format!("line {line:?} is not key=value"))?;
        let n: u64 = v.trim().parse().map_err(|_| format!("{k}: {v:?} is not a whole number"))?;
        match k.trim() {
            "version" => version = Some(n),
            "issued_unix_s" => issued = Some(n),
            other => return Err(format!("unknown key {other:?}")),
        }
    }
    match (version, issued) {
        (Some(version), Some(issued_unix_s)) => Ok(Mark { version, issued_unix_s }),
        _ => Err("needs version= and issued_unix_s=".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_round_trips_and_a_damaged_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("state");
        let (f, mark) = StateFile::open(&sub).unwrap();
        assert_eq!(mark, None, "first start: no mark");
        f.store(Mark { version: 7, issued_unix_s: 1_800_000_000 }).unwrap();
        f.store(Mark { version: 9, issued_unix_s: 1_800_000_100 }).unwrap();
        let (_, mark) = StateFile::open(&sub).unwrap();
        assert_eq!(mark, Some(Mark { version: 9, issued_unix_s: 1_800_000_100 }));
        assert_eq!(std::fs::read_dir(&sub).unwrap().count(), 1, "no temporary file left behind");
        std::fs::write(sub.join(FILE), "version=x\n").unwrap();
        let e = StateFile::open(&sub).unwrap_err().to_string();
        assert!(e.contains("--failure-table-state-dir") && e.contains(FILE), "{e}");
        assert!(Mark { version: 2, issued_unix_s: 0 } > Mark { version: 1, issued_unix_s: 9 });
    }
}
