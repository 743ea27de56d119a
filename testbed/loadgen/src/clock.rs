//! The shared trip clock: trip time 0 is the wall-clock instant `--epoch-unix-ms`.
//!
//! The wall clock is read once at start-up; from then on trip time advances with the monotonic
//! clock, so a wall-clock step (NTP) during a run cannot reorder records or break sleeps. All copies
//! on one machine read the same wall clock, so they agree on trip time to within a few µs.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};

#[derive(Debug, Clone, Copy)]
pub struct TripClock {
    /// Trip time (µs) at `anchor`.
    base_us: i64,
    anchor: Instant,
}

impl TripClock {
    /// A clock whose trip time 0 is `epoch_unix_ms` (UNIX milliseconds).
    pub fn new(epoch_unix_ms: i64) -> Result<Self> {
        let anchor = Instant::now();
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).context("system clock is before 1970")?;
        let wall_us = i64::try_from(wall.as_micros()).context("system clock out of range")?;
        let epoch_us = epoch_unix_ms.checked_mul(1000).context("--epoch-unix-ms out of range")?;
        Ok(Self { base_us: wall_us - epoch_us, anchor })
    }

    /// Current trip time in µs (negative before the epoch).
    pub fn now_us(&self) -> i64 {
        self.base_us + self.anchor.elapsed().as_micros() as i64
    }

    /// The tokio instant at trip time `trip_us` (the present if that is already past).
    pub fn instant_at(&self, trip_us: i64) -> tokio::time::Instant {
        let off = trip_us - self.base_us;
        let std = if off <= 0 { self.anchor } else { self.anchor + Duration::from_micros(off as u64) };
        tokio::time::Instant::from_std(std)
    }

    /// Sleeps until trip time `trip_us`; returns at once if it has passed. Returns whether it had
    /// already passed on entry.
    pub async fn sleep_until(&self, trip_us: i64) -> bool {
        if self.now_us() >= trip_us {
            return true;
        }
        tokio::time::sleep_until(self.instant_at(trip_us)).await;
        // tokio's timer has 1 ms granularity and never fires early; top up in the (theoretical)
        // case of an early wake-up so that a record never shows a start before its plan.
        while self.now_us() < trip_us {
            tokio::time::sleep(Duration::from_micros((trip_us - self.now_us()) as u64)).await;
        }
        false
    }
}
