//! Reconnect backoff: the wait before the next attempt after a failure,
//! doubling from `initial` up to `max`, back to `initial` after a success.
//! Sans-IO (the caller sleeps), so the schedule is tested without time.
//! One definition for every reconnect loop of the binaries (subflows, gpsd).
//! No jitter: each train has its own proxy, so there is no herd of clients
//! to spread out.

use std::time::Duration;

/// The backoff state of one reconnect loop.
#[derive(Clone, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Waits of `initial`, 2 × `initial`, ... up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff { initial, max: max.max(initial), next: initial }
    }

    /// The reconnect loops' schedule: 100 ms doubling to 5 s.
    pub fn reconnect() -> Backoff {
        Backoff::new(Duration::from_millis(100), Duration::from_secs(5))
    }

    /// The wait before the next attempt; the one after it is twice as long
    /// (at most `max`).
    pub fn next_wait(&mut self) -> Duration {
        let wait = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        wait
    }

    /// The connection succeeded: the next failure waits `initial` again.
    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_and_resets() {
        let mut b = Backoff::reconnect();
        let waits: Vec<u64> = (0..8).map(|_| b.next_wait().as_millis() as u64).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        b.reset();
        assert_eq!(b.next_wait(), Duration::from_millis(100));
        let mut odd = Backoff::new(Duration::from_secs(10), Duration::from_secs(1));
        assert_eq!((odd.next_wait(), odd.next_wait()), (Duration::from_secs(10), Duration::from_secs(10)));
    }
}
