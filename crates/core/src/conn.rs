//! One passenger connection: a bounded send buffer with data-level
//! sequencing and reinjection bookkeeping, and a bounded reassembly buffer
//! that keeps the first copy of every byte.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;

use crate::ids::{ConnId, PathMask, UserId};

/// Sending half: bytes the local application wrote, kept until the peer
/// acknowledges them at the data level.
#[derive(Debug)]
pub struct SendStream {
    /// Bytes `[acked_base, acked_base + buf.len())`.
    buf: VecDeque<u8>,
    acked_base: u64,
    capacity: usize,
    /// Lowest offset never sent.
    next_new: u64,
    /// Segments sent at least once and not yet cumulatively acknowledged.
    segs: BTreeMap<u64, SegMeta>,
    /// Offsets of segments thrown back for reinjection (lazy: they are
    /// scheduled again like new data, lowest offset first).
    reinject: BTreeSet<u64>,
    /// Peer's flow-control limit.
    max_data: u64,
    fin_requested: bool,
    fin_acked: bool,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct SegMeta {
    pub len: u32,
    pub fin: bool,
    /// Paths this segment has been placed on; a reinjection never goes back.
    pub paths_used: PathMask,
    pub sacked: bool,
}

/// The next packet of a flow, as the scheduler sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NextPacket {
    pub offset: u64,
    pub len: u32,
    pub fin: bool,
    pub reinjection: bool,
    pub paths_used: PathMask,
}

impl SendStream {
    pub fn new(capacity: usize, initial_max_data: u64) -> Self {
        SendStream {
            buf: VecDeque::new(),
            acked_base: 0,
            capacity,
            next_new: 0,
            segs: BTreeMap::new(),
            reinject: BTreeSet::new(),
            max_data: initial_max_data,
            fin_requested: false,
            fin_acked: false,
        }
    }

    /// Free space for the application to write.
    pub fn room(&self) -> usize {
        if self.fin_requested {
            0
        } else {
            self.capacity.saturating_sub(self.buf.len())
        }
    }

    /// Accept up to `room()` bytes; returns how many were taken.
    pub fn write(&mut self, data: &[u8]) -> usize {
        let n = data.len().min(self.room());
        self.buf.extend(&data[..n]);
        n
    }

    pub fn finish(&mut self) {
        self.fin_requested = true;
    }

    pub fn fin_requested(&self) -> bool {
        self.fin_requested
    }

    /// Everything written, including the FIN, is acknowledged.
    pub fn is_done(&self) -> bool {
        self.fin_acked && self.buf.is_empty()
    }

    fn write_end(&self) -> u64 {
        self.acked_base + self.buf.len() as u64
    }

    /// Bytes of this flow not sent yet (new data plus reinjections).
    pub fn remaining_bytes(&self) -> u64 {
        let re: u64 = self.reinject.iter().filter_map(|o| self.segs.get(o)).map(|s| u64::from(s.len)).sum();
        self.write_end() - self.next_new + re
    }

    /// The lowest unsent packet, reinjections included, limited by flow
    /// control and by `segment_bytes`.
    pub fn next_packet(&self, segment_bytes: u32) -> Option<NextPacket> {
        if let Some(&off) = self.reinject.iter().next() {
            let s = self.segs[&off];
            return Some(NextPacket {
                offset: off,
                len: s.len,
                fin: s.fin,
                reinjection: true,
                paths_used: s.paths_used,
            });
        }
        let end = self.write_end();
        let limit = end.min(self.max_data);
        let avail = limit.saturating_sub(self.next_new);
        let fin_unsent = self.fin_requested && !self.segs.values().any(|s| s.fin) && !self.fin_acked;
        if avail == 0 && !(fin_unsent && self.next_new == end) {
            return None;
        }
        let len = avail.min(u64::from(segment_bytes)) as u32;
        let fin = fin_unsent && self.next_new + u64::from(len) == end;
        Some(NextPacket { offset: self.next_new, len, fin, reinjection: false, paths_used: PathMask::EMPTY })
    }

    /// Mark `pkt` as placed on `paths`.
    pub fn on_scheduled(&mut self, pkt: &NextPacket, paths: PathMask) {
        if pkt.reinjection {
            self.reinject.remove(&pkt.offset);
            if let Some(s) = self.segs.get_mut(&pkt.offset) {
                s.paths_used = s.paths_used.union(paths);
            }
        } else {
            debug_assert_eq!(pkt.offset, self.next_new);
            self.segs.insert(pkt.offset, SegMeta { len: pkt.len, fin: pkt.fin, paths_used: paths, sacked: false });
            self.next_new += u64::from(pkt.len);
        }
    }

