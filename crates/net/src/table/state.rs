//! `--failure-table-state-dir DIR`: the highest table a process has
//! accepted ([`Mark`]: its version and issue time), kept in `DIR/`[`FILE`]
//! so that a restarted proxy or relay still refuses tables older than
//! the ones it had already taken (a replay of an old signed table from the
//! topic, the API or a man in the middle). Written atomically (a temporary
//! file in `DIR`, synced, renamed over the old one, the directory synced)
//! each time the mark rises; read once at start.
//!
//! The marks are kept per signing key ([`Marks`]): a table binds the
//! process only while the key that signed it is trusted. Whoever holds a
//! leaked key can push its mark far ahead; once the key is taken out of
//! `--failure-table-verify-key`, that mark no longer counts and the
//! trainer's tables under the new key are taken again, without anyone
//! deleting the file. Unsigned tables (no verify key) and files written
//! before marks were kept per key have the unkeyed mark, which always counts.
//!
//! Without the file (first start, or a new volume) there is no mark: the
//! first valid, unexpired table is accepted, whatever its version, and its
//! mark is written. An unreadable or malformed file is an error at start,
//! not a silent reset: a reset would reopen the process to replays.

use std::collections::BTreeMap;
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

/// A signing key's identity in the state file: the first 8 bytes of its
/// Ed25519 public key (collisions among an operator's few keys are
/// negligible, and the file stays readable).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyId(pub [u8; 8]);

impl KeyId {
    pub fn of(public_key: &[u8; 32]) -> KeyId {
        let mut id = [0; 8];
        id.copy_from_slice(&public_key[..8]);
        KeyId(id)
    }
}

impl std::fmt::Display for KeyId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl std::str::FromStr for KeyId {
    type Err = String;

    fn from_str(s: &str) -> Result<KeyId, String> {
        let bad = || format!("key {s:?} is not 16 hex digits");
        if s.len() != 16 || !s.is_ascii() {
            return Err(bad());
        }
        let mut id = [0; 8];
        for (i, b) in id.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(KeyId(id))
    }
}

/// The highest mark accepted under each signing key (`None`: unsigned, or
/// from a file written before marks were kept per key).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Marks(BTreeMap<Option<KeyId>, Mark>);

impl Marks {
    /// Whether nothing was accepted yet.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The mark that binds while the keys `trusted` verify: the highest of
    /// theirs and the unkeyed one.
    pub fn binding(&self, trusted: impl Fn(&KeyId) -> bool) -> Option<Mark> {
        self.0.iter().filter(|(k, _)| k.as_ref().is_none_or(&trusted)).map(|(_, m)| *m).max()
    }

    /// Raise `key`'s mark to `mark`; true if it rose.
    pub fn raise(&mut self, key: Option<KeyId>, mark: Mark) -> bool {
        match self.0.get_mut(&key) {
            Some(m) if *m >= mark => false,
            Some(m) => {
                *m = mark;
                true
            }
            None => {
                self.0.insert(key, mark);
                true
            }
        }
    }

    /// Forget the marks of keys no longer `trusted` (revoked); what was forgotten.
    pub fn forget_untrusted(&mut self, trusted: impl Fn(&KeyId) -> bool) -> Vec<(KeyId, Mark)> {
        let gone: Vec<(KeyId, Mark)> =
            self.0.iter().filter_map(|(k, m)| k.filter(|k| !trusted(k)).map(|k| (k, *m))).collect();
        for (k, _) in &gone {
            self.0.remove(&Some(*k));
        }
        gone
    }

    pub fn iter(&self) -> impl Iterator<Item = (Option<KeyId>, Mark)> + '_ {
        self.0.iter().map(|(k, m)| (*k, *m))
    }
}

impl FromIterator<(Option<KeyId>, Mark)> for Marks {
    fn from_iter<I: IntoIterator<Item = (Option<KeyId>, Mark)>>(it: I) -> Marks {
        Marks(it.into_iter().collect())
    }
}

/// The state file of one process.
#[derive(Debug, Clone)]
pub struct StateFile {
    path: PathBuf,
}

