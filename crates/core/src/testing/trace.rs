//! Mahimahi link traces (Netravali et al., USENIX ATC 2015).
//!
//! A trace file has one line per delivery opportunity: a millisecond
//! timestamp at which one 1500-byte packet may leave the link. Repeated
//! timestamps mean several opportunities in that millisecond. The trace
//! repeats when it ends, shifted by its last timestamp, exactly as
//! `mm-link` does: each wrap adds the last timestamp to the base, so a
//! trace of `1\n2\n3\n` offers one packet per millisecond and a trace of
//! `0\n0\n3\n` offers two at 0 ms, then three at every multiple of 3 ms.
//! Opportunities that find the queue empty are wasted, as in `mm-link`.

use std::path::Path;
use std::sync::Arc;

/// Bytes one opportunity may carry (Mahimahi's MTU).
pub const OPPORTUNITY_BYTES: usize = 1500;

const NS_PER_MS: u64 = 1_000_000;

/// Why a trace was refused; line numbers count from 1.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    #[error("reading Mahimahi trace {path}: {reason}")]
    Io { path: String, reason: String },
    #[error("Mahimahi trace has no timestamps")]
    Empty,
    #[error("Mahimahi trace line {line}: {text:?} is not a non-negative integer number of milliseconds")]
    BadLine { line: usize, text: String },
    #[error("Mahimahi trace line {line}: timestamp {ms} ms goes back from {prev} ms (timestamps must not decrease)")]
    Decreasing { line: usize, ms: u64, prev: u64 },
    #[error("Mahimahi trace must last a nonzero time (its last timestamp is 0)")]
    ZeroLength,
}

/// A parsed trace: non-decreasing opportunity timestamps in milliseconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MahimahiTrace {
    ms: Vec<u64>,
}

impl MahimahiTrace {
    /// Parse trace text. Blank lines and surrounding whitespace (including
    /// a `\r` from CRLF files) are tolerated; anything else that is not a
    /// plain decimal integer is refused with its line number, because a
    /// silently skipped line would change the link's capacity.
    pub fn parse(text: &str) -> Result<Self, TraceError> {
        let mut ms: Vec<u64> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() {
                continue;
            }
            let bad = || TraceError::BadLine { line: i + 1, text: raw.to_string() };
            // `u64::from_str` accepts a leading '+'; Mahimahi does not.
            if !line.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            let v: u64 = line.parse().map_err(|_| bad())?;
            if let Some(&prev) = ms.last() {
                if v < prev {
                    return Err(TraceError::Decreasing { line: i + 1, ms: v, prev });
                }
            }
            ms.push(v);
        }
        match ms.last() {
            None => Err(TraceError::Empty),
            Some(0) => Err(TraceError::ZeroLength),
            Some(_) => Ok(MahimahiTrace { ms }),
        }
    }

    pub fn from_file(path: &Path) -> Result<Self, TraceError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| TraceError::Io { path: path.display().to_string(), reason: e.to_string() })?;
        Self::parse(&text)
    }

    /// Opportunity timestamps of one period, in milliseconds.
    pub fn timestamps_ms(&self) -> &[u64] {
        &self.ms
    }

    /// Length of one period: the last timestamp.
    pub fn period_ms(&self) -> u64 {
        *self.ms.last().expect("a parsed trace is non-empty")
    }

    /// Average capacity in bytes per second over one period.
    pub fn mean_bytes_per_sec(&self) -> f64 {
        (self.ms.len() * OPPORTUNITY_BYTES) as f64 * 1000.0 / self.period_ms() as f64
    }
}

/// A position in the endless repetition of a trace.
#[derive(Clone, Debug)]
pub struct TraceCursor {
    trace: Arc<MahimahiTrace>,
    /// Virtual time (ns) at which the trace's time 0 falls.
    origin_ns: u64,
    cycle: u64,
    idx: usize,
}

impl TraceCursor {
    /// The trace starts playing at `origin_ns`.
    pub fn new(trace: Arc<MahimahiTrace>, origin_ns: u64) -> Self {
        TraceCursor { trace, origin_ns, cycle: 0, idx: 0 }
    }

    /// Time (ns) of the current opportunity.
    pub fn peek(&self) -> u64 {
        let ms = self.cycle * self.trace.period_ms() + self.trace.ms[self.idx];
        self.origin_ns + ms * NS_PER_MS
    }