    /// Add paths to a segment already scheduled (redundant copies).
    pub fn add_paths(&mut self, offset: u64, paths: PathMask) {
        if let Some(s) = self.segs.get_mut(&offset) {
            s.paths_used = s.paths_used.union(paths);
        }
    }

    /// Throw a sent segment back into the send buffer for reinjection.
    /// Returns whether it was still unacknowledged (and so queued).
    pub fn requeue(&mut self, offset: u64) -> Option<u32> {
        match self.segs.get(&offset) {
            Some(s) if !s.sacked => {
                self.reinject.insert(offset);
                Some(s.len)
            }
            _ => None,
        }
    }

    /// Forget that a segment used `paths` (its copies there are lost).
    pub fn forget_paths(&mut self, offset: u64, paths: PathMask) {
        if let Some(s) = self.segs.get_mut(&offset) {
            s.paths_used = s.paths_used.minus(paths);
        }
    }

    /// Whether a segment still needs delivering (not acknowledged).
    pub fn is_unacked(&self, offset: u64) -> bool {
        self.segs.get(&offset).is_some_and(|s| !s.sacked)
    }

    /// Copy `[offset, offset + len)` of the stream into `out`.
    pub fn copy_range(&self, offset: u64, len: u32, out: &mut Vec<u8>) {
        let start = (offset - self.acked_base) as usize;
        let end = start + len as usize;
        let (a, b) = self.buf.as_slices();
        if end <= a.len() {
            out.extend_from_slice(&a[start..end]);
        } else if start >= a.len() {
            out.extend_from_slice(&b[start - a.len()..end - a.len()]);
        } else {
            out.extend_from_slice(&a[start..]);
            out.extend_from_slice(&b[..end - a.len()]);
        }
    }

    /// Process a data-level acknowledgement. Returns the bytes freed.
    pub fn on_ack(&mut self, cumulative: u64, fin: bool, sack: &[(u64, u64)]) -> u64 {
        let base = self.acked_base;
        let mut freed = self.apply_ack(cumulative, fin, sack);
        // Segments just above a new cumulative point may already be known
        // delivered (by a path-level ack, see `on_delivered`), waiting only
        // for the gap below them. Fold them in now: a peer that has closed
        // the connection sends no further data-level ACK, so otherwise the
        // stream, and its FIN, would never complete.
        if self.acked_base > base {
            let (cum, fin) = self.delivered_run();
            if cum > self.acked_base || (fin && !self.fin_acked) {
                freed += self.apply_ack(cum, fin, &[]);
            }
        }
        freed
    }

    /// End of the run of delivered segments starting at the cumulative
    /// point, and whether the run carries the FIN.
    fn delivered_run(&self) -> (u64, bool) {
        let mut cum = self.acked_base;
        let mut fin = false;
        for (&off, s) in &self.segs {
            if off != cum || !s.sacked {
                break;
            }
            cum += u64::from(s.len);
            fin |= s.fin;
        }
        (cum, fin)
    }

    fn apply_ack(&mut self, cumulative: u64, fin: bool, sack: &[(u64, u64)]) -> u64 {
        let cum = cumulative.min(self.next_new.max(self.acked_base));
        let mut freed = 0;
        if cum > self.acked_base {
            freed = cum - self.acked_base;
            self.buf.drain(..freed as usize);
            self.acked_base = cum;
            // Drop segments wholly below the cumulative point.
            let keep = self.segs.split_off(&cum);
            for (off, s) in std::mem::replace(&mut self.segs, keep) {
                if off + u64::from(s.len) > cum {
                    // A segment straddling cum cannot happen: acks arrive on
                    // segment boundaries. Keep it to be safe.
                    self.segs.insert(off, s);
                } else {
                    self.reinject.remove(&off);
                }
            }
        }
        for &(s, e) in sack {
            for (off, seg) in self.segs.range_mut(s..e) {
                if off + u64::from(seg.len) <= e {
                    seg.sacked = true;
                    self.reinject.remove(off);
                }
            }
        }
        if fin && self.fin_requested && self.acked_base == self.write_end() && self.next_new == self.write_end() {
            self.fin_acked = true;
            self.segs.clear();
            self.reinject.clear();
        }
        freed
    }

