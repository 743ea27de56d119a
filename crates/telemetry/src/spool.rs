//! The relay-agent's durable telemetry spool (`docs/telemetry.md`).
//!
//! Every record gets a sequence number that only ever grows, across
//! restarts, and stays on disk until the proxy confirms that Kafka has it
//! ([`Spool::ack`]). The spool does file IO but no networking and reads no
//! clock: [`Spool::next_to_send`] takes `now`, so resend timing is tested in
//! virtual time.
//!
//! # On disk
//!
//! One directory holds:
//!
//! - `handover-<first seq>.seg` and `sample-<first seq>.seg`: append-only
//!   segment logs, one per priority class. A frame is
//!   `len: u32 LE | crc32: u32 LE | seq: u64 LE | payload (len bytes)`, the
//!   CRC-32 (IEEE) over `seq` and `payload`. Seqs grow within a segment.
//! - `acks.log`: append-only entries `kind: u8 | seq: u64 LE | crc32: u32 LE`
//!   (CRC over kind and seq); kind 1 acknowledges one record, kind 2 says
//!   "seqs up to here were used" (written when a segment is deleted, so a
//!   restart never reuses a seq). It is rewritten (compacted, through a
//!   temporary file and a rename) at open and when it grows large.
//!
//! A segment is deleted when every record in it is acknowledged and it no
//! longer takes appends (sealed, or found so at open). On open a
//! torn or corrupt frame ends its file: the file is truncated there (a crash
//! mid-write leaves at most one torn frame at a tail).
//!
//! # Bound and drop policy
//!
//! Segment bytes never exceed `max_bytes`. An append that would pass the
//! bound first deletes whole segments, the oldest **sample** segment first
//! (GPS fixes, cell samples, path statistics; a fresher sample replaces an
//! old one's value for the fleet), and a **handover** segment only when no
//! sample segment is left. A sample that still does not fit while only
//! handover segments remain is itself dropped. Every record dropped unacked
//! is counted per class ([`SpoolStats::dropped`]).
//!
//! # Durability
//!
//! Writes go straight to the files (no user-space buffer) but are not
//! fsynced by [`Spool::append`]; [`Spool::sync`] fsyncs the files written
//! since the last call (and the directory when files were created or
//! deleted). The relay calls it after every handover event and at least
//! every second, so a power cut loses at most the last second of samples
//! and no handover event; a lost acknowledgement only makes a record go
//! out again (receivers dedup by `(train, seq)`).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The largest record the spool takes, bytes: what one `TELEMETRY` frame
/// carries.
pub const MAX_RECORD_BYTES: usize = polycorn_core::wire::MAX_TELEMETRY_PAYLOAD;
/// The largest record a spool file may hold: versions before 2026-11-27 took
/// records up to 1 MiB; such a record is read (not taken for a torn tail),
/// and the relay drops it when it comes up for sending.
const MAX_STORED_RECORD_BYTES: usize = 1 << 20;
const FRAME_HEADER: u64 = 16;
const ACK_ENTRY: usize = 13;
const KIND_ACK: u8 = 1;
const KIND_HIGH_WATER: u8 = 2;
const ACK_LOG: &str = "acks.log";

/// A record's priority class: what is sent first and dropped last.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    /// Handover events: sent first, dropped only when no sample is left.
    Handover = 0,
    /// GPS fixes, cell samples, path statistics: dropped oldest first.
    Sample = 1,
}

impl Class {
    pub const ALL: [Class; 2] = [Class::Handover, Class::Sample];
    /// The name in file names and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            Class::Handover => "handover",
            Class::Sample => "sample",
        }
    }
    fn from_name(s: &str) -> Option<Class> {
        Class::ALL.into_iter().find(|c| c.name() == s)
    }
}

/// Spool limits and timers.
#[derive(Clone, Debug)]
pub struct SpoolConfig {
    /// Upper bound on segment bytes on disk.
    pub max_bytes: u64,
    /// A segment is sealed once it reaches this size (drops and deletions
    /// work on whole segments, so this is their granularity).
    pub segment_bytes: u64,
    /// A record sent and not acknowledged this long is sent again.
    pub resend_after: Duration,
    /// At most this many records sent and not yet acknowledged (and not yet
    /// due for resending) at once.
    pub max_in_flight: usize,
}

impl SpoolConfig {
    /// Defaults for a spool of `max_bytes`: segments of a sixteenth of it
    /// (4 KiB to 1 MiB), resend after 5 s, 256 records in flight.
    pub fn with_max_bytes(max_bytes: u64) -> SpoolConfig {
        SpoolConfig {
            max_bytes,
            segment_bytes: (max_bytes / 16).clamp(4096, 1 << 20),
            resend_after: Duration::from_secs(5),
            max_in_flight: 256,
        }
    }
}

/// Why the spool could not do something.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("telemetry spool {dir}: {op}: {source}")]
    Io {
        dir: PathBuf,
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("telemetry spool {0} is in use by another process (one relay-agent per spool directory: give each its own --telemetry-spool)")]
    Locked(PathBuf),
    #[error("telemetry record of {0} bytes is larger than the spool takes ({MAX_RECORD_BYTES} bytes, or --telemetry-spool-max-bytes)")]
    TooLarge(usize),
}

/// Counters and sizes, for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpoolStats {
    /// Records held and not yet acknowledged.
    pub records: u64,
    /// Segment bytes on disk.
    pub bytes: u64,
    /// Records dropped unacknowledged by the size bound, per [`Class`] index.
    pub dropped: [u64; 2],
    /// Records acknowledged (this process).
    pub acked: u64,
    /// Records sent again after a timeout or a path coming up (this process).
    pub resent: u64,
    /// Records sent and awaiting their acknowledgement.
    pub in_flight: u64,
    /// Bytes cut off torn or corrupt file tails when the spool was opened.
    pub truncated_bytes: u64,
    /// The seq the next record gets.
    pub next_seq: u64,
}

