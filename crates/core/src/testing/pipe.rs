//! One direction of a simulated subflow: a TCP connection seen from above,
//! as an in-order byte pipe.
//!
//! Bytes written by the shell wait in the *unsent* queue (the kernel send
//! buffer), leave it in segments of at most 1500 bytes at the link's pace
//! (a fixed rate, or the opportunities of a Mahimahi trace), then arrive one
//! way-delay later. A lost segment is not dropped — TCP would retransmit it
//! — but arrives a retransmission delay late, and since TCP delivers in
//! order everything behind it waits too (head-of-line blocking). During a
//! blackout nothing is serialized and nothing arrives; both resume at its
//! end, queues intact.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use super::rng::SplitMix64;
use super::trace::{MahimahiTrace, TraceCursor, OPPORTUNITY_BYTES};

/// What drains the unsent queue.
#[derive(Clone, Debug)]
pub enum Link {
    /// A constant rate in bytes per second (must be positive).
    Rate { bytes_per_sec: u64 },
    /// Mahimahi delivery opportunities, starting at the pipe's creation.
    Trace(Arc<MahimahiTrace>),
}

/// A one-way delay that changes over time: a step function of the time a
/// segment leaves the bottleneck, `(from_ns, delay_ns)` sorted by time (the
/// emulator's delay schedule). Before the first step, the first delay.
#[derive(Clone, Debug, Default)]
pub struct DelaySchedule(Vec<(u64, u64)>);

impl DelaySchedule {
    /// Steps `(from, delay)`; they are sorted here.
    pub fn new(mut steps: Vec<(Duration, Duration)>) -> Self {
        steps.sort_by_key(|s| s.0);
        DelaySchedule(steps.into_iter().map(|(t, d)| (t.as_nanos() as u64, d.as_nanos() as u64)).collect())
    }

    /// The delay (ns) of a segment leaving at `t` (ns); `None` with no steps.
    pub fn at(&self, t: u64) -> Option<u64> {
        let i = self.0.partition_point(|s| s.0 <= t);
        self.0.get(i.saturating_sub(1)).map(|s| s.1)
    }
}

/// One direction of a path.
#[derive(Clone, Debug)]
pub struct DirSpec {
    pub link: Link,
    pub one_way_delay: Duration,
    /// Replaces `one_way_delay` when set: the delay by the time a segment
    /// leaves (FIFO: a falling delay never reorders segments).
    pub delay_schedule: Option<Arc<DelaySchedule>>,
    /// Trace links: the virtual time at which the trace starts playing
    /// (a carrier's trace runs on whatever subflow uses it); `None`: when
    /// the pipe is created.
    pub trace_origin: Option<Duration>,
    /// Probability that a segment is lost (and so retransmitted).
    pub loss: f64,
    /// Extra delay of a lost segment; `None` means max(200 ms, 2 × delay),
    /// Linux's minimum RTO or two one-way delays.
    pub retx_delay: Option<Duration>,
}

impl DirSpec {
    pub fn rate(bytes_per_sec: u64, one_way_delay: Duration) -> Self {
        assert!(bytes_per_sec > 0, "a rate link needs a positive rate");
        DirSpec {
            link: Link::Rate { bytes_per_sec },
            one_way_delay,
            delay_schedule: None,
            trace_origin: None,
            loss: 0.0,
            retx_delay: None,
        }
    }

    pub fn trace(trace: Arc<MahimahiTrace>, one_way_delay: Duration) -> Self {
        DirSpec {
            link: Link::Trace(trace),
            one_way_delay,
            delay_schedule: None,
            trace_origin: None,
            loss: 0.0,
            retx_delay: None,
        }
    }

    fn retx_ns(&self) -> u64 {
        self.retx_delay.unwrap_or_else(|| (2 * self.one_way_delay).max(Duration::from_millis(200))).as_nanos() as u64
    }
}

/// Half-open intervals `[start, end)` in ns, sorted and merged.
#[derive(Clone, Debug, Default)]
pub struct Blackouts(Vec<(u64, u64)>);

