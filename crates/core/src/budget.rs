//! The memory budget shared by every connection of an endpoint (or of all
//! the endpoints of a proxy pod), after Linux's `tcp_mem`: three levels,
//! `low`, `pressure` and `high`, over the bytes connections hold or have
//! promised (send buffers plus receive windows, [`crate::conn::Conn::commitment`]).
//!
//! - Below `low`, receive windows grow freely (up to their cap).
//! - Between `low` and `pressure`, a window grows only up to its fair share
//!   (`pressure` divided by the endpoint's connections).
//! - Above `pressure`, nothing grows, and the endpoint shrinks windows back,
//!   largest first, never below the data in flight or the minimum window.
//! - Above `high`, no connection gets new window or send-buffer space
//!   beyond its floor (the minimum window and the not-sent floor), so every
//!   connection can still make progress: the budget never deadlocks a
//!   connection and never resets one.
//!
//! A connection's floors, and the fixed memory it costs the shells
//! (sockets, task, copy buffers: [`crate::EndpointConfig::conn_overhead_bytes`]),
//! are reserved when it opens. With a hard budget (the proxy's), a
//! connection whose reservation does not fit under `high` is refused
//! ([`MemoryBudget::try_charge`]), so the account never passes `high`: what
//! every connection holds, floors included, stays within the budget. What is
//! counted is memory allocated (buffer capacity), not only bytes stored.
//!
//! The budget is a handle: clones share one account, so a proxy serving
//! many trains gives every session's endpoint a clone of one budget. The
//! account is an atomic counter; nothing here blocks, sleeps or reads a
//! clock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Where the account stands relative to its levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Pressure {
    /// Below `low`.
    Free,
    /// Between `low` and `pressure`.
    Moderate,
    /// Between `pressure` and `high`.
    Pressure,
    /// At or above `high`.
    High,
}

impl Pressure {
    /// 0 (free) to 3 (high), for a metric.
    pub fn level(self) -> u8 {
        self as u8
    }
}

/// The three levels, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BudgetLevels {
    pub low: u64,
    pub pressure: u64,
    pub high: u64,
}

impl BudgetLevels {
    /// `high` with `low` at one half and `pressure` at three quarters of it
    /// (the ratios of Linux's default `tcp_mem`, roughly).
    pub fn from_high(high: u64) -> Self {
        BudgetLevels { low: high / 2, pressure: high / 4 * 3, high }
    }
}

/// Counters of a budget (plain data; shells export them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BudgetStats {
    /// Bytes held or promised now.
    pub used: u64,
    /// Most bytes ever held or promised at once.
    pub peak: u64,
    /// Window growths and writes refused (or cut) for lack of budget.
    pub grants_denied: u64,
    /// Window bytes taken back under pressure.
    pub reclaimed_bytes: u64,
}

#[derive(Debug)]
struct Account {
    levels: BudgetLevels,
    used: AtomicU64,
    peak: AtomicU64,
    denied: AtomicU64,
    reclaimed: AtomicU64,
}

/// A shared memory budget; see the module documentation.
#[derive(Clone, Debug)]
pub struct MemoryBudget {
    inner: Arc<Account>,
}

impl MemoryBudget {
    pub fn new(levels: BudgetLevels) -> Self {
        let high = levels.high;
        let pressure = levels.pressure.min(high);
        let low = levels.low.min(pressure);
        MemoryBudget {
            inner: Arc::new(Account {
                levels: BudgetLevels { low, pressure, high },
                used: AtomicU64::new(0),
                peak: AtomicU64::new(0),
                denied: AtomicU64::new(0),
                reclaimed: AtomicU64::new(0),
            }),
        }
    }

    /// A budget with `high` bytes and the default ratios.
    pub fn with_high(high: u64) -> Self {
        Self::new(BudgetLevels::from_high(high))
    }

    pub fn levels(&self) -> BudgetLevels {
        self.inner.levels
    }

    pub fn used(&self) -> u64 {
        self.inner.used.load(Ordering::Relaxed)
    }

    pub fn pressure(&self) -> Pressure {
        let u = self.used();
        let l = self.inner.levels;
        if u >= l.high {
            Pressure::High
        } else if u >= l.pressure {
            Pressure::Pressure
        } else if u >= l.low {
            Pressure::Moderate
        } else {
            Pressure::Free
        }
    }