/// Pending fsyncs, taken from a [`Spool`] by [`Spool::sync_work`].
#[derive(Debug)]
pub struct SyncWork {
    spool_dir: PathBuf,
    files: Vec<File>,
    dir: Option<PathBuf>,
}

impl SyncWork {
    /// Fsync the files, then the directory if files were created or deleted.
    pub fn run(self) -> Result<(), SpoolError> {
        let err = |op| {
            let dir = self.spool_dir.clone();
            move |source| SpoolError::Io { dir, op, source }
        };
        for f in &self.files {
            f.sync_data().map_err(err("fsync"))?;
        }
        if let Some(d) = &self.dir {
            File::open(d).and_then(|d| d.sync_all()).map_err(err("syncing the directory"))?;
        }
        Ok(())
    }
}

/// A record to send now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    pub seq: u64,
    pub class: Class,
    pub payload: Vec<u8>,
}

struct Segment {
    first_seq: u64,
    path: PathBuf,
    file: File,
    bytes: u64,
    /// Every seq stored in it.
    seqs: Vec<u64>,
    /// How many of them are not acknowledged.
    live: usize,
    dirty: bool,
}

struct Pending {
    class: Class,
    segment: u64,
    offset: u64,
    len: u32,
    /// When it is due again, if it was sent.
    deadline: Option<Instant>,
    /// When it was first sent (this process).
    first_sent: Option<Instant>,
    sends: u32,
}

/// The spool. See the module documentation.
pub struct Spool {
    dir: PathBuf,
    cfg: SpoolConfig,
    next_seq: u64,
    /// Segments per class, oldest first; the last may take appends.
    segments: [VecDeque<Segment>; 2],
    /// Whether the last segment of each class still takes appends.
    open_tail: [bool; 2],
    pending: BTreeMap<u64, Pending>,
    unsent: [BTreeSet<u64>; 2],
    sent: BTreeSet<(Instant, u64)>,
    acks: File,
    ack_entries: u64,
    acks_dirty: bool,
    dir_dirty: bool,
    stats: SpoolStats,
    /// Holds the directory's exclusive lock while the spool is open.
    _lock: File,
    /// Why compacting acks.log at open failed (the spool works without it).
    open_warning: Option<String>,
}

/// Take an exclusive, non-blocking `flock` on `dir/lock` (rustix's safe
/// wrapper): two relay-agents appending to one spool would corrupt it.
fn lock_dir(dir: &Path) -> Result<File, SpoolError> {
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("lock"))
        .map_err(|source| SpoolError::Io { dir: dir.to_path_buf(), op: "opening the lock file", source })?;
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(f),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(SpoolError::Locked(dir.to_path_buf())),
        Err(e) => Err(SpoolError::Io { dir: dir.to_path_buf(), op: "locking the directory", source: e.into() }),
    }
}

fn crc(parts: &[&[u8]]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    for p in parts {
        h.update(p);
    }
    h.finalize()
}

fn ack_entry(kind: u8, seq: u64) -> [u8; ACK_ENTRY] {
    let mut e = [0u8; ACK_ENTRY];
    e[0] = kind;
    e[1..9].copy_from_slice(&seq.to_le_bytes());
    let c = crc(&[&e[..9]]);
    e[9..].copy_from_slice(&c.to_le_bytes());
    e
}

fn segment_name(class: Class, first_seq: u64) -> String {
    format!("{}-{first_seq:020}.seg", class.name())
}

/// Parse the frames of a segment file's contents; returns the records
/// (seq, offset of the payload, length) and where the valid part ends.
fn scan_segment(data: &[u8]) -> (Vec<(u64, u64, u32)>, usize) {
    let mut out = Vec::new();
    let mut at = 0usize;
    let mut last = None;
    while data.len() - at >= FRAME_HEADER as usize {
        let len = u32::from_le_bytes(data[at..at + 4].try_into().expect("4 bytes")) as usize;
        let want = u32::from_le_bytes(data[at + 4..at + 8].try_into().expect("4 bytes"));
        let seq_bytes = &data[at + 8..at + 16];
        let seq = u64::from_le_bytes(seq_bytes.try_into().expect("8 bytes"));
        let start = at + FRAME_HEADER as usize;
        if len > MAX_STORED_RECORD_BYTES || data.len() - start < len {
            break;
        }
        let payload = &data[start..start + len];
        if crc(&[seq_bytes, payload]) != want || last.is_some_and(|l| seq <= l) {
            break;
        }
        out.push((seq, start as u64, len as u32));
        last = Some(seq);
        at = start + len;
    }
    (out, at)
}

impl Spool {
    /// Open (or create) the spool in `dir`, recovering what a previous run
    /// left: unacknowledged records are sent again, torn tails truncated.
    pub fn open(dir: &Path, cfg: SpoolConfig) -> Result<Spool, SpoolError> {
        let io_err = |op: &'static str| {
            let dir = dir.to_path_buf();
            move |source| SpoolError::Io { dir: dir.clone(), op, source }
        };
        fs::create_dir_all(dir).map_err(io_err("creating the directory"))?;
        let lock = lock_dir(dir)?;
        let mut stats = SpoolStats::default();

