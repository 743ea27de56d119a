//! One passenger connection: a send buffer with data-level sequencing,
//! non-renegable selective acknowledgement and reinjection bookkeeping, and
//! a reassembly buffer that keeps the first copy of every byte behind an
//! autotuned receive window.
//!
//! Memory per connection follows what the connection does, not a fixed
//! size (docs/architecture.md, "Flow control and memory"):
//!
//! - **Send side.** Bytes the application wrote and the scheduler has not
//!   placed yet ("unsent") are kept to about two round trips of the
//!   connection's delivery rate (a not-sent low-water mark, as Linux's
//!   `TCP_NOTSENT_LOWAT`), so the scheduler, not a deep queue, decides where
//!   bytes go. Once placed, a segment owns its payload until it is
//!   acknowledged, cumulatively or selectively: a SACK, or a path-level
//!   acknowledgement of the frame that carried it, is final (as in QUIC,
//!   RFC 9002 §4.5), so the payload is freed at once and a segment lost on
//!   a slow path holds only itself, not everything sent after it.
//! - **Receive side.** The window starts small and doubles while the
//!   application reads close to a full window per round trip of the
//!   slowest path (Linux MPTCP's `mptcp_rcv_space_adjust`: window ≈ 2 ×
//!   bytes read per RTT_max + the out-of-order span), up to a cap. Growth
//!   is granted by the endpoint's [`crate::budget::MemoryBudget`].
//!
//! Offsets and lengths that come from the peer are checked, never trusted:
//! an acknowledgement of bytes never sent, or one that cuts a segment, is a
//! protocol error ([`AckError`]), never a panic.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::ids::{ConnId, PathMask, UserId};

/// The peer acknowledged something it cannot have received.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AckError {
    #[error("cumulative acknowledgement {cumulative} is beyond the {sent} bytes sent")]
    BeyondSent { cumulative: u64, sent: u64 },
    #[error("cumulative acknowledgement {cumulative} falls inside the segment at {offset} (length {len})")]
    InsideSegment { cumulative: u64, offset: u64, len: u32 },
}

/// Sizes of a send stream; [`SendStream::new`] clamps them to be consistent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendLimits {
    /// Most bytes a connection may hold (unsent plus sent and not yet
    /// acknowledged).
    pub cap: u64,
    /// Floor of the not-sent low-water mark: unsent bytes accepted even
    /// before any rate is measured.
    pub min_unsent: u64,
    /// The low-water mark before the first rate estimate (at least
    /// `min_unsent`): a connection may take this much of a response at
    /// once, so a short one is wholly in the buffer with its end known to
    /// the scheduler (tail packets, [`crate::sched::PacketInfo::is_tail`]).
    pub initial_unsent: u64,
}

/// Sending half: bytes the local application wrote, kept until the peer
/// acknowledges them at the data level.
#[derive(Debug)]
pub struct SendStream {
    /// Bytes `[next_new, next_new + unsent.len())`, written and not placed.
    unsent: VecDeque<u8>,
    /// Lowest offset never placed on a path.
    next_new: u64,
    /// Every byte below this is acknowledged.
    acked_base: u64,
    /// Segments placed at least once and not yet cumulatively acknowledged,
    /// by offset; contiguous from `acked_base` to `next_new`.
    segs: BTreeMap<u64, Seg>,
    /// Bytes of payload held by unacknowledged segments.
    held: u64,
    /// Offsets of segments thrown back for reinjection (lazy: they are
    /// scheduled again like new data, lowest offset first).
    reinject: BTreeSet<u64>,
    /// Peer's flow-control limit.
    max_data: u64,
    /// The last write ended a burst ([`crate::Endpoint::send_burst`]).
    burst_end: bool,
    fin_requested: bool,
    fin_acked: bool,
    limits: SendLimits,
    /// Current not-sent low-water mark (bytes).
    unsent_limit: u64,
    /// Delivery-rate epoch for the low-water mark: start, and bytes freed by
    /// acknowledgements since the stream began, at that start.
    rate_epoch: Option<(Instant, u64)>,
    freed_total: u64,
    /// A write found no room (or the budget refused it): the endpoint wakes
    /// the writer when room returns. Timed for the "send-limited" metric.
    write_blocked: Waits,
    /// New data waits only for the peer's window ("window-limited" metric).
    window_limited: Waits,
}

/// A state a stream is in now and then, and the time it spent in it,
/// counted when each spell ends (so a counter built on it never goes back).
#[derive(Clone, Copy, Debug, Default)]
struct Waits {
    since: Option<Instant>,
    total: Duration,
}

impl Waits {
    /// Enter or leave the state; returns whether that changed it.
    fn set(&mut self, waiting: bool, now: Instant) -> bool {
        match (waiting, self.since) {
            (true, None) => {
                self.since = Some(now);
                true
            }
            (false, Some(t)) => {
                self.total += now.saturating_duration_since(t);
                self.since = None;
                true
            }
            _ => false,
        }
    }
}

#[derive(Clone, Debug)]
struct Seg {
    len: u32,
    fin: bool,
    /// Paths this segment has been placed on; a reinjection never goes back.
    paths_used: PathMask,
    /// The bytes, until the peer has them (cumulatively or selectively).
    payload: Option<Bytes>,
    /// Already sent again for head-of-line recovery (at most once).
    head_reinjected: bool,
    /// Given back before any copy of it left the endpoint (its only path
    /// timed out while it waited in that path's queue): its next placement
    /// is its first copy, not a reinjection.
    unwritten: bool,
}

/// The next packet of a flow, as the scheduler sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NextPacket {
    pub offset: u64,
    pub len: u32,
    pub fin: bool,
    pub reinjection: bool,
    pub paths_used: PathMask,
    /// A segment given back before any copy of it was written
    /// ([`SendStream::requeue_unwritten`]): placing it sends its first copy.
    pub unwritten: bool,
}

impl SendStream {
    pub fn new(limits: SendLimits, initial_max_data: u64) -> Self {
        let cap = limits.cap.max(1);
        let min_unsent = limits.min_unsent.clamp(1, cap);
        let limits = SendLimits { cap, min_unsent, initial_unsent: limits.initial_unsent.clamp(min_unsent, cap) };
        SendStream {
            unsent: VecDeque::new(),
            next_new: 0,
            acked_base: 0,
            segs: BTreeMap::new(),
            held: 0,
            reinject: BTreeSet::new(),
            max_data: initial_max_data,
            fin_requested: false,
            burst_end: false,
            fin_acked: false,
            unsent_limit: limits.initial_unsent,
            limits,
            rate_epoch: None,
            freed_total: 0,
            write_blocked: Waits::default(),
            window_limited: Waits::default(),
        }
    }

    /// Free space for the application to write: below both the not-sent
    /// low-water mark and the connection's cap.
    pub fn room(&self) -> usize {
        if self.fin_requested {
            return 0;
        }
        let unsent = self.unsent.len() as u64;
        let by_unsent = self.unsent_limit.saturating_sub(unsent);
        let by_cap = self.limits.cap.saturating_sub(self.buffered());
        by_unsent.min(by_cap).min(usize::MAX as u64) as usize
    }

    /// Whether a writer that found no room should be woken now: when room
    /// for at least half the not-sent low-water mark is back (Linux wakes a
    /// blocked writer once free space reaches half of what is queued,
    /// `sk_stream_write_space`). Waking it for every placed segment cost
    /// the fast path a task wake-up and two lock round trips per segment.
    pub fn writer_wake_due(&self) -> bool {
        self.is_write_blocked() && self.room() as u64 >= (self.unsent_limit / 2).max(1)
    }

    /// A write at `now` took less than offered (`blocked`) or all of it.
    pub(crate) fn set_burst_end(&mut self, end: bool) {
        self.burst_end = end;
    }

    /// The last write ended a burst and nothing was written since.
    pub fn burst_end(&self) -> bool {
        self.burst_end
    }

    pub(crate) fn note_write(&mut self, blocked: bool, now: Instant) {
        let _ = self.write_blocked.set(blocked, now);
    }