    /// The segment at `offset` reached the peer's endpoint (its frame was
    /// acknowledged at path level, which the peer sends only after
    /// processing the frame). Advances the cumulative point over delivered
    /// segments. Returns the bytes freed.
    pub fn on_delivered(&mut self, offset: u64) -> u64 {
        match self.segs.get_mut(&offset) {
            Some(s) => s.sacked = true,
            None => return 0,
        }
        self.reinject.remove(&offset);
        let (cum, fin) = self.delivered_run();
        self.on_ack(cum, fin, &[])
    }

    /// Bytes sent and not yet acknowledged, plus the room the peer's window
    /// leaves for new data.
    pub fn window_room(&self) -> u64 {
        self.max_data.saturating_sub(self.next_new)
    }

    pub fn set_max_data(&mut self, max_data: u64) {
        self.max_data = self.max_data.max(max_data);
    }

    pub fn max_data(&self) -> u64 {
        self.max_data
    }

    /// Bytes held (written and not yet acknowledged).
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }
}

/// Receiving half: reassembly with de-duplication, bounded by the window
/// this side advertises.
#[derive(Debug)]
pub struct RecvStream {
    /// In-order bytes the application has not read yet, starting at `read_off`.
    ready: VecDeque<u8>,
    read_off: u64,
    /// Out-of-order pieces above `contiguous_end()`, non-overlapping.
    ooo: BTreeMap<u64, Vec<u8>>,
    fin_off: Option<u64>,
    window: u64,
    /// Limit last advertised to the peer.
    advertised: u64,
}

/// The peer broke flow control or changed the end of the stream.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecvError {
    #[error("peer sent bytes up to {end} beyond the advertised window {limit}")]
    FlowControl { end: u64, limit: u64 },
    #[error("peer moved the end of the stream from {old} to {new}")]
    FinChanged { old: u64, new: u64 },
}

/// What either side may send on a new connection before the peer's first
/// WINDOW frame: a protocol constant, so the two ends never disagree about
/// a limit neither has announced.
pub const INITIAL_MAX_DATA: u64 = 64 * 1024;

impl RecvStream {
    pub fn new(window: u64) -> Self {
        RecvStream {
            ready: VecDeque::new(),
            read_off: 0,
            ooo: BTreeMap::new(),
            fin_off: None,
            window,
            advertised: INITIAL_MAX_DATA,
        }
    }

    /// The limit to announce right after the connection opens, when the
    /// configured window exceeds the protocol's initial one.
    pub fn initial_window_update(&mut self) -> Option<u64> {
        (self.window > self.advertised).then(|| {
            self.advertised = self.window;
            self.window
        })
    }

    fn contiguous_end(&self) -> u64 {
        self.read_off + self.ready.len() as u64
    }