impl Blackouts {
    pub fn new(mut spans: Vec<(u64, u64)>) -> Self {
        spans.retain(|(s, e)| e > s);
        spans.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(spans.len());
        for (s, e) in spans {
            match out.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => out.push((s, e)),
            }
        }
        Blackouts(out)
    }

    /// The first time at or after `t` outside every blackout.
    pub fn release(&self, t: u64) -> u64 {
        // Merged spans never touch, so one lookup suffices.
        let i = self.0.partition_point(|&(_, e)| e <= t);
        match self.0.get(i) {
            Some(&(s, e)) if s <= t => e,
            _ => t,
        }
    }

    pub fn contains(&self, t: u64) -> bool {
        self.release(t) != t
    }
}

/// Counters of one pipe.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PipeStats {
    pub pushed_bytes: u64,
    pub serialized_bytes: u64,
    pub delivered_bytes: u64,
    pub segments: u64,
    /// Segments that suffered a (simulated) retransmission.
    pub lost_segments: u64,
    /// Bytes dropped because the subflow was torn down with them inside.
    pub discarded_bytes: u64,
}

impl PipeStats {
    pub fn add(&mut self, o: &PipeStats) {
        self.pushed_bytes += o.pushed_bytes;
        self.serialized_bytes += o.serialized_bytes;
        self.delivered_bytes += o.delivered_bytes;
        self.segments += o.segments;
        self.lost_segments += o.lost_segments;
        self.discarded_bytes += o.discarded_bytes;
    }
}

/// One direction of a subflow in virtual time (ns since the start).
#[derive(Debug)]
pub struct Pipe {
    spec: DirSpec,
    blackouts: Arc<Blackouts>,
    unsent: VecDeque<u8>,
    /// Segments on the wire: arrival time (before blackouts) and bytes.
    wire: VecDeque<(u64, Vec<u8>)>,
    /// Rate links: when the segment being serialized has left.
    busy_until: u64,
    cursor: Option<TraceCursor>,
    last_arrival: u64,
    rng: SplitMix64,
    stats: PipeStats,
}

impl Pipe {
    pub fn new(spec: DirSpec, blackouts: Arc<Blackouts>, seed: u64, now: u64) -> Self {
        let cursor = match &spec.link {
            Link::Trace(t) => {
                let origin = spec.trace_origin.map_or(now, |o| o.as_nanos() as u64);
                let mut c = TraceCursor::new(t.clone(), origin);
                c.seek(now);
                Some(c)
            }
            Link::Rate { bytes_per_sec } => {
                assert!(*bytes_per_sec > 0, "a rate link needs a positive rate");
                None
            }
        };
        Pipe {
            spec,
            blackouts,
            unsent: VecDeque::new(),
            wire: VecDeque::new(),
            busy_until: now,
            cursor,
            last_arrival: now,
            rng: SplitMix64::new(seed),
            stats: PipeStats::default(),
        }
    }

    /// Bytes written but not yet serialized (TCP's "notsent").
    pub fn unsent_bytes(&self) -> u64 {
        self.unsent.len() as u64
    }

    /// Bytes serialized but not yet delivered.
    pub fn wire_bytes(&self) -> u64 {
        self.wire.iter().map(|(_, b)| b.len() as u64).sum()
    }

    pub fn stats(&self) -> &PipeStats {
        &self.stats
    }

    /// The shell wrote `data` to the socket at `now`.
    pub fn push(&mut self, data: &[u8], now: u64) {
        if data.is_empty() {
            return;
        }
        if self.unsent.is_empty() {
            // An idle link starts now: trace opportunities that found the
            // queue empty are wasted, and a rate link does not bank time.
            match &mut self.cursor {
                Some(c) => c.seek(now),
                None => self.busy_until = self.busy_until.max(now),
            }
        }
        self.unsent.extend(data);
        self.stats.pushed_bytes += data.len() as u64;
    }