    /// The writer is being woken: its wait ends.
    pub(crate) fn unblock_writer(&mut self, now: Instant) {
        let _ = self.write_blocked.set(false, now);
    }

    pub fn is_write_blocked(&self) -> bool {
        self.write_blocked.since.is_some()
    }

    /// Time writes waited for room (the low-water mark, the cap or the
    /// budget), up to the last wait that ended.
    pub fn send_limited_noted(&self) -> Duration {
        self.write_blocked.total
    }

    /// Accept up to `room()` bytes; returns how many were taken.
    pub fn write(&mut self, data: &[u8]) -> usize {
        self.write_with(data, false)
    }

    /// [`Self::write`]; with `exact`, the unsent buffer grows only to what
    /// the bytes need instead of doubling (when the memory budget has no
    /// room for the doubling). Its capacity is then what
    /// [`Self::memory_after_write`] said.
    pub fn write_with(&mut self, data: &[u8], exact: bool) -> usize {
        let n = data.len().min(self.room());
        let target = self.unsent_capacity_for(n, exact);
        if target > self.unsent.capacity() {
            self.unsent.reserve_exact(target - self.unsent.len());
        }
        self.unsent.extend(&data[..n]);
        n
    }

    /// Capacity of the unsent buffer once `n` more bytes are in it: as now
    /// if they fit, else doubled (amortised copying) but never past the
    /// most the buffer may hold, or (`exact`) just enough.
    fn unsent_capacity_for(&self, n: usize, exact: bool) -> usize {
        let cap = self.unsent.capacity();
        let need = self.unsent.len() + n;
        if need <= cap {
            cap
        } else if exact {
            need
        } else {
            (cap * 2).min(self.limits.cap as usize).max(need)
        }
    }

    /// Memory the send side holds or will: the unsent buffer's capacity
    /// (not only the bytes in it), the segment each unsent byte is copied
    /// into when it is scheduled (while the buffer keeps its capacity), and
    /// the payloads of segments not acknowledged.
    pub fn memory(&self) -> u64 {
        (self.unsent.capacity() + self.unsent.len()) as u64 + self.held
    }

    /// Bytes [`Self::write_with`] (`exact`) may take while [`Self::memory`]
    /// stays at or below `memory`.
    pub fn room_within(&self, memory: u64) -> usize {
        let (cap, len) = (self.unsent.capacity(), self.unsent.len());
        let avail = memory.saturating_sub(self.held) as usize;
        // Within the capacity there is, or growing it to just what is held.
        let within = (cap - len).min(avail.saturating_sub(cap + len));
        let grown = (avail / 2).saturating_sub(len);
        within.max(if len + grown > cap { grown } else { 0 })
    }

    /// [`Self::memory`] once `n` more bytes are written ([`Self::write_with`]).
    pub fn memory_after_write(&self, n: usize, exact: bool) -> u64 {
        (self.unsent_capacity_for(n, exact) + self.unsent.len() + n) as u64 + self.held
    }

    pub fn finish(&mut self) {
        self.fin_requested = true;
    }

    pub fn fin_requested(&self) -> bool {
        self.fin_requested
    }

    /// Everything written, including the FIN, is acknowledged.
    pub fn is_done(&self) -> bool {
        self.fin_acked && self.unsent.is_empty()
    }

    fn write_end(&self) -> u64 {
        self.next_new + self.unsent.len() as u64
    }

    /// Bytes of this flow not sent yet (new data plus reinjections).
    pub fn remaining_bytes(&self) -> u64 {
        let re: u64 = self.reinject.iter().filter_map(|o| self.segs.get(o)).map(|s| u64::from(s.len)).sum();
        self.unsent.len() as u64 + re
    }

    /// The lowest unsent packet, reinjections included, limited by flow
    /// control and by `segment_bytes`.
    pub fn next_packet(&self, segment_bytes: u32) -> Option<NextPacket> {
        if let Some(&off) = self.reinject.iter().next() {
            let s = &self.segs[&off];
            return Some(NextPacket {
                offset: off,
                len: s.len,
                fin: s.fin,
                reinjection: true,
                paths_used: s.paths_used,
                unwritten: s.unwritten,
            });
        }
        let end = self.write_end();
        let limit = end.min(self.max_data);
        let avail = limit.saturating_sub(self.next_new);
        let fin_unsent = self.fin_requested && !self.fin_acked && !self.segs.values().any(|s| s.fin);
        if avail == 0 && !(fin_unsent && self.next_new == end) {
            return None;
        }
        let len = avail.min(u64::from(segment_bytes)) as u32;
        let fin = fin_unsent && self.next_new + u64::from(len) == end;
        Some(NextPacket {
            offset: self.next_new,
            len,
            fin,
            reinjection: false,
            paths_used: PathMask::EMPTY,
            unwritten: false,
        })
    }

    /// Mark `pkt` (from [`Self::next_packet`]) as placed on `paths`.
    pub fn on_scheduled(&mut self, pkt: &NextPacket, paths: PathMask) {
        if pkt.reinjection {
            self.reinject.remove(&pkt.offset);
            if let Some(s) = self.segs.get_mut(&pkt.offset) {
                s.paths_used = s.paths_used.union(paths);
                s.unwritten = false;
            }
            return;
        }
        if pkt.offset != self.next_new || pkt.len as usize > self.unsent.len() {
            debug_assert!(false, "on_scheduled with a packet next_packet did not return");
            return;
        }
        // Copy slice-wise, then drop the front without iterating it (a
        // byte-by-byte collect here cost the fast path half its throughput).
        let n = pkt.len as usize;
        let mut payload = Vec::with_capacity(n);
        let (a, b) = self.unsent.as_slices();
        if n <= a.len() {
            payload.extend_from_slice(&a[..n]);
        } else {
            payload.extend_from_slice(a);
            payload.extend_from_slice(&b[..n - a.len()]);
        }
        self.unsent.drain(..n);
        let keep = (self.limits.min_unsent / 2) as usize;
        if self.unsent.is_empty() && self.unsent.capacity() > keep {
            // A burst is out: keep no more capacity than half the floor, so
            // the floor (counted as capacity plus the segments the bytes are
            // copied into) always has room for a write, whatever the budget.
            self.unsent.shrink_to(keep);
        }
        self.held += u64::from(pkt.len);
        self.segs.insert(
            pkt.offset,
            Seg {
                len: pkt.len,
                fin: pkt.fin,
                paths_used: paths,
                payload: Some(Bytes::from(payload)),
                head_reinjected: false,
                unwritten: false,
            },
        );
        self.next_new += u64::from(pkt.len);
    }

    /// Add paths to a segment already scheduled (redundant copies).
    pub fn add_paths(&mut self, offset: u64, paths: PathMask) {
        if let Some(s) = self.segs.get_mut(&offset) {
            s.paths_used = s.paths_used.union(paths);
        }
    }

    /// Throw a sent segment back into the send buffer for reinjection.
    /// Returns its length when it was still unacknowledged (and so queued).
    pub fn requeue(&mut self, offset: u64) -> Option<u32> {
        match self.segs.get(&offset) {
            Some(s) if s.payload.is_some() => {
                self.reinject.insert(offset);
                Some(s.len)
            }
            _ => None,
        }
    }

    /// Give back a segment that was placed but whose copies never left the
    /// endpoint (`paths` held it queued): it is sent again as a first copy,
    /// not counted as a reinjection, unless another path has a copy.
    pub fn requeue_unwritten(&mut self, offset: u64, paths: PathMask) -> Option<u32> {
        self.forget_paths(offset, paths);
        let len = self.requeue(offset)?;
        if let Some(s) = self.segs.get_mut(&offset) {
            s.unwritten = s.paths_used.is_empty();
        }
        Some(len)
    }

    /// Forget that a segment used `paths` (its copies there are lost).
    pub fn forget_paths(&mut self, offset: u64, paths: PathMask) {
        if let Some(s) = self.segs.get_mut(&offset) {
            s.paths_used = s.paths_used.minus(paths);
        }
    }

    /// Whether a segment still needs delivering (not acknowledged).
    pub fn is_unacked(&self, offset: u64) -> bool {
        self.segs.get(&offset).is_some_and(|s| s.payload.is_some())
    }