    pub fn stats(&self) -> BudgetStats {
        BudgetStats {
            used: self.used(),
            peak: self.inner.peak.load(Ordering::Relaxed),
            grants_denied: self.inner.denied.load(Ordering::Relaxed),
            reclaimed_bytes: self.inner.reclaimed.load(Ordering::Relaxed),
        }
    }

    fn note_peak(&self, used: u64) {
        self.inner.peak.fetch_max(used, Ordering::Relaxed);
    }

    /// Charge up to `want` bytes while the account stays at or below
    /// `limit`; returns what was charged (possibly 0).
    pub(crate) fn charge_up_to(&self, want: u64, limit: u64) -> u64 {
        let mut cur = self.inner.used.load(Ordering::Relaxed);
        loop {
            let got = want.min(limit.saturating_sub(cur));
            if got == 0 {
                return 0;
            }
            match self.inner.used.compare_exchange_weak(cur, cur + got, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => {
                    self.note_peak(cur + got);
                    return got;
                }
                Err(now) => cur = now,
            }
        }
    }

    /// Charge all of `n` bytes if the account stays at or below `limit`,
    /// else nothing: a new connection's reservation.
    pub(crate) fn try_charge(&self, n: u64, limit: u64) -> bool {
        let mut cur = self.inner.used.load(Ordering::Relaxed);
        loop {
            if cur.saturating_add(n) > limit {
                return false;
            }
            match self.inner.used.compare_exchange_weak(cur, cur + n, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => {
                    self.note_peak(cur + n);
                    return true;
                }
                Err(now) => cur = now,
            }
        }
    }

    /// Charge `n` bytes whatever the level: a soft budget's floor, or
    /// memory already allocated (a connection's out-of-order pieces).
    pub(crate) fn charge(&self, n: u64) {
        let used = self.inner.used.fetch_add(n, Ordering::Relaxed) + n;
        self.note_peak(used);
    }

    pub(crate) fn release(&self, n: u64) {
        let prev = self.inner.used.fetch_sub(n, Ordering::Relaxed);
        debug_assert!(prev >= n, "released {n} of {prev} bytes charged");
    }

    pub(crate) fn note_denied(&self) {
        self.inner.denied.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn note_reclaimed(&self, n: u64) {
        self.inner.reclaimed.fetch_add(n, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_and_charges() {
        let b = MemoryBudget::new(BudgetLevels { low: 100, pressure: 150, high: 200 });
        assert_eq!(b.pressure(), Pressure::Free);
        assert_eq!(b.charge_up_to(120, 200), 120);
        assert_eq!(b.pressure(), Pressure::Moderate);
        assert_eq!(b.charge_up_to(120, 200), 80, "cut at the limit");
        assert_eq!(b.pressure(), Pressure::High);
        assert_eq!(b.charge_up_to(1, 200), 0);
        b.charge(10);
        assert_eq!(b.used(), 210, "a floor is charged whatever the level");
        b.release(60);
        assert_eq!(b.pressure(), Pressure::Pressure);
        let c = b.clone();
        c.release(150);
        assert_eq!(b.used(), 0, "clones share the account");
        assert_eq!(b.stats().peak, 210);
    }

    #[test]
    fn a_reservation_is_all_or_nothing_and_never_passes_its_limit() {
        let b = MemoryBudget::with_high(1000);
        assert!(b.try_charge(600, 1000));
        assert!(!b.try_charge(401, 1000), "would pass the limit");
        assert_eq!(b.used(), 600, "a refused reservation charges nothing");
        assert!(b.try_charge(400, 1000));
        assert_eq!(b.pressure(), Pressure::High);
        assert!(!b.try_charge(1, 1000));
        assert_eq!(b.stats().peak, 1000);
    }

    #[test]
    fn levels_are_ordered_whatever_is_configured() {
        let b = MemoryBudget::new(BudgetLevels { low: 500, pressure: 300, high: 200 });
        assert_eq!(b.levels(), BudgetLevels { low: 200, pressure: 200, high: 200 });
        assert_eq!(BudgetLevels::from_high(64), BudgetLevels { low: 32, pressure: 48, high: 64 });
    }
}