    /// Use the current opportunity.
    pub fn advance(&mut self) {
        self.idx += 1;
        if self.idx == self.trace.ms.len() {
            self.idx = 0;
            self.cycle += 1;
        }
    }

    /// Skip (waste) every opportunity before `t_ns`.
    pub fn seek(&mut self, t_ns: u64) {
        if self.peek() >= t_ns {
            return;
        }
        let period = self.trace.period_ms();
        let target = (t_ns - self.origin_ns).div_ceil(NS_PER_MS);
        let (cycle, rem) = (target / period, target % period);
        // At an exact multiple of the period, the previous cycle's final
        // timestamps (equal to the period) fall at the same instant and
        // come first in sequence.
        let (cycle, idx) = if rem == 0 && cycle > 0 {
            (cycle - 1, self.trace.ms.partition_point(|&m| m < period))
        } else {
            (cycle, self.trace.ms.partition_point(|&m| m < rem))
        };
        self.cycle = cycle;
        self.idx = idx;
        debug_assert!(self.peek() >= t_ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn times(trace: &str, from_ms: u64, n: usize) -> Vec<u64> {
        let mut c = TraceCursor::new(Arc::new(MahimahiTrace::parse(trace).unwrap()), 0);
        c.seek(from_ms * NS_PER_MS);
        (0..n)
            .map(|_| {
                let t = c.peek() / NS_PER_MS;
                c.advance();
                t
            })
            .collect()
    }

    #[test]
    fn a_trace_repeats_shifted_by_its_last_timestamp() {
        assert_eq!(times("1\n2\n3\n", 0, 6), vec![1, 2, 3, 4, 5, 6]);
        assert_eq!(times("0\n0\n3\n", 0, 8), vec![0, 0, 3, 3, 3, 6, 6, 6]);
        assert_eq!(times("5", 0, 3), vec![5, 10, 15]);
    }

    #[test]
    fn seeking_wastes_only_earlier_opportunities() {
        // At 3 ms: the last entry of cycle 0 and both zeros of cycle 1.
        assert_eq!(times("0\n0\n3\n", 3, 4), vec![3, 3, 3, 6]);
        assert_eq!(times("0\n0\n3\n", 4, 3), vec![6, 6, 6]);
        assert_eq!(times("1\n2\n3\n", 7, 2), vec![7, 8]);
        let mut c = TraceCursor::new(Arc::new(MahimahiTrace::parse("1\n1\n2").unwrap()), 0);
        c.seek(1); // 1 ns rounds up to the 1 ms opportunities
        assert_eq!(c.peek(), NS_PER_MS);
    }

    #[test]
    fn malformed_traces_are_refused_with_the_line() {
        assert_eq!(MahimahiTrace::parse(""), Err(TraceError::Empty));
        assert_eq!(MahimahiTrace::parse("\n \n"), Err(TraceError::Empty));
        assert_eq!(MahimahiTrace::parse("0\n0\n"), Err(TraceError::ZeroLength));
        assert!(matches!(MahimahiTrace::parse("1\nx\n"), Err(TraceError::BadLine { line: 2, .. })));
        assert!(matches!(MahimahiTrace::parse("1\n-2\n"), Err(TraceError::BadLine { line: 2, .. })));
        assert!(matches!(MahimahiTrace::parse("+1\n"), Err(TraceError::BadLine { line: 1, .. })));
        assert!(matches!(MahimahiTrace::parse("1.5\n"), Err(TraceError::BadLine { line: 1, .. })));
        assert!(matches!(MahimahiTrace::parse("1 2\n"), Err(TraceError::BadLine { line: 1, .. })));
        assert_eq!(MahimahiTrace::parse("3\n2\n"), Err(TraceError::Decreasing { line: 2, ms: 2, prev: 3 }));
        let e = MahimahiTrace::parse("1\n2\nnope\n").unwrap_err().to_string();
        assert!(e.contains("line 3") && e.contains("nope"), "{e}");
        assert_eq!(MahimahiTrace::parse(" 1\r\n\r\n2\r\n").unwrap().timestamps_ms(), &[1, 2]);
    }

    #[test]
    fn mean_rate_counts_opportunities_per_period() {
        let t = MahimahiTrace::parse("1").unwrap();
        assert_eq!(t.mean_bytes_per_sec(), 1_500_000.0, "one packet per ms is 12 Mbit/s");
    }
}