    /// The bytes of an unacknowledged segment (cheap: shared, not copied).
    pub fn segment_payload(&self, offset: u64) -> Option<&Bytes> {
        self.segs.get(&offset).and_then(|s| s.payload.as_ref())
    }

    /// Drop a segment's payload: the peer has it.
    fn release(&mut self, offset: u64) -> u64 {
        let Some(s) = self.segs.get_mut(&offset) else { return 0 };
        self.reinject.remove(&offset);
        match s.payload.take() {
            Some(_) => {
                self.held -= u64::from(s.len);
                u64::from(s.len)
            }
            None => 0,
        }
    }

    /// Process a data-level acknowledgement. Returns the bytes freed, or
    /// an error (nothing changed) when the peer acknowledged something it
    /// cannot have received.
    pub fn on_ack(&mut self, cumulative: u64, fin: bool, sack: &[(u64, u64)]) -> Result<u64, AckError> {
        if cumulative > self.next_new {
            return Err(AckError::BeyondSent { cumulative, sent: self.next_new });
        }
        if cumulative > self.acked_base {
            if let Some((&off, s)) = self.segs.range(..cumulative).next_back() {
                if off + u64::from(s.len) > cumulative {
                    return Err(AckError::InsideSegment { cumulative, offset: off, len: s.len });
                }
            }
        }
        let before = self.held;
        self.apply_ack(cumulative, fin, sack);
        // Segments just above a new cumulative point may already be known
        // delivered (by a path-level ack, see `on_delivered`), waiting only
        // for the gap below them. Fold them in now: a peer that has closed
        // the connection sends no further data-level ACK, so otherwise the
        // stream, and its FIN, would never complete.
        self.fold_delivered();
        let freed = before - self.held;
        self.freed_total += freed;
        Ok(freed)
    }

    fn fold_delivered(&mut self) {
        let (cum, fin) = self.delivered_run();
        if cum > self.acked_base || (fin && !self.fin_acked) {
            self.apply_ack(cum, fin, &[]);
        }
    }

    /// End of the run of delivered segments starting at the cumulative
    /// point, and whether the run carries the FIN.
    fn delivered_run(&self) -> (u64, bool) {
        let mut cum = self.acked_base;
        let mut fin = false;
        for (&off, s) in &self.segs {
            if off != cum || s.payload.is_some() {
                break;
            }
            cum += u64::from(s.len);
            fin |= s.fin;
        }
        (cum, fin)
    }

    /// Apply a checked acknowledgement (`cum` on a segment boundary, at
    /// most `next_new`).
    fn apply_ack(&mut self, cum: u64, fin: bool, sack: &[(u64, u64)]) {
        if cum > self.acked_base {
            let keep = self.segs.split_off(&cum);
            for (off, s) in std::mem::replace(&mut self.segs, keep) {
                self.reinject.remove(&off);
                if s.payload.is_some() {
                    self.held -= u64::from(s.len);
                }
            }
            self.acked_base = cum;
        }
        for &(s, e) in sack {
            if s >= e {
                continue;
            }
            let covered: Vec<u64> = self
                .segs
                .range(s..e)
                .filter(|(&off, seg)| off + u64::from(seg.len) <= e && seg.payload.is_some())
                .map(|(&off, _)| off)
                .collect();
            for off in covered {
                self.release(off);
            }
        }
        if fin && self.fin_requested && self.acked_base == self.next_new && self.unsent.is_empty() {
            self.fin_acked = true;
            self.segs.clear();
            self.reinject.clear();
            self.held = 0;
        }
    }

    /// The segment at `offset` reached the peer's endpoint (its frame was
    /// acknowledged at path level, which the peer sends only after
    /// processing the frame). Advances the cumulative point over delivered
    /// segments. Returns the bytes freed.
    pub fn on_delivered(&mut self, offset: u64) -> u64 {
        let before = self.held;
        if !self.segs.contains_key(&offset) {
            return 0;
        }
        self.release(offset);
        self.fold_delivered();
        let freed = before - self.held;
        self.freed_total += freed;
        freed
    }

    /// Re-estimate the not-sent low-water mark: about one `rtt_max` of the
    /// bytes the peer acknowledged per `rtt_max`, between the floor and the
    /// cap. Call after acknowledgements.
    pub fn update_rate(&mut self, now: Instant, rtt_max: Duration) {
        let rtt = rtt_max.max(MIN_TUNING_RTT);
        let (t0, f0) = *self.rate_epoch.get_or_insert((now, self.freed_total));
        let elapsed = now.saturating_duration_since(t0);
        if elapsed < rtt {
            return;
        }
        let per_rtt = ((self.freed_total - f0) as u128 * rtt.as_nanos() / elapsed.as_nanos().max(1)) as u64;
        // Two round trips' worth: the scheduler always has the next round
        // trip's bytes to place while the application refills.
        self.unsent_limit = per_rtt.saturating_mul(2).clamp(self.limits.min_unsent, self.limits.cap);
        self.rate_epoch = Some((now, self.freed_total));
    }

    /// Note whether new data waits only for the peer's window (for the
    /// "window-limited time" metric); returns the new state when it
    /// changed.
    pub fn note_window_limit(&mut self, now: Instant) -> Option<bool> {
        let limited = self.is_window_limited();
        self.window_limited.set(limited, now).then_some(limited)
    }

    /// Time new data waited only for the peer's window, up to the last
    /// time that ended.
    pub fn window_limited_noted(&self) -> Duration {
        self.window_limited.total
    }

    /// Room the peer's window leaves for new data.
    pub fn window_room(&self) -> u64 {
        self.max_data.saturating_sub(self.next_new)
    }

    pub fn set_max_data(&mut self, max_data: u64) {
        self.max_data = self.max_data.max(max_data);
    }

    pub fn max_data(&self) -> u64 {
        self.max_data
    }

    /// Bytes held: unsent plus sent and unacknowledged.
    pub fn buffered(&self) -> u64 {
        self.unsent.len() as u64 + self.held
    }

    /// Bytes written and not yet placed on a path.
    pub fn unsent(&self) -> u64 {
        self.unsent.len() as u64
    }

    /// The current not-sent low-water mark.
    pub fn unsent_limit(&self) -> u64 {
        self.unsent_limit
    }

    /// Bytes placed on paths and not yet acknowledged.
    pub fn in_flight(&self) -> u64 {
        self.held
    }

    /// Offset of the first byte the peer has not acknowledged.
    pub fn acked_base(&self) -> u64 {
        self.acked_base
    }

    /// The head of the connection's window (the segment at the cumulative
    /// point) when it is in flight and unacknowledged: offset, length, the
    /// paths it was placed on, whether it was already reinjected for
    /// head-of-line recovery.
    pub fn head_in_flight(&self) -> Option<(u64, u32, PathMask, bool)> {
        let (&off, s) = self.segs.iter().next()?;
        (off == self.acked_base && s.payload.is_some() && !self.reinject.contains(&off)).then_some((
            off,
            s.len,
            s.paths_used,
            s.head_reinjected,
        ))
    }

    /// Everything written is placed, the writer has said where the data
    /// ends (FIN, or a burst's end), and some of it is unacknowledged: what
    /// is in flight is the flow's tail.
    pub fn tail_in_flight(&self) -> bool {
        self.unsent.is_empty() && self.reinject.is_empty() && self.held > 0 && (self.fin_requested || self.burst_end)
    }

    /// Queue for reinjection every unacknowledged segment placed only on
    /// paths of `slow`, once per segment (the same once as
    /// [`Self::reinject_head`]); returns how many were queued.
    pub fn reinject_from(&mut self, slow: PathMask) -> usize {
        let mut n = 0;
        for (&off, s) in self.segs.iter_mut() {
            if s.payload.is_some()
                && !s.head_reinjected
                && !s.paths_used.is_empty()
                && s.paths_used.minus(slow).is_empty()
                && self.reinject.insert(off)
            {
                s.head_reinjected = true;
                n += 1;
            }
        }
        n
    }