        // The acknowledgement log.
        let ack_path = dir.join(ACK_LOG);
        let mut acked = BTreeSet::new();
        let mut high_water = 0u64;
        if let Ok(mut f) = OpenOptions::new().read(true).write(true).open(&ack_path) {
            let mut data = Vec::new();
            f.read_to_end(&mut data).map_err(io_err("reading acks.log"))?;
            let mut at = 0;
            while data.len() - at >= ACK_ENTRY {
                let e = &data[at..at + ACK_ENTRY];
                if crc(&[&e[..9]]).to_le_bytes() != e[9..] {
                    break;
                }
                let seq = u64::from_le_bytes(e[1..9].try_into().expect("8 bytes"));
                match e[0] {
                    KIND_ACK => {
                        acked.insert(seq);
                    }
                    KIND_HIGH_WATER => high_water = high_water.max(seq),
                    _ => break,
                }
                at += ACK_ENTRY;
            }
            if at < data.len() {
                stats.truncated_bytes += (data.len() - at) as u64;
            }
        }
        high_water = high_water.max(acked.last().copied().unwrap_or(0));

        // The segments.
        let mut found: Vec<(Class, u64, PathBuf)> = Vec::new();
        for entry in fs::read_dir(dir).map_err(io_err("listing the directory"))? {
            let entry = entry.map_err(io_err("listing the directory"))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some(stem) = name.strip_suffix(".seg") else { continue };
            let Some((class, first)) = stem.split_once('-') else { continue };
            let (Some(class), Ok(first)) = (Class::from_name(class), first.parse::<u64>()) else { continue };
            found.push((class, first, entry.path()));
        }
        found.sort_by_key(|(c, first, _)| (*c, *first));
        let mut segments: [VecDeque<Segment>; 2] = Default::default();
        let mut pending = BTreeMap::new();
        let mut unsent: [BTreeSet<u64>; 2] = Default::default();
        for (class, first_seq, path) in found {
            let mut file =
                OpenOptions::new().read(true).append(true).open(&path).map_err(io_err("opening a segment"))?;
            let mut data = Vec::new();
            file.read_to_end(&mut data).map_err(io_err("reading a segment"))?;
            let (records, valid) = scan_segment(&data);
            if valid < data.len() {
                stats.truncated_bytes += (data.len() - valid) as u64;
                file.set_len(valid as u64).map_err(io_err("truncating a torn segment"))?;
                file.sync_all().map_err(io_err("truncating a torn segment"))?;
            }
            let mut seg = Segment {
                first_seq,
                path: path.clone(),
                file,
                bytes: valid as u64,
                seqs: Vec::with_capacity(records.len()),
                live: 0,
                dirty: false,
            };
            for (seq, offset, len) in records {
                high_water = high_water.max(seq);
                seg.seqs.push(seq);
                if !acked.contains(&seq) {
                    seg.live += 1;
                    pending.insert(
                        seq,
                        Pending { class, segment: first_seq, offset, len, deadline: None, first_sent: None, sends: 0 },
                    );
                    unsent[class as usize].insert(seq);
                }
            }
            if seg.live == 0 {
                fs::remove_file(&path).map_err(io_err("deleting an acknowledged segment"))?;
                continue;
            }
            stats.bytes += seg.bytes;
            segments[class as usize].push_back(seg);
        }
        let mut spool = Spool {
            dir: dir.to_path_buf(),
            cfg,
            next_seq: high_water + 1,
            open_tail: [!segments[0].is_empty(), !segments[1].is_empty()],
            segments,
            pending,
            unsent,
            sent: BTreeSet::new(),
            // Replaced by the compaction below.
            acks: OpenOptions::new().create(true).append(true).open(&ack_path).map_err(io_err("opening acks.log"))?,
            ack_entries: 0,
            acks_dirty: false,
            dir_dirty: true,
            stats,
            _lock: lock,
            open_warning: None,
        };
        if let Err(e) = spool.compact_acks() {
            // Compaction only shrinks acks.log, which is valid as it is: a
            // full disk must not keep the relay (and so the passengers)
            // from starting (found by `make chaos`: a relay restarted while
            // the spool's disk was full exited at once).
            let _ = fs::remove_file(spool.dir.join("acks.log.tmp"));
            spool.acks = OpenOptions::new()
                .append(true)
                .open(spool.dir.join(ACK_LOG))
                .map_err(spool.io_err("opening acks.log"))?;
            spool.open_warning = Some(e.to_string());
        }
        Ok(spool)
    }

    /// Why acks.log could not be compacted when the spool was opened (a
    /// full disk, say); the spool works all the same.
    pub fn open_warning(&self) -> Option<&str> {
        self.open_warning.as_deref()
    }

    fn io_err(&self, op: &'static str) -> impl Fn(io::Error) -> SpoolError + '_ {
        move |source| SpoolError::Io { dir: self.dir.clone(), op, source }
    }

    /// Rewrite acks.log with only what the live segments need.
    fn compact_acks(&mut self) -> Result<(), SpoolError> {
        let tmp = self.dir.join("acks.log.tmp");
        let mut buf = Vec::new();
        buf.extend_from_slice(&ack_entry(KIND_HIGH_WATER, self.next_seq - 1));
        let mut n = 1;
        for seg in self.segments.iter().flatten() {
            for &s in &seg.seqs {
                if !self.pending.contains_key(&s) {
                    buf.extend_from_slice(&ack_entry(KIND_ACK, s));
                    n += 1;
                }
            }
        }
        let mut f = File::create(&tmp).map_err(self.io_err("writing acks.log.tmp"))?;
        f.write_all(&buf).map_err(self.io_err("writing acks.log.tmp"))?;
        f.sync_all().map_err(self.io_err("syncing acks.log.tmp"))?;
        fs::rename(&tmp, self.dir.join(ACK_LOG)).map_err(self.io_err("replacing acks.log"))?;
        self.acks =
            OpenOptions::new().append(true).open(self.dir.join(ACK_LOG)).map_err(self.io_err("opening acks.log"))?;
        self.ack_entries = n;
        self.dir_dirty = true;
        Ok(())
    }

    fn log_ack(&mut self, kind: u8, seq: u64) -> Result<(), SpoolError> {
        self.acks.write_all(&ack_entry(kind, seq)).map_err(self.io_err("appending to acks.log"))?;
        self.ack_entries += 1;
        self.acks_dirty = true;
        Ok(())
    }

    /// Delete the oldest segment of `class`, dropping its unacknowledged
    /// records (counted when `count_drops`).
    fn delete_oldest(&mut self, class: Class, count_drops: bool) -> Result<(), SpoolError> {
        let Some(seg) = self.segments[class as usize].pop_front() else { return Ok(()) };
        if self.segments[class as usize].is_empty() {
            self.open_tail[class as usize] = false;
        }
        for s in &seg.seqs {
            if let Some(p) = self.pending.remove(s) {
                self.unsent[class as usize].remove(s);
                if let Some(d) = p.deadline {
                    self.sent.remove(&(d, *s));
                }
            }
        }
        if count_drops {
            self.stats.dropped[class as usize] += seg.live as u64;
        }
        self.stats.bytes -= seg.bytes;
        drop(seg.file);
        fs::remove_file(&seg.path).map_err(self.io_err("deleting a segment"))?;
        self.dir_dirty = true;
        // Deleted seqs must never be reused.
        self.log_ack(KIND_HIGH_WATER, self.next_seq - 1)
    }

    /// Delete segment `idx` of class `c`, every record of which is
    /// acknowledged.
    fn delete_acknowledged(&mut self, c: usize, idx: usize) -> Result<(), SpoolError> {
        let seg = self.segments[c].remove(idx).expect("index valid");
        if self.segments[c].len() == idx {
            self.open_tail[c] = false;
        }
        self.stats.bytes -= seg.bytes;
        drop(seg.file);
        fs::remove_file(&seg.path).map_err(self.io_err("deleting an acknowledged segment"))?;
        self.dir_dirty = true;
        self.log_ack(KIND_HIGH_WATER, self.next_seq - 1)
    }

    /// Store a record; returns its seq, or `None` when the bound left no
    /// room for it (a sample while only handover events fill the spool;
    /// counted as dropped).
    pub fn append(&mut self, payload: &[u8], class: Class) -> Result<Option<u64>, SpoolError> {
        let need = FRAME_HEADER + payload.len() as u64;
        if payload.len() > MAX_RECORD_BYTES || need > self.cfg.max_bytes {
            return Err(SpoolError::TooLarge(payload.len()));
        }
        while self.stats.bytes + need > self.cfg.max_bytes {
            if !self.segments[Class::Sample as usize].is_empty() {
                self.delete_oldest(Class::Sample, true)?;
            } else if class == Class::Sample {
                self.stats.dropped[Class::Sample as usize] += 1;
                return Ok(None);
            } else {
                self.delete_oldest(Class::Handover, true)?;
            }
        }
        let c = class as usize;
        let seq = self.next_seq;
        let tail_full = self.segments[c].back().is_none_or(|s| s.bytes > 0 && s.bytes + need > self.cfg.segment_bytes);
        if !self.open_tail[c] || tail_full {
            // Sealing a tail whose records are all acknowledged deletes it.
            if self.open_tail[c] && self.segments[c].back().is_some_and(|s| s.live == 0) {
                let last = self.segments[c].len() - 1;
                self.delete_acknowledged(c, last)?;
            }
            let path = self.dir.join(segment_name(class, seq));
            let file = OpenOptions::new()
                .read(true)
                .append(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(self.io_err("creating a segment"))?;
            // A leftover file of that name (from a crash before its first
            // frame was complete) holds nothing valid.
            file.set_len(0).map_err(self.io_err("creating a segment"))?;
            self.segments[c].push_back(Segment {
                first_seq: seq,
                path,
                file,
                bytes: 0,
                seqs: Vec::new(),
                live: 0,
                dirty: true,
            });
            self.open_tail[c] = true;
            self.dir_dirty = true;
        }
        let mut frame = Vec::with_capacity(need as usize);
        frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        frame.extend_from_slice(&crc(&[&seq.to_le_bytes(), payload]).to_le_bytes());
        frame.extend_from_slice(&seq.to_le_bytes());
        frame.extend_from_slice(payload);
        let seg = self.segments[c].back_mut().expect("a tail segment");
        if let Err(e) = seg.file.write_all(&frame) {
            // Leave no partial frame behind.
            let _ = seg.file.set_len(seg.bytes);
            return Err(SpoolError::Io { dir: self.dir.clone(), op: "appending a record", source: e });
        }
        let offset = seg.bytes + FRAME_HEADER;
        seg.bytes += need;
        seg.seqs.push(seq);
        seg.live += 1;
        seg.dirty = true;
        let segment = seg.first_seq;
        self.stats.bytes += need;
        self.next_seq += 1;
        self.pending.insert(
            seq,
            Pending { class, segment, offset, len: payload.len() as u32, deadline: None, first_sent: None, sends: 0 },
        );
        self.unsent[c].insert(seq);
        Ok(Some(seq))
    }

    /// Records to send now, at most `limit`: first those never sent or due
    /// again (sent `resend_after` ago without an acknowledgement), handover
    /// events before samples, oldest first, while fewer than
    /// `max_in_flight` records await acknowledgement.
    pub fn next_to_send(&mut self, now: Instant, limit: usize) -> Result<Vec<Outgoing>, SpoolError> {
        while let Some(&(d, seq)) = self.sent.first() {
            if d > now {
                break;
            }
            self.sent.pop_first();
            if let Some(p) = self.pending.get_mut(&seq) {
                p.deadline = None;
                self.unsent[p.class as usize].insert(seq);
            }
        }
        let room = self.cfg.max_in_flight.saturating_sub(self.sent.len()).min(limit);
        let mut out = Vec::new();
        for class in Class::ALL {
            while out.len() < room {
                let Some(seq) = self.unsent[class as usize].pop_first() else { break };
                let p = self.pending.get_mut(&seq).expect("unsent records are pending");
                let seg = self.segments[class as usize]
                    .iter()
                    .find(|s| s.first_seq == p.segment)
                    .expect("a pending record's segment exists");
                let mut payload = vec![0u8; p.len as usize];
                if let Err(e) = seg.file.read_exact_at(&mut payload, p.offset) {
                    self.unsent[class as usize].insert(seq);
                    return Err(SpoolError::Io { dir: self.dir.clone(), op: "reading a record", source: e });
                }
                if p.sends > 0 {
                    self.stats.resent += 1;
                }
                p.first_sent.get_or_insert(now);
                p.sends += 1;
                let d = now + self.cfg.resend_after;
                p.deadline = Some(d);
                self.sent.insert((d, seq));
                out.push(Outgoing { seq, class, payload });
            }
        }
        Ok(out)
    }

    /// Make every record awaiting its acknowledgement due at once (a path
    /// came up: what was in flight may have died with the old paths).
    pub fn resend_now(&mut self) {
        while let Some((_, seq)) = self.sent.pop_first() {
            if let Some(p) = self.pending.get_mut(&seq) {
                p.deadline = None;
                self.unsent[p.class as usize].insert(seq);
            }
        }
    }

    /// When the record in flight that has waited longest for its
    /// acknowledgement was first sent; None with nothing in flight. A
    /// healthy link confirms a record within a round trip and Kafka's
    /// commit, so one first sent longer than `resend_after` ago means
    /// acknowledgements are being lost. Costs a look at each record in
    /// flight (at most `max_in_flight`).
    pub fn oldest_in_flight_since(&self) -> Option<Instant> {
        self.sent.iter().filter_map(|(_, seq)| self.pending.get(seq)?.first_sent).min()
    }

    /// When the earliest record in flight becomes due again.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.sent.first().map(|(d, _)| *d)
    }

    /// Whether something can be sent now (never-sent or due records, and
    /// room in the in-flight window).
    pub fn has_sendable(&self, now: Instant) -> bool {
        let due = self.unsent.iter().any(|u| !u.is_empty()) || self.poll_timeout().is_some_and(|d| d <= now);
        due && self.sent.len() < self.cfg.max_in_flight
    }

    /// The proxy confirmed record `seq` (Kafka has it). Returns whether it
    /// was held; acknowledging an unknown or already acknowledged seq is
    /// harmless.
    pub fn ack(&mut self, seq: u64) -> Result<bool, SpoolError> {
        let Some(p) = self.pending.remove(&seq) else { return Ok(false) };
        let c = p.class as usize;
        self.unsent[c].remove(&seq);
        if let Some(d) = p.deadline {
            self.sent.remove(&(d, seq));
        }
        self.stats.acked += 1;
        self.log_ack(KIND_ACK, seq)?;
        let idx = self.segments[c].iter().position(|s| s.first_seq == p.segment).expect("segment exists");
        // The open tail stays (appends go on into it) until it is sealed.
        let is_open_tail = self.open_tail[c] && idx + 1 == self.segments[c].len();
        let seg = &mut self.segments[c][idx];
        seg.live -= 1;
        if seg.live == 0 && !is_open_tail {
            self.delete_acknowledged(c, idx)?;
        }
        let live_acked: u64 = self.segments.iter().flatten().map(|s| (s.seqs.len() - s.live) as u64).sum();
        if self.ack_entries > 8192 + 2 * live_acked {
            self.compact_acks()?;
        }
        Ok(true)
    }

    /// Fsync what was written since the last call.
    pub fn sync(&mut self) -> Result<(), SpoolError> {
        self.sync_work()?.run()
    }

    /// What [`Spool::sync`] would fsync, as duplicated file handles: a
    /// shell runs [`SyncWork::run`] without holding the spool's lock, so
    /// appends are not stalled by a slow disk. The files written since the
    /// last call count as synced from now on; if `run` fails, the next
    /// `sync` does not retry them (the error is reported once, and the
    /// records stay in the spool either way).
    pub fn sync_work(&mut self) -> Result<SyncWork, SpoolError> {
        let mut files = Vec::new();
        for seg in self.segments.iter_mut().flatten() {
            if seg.dirty {
                files.push(seg.file.try_clone().map_err(|source| SpoolError::Io {
                    dir: self.dir.clone(),
                    op: "duplicating a segment handle",
                    source,
                })?);
                seg.dirty = false;
            }
        }
        if self.acks_dirty {
            files.push(self.acks.try_clone().map_err(self.io_err("duplicating the acks.log handle"))?);
            self.acks_dirty = false;
        }
        let dir = std::mem::take(&mut self.dir_dirty).then(|| self.dir.clone());
        Ok(SyncWork { spool_dir: self.dir.clone(), files, dir })
    }

    /// Counters and sizes.
    pub fn stats(&self) -> SpoolStats {
        SpoolStats {
            records: self.pending.len() as u64,
            in_flight: self.sent.len() as u64,
            next_seq: self.next_seq,
            ..self.stats.clone()
        }
    }

    /// The directory the spool lives in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(max_bytes: u64, segment_bytes: u64) -> SpoolConfig {
        SpoolConfig { max_bytes, segment_bytes, resend_after: Duration::from_secs(5), max_in_flight: 1000 }
    }

    fn seqs(out: &[Outgoing]) -> Vec<u64> {
        out.iter().map(|o| o.seq).collect()
    }

    #[test]
    fn records_survive_a_restart_with_their_seqs_and_acks() {
        let dir = tempfile::tempdir().unwrap();
        let now = Instant::now();
        {
            let mut s = Spool::open(dir.path(), cfg(1 << 20, 4096)).unwrap();
            for i in 0..5u8 {
                let class = if i == 2 { Class::Handover } else { Class::Sample };
                assert_eq!(s.append(&[i; 10], class).unwrap(), Some(u64::from(i) + 1));
            }
            let out = s.next_to_send(now, 100).unwrap();
            assert_eq!(seqs(&out), vec![3, 1, 2, 4, 5], "handover events first");
            assert!(s.ack(1).unwrap());
            assert!(s.ack(3).unwrap());
            s.sync().unwrap();
        }
        let mut s = Spool::open(dir.path(), cfg(1 << 20, 4096)).unwrap();
        assert_eq!(s.stats().records, 3);
        let out = s.next_to_send(now, 100).unwrap();
        assert_eq!(seqs(&out), vec![2, 4, 5], "acked records stay acked");
        assert_eq!(out[0].payload, vec![1u8; 10]);
        assert_eq!(s.append(b"x", Class::Sample).unwrap(), Some(6), "seqs continue");
    }

    #[test]
    fn a_spool_whose_acks_cannot_be_compacted_still_opens_and_keeps_its_acks() {
        let dir = tempfile::tempdir().unwrap();
        let now = Instant::now();
        {
            let mut s = Spool::open(dir.path(), cfg(1 << 20, 4096)).unwrap();
            for _ in 0..3 {
                s.append(b"gps", Class::Sample).unwrap();
            }
            s.next_to_send(now, 100).unwrap();
            assert!(s.ack(1).unwrap());
            s.sync().unwrap();
        }
        // acks.log.tmp cannot be written (a directory in its place stands in
        // for a full disk).
        fs::create_dir(dir.path().join("acks.log.tmp")).unwrap();
        {
            let mut s = Spool::open(dir.path(), cfg(1 << 20, 4096)).unwrap();
            assert!(s.open_warning().is_some_and(|w| w.contains("acks.log.tmp")), "{:?}", s.open_warning());
            assert_eq!(seqs(&s.next_to_send(now, 100).unwrap()), vec![2, 3], "seq 1 stays acknowledged");
            assert!(s.ack(2).unwrap());
            s.sync().unwrap();
        }
        fs::remove_dir(dir.path().join("acks.log.tmp")).unwrap();
        let mut s = Spool::open(dir.path(), cfg(1 << 20, 4096)).unwrap();
        assert_eq!(s.open_warning(), None);
        assert_eq!(seqs(&s.next_to_send(now, 100).unwrap()), vec![3], "the ack logged after the failure counts");
    }

    #[test]
    fn the_oldest_in_flight_is_the_longest_unconfirmed_since_its_first_send() {
        let dir = tempfile::tempdir().unwrap();
        let t0 = Instant::now();
        let s5 = Duration::from_secs(5);
        let mut s = Spool::open(dir.path(), cfg(1 << 20, 4096)).unwrap();
        assert_eq!(s.oldest_in_flight_since(), None, "nothing in flight");
        s.append(b"a", Class::Sample).unwrap();
        assert_eq!(s.oldest_in_flight_since(), None, "spooled, not sent");
        s.next_to_send(t0, 100).unwrap();
        s.append(b"b", Class::Sample).unwrap();
        s.next_to_send(t0 + Duration::from_secs(1), 100).unwrap();
        assert_eq!(s.oldest_in_flight_since(), Some(t0));
        // Seq 1's acknowledgement is lost: resent, it keeps its first send.
        assert_eq!(seqs(&s.next_to_send(t0 + s5, 100).unwrap()), vec![1]);
        assert_eq!(s.oldest_in_flight_since(), Some(t0), "a resend is no fresh start");
        assert!(s.ack(1).unwrap());
        assert_eq!(s.oldest_in_flight_since(), Some(t0 + Duration::from_secs(1)));
        assert!(s.ack(2).unwrap());
        assert_eq!(s.oldest_in_flight_since(), None);
    }

    #[test]
    fn a_second_process_cannot_open_a_spool_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let s = Spool::open(dir.path(), cfg(1 << 20, 4096)).unwrap();
        assert!(matches!(Spool::open(dir.path(), cfg(1 << 20, 4096)), Err(SpoolError::Locked(_))));
        drop(s);
        Spool::open(dir.path(), cfg(1 << 20, 4096)).unwrap();
    }

    #[test]
    fn seqs_are_never_reused_after_everything_was_acknowledged() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut s = Spool::open(dir.path(), cfg(1 << 20, 4096)).unwrap();
            for _ in 0..3 {
                s.append(b"gps", Class::Sample).unwrap();
            }
            for q in 1..=3 {
                s.ack(q).unwrap();
            }
            assert_eq!(s.stats().records, 0);
        }
        let mut s = Spool::open(dir.path(), cfg(1 << 20, 4096)).unwrap();
        assert_eq!(s.append(b"gps", Class::Sample).unwrap(), Some(4));
        drop(s);
        // Even after a compaction at open.
        let mut s = Spool::open(dir.path(), cfg(1 << 20, 4096)).unwrap();
        assert_eq!(s.append(b"gps", Class::Sample).unwrap(), Some(5));
    }

    #[test]
    fn the_bound_drops_oldest_samples_first_and_handovers_last() {
        let dir = tempfile::tempdir().unwrap();
        // Records of 100 payload bytes take 116 on disk; segments of 2.
        let mut s = Spool::open(dir.path(), cfg(116 * 8, 232)).unwrap();
        let rec = [7u8; 100];
        for _ in 0..2 {
            s.append(&rec, Class::Handover).unwrap();
        }
        for _ in 0..6 {
            s.append(&rec, Class::Sample).unwrap();
        }
        assert_eq!(s.stats().bytes, 116 * 8);
        // Full: the next sample drops the oldest sample segment (seqs 3, 4).
        assert_eq!(s.append(&rec, Class::Sample).unwrap(), Some(9));
        assert_eq!(s.stats().dropped, [0, 2]);
        // Handover events push out every sample before any handover.
        for _ in 0..6 {
            s.append(&rec, Class::Handover).unwrap();
        }
        let st = s.stats();
        assert!(st.bytes <= 116 * 8);
        assert_eq!(st.dropped, [0, 7], "every sample went before a handover");
        let out = s.next_to_send(Instant::now(), 100).unwrap();
        assert_eq!(seqs(&out), vec![1, 2, 10, 11, 12, 13, 14, 15]);
        // Only handover events left: a sample has no room and is dropped.
        assert_eq!(s.append(&rec, Class::Sample).unwrap(), None);
        assert_eq!(s.stats().dropped, [0, 8]);
        // More handover events: the oldest handover segment goes.
        assert_eq!(s.append(&rec, Class::Handover).unwrap(), Some(16));
        assert_eq!(s.stats().dropped, [2, 8]);
    }

    #[test]
    fn acknowledged_segments_are_deleted_once_sealed() {
        let dir = tempfile::tempdir().unwrap();
        // 10-byte records take 26 bytes: two per segment.
        let mut s = Spool::open(dir.path(), cfg(1 << 20, 52)).unwrap();
        let segs = || {
            fs::read_dir(dir.path())
                .unwrap()
                .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "seg"))
                .count()
        };
        for _ in 0..3 {
            s.append(&[0; 10], Class::Sample).unwrap();
        }
        assert_eq!(segs(), 2);
        s.ack(1).unwrap();
        s.ack(2).unwrap();
        assert_eq!(segs(), 1, "the sealed, acknowledged segment is gone");
        s.ack(3).unwrap();
        assert_eq!(segs(), 1, "the open tail stays for the next appends");
        assert_eq!(s.stats().bytes, 26);
        assert_eq!(s.append(&[0; 10], Class::Sample).unwrap(), Some(4));
        s.ack(4).unwrap();
        assert_eq!(s.append(&[0; 10], Class::Sample).unwrap(), Some(5));
        assert_eq!(segs(), 1, "sealing the acknowledged tail deleted it");
        assert_eq!(s.stats().bytes, 26);
    }

    #[test]
    fn a_torn_or_corrupt_tail_is_cut_off_at_open() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut s = Spool::open(dir.path(), cfg(1 << 20, 1 << 16)).unwrap();
            for i in 0..3u8 {
                s.append(&[i; 20], Class::Sample).unwrap();
            }
            s.ack(1).unwrap();
            s.sync().unwrap();
        }
        let seg = dir.path().join(segment_name(Class::Sample, 1));
        let good = fs::metadata(&seg).unwrap().len();
        // A torn frame (header claims more than is there) after garbage-free records.
        let mut f = OpenOptions::new().append(true).open(&seg).unwrap();
        f.write_all(&[50, 0, 0, 0, 1, 2, 3]).unwrap();
        let mut a = OpenOptions::new().append(true).open(dir.path().join(ACK_LOG)).unwrap();
        a.write_all(&[1, 2, 3]).unwrap();
        drop((f, a));
        let mut s = Spool::open(dir.path(), cfg(1 << 20, 1 << 16)).unwrap();
        assert_eq!(fs::metadata(&seg).unwrap().len(), good, "truncated to the last whole frame");
        assert!(s.stats().truncated_bytes >= 10);
        assert_eq!(seqs(&s.next_to_send(Instant::now(), 10).unwrap()), vec![2, 3]);
        assert_eq!(s.append(b"new", Class::Sample).unwrap(), Some(4));
        drop(s);

        // Flip a payload byte of the last record: its CRC fails, it goes.
        let mut data = fs::read(&seg).unwrap();
        let n = data.len();
        data[n - 1] ^= 0xff;
        fs::write(&seg, &data).unwrap();
        let mut s = Spool::open(dir.path(), cfg(1 << 20, 1 << 16)).unwrap();
        assert_eq!(seqs(&s.next_to_send(Instant::now(), 10).unwrap()), vec![2, 3]);
        assert_eq!(s.append(b"again", Class::Sample).unwrap(), Some(4), "the corrupt record's seq was never acked");
    }

    #[test]
    fn unacknowledged_records_go_again_after_the_timeout_or_when_a_path_comes_up() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = cfg(1 << 20, 4096);
        c.max_in_flight = 2;
        let mut s = Spool::open(dir.path(), c).unwrap();
        for _ in 0..3 {
            s.append(b"r", Class::Sample).unwrap();
        }
        let t0 = Instant::now();
        assert_eq!(seqs(&s.next_to_send(t0, 10).unwrap()), vec![1, 2], "the in-flight window is 2");
        assert!(s.next_to_send(t0, 10).unwrap().is_empty());
        s.ack(1).unwrap();
        assert_eq!(seqs(&s.next_to_send(t0, 10).unwrap()), vec![3]);
        assert_eq!(s.poll_timeout(), Some(t0 + Duration::from_secs(5)));
        let t1 = t0 + Duration::from_secs(5);
        assert_eq!(seqs(&s.next_to_send(t1, 10).unwrap()), vec![2, 3]);
        assert_eq!(s.stats().resent, 2);
        s.resend_now();
        assert!(s.has_sendable(t1));
        assert_eq!(seqs(&s.next_to_send(t1, 10).unwrap()), vec![2, 3]);
        s.ack(2).unwrap();
        s.ack(3).unwrap();
        assert!(!s.has_sendable(t1 + Duration::from_secs(60)));
        assert_eq!(s.stats().records, 0);
        assert!(!s.ack(3).unwrap(), "a second ack is harmless");
    }

    #[test]
    fn the_ack_log_stays_small() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Spool::open(dir.path(), cfg(1 << 20, 4096)).unwrap();
        for _ in 0..10_000 {
            let q = s.append(b"gps fix", Class::Sample).unwrap().unwrap();
            s.ack(q).unwrap();
        }
        assert!(fs::metadata(dir.path().join(ACK_LOG)).unwrap().len() < 10_000 * ACK_ENTRY as u64);
        drop(s);
        let mut s = Spool::open(dir.path(), cfg(1 << 20, 4096)).unwrap();
        assert_eq!(s.append(b"x", Class::Sample).unwrap(), Some(10_001));
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        #[derive(Clone, Debug)]
        enum Op {
            Append(Class, u8),
            Send(u8),
            /// Deliver the i-th record in flight (mod), and maybe lose its ack.
            Deliver(u8, bool),
            Tick(u8),
            Restart,
            PathUp,
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                4 => (prop_oneof![Just(Class::Handover), Just(Class::Sample)], 0u8..200).prop_map(|(c, n)| Op::Append(c, n)),
                3 => (1u8..8).prop_map(Op::Send),
                4 => (any::<u8>(), any::<bool>()).prop_map(|(i, l)| Op::Deliver(i, l)),
                2 => (0u8..8).prop_map(Op::Tick),
                1 => Just(Op::Restart),
                1 => Just(Op::PathUp),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(crate::cases(64)))]
            /// Every handover event that was not dropped ends up delivered
            /// (in the receiver's dedup log) exactly once, and every
            /// delivered record was acknowledged in the end.
            #[test]
            fn every_kept_handover_is_delivered_once(ops in proptest::collection::vec(op(), 1..120)) {
                let dir = tempfile::tempdir().unwrap();
                let c = SpoolConfig { max_bytes: 2000, segment_bytes: 300, resend_after: Duration::from_secs(5), max_in_flight: 8 };
                let mut s = Spool::open(dir.path(), c.clone()).unwrap();
                let t0 = Instant::now();
                let mut now = t0;
                let mut handovers = BTreeSet::new();
                let mut in_flight: Vec<Outgoing> = Vec::new();
                // The receiver's log after dedup by seq: seq -> payload.
                let mut delivered = BTreeMap::<u64, Vec<u8>>::new();
                let mut deliver = |o: &Outgoing| -> Result<(), TestCaseError> {
                    let first = delivered.entry(o.seq).or_insert_with(|| o.payload.clone());
                    prop_assert_eq!(first, &o.payload, "a seq never stands for two records");
                    Ok(())
                };
                let mut dropped_handovers = 0;
                for o in ops {
                    match o {
                        Op::Append(class, n) => {
                            let payload = vec![n; usize::from(n) % 40 + 1];
                            if let Some(q) = s.append(&payload, class).unwrap() {
                                if class == Class::Handover { handovers.insert(q); }
                            }
                        }
                        Op::Send(n) => in_flight.extend(s.next_to_send(now, n.into()).unwrap()),
                        Op::Deliver(i, lose) => {
                            if !in_flight.is_empty() {
                                let o = in_flight.remove(usize::from(i) % in_flight.len());
                                deliver(&o)?;
                                if !lose { s.ack(o.seq).unwrap(); }
                            }
                        }
                        Op::Tick(n) => now += Duration::from_secs(n.into()),
                        Op::Restart => {
                            dropped_handovers += s.stats().dropped[0];
                            s.sync().unwrap();
                            drop(s);
                            s = Spool::open(dir.path(), c.clone()).unwrap();
                            in_flight.clear();
                        }
                        Op::PathUp => s.resend_now(),
                    }
                }
                // Drain over a perfect network.
                for _ in 0..10_000 {
                    now += Duration::from_secs(10);
                    let out = s.next_to_send(now, 64).unwrap();
                    if out.is_empty() && s.stats().records == 0 { break; }
                    for o in out {
                        deliver(&o)?;
                        s.ack(o.seq).unwrap();
                    }
                }
                prop_assert_eq!(s.stats().records, 0);
                dropped_handovers += s.stats().dropped[0];
                let got = handovers.iter().filter(|q| delivered.contains_key(q)).count() as u64;
                prop_assert!(got + dropped_handovers >= handovers.len() as u64,
                    "{} handovers, {} delivered, {} dropped", handovers.len(), got, dropped_handovers);
            }
        }
    }
}