    /// When the next segment starts serializing, if anything is unsent.
    pub fn next_serialization(&mut self) -> Option<u64> {
        if self.unsent.is_empty() {
            return None;
        }
        match &mut self.cursor {
            None => Some(self.blackouts.release(self.busy_until)),
            Some(c) => {
                // Opportunities inside a blackout are wasted.
                loop {
                    let t = c.peek();
                    let r = self.blackouts.release(t);
                    if r == t {
                        return Some(t);
                    }
                    c.seek(r);
                }
            }
        }
    }

    /// Serialize every segment due at or before `now`; returns how many.
    pub fn serialize_due(&mut self, now: u64) -> usize {
        let mut n = 0;
        while let Some(t) = self.next_serialization() {
            if t > now {
                break;
            }
            self.serialize_one(t);
            n += 1;
        }
        n
    }

    fn serialize_one(&mut self, start: u64) {
        let len = self.unsent.len().min(OPPORTUNITY_BYTES);
        let seg: Vec<u8> = self.unsent.drain(..len).collect();
        let left = match (&self.spec.link, &mut self.cursor) {
            (Link::Rate { bytes_per_sec }, _) => {
                let tx = (len as u128 * 1_000_000_000).div_ceil(u128::from(*bytes_per_sec)) as u64;
                self.busy_until = start + tx;
                self.busy_until
            }
            (Link::Trace(_), Some(c)) => {
                c.advance();
                start
            }
            (Link::Trace(_), None) => unreachable!("trace links have a cursor"),
        };
        let delay = self.spec.delay_schedule.as_ref().and_then(|d| d.at(left));
        let mut arrival = left + delay.unwrap_or(self.spec.one_way_delay.as_nanos() as u64);
        if self.rng.chance(self.spec.loss) {
            arrival += self.spec.retx_ns();
            self.stats.lost_segments += 1;
        }
        // In order: nothing overtakes a segment being retransmitted.
        arrival = arrival.max(self.last_arrival);
        self.last_arrival = arrival;
        self.stats.serialized_bytes += len as u64;
        self.stats.segments += 1;
        self.wire.push_back((arrival, seg));
    }

    /// When the next bytes arrive.
    pub fn next_delivery(&self) -> Option<u64> {
        self.wire.front().map(|(t, _)| self.blackouts.release(*t))
    }

    /// Append to `out` every byte that has arrived by `now`; returns how many.
    pub fn deliver_due(&mut self, now: u64, out: &mut Vec<u8>) -> usize {
        let start = out.len();
        while let Some((t, _)) = self.wire.front() {
            if self.blackouts.release(*t) > now {
                break;
            }
            let (_, seg) = self.wire.pop_front().expect("front exists");
            out.extend_from_slice(&seg);
        }
        let n = out.len() - start;
        self.stats.delivered_bytes += n as u64;
        n
    }