    /// Queue the head segment at `offset` for reinjection, once per
    /// segment; returns whether it was queued.
    pub fn reinject_head(&mut self, offset: u64) -> bool {
        match self.segs.get_mut(&offset) {
            Some(s) if s.payload.is_some() && !s.head_reinjected => {
                s.head_reinjected = true;
                self.reinject.insert(offset);
                true
            }
            _ => false,
        }
    }

    /// New data waits only for the peer's window.
    pub fn is_window_limited(&self) -> bool {
        !self.unsent.is_empty() && self.next_new >= self.max_data
    }
}

/// Autotuning never measures over less than this, so a burst of reads at
/// one instant (or paths with no RTT sample yet) cannot inflate a window.
pub const MIN_TUNING_RTT: Duration = Duration::from_millis(10);

/// Sizes of a receive window; see [`RecvStream::new`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowLimits {
    /// The window a connection starts with.
    pub initial: u64,
    /// The most autotuning grows it to.
    pub max: u64,
    /// The least memory pressure shrinks it to.
    pub min: u64,
}

/// Receiving half: reassembly with de-duplication, bounded by the window
/// this side advertises.
#[derive(Debug)]
pub struct RecvStream {
    /// In-order bytes the application has not read yet, starting at `read_off`.
    ready: VecDeque<u8>,
    read_off: u64,
    /// Out-of-order pieces above `contiguous_end()`, non-overlapping, with
    /// the bytes they hold in `ooo_bytes`.
    ooo: BTreeMap<u64, VecDeque<u8>>,
    ooo_bytes: u64,
    fin_off: Option<u64>,
    /// Current window: the most bytes the peer may send beyond `read_off`.
    window: u64,
    limits: WindowLimits,
    /// Limit last advertised to the peer.
    advertised: u64,
    /// Autotuning epoch: when it started, `read_off` and the bytes received then.
    epoch: Option<(Instant, u64, u64)>,
    /// A head-of-line stall in progress: since when bytes wait above a gap,
    /// and the in-order end then.
    hol: Option<(Instant, u64)>,
}

/// The peer broke flow control or changed the end of the stream.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecvError {
    #[error("peer sent bytes up to {end} beyond the advertised window {limit}")]
    FlowControl { end: u64, limit: u64 },
    #[error("peer moved the end of the stream from {old} to {new}")]
    FinChanged { old: u64, new: u64 },
    #[error(
        "peer sent {pieces} separate out-of-order pieces ({bytes} bytes): reassembly would cost more than the window"
    )]
    Fragmented { pieces: usize, bytes: u64 },
}

/// What one out-of-order piece costs beyond its bytes (its map entry, its
/// allocation's header), counted against the window so that a peer sending
/// tiny pieces with gaps between them cannot make reassembly cost many
/// times the window. A piece is a B-tree entry (key and a 32-byte
/// double-ended buffer, in leaves that ascending inserts leave about half
/// full) plus its allocation: about 80 bytes measured.
pub const PIECE_OVERHEAD: u64 = 96;

/// Out-of-order pieces may cost ([`PIECE_OVERHEAD`] each) this much beyond
/// the window before the peer breaks the protocol: 1024 pieces. A sender
/// of whole segments (16 KiB) needs one piece per gap, so 1024 gaps.
pub const PIECE_OVERHEAD_SLACK: u64 = 1024 * PIECE_OVERHEAD;

/// What either side may send on a new connection before the peer's first
/// WINDOW frame: a protocol constant, so the two ends never disagree about
/// a limit neither has announced.
pub const INITIAL_MAX_DATA: u64 = 64 * 1024;

/// A receiver advertises more window once reading has freed this fraction
/// of it (1/8). With 1/2, a sender held by the window gets its credit in
/// half-window steps, one way-trip late each, so it has between half and
/// all of the window to use: in virtual time, 8 MB over two carriers (8 and
/// 24 Mbit/s, 240 and 200 ms round trips) took 3.78 s with a fixed 1 MiB
/// window and 3.21 s with 1/8 (6.88 and 4.59 s at 512 KiB). WINDOW frames
/// are a few bytes, and go out at most once per acknowledgement.
pub const WINDOW_UPDATE_DIVISOR: u64 = 8;

/// Put `bytes` in front of `piece` (amortised O(`bytes.len()`)).
fn prepend(piece: &mut VecDeque<u8>, bytes: &[u8]) {
    piece.reserve(bytes.len());
    for &b in bytes.iter().rev() {
        piece.push_front(b);
    }
}

impl RecvStream {
    pub fn new(limits: WindowLimits) -> Self {
        let max = limits.max.max(1);
        let min = limits.min.clamp(1, max);
        let limits = WindowLimits { initial: limits.initial.clamp(min, max), max, min };
        RecvStream {
            ready: VecDeque::new(),
            read_off: 0,
            ooo: BTreeMap::new(),
            ooo_bytes: 0,
            fin_off: None,
            window: limits.initial,
            limits,
            advertised: INITIAL_MAX_DATA,
            epoch: None,
            hol: None,
        }
    }

    /// The limit to announce right after the connection opens, when the
    /// window exceeds the protocol's initial one.
    pub fn initial_window_update(&mut self) -> Option<u64> {
        (self.window > self.advertised).then(|| {
            self.advertised = self.window;
            self.window
        })
    }

    fn contiguous_end(&self) -> u64 {
        self.read_off + self.ready.len() as u64
    }

    /// Highest offset received so far (in order or not).
    fn high_end(&self) -> u64 {
        self.ooo.last_key_value().map_or(self.contiguous_end(), |(&o, v)| o + v.len() as u64)
    }

    /// Accept `[offset, offset + data.len())`. Bytes already held are
    /// ignored (the first copy wins). Returns the number of new bytes.
    pub fn insert(&mut self, offset: u64, data: &[u8], fin: bool) -> Result<u64, RecvError> {
        let end = offset.saturating_add(data.len() as u64);
        if end > self.advertised {
            return Err(RecvError::FlowControl { end, limit: self.advertised });
        }
        if fin {
            match self.fin_off {
                Some(old) if old != end => return Err(RecvError::FinChanged { old, new: end }),
                _ if end < self.high_end() => return Err(RecvError::FinChanged { old: self.high_end(), new: end }),
                _ => self.fin_off = Some(end),
            }
        }
        if let Some(f) = self.fin_off {
            if end > f {
                return Err(RecvError::FinChanged { old: f, new: end });
            }
        }
        let mut new_bytes = 0;
        let mut start = offset.max(self.contiguous_end());
        while start < end {
            // Find the first held piece at or after `start`, or one covering it.
            if let Some((&o, v)) = self.ooo.range(..=start).next_back() {
                let oe = o + v.len() as u64;
                if oe > start {
                    start = oe;
                    continue;
                }
            }
            let stop = match self.ooo.range(start..end).next() {
                Some((&o, _)) => o,
                None => end,
            };
            let piece = &data[(start - offset) as usize..(stop - offset) as usize];
            if !piece.is_empty() {
                self.store_piece(start, piece)?;
                new_bytes += piece.len() as u64;
            }
            start = stop;
        }
        // Move what became contiguous into the ready buffer.
        loop {
            let end = self.contiguous_end();
            match self.ooo.first_entry() {
                Some(entry) if *entry.key() == end => {
                    let v = entry.remove();
                    self.ooo_bytes -= v.len() as u64;
                    self.reserve_ready(v.len());
                    let (a, b) = v.as_slices();
                    self.ready.extend(a);
                    self.ready.extend(b);
                }
                _ => break,
            }
        }
        Ok(new_bytes)
    }