impl StateFile {
    /// The state file in `dir` (created if missing) and the marks it holds
    /// (none: no file yet).
    pub fn open(dir: &Path) -> Result<(StateFile, Marks), Error> {
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            what: "creating --failure-table-state-dir",
            path: dir.to_path_buf(),
            source,
        })?;
        let path = dir.join(FILE);
        let marks = match std::fs::read_to_string(&path) {
            Ok(text) => parse(&text).map_err(|reason| {
                Error::option(
                    "--failure-table-state-dir",
                    format!("{}: {reason} (remove it only if you accept tables of any version again)", path.display()),
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Marks::default(),
            Err(source) => return Err(Error::Io { what: "reading failure-table state", path, source }),
        };
        Ok((StateFile { path }, marks))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Replace the file with `marks`, atomically: a line per key,
    /// `key=<id> version=<n> issued_unix_s=<t>` (`key=none` unkeyed).
    pub fn store(&self, marks: &Marks) -> std::io::Result<()> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let tmp = dir.join(format!(".{FILE}.tmp"));
        {
            let mut f = std::fs::File::create(&tmp)?;
            let mut text = String::new();
            for (key, m) in marks.iter() {
                let key = key.map_or_else(|| "none".to_string(), |k| k.to_string());
                text += &format!("key={key} version={} issued_unix_s={}\n", m.version, m.issued_unix_s);
            }
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &self.path)?;
        std::fs::File::open(dir)?.sync_all()
    }
}

/// The marks of a state file: lines of `key=<id|none> version=<n>
/// issued_unix_s=<t>`, or the unkeyed form of older files (`version=<n>`
/// and `issued_unix_s=<t>` on lines of their own).
fn parse(text: &str) -> Result<Marks, String> {
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    if !lines.iter().any(|l| l.starts_with("key=")) {
        return parse_fields(&lines).map(|m| [(None, m)].into_iter().collect());
    }
    let mut marks = BTreeMap::new();
    for line in lines {
        let mut fields: Vec<&str> = line.split_whitespace().collect();
        let key = match fields.first().and_then(|f| f.strip_prefix("key=")) {
            Some("none") => None,
            Some(id) => Some(id.parse::<KeyId>()?),
            None => return Err(format!("line {line:?} does not start with key=")),
        };
        fields.remove(0);
        if marks.insert(key, parse_fields(&fields)?).is_some() {
            return Err(format!("line {line:?}: a second mark for the same key"));
        }
    }
    Ok(Marks(marks))
}

fn parse_fields(fields: &[&str]) -> Result<Mark, String> {
    let (mut version, mut issued) = (None, None);
    for field in fields {
        let (k, v) = field.split_once('=').ok_or_else(|| format!("{field:?} is not key=value"))?;
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
    fn the_marks_round_trip_per_key_and_a_damaged_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("state");
        let (f, marks) = StateFile::open(&sub).unwrap();
        assert!(marks.is_empty(), "first start: no mark");
        let (a, b) = (KeyId([1; 8]), KeyId([0xab; 8]));
        let mut m = Marks::default();
        assert!(m.raise(Some(a), Mark { version: 7, issued_unix_s: 1_800_000_000 }));
        assert!(m.raise(Some(b), Mark { version: 9, issued_unix_s: 1_800_000_100 }));
        assert!(!m.raise(Some(b), Mark { version: 8, issued_unix_s: 1_800_000_200 }), "lower: no rise");
        f.store(&m).unwrap();
        let (_, back) = StateFile::open(&sub).unwrap();
        assert_eq!(back, m);
        assert_eq!(std::fs::read_dir(&sub).unwrap().count(), 1, "no temporary file left behind");
        assert_eq!(back.binding(|_| true), Some(Mark { version: 9, issued_unix_s: 1_800_000_100 }));
        assert_eq!(back.binding(|k| *k == a), Some(Mark { version: 7, issued_unix_s: 1_800_000_000 }));
        assert_eq!(back.binding(|_| false), None, "no trusted key: nothing binds");

        // A file from before marks were kept per key: its mark is unkeyed
        // and binds whatever the keys.
        std::fs::write(sub.join(FILE), "version=5\nissued_unix_s=1800000000\n").unwrap();
        let (_, old) = StateFile::open(&sub).unwrap();
        assert_eq!(old.binding(|_| false), Some(Mark { version: 5, issued_unix_s: 1_800_000_000 }));

        for bad in ["version=x\n", "key=zz version=1 issued_unix_s=2\n", "key=none version=1\n"] {
            std::fs::write(sub.join(FILE), bad).unwrap();
            let e = StateFile::open(&sub).unwrap_err().to_string();
            assert!(e.contains("--failure-table-state-dir") && e.contains(FILE), "{bad:?}: {e}");
        }
        assert!(Mark { version: 2, issued_unix_s: 0 } > Mark { version: 1, issued_unix_s: 9 });
    }
}
