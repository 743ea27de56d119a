//! Mahimahi capacity traces.
//!
//! The format is mm-link's: one non-negative integer per line, a millisecond timestamp at which
//! one delivery opportunity occurs (a budget of [`crate::LinkConfig::opportunity_bytes`], 1500 by
//! default; see the crate docs). Timestamps must be non-decreasing; several equal lines are several
//! opportunities in the same millisecond. The trace repeats with period equal to its last
//! timestamp, which must therefore be non-zero (mm-link refuses a zero-length trace too). Blank
//! lines are errors (mm-link: "invalid empty line"); a final newline is fine.

use std::time::Duration;

use thiserror::Error;

/// Why a trace file was rejected; line numbers are 1-based.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TraceError {
    /// A line that is not a non-negative integer number of milliseconds.
    #[error("line {line}: not a millisecond timestamp: {text:?}")]
    NotANumber {
        /// 1-based line number.
        line: usize,
        /// The offending text.
        text: String,
    },
    /// A blank line.
    #[error("line {line}: empty line")]
    EmptyLine {
        /// 1-based line number.
        line: usize,
    },
    /// A timestamp smaller than the one before it.
    #[error("line {line}: timestamp {ms} ms is smaller than the previous one ({prev} ms)")]
    Decreasing {
        /// 1-based line number.
        line: usize,
        /// This line's timestamp.
        ms: u64,
        /// The previous line's timestamp.
        prev: u64,
    },
    /// No timestamps at all.
    #[error("trace is empty")]
    Empty,
    /// The last timestamp is 0, so the trace has no period.
    #[error("trace must last a non-zero time (last timestamp is 0)")]
    ZeroPeriod,
}

/// A parsed Mahimahi trace: sorted opportunity timestamps in milliseconds, repeating with
/// period [`Trace::period_ms`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    ms: Vec<u64>,
}

impl Trace {
    /// Parses mm-link's trace format (see the module docs).
    pub fn parse(text: &str) -> Result<Self, TraceError> {
        let mut ms: Vec<u64> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let t = raw.trim();
            if t.is_empty() {
                return Err(TraceError::EmptyLine { line });
            }
            let v: u64 = t.parse().map_err(|_| TraceError::NotANumber { line, text: t.to_string() })?;
            if let Some(&prev) = ms.last() {
                if v < prev {
                    return Err(TraceError::Decreasing { line, ms: v, prev });
                }
            }
            ms.push(v);
        }
        Self::from_millis(ms)
    }

    /// A trace from opportunity timestamps in milliseconds (same checks as [`Trace::parse`],
    /// reported with line = index + 1).
    pub fn from_millis(ms: Vec<u64>) -> Result<Self, TraceError> {
        for (i, w) in ms.windows(2).enumerate() {
            if w[1] < w[0] {
                return Err(TraceError::Decreasing { line: i + 2, ms: w[1], prev: w[0] });
            }
        }
        match ms.last() {
            None => Err(TraceError::Empty),
            Some(0) => Err(TraceError::ZeroPeriod),
            Some(_) => Ok(Self { ms }),
        }
    }

    /// Opportunity timestamps of one period, in milliseconds.
    pub fn millis(&self) -> &[u64] {
        &self.ms
    }

    /// Number of opportunities per period (lines of the file).
    pub fn len(&self) -> usize {
        self.ms.len()
    }

    /// Always `false`: an empty trace is rejected at construction.
    pub fn is_empty(&self) -> bool {
        self.ms.is_empty()
    }

    /// The repetition period in milliseconds (the last timestamp).
    pub fn period_ms(&self) -> u64 {
        *self.ms.last().expect("non-empty by construction")
    }

    /// The repetition period.
    pub fn period(&self) -> Duration {
        Duration::from_millis(self.period_ms())
    }

    /// Time of opportunity `k` (0-based, counting over all repetitions).
    pub(crate) fn opportunity_time(&self, k: u64) -> Duration {
        let n = self.ms.len() as u64;
        let base = (k / n) * self.period_ms();
        Duration::from_millis(base + self.ms[(k % n) as usize])
    }

    /// Index of the first opportunity whose time is `>= t` (`strict`: `> t`).
    pub(crate) fn first_at_or_after(&self, t: Duration, strict: bool) -> u64 {
        let n = self.ms.len() as u64;
        let period_ns = u128::from(self.period_ms()) * 1_000_000;
        let t_ns = t.as_nanos();
        let r = (t_ns / period_ns) as u64;
        let within = t_ns - u128::from(r) * period_ns;
        let idx = self.ms.partition_point(|&m| {
            let m_ns = u128::from(m) * 1_000_000;
            if strict {
                m_ns <= within
            } else {
                m_ns < within
            }
        });
        let mut k = r * n + idx as u64;
        // Lines equal to the period in the previous repetition coincide with this repetition's
        // start; step back over those that also qualify.
        while k > 0 {
            let prev = self.opportunity_time(k - 1);
            if (strict && prev > t) || (!strict && prev >= t) {
                k -= 1;
            } else {
                break;
            }
        }
        k
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_errors_carry_line_numbers() {
        assert_eq!(Trace::parse(""), Err(TraceError::Empty));
        assert_eq!(Trace::parse("0\n0\n"), Err(TraceError::ZeroPeriod));
        assert_eq!(Trace::parse("1\nx\n"), Err(TraceError::NotANumber { line: 2, text: "x".into() }));
        assert_eq!(Trace::parse("1\n-3\n"), Err(TraceError::NotANumber { line: 2, text: "-3".into() }));
        assert_eq!(Trace::parse("1\n5\n4\n"), Err(TraceError::Decreasing { line: 3, ms: 4, prev: 5 }));
        assert_eq!(Trace::parse("1\n\n4\n"), Err(TraceError::EmptyLine { line: 2 }));
        let t = Trace::parse("1\n2\n3\n").unwrap();
        assert_eq!(t.period_ms(), 3);
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn opportunity_indexing_repeats_and_seeks() {
        let t = Trace::parse("0\n0\n2\n5\n").unwrap();
        let times: Vec<u64> = (0..8).map(|k| t.opportunity_time(k).as_millis() as u64).collect();
        assert_eq!(times, vec![0, 0, 2, 5, 5, 5, 7, 10]);
        for ms in 0..40u64 {
            for strict in [false, true] {
                let at = Duration::from_millis(ms) + Duration::from_micros(if ms % 3 == 0 { 0 } else { 400 });
                let k = t.first_at_or_after(at, strict);
                let tk = t.opportunity_time(k);
                assert!(if strict { tk > at } else { tk >= at });
                if k > 0 {
                    let prev = t.opportunity_time(k - 1);
                    assert!(if strict { prev <= at } else { prev < at }, "ms={ms} strict={strict} k={k}");
                }
            }
        }
    }
}