    /// Hold `piece` at `start` (a gap between held pieces, or above them):
    /// joined with the piece that ends at `start` and the one that begins
    /// where it ends, so contiguous arrivals above a gap share one
    /// allocation. Pieces are double-ended and two are joined by moving the
    /// smaller into the larger, so each byte is moved O(log n) times
    /// whatever the arrival order: a peer sending one-byte pieces in reverse
    /// order cannot make reassembly copy the window once per byte. Refused
    /// when the pieces would cost more than the window allows
    /// ([`PIECE_OVERHEAD`]).
    fn store_piece(&mut self, start: u64, piece: &[u8]) -> Result<(), RecvError> {
        let end = start + piece.len() as u64;
        let prev = self.ooo.range(..start).next_back().filter(|(&o, v)| o + v.len() as u64 == start).map(|(&o, _)| o);
        let joins_next = self.ooo.contains_key(&end);
        if prev.is_none() && !joins_next {
            let pieces = self.ooo.len() + 1;
            let cost = self.ooo_bytes + piece.len() as u64 + pieces as u64 * PIECE_OVERHEAD;
            let allowed = self.advertised.saturating_sub(self.read_off) + PIECE_OVERHEAD_SLACK;
            if cost > allowed {
                return Err(RecvError::Fragmented { pieces, bytes: self.ooo_bytes });
            }
        }
        self.ooo_bytes += piece.len() as u64;
        let next = if joins_next { self.ooo.remove(&end) } else { None };
        let (at, mut held) = match prev {
            Some(o) => {
                let mut p = self.ooo.remove(&o).expect("found above");
                p.extend(piece);
                (o, p)
            }
            None => match next {
                Some(mut n) => {
                    prepend(&mut n, piece);
                    self.ooo.insert(start, n);
                    return Ok(());
                }
                None => (start, VecDeque::from(piece.to_vec())),
            },
        };
        if let Some(mut n) = next {
            if held.len() >= n.len() {
                held.extend(n);
            } else {
                let (a, b) = held.as_slices();
                prepend(&mut n, b);
                prepend(&mut n, a);
                held = n;
            }
        }
        self.ooo.insert(at, held);
        Ok(())
    }

    /// Out-of-order pieces held (each its own allocation).
    pub fn out_of_order_pieces(&self) -> usize {
        self.ooo.len()
    }

    /// Head-of-line stall bookkeeping, after [`Self::insert`]: a stall is a
    /// period in which bytes wait above a gap while the in-order end stands
    /// still (data sent on a faster path waits for the head on a slower
    /// one). Returns the length of a stall that the arrival ended; a new
    /// stall starts at once when bytes still wait above the next gap.
    pub fn note_hol(&mut self, now: Instant) -> Option<Duration> {
        let end = self.contiguous_end();
        let mut ended = None;
        if let Some((since, at)) = self.hol {
            if end > at {
                ended = Some(now.saturating_duration_since(since));
                self.hol = None;
            }
        }
        if self.ooo_bytes > 0 && self.hol.is_none() {
            self.hol = Some((now, end));
        }
        ended
    }

    /// Room in the ready buffer for `n` more bytes: doubled (amortised
    /// copying) but never past the connection's commitment, which the
    /// budget has granted, so the buffer's capacity stays within it.
    fn reserve_ready(&mut self, n: usize) {
        let (len, cap) = (self.ready.len(), self.ready.capacity());
        let need = len + n;
        if need > cap {
            let target = (cap * 2).min(self.commitment() as usize).max(need);
            self.ready.reserve_exact(target - len);
        }
    }

    /// Give back ready-buffer capacity beyond the commitment (after the
    /// window shrank, or an advertisement beyond it was read up to).
    fn fit_ready(&mut self) {
        let commitment = self.commitment() as usize;
        if self.ready.capacity() > commitment {
            self.ready.shrink_to(commitment.max(self.ready.len()));
        }
    }

    /// Memory the receive side holds: the ready buffer's capacity and the
    /// pieces held above a gap.
    pub fn memory(&self) -> u64 {
        self.ready.capacity() as u64 + self.ooo_bytes
    }

    /// Read in-order bytes into `out`; returns how many.
    pub fn read(&mut self, out: &mut [u8]) -> usize {
        let n = out.len().min(self.ready.len());
        let (a, b) = self.ready.as_slices();
        if n <= a.len() {
            out[..n].copy_from_slice(&a[..n]);
        } else {
            out[..a.len()].copy_from_slice(a);
            out[a.len()..n].copy_from_slice(&b[..n - a.len()]);
        }
        self.ready.drain(..n);
        self.read_off += n as u64;
        self.fit_ready();
        n
    }

    pub fn readable(&self) -> usize {
        self.ready.len()
    }

    /// All bytes up to the FIN have been read.
    pub fn is_finished(&self) -> bool {
        self.fin_off == Some(self.read_off)
    }

    /// Every byte up to the FIN has arrived.
    pub fn fin_received(&self) -> bool {
        self.fin_off == Some(self.contiguous_end())
    }

    /// Cumulative point and up to `max` out-of-order ranges.
    pub fn ack_state(&self, max: usize) -> (u64, Vec<(u64, u64)>) {
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for (&o, v) in &self.ooo {
            let e = o + v.len() as u64;
            match ranges.last_mut() {
                Some(last) if last.1 == o => last.1 = e,
                _ => {
                    if ranges.len() == max {
                        break;
                    }
                    ranges.push((o, e));
                }
            }
        }
        (self.contiguous_end(), ranges)
    }

    /// A new window limit to advertise, when reading freed at least
    /// 1/[`WINDOW_UPDATE_DIVISOR`] of the window since the last
    /// advertisement, or the window grew.
    pub fn window_update(&mut self) -> Option<u64> {
        let limit = self.read_off + self.window;
        if limit >= self.advertised + self.window / WINDOW_UPDATE_DIVISOR {
            self.advertised = limit;
            Some(limit)
        } else {
            None
        }
    }

    /// Autotuning (after Linux MPTCP `mptcp_rcv_space_adjust`): once per
    /// `rtt_min` (the smallest smoothed RTT of the live paths), the window
    /// this connection would like: twice the bytes that moved per `rtt_max`
    /// (the largest), plus the out-of-order span, capped. The bytes that
    /// moved are those the application read or, while it keeps up (at most
    /// 1/[`WINDOW_UPDATE_DIVISOR`] of the window waits in order), those that
    /// arrived: a head held on a slow path starves the reader, and counting
    /// reads alone, the window that the gap fills up would never grow.
    /// Linux measures once per `rtt_max`; at a train's RTTs (a weak carrier
    /// at seconds) that held a 4 MB download at its initial window for most
    /// of its life. `Some` only when the wish exceeds the current window,
    /// i.e. when the window is what limits the connection: a sender held
    /// back by its paths delivers less than half a window per round trip,
    /// and a reader that does not keep up is counted by what it reads.
    pub fn wanted_window(&mut self, now: Instant, rtt_min: Duration, rtt_max: Duration) -> Option<u64> {
        let rtt = rtt_max.max(MIN_TUNING_RTT);
        let epoch = rtt_min.clamp(MIN_TUNING_RTT, rtt);
        // Every byte received so far, read, in order or above a gap.
        let received = self.read_off + self.buffered();
        let (t0, r0, a0) = *self.epoch.get_or_insert((now, self.read_off, received));
        let elapsed = now.saturating_duration_since(t0);
        if elapsed < epoch {
            return None;
        }
        self.epoch = Some((now, self.read_off, received));
        // Bytes that arrived count as well as bytes read while the reader
        // keeps up: data held above a gap (the head on a slow path) is what
        // the network could deliver, and the reader would take it.
        let keeps_up = self.ready.len() as u64 <= self.window / WINDOW_UPDATE_DIVISOR;
        let (read, arrived) = (self.read_off.saturating_sub(r0), received.saturating_sub(a0));
        let moved = if keeps_up { read.max(arrived) } else { read };
        let moved_per_rtt = (moved as u128 * rtt.as_nanos() / elapsed.as_nanos().max(1)) as u64;
        let ooo_span = self.high_end() - self.contiguous_end();
        let want = moved_per_rtt.saturating_mul(2).saturating_add(ooo_span).min(self.limits.max);
        (want > self.window).then_some(want)
    }

    /// Set the window (grown by a budget grant or shrunk under memory
    /// pressure, never below the minimum). Returns the new window.
    pub fn set_window(&mut self, window: u64) -> u64 {
        self.window = window.clamp(self.limits.min, self.limits.max);
        self.fit_ready();
        self.window
    }

    pub fn window(&self) -> u64 {
        self.window
    }

    pub fn limits(&self) -> WindowLimits {
        self.limits
    }