    /// Accept `[offset, offset + data.len())`. Bytes already held are
    /// ignored (the first copy wins). Returns the number of new bytes.
    pub fn insert(&mut self, offset: u64, data: &[u8], fin: bool) -> Result<u64, RecvError> {
        let end = offset + data.len() as u64;
        if end > self.advertised {
            return Err(RecvError::FlowControl { end, limit: self.advertised });
        }
        if fin {
            match self.fin_off {
                Some(old) if old != end => return Err(RecvError::FinChanged { old, new: end }),
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
                new_bytes += piece.len() as u64;
                self.ooo.insert(start, piece.to_vec());
            }
            start = stop;
        }
        // Move what became contiguous into the ready buffer.
        loop {
            let end = self.contiguous_end();
            match self.ooo.first_entry() {
                Some(entry) if *entry.key() == end => {
                    let v = entry.remove();
                    self.ready.extend(v);
                }
                _ => break,
            }
        }
        Ok(new_bytes)
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

    /// A new window limit to advertise, when reading freed at least half a
    /// window since the last advertisement.
    pub fn window_update(&mut self) -> Option<u64> {
        let limit = self.read_off + self.window;
        if limit >= self.advertised + self.window / 2 {
            self.advertised = limit;
            Some(limit)
        } else {
            None
        }
    }

    /// The flow-control limit last advertised to the peer.
    pub fn advertised(&self) -> u64 {
        self.advertised
    }

    /// Bytes held (ready plus out of order).
    pub fn buffered(&self) -> u64 {
        self.ready.len() as u64 + self.ooo.values().map(|v| v.len() as u64).sum::<u64>()
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
}

impl Conn {
    pub fn new(id: ConnId, user: UserId, dst: SocketAddr, send_capacity: usize, window: u64) -> Self {
        Conn {
            id,
            user,
            dst,
            send: SendStream::new(send_capacity, INITIAL_MAX_DATA),
            recv: RecvStream::new(window),
            state: ConnState::Open,
            ack_pending: false,
            window_pending: None,
            open_unconfirmed: false,
        }
    }

    /// Both directions are complete.
    pub fn is_closed(&self) -> bool {
        self.state == ConnState::Reset || (self.send.is_done() && self.recv.is_finished())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::PathId;

    #[test]
    fn reassembly_keeps_the_first_copy_and_orders_bytes() {
        let mut r = RecvStream::new(1000);
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
        let mut r = RecvStream::new(1000);
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
        let mut r = RecvStream::new(10);
        let end = INITIAL_MAX_DATA + 1;
        assert_eq!(
            r.insert(5, &vec![0u8; end as usize - 5], false),
            Err(RecvError::FlowControl { end, limit: INITIAL_MAX_DATA })
        );
        let mut big = RecvStream::new(1 << 20);
        assert_eq!(big.initial_window_update(), Some(1 << 20));
        assert!(big.insert(0, &vec![0u8; 100_000], false).is_ok());
    }

    #[test]
    fn window_reopens_after_reading_half_of_it() {
        let w = INITIAL_MAX_DATA;
        let mut r = RecvStream::new(w);
        r.insert(0, &vec![7u8; w as usize], false).unwrap();
        assert_eq!(r.window_update(), None);
        let mut out = vec![0u8; (w / 4) as usize];
        r.read(&mut out);
        assert_eq!(r.window_update(), None);
        r.read(&mut out);
        assert_eq!(r.window_update(), Some(w + w / 2));
    }

    #[test]
    fn ack_state_reports_sack_ranges() {
        let mut r = RecvStream::new(100);
        r.insert(0, b"ab", false).unwrap();
        r.insert(4, b"ef", false).unwrap();
        r.insert(6, b"gh", false).unwrap();
        r.insert(10, b"k", false).unwrap();
        assert_eq!(r.ack_state(8), (2, vec![(4, 8), (10, 11)]));
        assert_eq!(r.ack_state(1), (2, vec![(4, 8)]));
    }

    #[test]
    fn fin_must_not_move() {
        let mut r = RecvStream::new(100);
        r.insert(0, b"abc", true).unwrap();
        assert!(r.fin_received());
        assert!(r.insert(0, b"abcd", false).is_err());
        assert!(r.insert(0, b"ab", true).is_err());
    }

    #[test]
    fn send_stream_segments_acks_and_reinjection() {
        let mut s = SendStream::new(100, 1000);
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
        s.on_ack(0, false, &[(0, 16)]);
        assert!(s.next_packet(16).is_none());
        assert_eq!(s.on_ack(30, false, &[]), 30);
        assert_eq!(s.buffered(), 0);
    }

    #[test]
    fn fin_rides_the_last_segment_or_goes_alone() {
        let mut s = SendStream::new(100, 1000);
        s.write(b"abc");
        s.finish();
        let p = s.next_packet(16).unwrap();
        assert!(p.fin && p.len == 3);
        s.on_scheduled(&p, PathMask::single(PathId(0)));
        assert!(s.next_packet(16).is_none());
        s.on_ack(3, true, &[]);
        assert!(s.is_done());

        let mut d = SendStream::new(100, 1000);
        d.write(b"abcdef");
        d.finish();
        let p = d.next_packet(4).unwrap();
        d.on_scheduled(&p, PathMask::single(PathId(0)));
        let q = d.next_packet(4).unwrap();
        assert!(q.fin);
        d.on_scheduled(&q, PathMask::single(PathId(1)));
        assert_eq!(d.on_delivered(4), 0, "second segment first: nothing contiguous yet");
        assert_eq!(d.on_delivered(0), 6);
        assert!(d.is_done(), "delivery of the FIN segment completes the stream");

        let mut e = SendStream::new(100, 1000);
        e.finish();
        let p = e.next_packet(16).unwrap();
        assert!(p.fin && p.len == 0);
    }

    #[test]
    fn flow_control_limits_new_data() {
        let mut s = SendStream::new(100, 10);
        s.write(&[1u8; 50]);
        let p = s.next_packet(64).unwrap();
        assert_eq!(p.len, 10);
        s.on_scheduled(&p, PathMask::single(PathId(0)));
        assert!(s.next_packet(64).is_none());
        s.set_max_data(30);
        assert_eq!(s.next_packet(64).unwrap().len, 20);
    }
}
