//! Multi-user scheduling (POLYCORN §4.7): proportional fair across users,
//! round robin across one user's flows.
//!
//! Every user shares the same paths, so a user's achievable rate is the same
//! for all; proportional fair then reduces to serving the backlogged user
//! with the least recently-served bytes, an exponentially decayed count with
//! time constant `tau`. A user who sends little (instant messaging) is
//! therefore served at once, while bulk users share the rest equally.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::ids::{ConnId, UserId};

#[derive(Debug)]
struct User {
    served: f64,
    updated: Instant,
    /// Backlogged flows in round-robin order.
    flows: VecDeque<ConnId>,
}

/// Which user and flow to serve next.
#[derive(Debug)]
pub struct UserScheduler {
    tau: Duration,
    users: HashMap<UserId, User>,
    /// Users with at least one backlogged flow.
    active: Vec<UserId>,
}

impl UserScheduler {
    pub fn new(tau: Duration) -> Self {
        UserScheduler { tau, users: HashMap::new(), active: Vec::new() }
    }

    fn decayed(&self, u: &User, now: Instant) -> f64 {
        let dt = now.saturating_duration_since(u.updated).as_secs_f64();
        u.served * (-dt / self.tau.as_secs_f64()).exp()
    }

    /// Mark `conn` of `user` as having something to send.
    pub fn activate(&mut self, user: UserId, conn: ConnId, now: Instant) {
        let u = self.users.entry(user).or_insert_with(|| User { served: 0.0, updated: now, flows: VecDeque::new() });
        if u.flows.contains(&conn) {
            return;
        }
        if u.flows.is_empty() {
            self.active.push(user);
        }
        u.flows.push_back(conn);
    }

    /// `conn` has nothing more to send for now.
    pub fn deactivate(&mut self, user: UserId, conn: ConnId) {
        if let Some(u) = self.users.get_mut(&user) {
            u.flows.retain(|c| *c != conn);
            if u.flows.is_empty() {
                self.active.retain(|x| *x != user);
            }
        }
    }

    /// Forget users with no flows whose served bytes have decayed away, so
    /// memory stays bounded over a long trip with passengers coming and
    /// going. Forgetting them changes nothing: a returning user starts at 0.
    pub fn forget_idle(&mut self, now: Instant) {
        let tau = self.tau.as_secs_f64();
        self.users.retain(|_, u| {
            let dt = now.saturating_duration_since(u.updated).as_secs_f64();
            !u.flows.is_empty() || u.served * (-dt / tau).exp() >= 1.0
        });
    }

    /// Users the scheduler remembers (active or recently served).
    pub fn known_users(&self) -> usize {
        self.users.len()
    }

    /// The next (user, flow) to serve, skipping users in `skip`. The flow is
    /// rotated to the back of its user's queue.
    pub fn next(&mut self, now: Instant, skip: &[UserId]) -> Option<(UserId, ConnId)> {
        let mut best: Option<(f64, UserId)> = None;
        for &uid in &self.active {
            if skip.contains(&uid) {
                continue;
            }
            let s = self.decayed(&self.users[&uid], now);
            if best.is_none_or(|(b, id)| s < b || (s == b && uid < id)) {
                best = Some((s, uid));
            }
        }
        let (_, uid) = best?;
        let u = self.users.get_mut(&uid).expect("active users exist");
        let conn = u.flows.pop_front().expect("active users have flows");
        u.flows.push_back(conn);
        Some((uid, conn))
    }

    /// Account `bytes` served to `user`.
    pub fn served(&mut self, user: UserId, bytes: u64, now: Instant) {
        let d = self.users.get(&user).map(|u| self.decayed(u, now));
        if let (Some(d), Some(u)) = (d, self.users.get_mut(&user)) {
            u.served = d + bytes as f64;
            u.updated = now;
        }
    }

    pub fn active_users(&self) -> usize {
        self.active.len()
    }

    pub fn active_flows(&self) -> usize {
        self.active.iter().map(|u| self.users[u].flows.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(i: u8) -> UserId {
        UserId([i; 16])
    }

    #[test]
    fn two_bulk_users_share_equally() {
        let now = Instant::now();
        let mut s = UserScheduler::new(Duration::from_secs(1));
        s.activate(u(1), ConnId(1), now);
        s.activate(u(2), ConnId(2), now);
        let mut bytes = HashMap::new();
        for _ in 0..1000 {
            let (user, _) = s.next(now, &[]).unwrap();
            s.served(user, 1400, now);
            *bytes.entry(user).or_insert(0u64) += 1400;
        }
        assert_eq!(bytes[&u(1)], bytes[&u(2)]);
    }

    #[test]
    fn a_light_user_is_served_before_a_heavy_one() {
        let now = Instant::now();
        let mut s = UserScheduler::new(Duration::from_secs(1));
        s.activate(u(1), ConnId(1), now);
        for _ in 0..100 {
            let (user, _) = s.next(now, &[]).unwrap();
            s.served(user, 1400, now);
        }
        s.activate(u(2), ConnId(2), now);
        assert_eq!(s.next(now, &[]).unwrap().0, u(2));
    }

    #[test]
    fn flows_of_one_user_take_turns() {
        let now = Instant::now();
        let mut s = UserScheduler::new(Duration::from_secs(1));
        for c in 1..=3 {
            s.activate(u(1), ConnId(c), now);
        }
        let order: Vec<u32> = (0..6).map(|_| s.next(now, &[]).unwrap().1 .0).collect();
        assert_eq!(order, vec![1, 2, 3, 1, 2, 3]);
        s.deactivate(u(1), ConnId(2));
        let order: Vec<u32> = (0..2).map(|_| s.next(now, &[]).unwrap().1 .0).collect();
        assert_eq!(order, vec![1, 3]);
    }

    #[test]
    fn idle_users_are_forgotten_once_their_history_decays() {
        let t0 = Instant::now();
        let mut s = UserScheduler::new(Duration::from_secs(1));
        s.activate(u(1), ConnId(1), t0);
        s.activate(u(2), ConnId(2), t0);
        s.served(u(1), 1_000_000, t0);
        s.deactivate(u(1), ConnId(1));
        s.forget_idle(t0 + Duration::from_secs(1));
        assert_eq!(s.known_users(), 2, "recent history is kept");
        s.forget_idle(t0 + Duration::from_secs(20));
        assert_eq!(s.known_users(), 1, "user 2 still has a flow; user 1 is forgotten");
    }

    #[test]
    fn served_bytes_decay_over_time() {
        let t0 = Instant::now();
        let mut s = UserScheduler::new(Duration::from_secs(1));
        s.activate(u(1), ConnId(1), t0);
        s.activate(u(2), ConnId(2), t0);
        s.served(u(1), 1_000_000, t0);
        s.served(u(2), 10_000, t0 + Duration::from_secs(9));
        // After 10 s u1's megabyte has decayed below u2's recent 10 kB.
        assert_eq!(s.next(t0 + Duration::from_secs(10), &[]).unwrap().0, u(1));
    }
}