    /// Memory this direction may come to hold: the window, or more while
    /// an advertisement made before the window shrank is outstanding.
    pub fn commitment(&self) -> u64 {
        self.window.max(self.advertised.saturating_sub(self.read_off))
    }

    /// The flow-control limit last advertised to the peer.
    pub fn advertised(&self) -> u64 {
        self.advertised
    }

    /// Bytes held (ready plus out of order).
    pub fn buffered(&self) -> u64 {
        self.ready.len() as u64 + self.ooo_bytes
    }

    /// Bytes held out of order (arrived above a gap).
    pub fn out_of_order_bytes(&self) -> u64 {
        self.ooo_bytes
    }
}

/// Lifecycle of a connection as seen by one endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnState {
    Open,
    /// Reset by either side; kept only until the shell observes it.
    Reset,
}

/// A passenger connection inside an endpoint.
#[derive(Debug)]
pub struct Conn {
    pub id: ConnId,
    pub user: UserId,
    pub dst: SocketAddr,
    pub send: SendStream,
    pub recv: RecvStream,
    pub state: ConnState,
    /// Whether a data-level ACK (or WINDOW) should be sent.
    pub(crate) ack_pending: bool,
    pub(crate) window_pending: Option<u64>,
    /// OPEN not yet confirmed by any frame from the peer (relay side).
    pub(crate) open_unconfirmed: bool,
    /// The application has read the end of the stream ([`crate::Recv::Fin`]).
    /// Until then the connection stays, even with both directions complete:
    /// the last bytes it read may have come with the FIN already there, and
    /// its next read must find the end, not a connection that is gone.
    pub(crate) fin_read: bool,
    /// Bytes of the endpoint's memory budget this connection holds; equal
    /// to [`Conn::commitment`] after every endpoint call.
    pub(crate) charged: u64,
    /// Memory the shells hold for the connection (sockets, task, copy
    /// buffers), charged for its whole life.
    pub(crate) overhead: u64,
    /// Send-buffer memory reserved whether used or not (a hard budget's
    /// not-sent floor), so the floor is never granted beyond the budget.
    pub(crate) send_reserved: u64,
}

impl Conn {
    pub fn new(id: ConnId, user: UserId, dst: SocketAddr, send: SendLimits, window: WindowLimits) -> Self {
        Conn {
            id,
            user,
            dst,
            send: SendStream::new(send, INITIAL_MAX_DATA),
            recv: RecvStream::new(window),
            state: ConnState::Open,
            ack_pending: false,
            window_pending: None,
            open_unconfirmed: false,
            fin_read: false,
            charged: 0,
            overhead: 0,
            send_reserved: 0,
        }
    }

    /// Both directions are complete, and the application has read the end.
    pub fn is_closed(&self) -> bool {
        self.state == ConnState::Reset || (self.send.is_done() && self.fin_read)
    }

    /// Memory the connection holds or has promised: the shells' fixed
    /// overhead, its send buffer (capacity, at least what is reserved) and
    /// its receive window (or the receive buffers' capacity, if more).
    pub fn commitment(&self) -> u64 {
        self.overhead + self.send_part(self.send.memory()) + self.recv.commitment().max(self.recv.memory())
    }