    /// The subflow is torn down: everything inside is lost.
    pub fn discard(&mut self) {
        self.stats.discarded_bytes += self.unsent_bytes() + self.wire_bytes();
        self.unsent.clear();
        self.wire.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Run a pipe on its own events until `until`, returning (time,
    /// bytes) for every delivery.
    fn drive(p: &mut Pipe, until: u64) -> Vec<(u64, usize)> {
        let mut now = 0;
        let mut got = Vec::new();
        let mut buf = Vec::new();
        loop {
            p.serialize_due(now);
            buf.clear();
            let n = p.deliver_due(now, &mut buf);
            if n > 0 {
                got.push((now, n));
            }
            let next = [p.next_serialization(), p.next_delivery()].into_iter().flatten().min();
            match next {
                Some(t) if t <= until => now = t,
                _ => return got,
            }
        }
    }

    fn delivered_by(got: &[(u64, usize)], t: u64) -> usize {
        got.iter().filter(|(at, _)| *at <= t).map(|(_, n)| n).sum()
    }

    #[test]
    fn a_one_two_three_trace_delivers_three_packets_per_three_ms() {
        let trace = Arc::new(MahimahiTrace::parse("1\n2\n3\n").unwrap());
        let delay = 10 * MS;
        let mut p = Pipe::new(DirSpec::trace(trace, Duration::from_nanos(delay)), Default::default(), 1, 0);
        p.push(&vec![0u8; 1 << 20], 0);
        let got = drive(&mut p, delay + 300 * MS);
        for k in 0..100u64 {
            let (a, b) = (delay + 3 * k * MS, delay + 3 * (k + 1) * MS);
            assert_eq!(delivered_by(&got, b) - delivered_by(&got, a), 3 * 1500, "period {k}");
        }
        for ms in 0..300u64 {
            assert_eq!(delivered_by(&got, delay + ms * MS), ms as usize * 1500, "by {ms} ms");
        }
    }

    #[test]
    fn opportunities_with_nothing_queued_are_wasted() {
        let trace = Arc::new(MahimahiTrace::parse("1").unwrap());
        let mut p = Pipe::new(DirSpec::trace(trace, Duration::ZERO), Default::default(), 1, 0);
        assert_eq!(p.next_serialization(), None);
        // Written at 10.5 ms: the first opportunity is at 11 ms, not 1 ms.
        p.push(&[0u8; 4000], 10 * MS + MS / 2);
        assert_eq!(p.next_serialization(), Some(11 * MS));
        p.serialize_due(12 * MS);
        let mut out = Vec::new();
        assert_eq!(p.deliver_due(12 * MS, &mut out), 3000, "opportunities at 11 and 12 ms, 1500 bytes each");
        p.serialize_due(13 * MS);
        assert_eq!(p.deliver_due(13 * MS, &mut out), 1000);
    }

    #[test]
    fn a_rate_link_paces_segments_and_adds_the_delay() {
        let mut p = Pipe::new(DirSpec::rate(1_500_000, Duration::from_millis(5)), Default::default(), 1, 0);
        p.push(&[0u8; 15_000], 0);
        let got = drive(&mut p, 100 * MS);
        // 1500 bytes per ms, each arriving 5 ms after it left.
        assert_eq!(got.first(), Some(&(6 * MS, 1500)));
        assert_eq!(delivered_by(&got, 15 * MS), 15_000);
        assert_eq!(delivered_by(&got, 15 * MS - 1), 13_500);
    }

    #[test]
    fn a_lost_segment_holds_back_everything_behind_it() {
        let mut spec = DirSpec::rate(1_500_000, Duration::from_millis(5));
        spec.loss = 1.0;
        spec.retx_delay = Some(Duration::from_millis(100));
        let mut p = Pipe::new(spec, Default::default(), 1, 0);
        p.push(&[0u8; 3000], 0);
        let got = drive(&mut p, 1000 * MS);
        assert_eq!(got, vec![(106 * MS, 1500), (107 * MS, 1500)]);
        assert_eq!(p.stats().lost_segments, 2);
    }

    #[test]
    fn a_blackout_holds_the_queue_and_the_wire() {
        let b = Arc::new(Blackouts::new(vec![(2 * MS, 50 * MS)]));
        let mut p = Pipe::new(DirSpec::rate(1_500_000, Duration::from_millis(5)), b, 1, 0);
        p.push(&[0u8; 6000], 0);
        let got = drive(&mut p, 1000 * MS);
        // Two segments left before the blackout; they arrive at its end,
        // followed by the rest, paced again from 50 ms.
        assert_eq!(got, vec![(50 * MS, 3000), (56 * MS, 1500), (57 * MS, 1500)]);
    }

    #[test]
    fn blackouts_merge_and_release_at_their_end() {
        let b = Blackouts::new(vec![(10, 20), (15, 30), (40, 50), (5, 5)]);
        assert_eq!(b.release(9), 9);
        assert_eq!(b.release(10), 30);
        assert_eq!(b.release(29), 30);
        assert_eq!(b.release(30), 30);
        assert_eq!(b.release(45), 50);
        assert!(b.contains(40) && !b.contains(50));
    }
}
