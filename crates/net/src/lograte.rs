//! Log lines that a remote party can cause, at most once per interval.
//!
//! Anyone on the Internet can open a TCP connection to the proxy and fail
//! its TLS handshake; one warn line per failure would let them fill the
//! node's disk through the log. Such events are counted in a metric every
//! time and logged at warn at most once per interval, with the number left
//! out since the last line.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One rate-limited log line; `Sync`, shared by every task that may write it.
#[derive(Debug)]
pub struct Every {
    every: Duration,
    /// When the last line was allowed, and how many were left out since.
    state: Mutex<(Option<Instant>, u64)>,
}

impl Every {
    pub const fn new(every: Duration) -> Every {
        Every { every, state: Mutex::new((None, 0)) }
    }

    /// `Some(left_out)` when a line may be written at `now` (the number of
    /// events left out since the last line); `None` when this one is left
    /// out (log it at debug).
    pub fn check(&self, now: Instant) -> Option<u64> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match st.0 {
            Some(last) if now.saturating_duration_since(last) < self.every => {
                st.1 += 1;
                None
            }
            _ => {
                let left_out = st.1;
                *st = (Some(now), 0);
                Some(left_out)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_and_the_rest_counted() {
        let e = Every::new(Duration::from_secs(60));
        let t0 = Instant::now();
        assert_eq!(e.check(t0), Some(0), "the first one is logged");
        for s in 1..60 {
            assert_eq!(e.check(t0 + Duration::from_secs(s)), None, "{s} s");
        }
        assert_eq!(e.check(t0 + Duration::from_secs(60)), Some(59), "then one with the count left out");
        assert_eq!(e.check(t0 + Duration::from_secs(61)), None);
        assert_eq!(e.check(t0 + Duration::from_secs(500)), Some(1));
    }
}