    /// What the send side counts for, holding `memory` bytes.
    pub(crate) fn send_part(&self, memory: u64) -> u64 {
        memory.max(self.send_reserved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::PathId;

    fn win(w: u64) -> WindowLimits {
        WindowLimits { initial: w, max: w, min: w }
    }

    fn lim(cap: u64) -> SendLimits {
        SendLimits { cap, min_unsent: cap, initial_unsent: cap }
    }

    /// A stream with `n` bytes placed in segments of `seg` on path 0.
    fn sent(n: usize, seg: u32) -> SendStream {
        let mut s = SendStream::new(lim(1 << 20), 1 << 20);
        assert_eq!(s.write(&vec![3u8; n]), n);
        while let Some(p) = s.next_packet(seg) {
            s.on_scheduled(&p, PathMask::single(PathId(0)));
        }
        s
    }

    #[test]
    fn a_tail_in_flight_is_reinjected_from_slow_paths_once() {
        let mut s = SendStream::new(lim(1 << 20), 1 << 20);
        s.write(&[1u8; 48_000]);
        let mut k = 0;
        while let Some(p) = s.next_packet(16_000) {
            s.on_scheduled(&p, PathMask::single(PathId(k % 2)));
            k += 1;
        }
        assert!(!s.tail_in_flight(), "the writer has not said where the data ends");
        s.finish();
        assert!(s.tail_in_flight());
        let slow = PathMask::single(PathId(1));
        assert_eq!(s.reinject_from(slow), 1, "the segment at 16 000 is on path 1 only");
        assert!(!s.tail_in_flight(), "a reinjection waits to be placed");
        let p = s.next_packet(16_000).unwrap();
        assert_eq!((p.offset, p.reinjection), (16_000, true));
        s.on_scheduled(&p, PathMask::single(PathId(0)));
        assert!(s.tail_in_flight());
        assert_eq!(s.reinject_from(slow), 0, "once per segment");
        s.on_ack(48_000, true, &[]).unwrap();
        assert!(!s.tail_in_flight(), "nothing unacknowledged");
    }

    #[test]
    fn an_ack_inside_a_segment_or_beyond_what_was_sent_is_an_error_not_a_panic() {
        let mut s = sent(20_000, 16_000);
        assert_eq!(s.on_ack(100, false, &[]), Err(AckError::InsideSegment { cumulative: 100, offset: 0, len: 16_000 }));
        assert_eq!(s.on_ack(20_001, false, &[]), Err(AckError::BeyondSent { cumulative: 20_001, sent: 20_000 }));
        assert_eq!(s.buffered(), 20_000, "a rejected acknowledgement changes nothing");
        assert_eq!(s.segment_payload(0).map(Bytes::len), Some(16_000));
        assert_eq!(s.on_ack(16_000, false, &[]), Ok(16_000));
        assert_eq!(s.segment_payload(16_000).map(Bytes::len), Some(4_000));
        assert!(s.on_ack(u64::MAX, true, &[(u64::MAX - 1, u64::MAX)]).is_err());
    }

    #[test]
    fn the_window_head_is_reinjected_at_most_once() {
        let mut s = sent(48_000, 16_000);
        let (off, len, paths, done) = s.head_in_flight().unwrap();
        assert_eq!((off, len, paths, done), (0, 16_000, PathMask::single(PathId(0)), false));
        assert!(s.reinject_head(0));
        assert_eq!(s.head_in_flight(), None, "queued for reinjection, not in flight");
        let p = s.next_packet(16_000).unwrap();
        assert!(p.reinjection && p.offset == 0);
        s.on_scheduled(&p, PathMask::single(PathId(1)));
        assert_eq!(s.head_in_flight().map(|h| h.3), Some(true));
        assert!(!s.reinject_head(0), "once per segment");
        s.on_ack(16_000, false, &[]).unwrap();
        assert!(s.reinject_head(16_000), "the next head may be reinjected in turn");
    }

    #[test]
    fn a_sack_frees_the_payload_at_once_and_is_never_reneged() {
        let mut s = sent(48_000, 16_000);
        assert_eq!(s.buffered(), 48_000);
        // The middle segment arrived over a fast path; the first is stuck.
        assert_eq!(s.on_ack(0, false, &[(16_000, 32_000)]), Ok(16_000));
        assert_eq!(s.buffered(), 32_000);
        assert!(!s.is_unacked(16_000));
        assert_eq!(s.requeue(16_000), None, "a SACKed segment is never sent again");
        assert_eq!(s.requeue(0), Some(16_000));
        // A later ACK without the range does not bring it back.
        assert_eq!(s.on_ack(0, false, &[]), Ok(0));
        assert!(!s.is_unacked(16_000));
        assert_eq!(s.on_ack(48_000, false, &[]), Ok(32_000));
        assert_eq!(s.buffered(), 0);
    }

    #[test]
    fn the_initial_mark_lies_between_the_floor_and_the_cap() {
        let s =
            SendStream::new(SendLimits { cap: 256 * 1024, min_unsent: 64 * 1024, initial_unsent: 1 << 20 }, 1 << 30);
        assert_eq!(s.unsent_limit(), 256 * 1024);
        let s = SendStream::new(SendLimits { cap: 8 << 20, min_unsent: 64 * 1024, initial_unsent: 1024 }, 1 << 30);
        assert_eq!(s.unsent_limit(), 64 * 1024);
    }

    #[test]
    fn unsent_bytes_are_kept_to_about_two_round_trips_of_the_delivery_rate() {
        let t0 = Instant::now();
        let rtt = Duration::from_millis(100);
        let mut s =
            SendStream::new(SendLimits { cap: 8 << 20, min_unsent: 64 * 1024, initial_unsent: 1 << 20 }, u64::MAX / 2);
        assert_eq!(s.room(), 1 << 20, "before any rate is known: the initial mark");
        // The peer acknowledges 1 MB per 100 ms.
        let mut t = t0;
        s.update_rate(t, rtt);
        for _ in 0..5 {
            let mut placed = 0;
            while placed < 1_000_000 {
                let n = s.write(&vec![0u8; 1_000_000 - placed]);
                assert!(n > 0);
                placed += n;
                while let Some(p) = s.next_packet(16_000) {
                    s.on_scheduled(&p, PathMask::single(PathId(0)));
                }
            }
            let end = s.next_new;
            s.on_ack(end, false, &[]).unwrap();
            t += rtt;
            s.update_rate(t, rtt);
        }
        assert_eq!(s.unsent_limit(), 2_000_000, "two round trips of 1 MB each");
        assert_eq!(s.room(), 2_000_000);
        // The rate falls to nothing: back to the floor.
        t += rtt * 5;
        s.update_rate(t, rtt);
        assert_eq!(s.unsent_limit(), 64 * 1024);
    }

    #[test]
    fn the_window_grows_only_while_it_is_what_limits_the_reader() {
        let t0 = Instant::now();
        let rtt = Duration::from_millis(50);
        let lim = WindowLimits { initial: 128 * 1024, max: 4 << 20, min: 64 * 1024 };
        // A slow sender: 16 KiB per RTT against a 128 KiB window.
        let mut r = RecvStream::new(lim);
        r.initial_window_update();
        let mut buf = vec![0u8; 8 << 20];
        let mut off = 0u64;
        for i in 1..=20u32 {
            r.insert(off, &[1u8; 16 * 1024], false).unwrap();
            off += 16 * 1024;
            r.read(&mut buf);
            r.window_update();
            assert_eq!(r.wanted_window(t0 + rtt * i, rtt, rtt), None, "round {i}");
        }
        // A sender that fills the window every RTT: it doubles each time.
        let mut r = RecvStream::new(lim);
        r.initial_window_update();
        let mut off = 0u64;
        let mut windows = vec![r.window()];
        r.wanted_window(t0, rtt, rtt);
        for i in 1..=8u32 {
            let w = r.advertised() - off;
            r.insert(off, &vec![1u8; w as usize], false).unwrap();
            off += w;
            r.read(&mut buf);
            if let Some(want) = r.wanted_window(t0 + rtt * i, rtt, rtt) {
                r.set_window(want);
            }
            r.window_update();
            windows.push(r.window());
        }
        assert_eq!(windows[..4], [128 * 1024, 256 * 1024, 512 * 1024, 1024 * 1024]);
        assert_eq!(*windows.last().unwrap(), 4 << 20, "capped: {windows:?}");
        assert_eq!(r.set_window(1), 64 * 1024, "never below the minimum");
        assert_eq!(r.commitment(), r.advertised() - off, "the outstanding advertisement still counts");
    }

    #[test]
    fn the_window_grows_for_data_held_above_a_gap_and_for_the_slowest_path() {
        let t0 = Instant::now();
        let (fast, slow) = (Duration::from_millis(40), Duration::from_millis(400));
        let lim = WindowLimits { initial: 1 << 20, max: 8 << 20, min: 64 * 1024 };
        // The head (64 KiB) is on the slow path; the fast one fills the rest
        // of the window within its round trip. The reader keeps up (nothing
        // in order to read yet), so the window must grow although nothing
        // was read: to what the fast path delivered per slow round trip.
        let mut r = RecvStream::new(lim);
        r.initial_window_update();
        assert_eq!(r.wanted_window(t0, fast, slow), None);
        r.insert(64 * 1024, &vec![1u8; (1 << 20) - 64 * 1024], false).unwrap();
        let want = r.wanted_window(t0 + fast, fast, slow).expect("window-limited above the gap");
        assert_eq!(want, 8 << 20, "960 KiB per 40 ms is 9.4 MiB per 400 ms: capped");
        // A reader that does not keep up: arrivals do not count, only reads.
        let mut r = RecvStream::new(lim);
        r.initial_window_update();
        assert_eq!(r.wanted_window(t0, fast, slow), None);
        r.insert(0, &vec![1u8; 1 << 20], false).unwrap();
        assert_eq!(r.wanted_window(t0 + fast, fast, slow), None, "a full buffer is the reader's limit");
    }

    #[test]
    fn reassembly_keeps_the_first_copy_and_orders_bytes() {
        let mut r = RecvStream::new(win(1000));
        assert_eq!(r.insert(5, b"FGHIJ", false).unwrap(), 5);
        assert_eq!(r.insert(3, b"xxfgh", false).unwrap(), 2, "only bytes 3..5 are new");
        assert_eq!(r.insert(0, b"ABC", false).unwrap(), 3);
        let mut out = [0u8; 16];
        let n = r.read(&mut out);
        assert_eq!(&out[..n], b"ABCxxFGHIJ");
        assert_eq!(r.insert(0, b"ABCDEFGHIJ", false).unwrap(), 0, "duplicates change nothing");
    }

    #[test]
    fn overlapping_pieces_fill_only_the_gaps() {
        let mut r = RecvStream::new(win(1000));
        r.insert(2, b"cd", false).unwrap();
        r.insert(6, b"gh", false).unwrap();
        assert_eq!(r.insert(1, b"BCDEFGHI", false).unwrap(), 4);
        r.insert(0, b"a", false).unwrap();
        let mut out = [0u8; 16];
        let n = r.read(&mut out);
        assert_eq!(&out[..n], b"aBcdEFghI");
    }

    #[test]
    fn data_beyond_the_window_is_a_flow_control_error() {
        let mut r = RecvStream::new(win(10));
        let end = INITIAL_MAX_DATA + 1;
        assert_eq!(
            r.insert(5, &vec![0u8; end as usize - 5], false),
            Err(RecvError::FlowControl { end, limit: INITIAL_MAX_DATA })
        );
        let mut big = RecvStream::new(win(1 << 20));
        assert_eq!(big.initial_window_update(), Some(1 << 20));
        assert!(big.insert(0, &vec![0u8; 100_000], false).is_ok());
    }

    #[test]
    fn window_reopens_after_reading_an_eighth_of_it() {
        let w = INITIAL_MAX_DATA;
        let mut r = RecvStream::new(win(w));
        r.insert(0, &vec![7u8; w as usize], false).unwrap();
        assert_eq!(r.window_update(), None);
        let mut out = vec![0u8; (w / 16) as usize];
        r.read(&mut out);
        assert_eq!(r.window_update(), None, "a sixteenth read: not yet");
        r.read(&mut out);
        assert_eq!(r.window_update(), Some(w + w / 8));
        r.read(&mut out);
        assert_eq!(r.window_update(), None, "the next sixteenth waits for another eighth");
    }

    #[test]
    fn ack_state_reports_sack_ranges() {
        let mut r = RecvStream::new(win(100));
        r.insert(0, b"ab", false).unwrap();
        r.insert(4, b"ef", false).unwrap();
        r.insert(6, b"gh", false).unwrap();
        r.insert(10, b"k", false).unwrap();
        assert_eq!(r.ack_state(8), (2, vec![(4, 8), (10, 11)]));
        assert_eq!(r.ack_state(1), (2, vec![(4, 8)]));
    }

    #[test]
    fn fin_must_not_move() {
        let mut r = RecvStream::new(win(100));
        r.insert(0, b"abc", true).unwrap();
        assert!(r.fin_received());
        assert!(r.insert(0, b"abcd", false).is_err());
        assert!(r.insert(0, b"ab", true).is_err());
    }

    #[test]
    fn send_stream_segments_acks_and_reinjection() {
        let mut s = SendStream::new(lim(100), 1000);
        assert_eq!(s.write(&[7u8; 30]), 30);
        let p = s.next_packet(16).unwrap();
        assert_eq!((p.offset, p.len, p.fin, p.reinjection), (0, 16, false, false));
        s.on_scheduled(&p, PathMask::single(PathId(0)));
        let p2 = s.next_packet(16).unwrap();
        assert_eq!((p2.offset, p2.len), (16, 14));
        s.on_scheduled(&p2, PathMask::single(PathId(1)));
        assert!(s.next_packet(16).is_none());
        // Path 0 fails: its segment returns, and goes first.
        assert_eq!(s.requeue(0), Some(16));
        let r = s.next_packet(16).unwrap();
        assert!(r.reinjection);
        assert_eq!(r.paths_used, PathMask::single(PathId(0)));
        // A SACK of the reinjected segment removes it from the queue.
        s.on_ack(0, false, &[(0, 16)]).unwrap();
        assert!(s.next_packet(16).is_none());
        assert_eq!(s.on_ack(30, false, &[]).unwrap(), 14, "the SACKed segment was freed before");
        assert_eq!(s.buffered(), 0);
    }

    #[test]
    fn fin_rides_the_last_segment_or_goes_alone() {
        let mut s = SendStream::new(lim(100), 1000);
        s.write(b"abc");
        s.finish();
        let p = s.next_packet(16).unwrap();
        assert!(p.fin && p.len == 3);
        s.on_scheduled(&p, PathMask::single(PathId(0)));
        assert!(s.next_packet(16).is_none());
        s.on_ack(3, true, &[]).unwrap();
        assert!(s.is_done());

        let mut d = SendStream::new(lim(100), 1000);
        d.write(b"abcdef");
        d.finish();
        let p = d.next_packet(4).unwrap();
        d.on_scheduled(&p, PathMask::single(PathId(0)));
        let q = d.next_packet(4).unwrap();
        assert!(q.fin);
        d.on_scheduled(&q, PathMask::single(PathId(1)));
        assert_eq!(d.on_delivered(4), 2, "second segment first: freed at once, above the gap");
        assert_eq!(d.on_delivered(0), 4);
        assert!(d.is_done(), "delivery of the FIN segment completes the stream");

        let mut e = SendStream::new(lim(100), 1000);
        e.finish();
        let p = e.next_packet(16).unwrap();
        assert!(p.fin && p.len == 0);
    }

    #[test]
    fn a_head_of_line_stall_lasts_from_the_first_byte_above_a_gap_until_the_gap_fills() {
        let t0 = Instant::now();
        let ms = |v: u64| t0 + Duration::from_millis(v);
        let mut r = RecvStream::new(win(1000));
        // In order: no stall.
        r.insert(0, &[0; 10], false).unwrap();
        assert_eq!(r.note_hol(ms(0)), None);
        assert!(r.hol.is_none());
        // Bytes above a gap start one.
        r.insert(20, &[0; 10], false).unwrap();
        assert_eq!(r.note_hol(ms(5)), None);
        r.insert(40, &[0; 10], false).unwrap();
        assert_eq!(r.note_hol(ms(30)), None, "more out-of-order bytes continue the stall");
        // The first gap fills: the stall (5..50 ms) ends, a new one begins
        // behind the second gap.
        r.insert(10, &[0; 10], false).unwrap();
        assert_eq!(r.note_hol(ms(50)), Some(Duration::from_millis(45)));
        assert_eq!(r.hol, Some((ms(50), 30)));
        r.insert(30, &[0; 10], false).unwrap();
        assert_eq!(r.note_hol(ms(60)), Some(Duration::from_millis(10)));
        assert!(r.hol.is_none(), "nothing waits any more");
        // A duplicate changes nothing.
        r.insert(0, &[0; 10], false).unwrap();
        assert_eq!(r.note_hol(ms(70)), None);
    }

    #[test]
    fn a_blocked_writer_is_woken_once_half_the_low_water_mark_is_free_not_per_segment() {
        // Low-water mark 64 KiB (the floor), cap 1 MiB.
        let mut s =
            SendStream::new(SendLimits { cap: 1 << 20, min_unsent: 64 * 1024, initial_unsent: 64 * 1024 }, 1 << 20);
        assert_eq!(s.write(&[1u8; 100 * 1024]), 64 * 1024);
        let t0 = Instant::now();
        s.note_write(true, t0);
        let mut placed = 0;
        while !s.writer_wake_due() {
            let p = s.next_packet(8 * 1024).expect("unsent data");
            s.on_scheduled(&p, PathMask::single(PathId(0)));
            placed += 1;
        }
        assert_eq!(placed, 4, "woken after 32 KiB of 64 KiB were placed, not after the first segment");
        assert_eq!(s.room(), 32 * 1024);
        s.unblock_writer(t0 + Duration::from_millis(7));
        assert!(!s.writer_wake_due(), "a writer that is not waiting is never woken");
        assert_eq!(s.send_limited_noted(), Duration::from_millis(7));
    }

    #[test]
    fn flow_control_limits_new_data() {
        let mut s = SendStream::new(lim(100), 10);
        s.write(&[1u8; 50]);
        let p = s.next_packet(64).unwrap();
        assert_eq!(p.len, 10);
        s.on_scheduled(&p, PathMask::single(PathId(0)));
        assert!(s.next_packet(64).is_none());
        s.set_max_data(30);
        assert_eq!(s.next_packet(64).unwrap().len, 20);
    }

    /// The send side counts its buffer's capacity and the segment each
    /// unsent byte will be copied into, not only the bytes; a drained
    /// buffer keeps no more than the floor.
    #[test]
    fn send_memory_counts_capacity_and_segment_copies_and_a_drained_buffer_shrinks_to_the_floor() {
        let limits = SendLimits { cap: 1 << 20, min_unsent: 64 * 1024, initial_unsent: 1 << 20 };
        let mut s = SendStream::new(limits, 1 << 30);
        let predicted = s.memory_after_write(100_000, false);
        assert_eq!(s.write(&vec![1u8; 100_000]), 100_000);
        assert_eq!(s.memory(), predicted, "the prediction is what the write takes");
        assert!(s.memory() >= 200_000, "{}: the buffer and the segments to come", s.memory());
        // Exact growth when the budget has no room to double the buffer.
        let room = s.room_within(s.memory() + 50_000);
        let before = s.memory();
        assert_eq!(s.write_with(&vec![2u8; room], true), room);
        assert!(s.memory() <= before + 50_000, "{} > {}", s.memory(), before + 50_000);
        while let Some(p) = s.next_packet(16_000) {
            s.on_scheduled(&p, PathMask::single(PathId(0)));
        }
        assert_eq!(s.unsent(), 0);
        let held = (100_000 + room) as u64;
        assert_eq!(s.memory(), held + 32 * 1024, "segments held, the buffer back to half the floor");
        // With every segment acknowledged, the floor alone has room for a write.
        s.on_ack(held, false, &[]).unwrap();
        assert!(s.room_within(64 * 1024) >= 16 * 1024, "room {}", s.room_within(64 * 1024));
    }

    /// The receive side's ready buffer never grows past the window granted
    /// (its commitment), however the bytes arrive.
    #[test]
    fn the_ready_buffer_never_grows_past_the_commitment() {
        let w = INITIAL_MAX_DATA;
        let mut r = RecvStream::new(win(w));
        let piece = vec![5u8; 1000];
        // In reverse order: everything sits above a gap until the first piece.
        for i in (0..w / 1000).rev() {
            r.insert(i * 1000, &piece, false).unwrap();
            assert!(r.ready.capacity() as u64 <= r.commitment());
        }
        assert_eq!(r.readable() as u64, w / 1000 * 1000);
        assert!(r.memory() <= r.commitment(), "{} > {}", r.memory(), r.commitment());
    }
}
