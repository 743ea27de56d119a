//! Built-in schedulerlets and reinjection handlers. Each is a small unit;
//! the baselines (minRTT, round robin, redundant, BLEST, ECF, single path)
//! are compositions of these in [`super::registry`], never copies of each
//! other.

use std::collections::HashMap;
use std::time::Instant;

use super::params::{ConfigError, FromParams, ParamReader};
use super::{Context, Kind, PathSets, Reinject, ReinjectionHandler, Schedulerlet};
use crate::ids::{PathId, UserId};
use crate::path::{Availability, PathView};

fn has_room(p: &PathView) -> bool {
    p.availability == Availability::Available
}

/// Soft selector: the lowest-RTT candidate with room in its window
/// (MPTCP's default scheduler).
#[derive(Debug, Default)]
pub struct MinRtt;

impl FromParams for MinRtt {
    const NAME: &'static str = "minrtt";
    fn from_params(_: &ParamReader<'_>) -> Result<Self, ConfigError> {
        Ok(MinRtt)
    }
}

impl Schedulerlet for MinRtt {
    fn name(&self) -> &'static str {
        Self::NAME
    }
    fn kind(&self) -> Kind {
        Kind::SoftSelector
    }
    fn apply(&mut self, ctx: &Context<'_>, sets: &mut PathSets) {
        if let Some(p) = ctx.in_set(sets.candidates).filter(|p| has_room(p)).min_by_key(|p| (p.srtt_us, p.id)) {
            sets.select(p.id);
        }
    }
}

/// Soft selector: candidates with room, taken in turn.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: u8,
}

impl FromParams for RoundRobin {
    const NAME: &'static str = "roundrobin";
    fn from_params(_: &ParamReader<'_>) -> Result<Self, ConfigError> {
        Ok(RoundRobin::default())
    }
}

impl Schedulerlet for RoundRobin {
    fn name(&self) -> &'static str {
        Self::NAME
    }
    fn kind(&self) -> Kind {
        Kind::SoftSelector
    }
    fn apply(&mut self, ctx: &Context<'_>, sets: &mut PathSets) {
        let ready: Vec<PathId> = ctx.in_set(sets.candidates).filter(|p| has_room(p)).map(|p| p.id).collect();
        if let Some(&p) = ready.iter().find(|p| p.0 >= self.next).or(ready.first()) {
            sets.select(p);
            self.next = p.0.wrapping_add(1);
        }
    }
}

/// Soft selector: every candidate (MPTCP's redundant scheduler: each packet
/// on every path).
#[derive(Debug, Default)]
pub struct AllPaths;

impl FromParams for AllPaths {
    const NAME: &'static str = "all-paths";
    fn from_params(_: &ParamReader<'_>) -> Result<Self, ConfigError> {
        Ok(AllPaths)
    }
}

impl Schedulerlet for AllPaths {
    fn name(&self) -> &'static str {
        Self::NAME
    }
    fn kind(&self) -> Kind {
        Kind::SoftSelector
    }
    fn apply(&mut self, _ctx: &Context<'_>, sets: &mut PathSets) {
        for p in sets.candidates.iter() {
            sets.select(p);
        }
    }
}

/// Candidate filter: each user is pinned to one path; users are spread over
/// the live paths round robin, in order of first appearance. This is what
/// operators run today (one passenger, one SIM). When a user's path goes
/// down the user is pinned again to the next live path, so its connections
/// survive; that is kinder than today's gateways, which drop them.
#[derive(Debug, Default)]
pub struct PinUser {
    pins: HashMap<UserId, PathId>,
    next: u8,
}

impl FromParams for PinUser {
    const NAME: &'static str = "pin-user";
    fn from_params(_: &ParamReader<'_>) -> Result<Self, ConfigError> {
        Ok(PinUser::default())
    }
}

impl Schedulerlet for PinUser {
    fn name(&self) -> &'static str {
        Self::NAME
    }
    fn kind(&self) -> Kind {
        Kind::CandidateFilter
    }
    fn apply(&mut self, ctx: &Context<'_>, sets: &mut PathSets) {
        let live: Vec<PathId> = ctx.paths.iter().map(|p| p.id).collect();
        if live.is_empty() {
            return;
        }
        let user = ctx.packet.user;
        let pinned = match self.pins.get(&user) {
            Some(p) if live.contains(p) => *p,
            _ => {
                let p = *live.iter().find(|p| p.0 >= self.next).unwrap_or(&live[0]);
                self.next = p.0.wrapping_add(1);
                self.pins.insert(user, p);
                p
            }
        };
        for p in sets.candidates.iter() {
            if p != pinned {
                sets.reject(p);
            }
        }
    }
}

/// Candidate filter: every packet on one configured path (`path`), for a
/// benchmark's single-carrier reference ("the best SIM alone"); while that
/// path is down, on any live path (connections survive, as with
/// `pin-user`).
#[derive(Debug)]
pub struct PinPath {
    pub path: PathId,
}

impl FromParams for PinPath {
    const NAME: &'static str = "pin-path";
    const PARAMS: &'static [&'static str] = &["path"];
    fn from_params(p: &ParamReader<'_>) -> Result<Self, ConfigError> {
        let path = p.get("path", 0.0, 0.0..=(crate::MAX_PATHS - 1) as f64, "a path id")?;
        Ok(PinPath { path: PathId(path as u8) })
    }
}

impl Schedulerlet for PinPath {
    fn name(&self) -> &'static str {
        Self::NAME
    }
    fn kind(&self) -> Kind {
        Kind::CandidateFilter
    }
    fn apply(&mut self, ctx: &Context<'_>, sets: &mut PathSets) {
        if ctx.path(self.path).is_none() {
            return;
        }
        for p in sets.candidates.iter() {
            if p != self.path {
                sets.reject(p);
            }
        }
    }
}

/// Selection filter: BLEST (Ferlin et al., IFIP Networking 2016). When the
/// soft selector picked a path slower than the fastest live path (which is
/// then out of window), estimate how much the fastest path could send
/// during one RTT of the slow one; if that would overrun the connection's
/// send window (head-of-line blocking at the receiver), wait for the fast
/// path instead.
#[derive(Debug)]
pub struct Blest {
    /// Scaling of the fast path's estimated bytes (BLEST's λ).
    pub lambda: f64,
}

impl FromParams for Blest {
    const NAME: &'static str = "blest";
    const PARAMS: &'static [&'static str] = &["lambda"];
    fn from_params(p: &ParamReader<'_>) -> Result<Self, ConfigError> {
        Ok(Blest { lambda: p.get("lambda", 1.0, 0.01..=100.0, "0.01..=100")? })
    }
}

impl Schedulerlet for Blest {
    fn name(&self) -> &'static str {
        Self::NAME
    }
    fn kind(&self) -> Kind {
        Kind::SelectionFilter
    }
    fn apply(&mut self, ctx: &Context<'_>, sets: &mut PathSets) {
        let Some(fast) = ctx.fastest() else { return };
        for slow in ctx.in_set(sets.selected).collect::<Vec<_>>() {
            if slow.id == fast.id || slow.srtt_us <= fast.srtt_us {
                continue;
            }
            let ratio = slow.srtt_us as f64 / fast.srtt_us.max(1) as f64;
            // Bytes the fast path can deliver while one packet crosses the
            // slow one, allowing its window to grow by one MSS-ish per RTT.
            let x = fast.cwnd_bytes as f64 * (ratio + (ratio - 1.0) / 2.0) * self.lambda;
            let window = ctx.packet.send_window_bytes as f64 - slow.in_flight_bytes as f64;
            if x > window {
                sets.deselect(slow.id);
            }
        }
    }
}

/// Selection filter: ECF, earliest completion first (Lim et al., CoNEXT
/// 2017). Compares finishing the flow's remaining bytes on the fastest path
/// (after waiting for its window) with using the slower selected path.
#[derive(Debug)]
pub struct Ecf {
    /// Hysteresis once waiting (ECF's β).
    pub beta: f64,
    waiting: bool,
}

impl Ecf {
    pub fn new(beta: f64) -> Self {
        Ecf { beta, waiting: false }
    }
}

impl FromParams for Ecf {
    const NAME: &'static str = "ecf";
    const PARAMS: &'static [&'static str] = &["beta"];
    fn from_params(p: &ParamReader<'_>) -> Result<Self, ConfigError> {
        Ok(Ecf::new(p.get("beta", 0.25, 0.0..=10.0, "0..=10")?))
    }
}

impl Schedulerlet for Ecf {
    fn name(&self) -> &'static str {
        Self::NAME
    }
    fn kind(&self) -> Kind {
        Kind::SelectionFilter
    }
    fn apply(&mut self, ctx: &Context<'_>, sets: &mut PathSets) {
        let Some(fast) = ctx.fastest() else { return };
        if has_room(fast) {
            self.waiting = false;
            return;
        }
        for slow in ctx.in_set(sets.selected).collect::<Vec<_>>() {
            if slow.id == fast.id {
                continue;
            }
            let k = ctx.packet.remaining_bytes as f64;
            let rtt_f = fast.srtt_us as f64;
            let rtt_s = slow.srtt_us as f64;
            let delta = fast.rttvar_us.max(slow.rttvar_us) as f64;
            let n = 1.0 + k / fast.cwnd_bytes.max(1) as f64;
            let hyst = if self.waiting { 1.0 + self.beta } else { 1.0 };
            if n * rtt_f < hyst * (rtt_s + delta) {
                if k / slow.cwnd_bytes.max(1) as f64 * rtt_s >= 2.0 * rtt_f + delta {
                    self.waiting = true;
                    sets.deselect(slow.id);
                } else {
                    self.waiting = false;
                }
            } else {
                self.waiting = false;
            }
        }
    }
}

/// Reinjection handler: none.
#[derive(Debug, Default)]
pub struct NoReinjection;

impl FromParams for NoReinjection {
    const NAME: &'static str = "none";
    fn from_params(_: &ParamReader<'_>) -> Result<Self, ConfigError> {
        Ok(NoReinjection)
    }
}

impl ReinjectionHandler for NoReinjection {
    fn name(&self) -> &'static str {
        Self::NAME
    }
    fn on_rto(&mut self, _now: Instant, _path: &PathView) -> Reinject {
        Reinject::Nothing
    }
}

/// Reinjection handler: MPTCP's opportunistic retransmission — on every
/// RTO, the path's oldest unacknowledged packet is reinjected elsewhere.
#[derive(Debug, Default)]
pub struct RtoOldest;

impl FromParams for RtoOldest {
    const NAME: &'static str = "rto-oldest";
    fn from_params(_: &ParamReader<'_>) -> Result<Self, ConfigError> {
        Ok(RtoOldest)
    }
}

impl ReinjectionHandler for RtoOldest {
    fn name(&self) -> &'static str {
        Self::NAME
    }
    fn on_rto(&mut self, _now: Instant, _path: &PathView) -> Reinject {
        Reinject::Oldest
    }
}

/// Reinjection handler: at the `k`-th RTO of a path, all its
/// unacknowledged packets go back to their connections' send buffers
/// (POLYCORN §4.5, extended reinjection); earlier RTOs behave like MPTCP.
#[derive(Debug)]
pub struct Extended {
    pub k: u32,
}

impl FromParams for Extended {
    const NAME: &'static str = "extended";
    const PARAMS: &'static [&'static str] = &["k"];
    fn from_params(p: &ParamReader<'_>) -> Result<Self, ConfigError> {
        Ok(Extended { k: p.get("k", 3.0, 1.0..=64.0, "1..=64")? as u32 })
    }
}

impl ReinjectionHandler for Extended {
    fn name(&self) -> &'static str {
        Self::NAME
    }
    fn on_rto(&mut self, _now: Instant, path: &PathView) -> Reinject {
        if path.rto_count == self.k {
            Reinject::AllUnacked
        } else if path.rto_count < self.k {
            Reinject::Oldest
        } else {
            Reinject::Nothing
        }
    }
}

/// Paths of `mask` as a vector, for tests.
#[cfg(test)]
fn ids(mask: crate::ids::PathMask) -> Vec<u8> {
    mask.iter().map(|p| p.0).collect()
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::Pipeline;
    use super::*;

    fn run(lets: Vec<Box<dyn Schedulerlet>>, paths: &[PathView], pkt: &super::super::PacketInfo) -> Vec<u8> {
        let mut p = Pipeline::new("t", lets, Box::new(NoReinjection));
        ids(p.select(&Context { now: Instant::now(), paths, packet: pkt }))
    }

    #[test]
    fn minrtt_picks_the_fastest_path_with_room() {
        let mut paths = [view(0, 50), view(1, 20), view(2, 30)];
        assert_eq!(run(vec![Box::new(MinRtt)], &paths, &packet()), vec![1]);
        paths[1].availability = Availability::Full;
        assert_eq!(run(vec![Box::new(MinRtt)], &paths, &packet()), vec![2]);
    }

    #[test]
    fn pin_path_keeps_to_its_path_while_it_is_live() {
        let paths = [view(0, 10), view(1, 20)];
        let pkt = packet();
        assert_eq!(run(vec![Box::new(PinPath { path: PathId(1) }), Box::new(MinRtt)], &paths, &pkt), vec![1]);
        assert_eq!(run(vec![Box::new(PinPath { path: PathId(2) }), Box::new(MinRtt)], &paths, &pkt), vec![0]);
    }

    #[test]
    fn roundrobin_cycles_over_paths_with_room() {
        let paths = [view(0, 50), view(1, 20), view(2, 30)];
        let mut p = Pipeline::new("rr", vec![Box::new(RoundRobin::default())], Box::new(NoReinjection));
        let pkt = packet();
        let ctx = Context { now: Instant::now(), paths: &paths, packet: &pkt };
        let got: Vec<Vec<u8>> = (0..4).map(|_| ids(p.select(&ctx))).collect();
        assert_eq!(got, vec![vec![0], vec![1], vec![2], vec![0]]);
    }

    #[test]
    fn redundant_uses_every_path_with_room() {
        let mut paths = [view(0, 50), view(1, 20), view(2, 30)];
        paths[2].availability = Availability::Full;
        assert_eq!(run(vec![Box::new(AllPaths)], &paths, &packet()), vec![0, 1]);
    }

    #[test]
    fn pin_user_spreads_users_and_repins_when_a_path_dies() {
        let paths = [view(0, 50), view(1, 20)];
        let mut p = Pipeline::new("sp", vec![Box::new(PinUser::default()), Box::new(MinRtt)], Box::new(NoReinjection));
        let mut a = packet();
        a.user = UserId([1; 16]);
        let mut b = packet();
        b.user = UserId([2; 16]);
        let now = Instant::now();
        assert_eq!(
            ids(p.select(&Context { now, paths: &paths, packet: &a })),
            vec![0],
            "first user, first path even though slower"
        );
        assert_eq!(ids(p.select(&Context { now, paths: &paths, packet: &b })), vec![1]);
        assert_eq!(ids(p.select(&Context { now, paths: &paths, packet: &a })), vec![0], "stays pinned");
        let only1 = [view(1, 20)];
        assert_eq!(ids(p.select(&Context { now, paths: &only1, packet: &a })), vec![1]);
    }

    #[test]
    fn pinned_user_waits_when_its_path_is_full() {
        let mut paths = [view(0, 50), view(1, 20)];
        paths[0].availability = Availability::Full;
        assert!(run(vec![Box::new(PinUser::default()), Box::new(MinRtt)], &paths, &packet()).is_empty());
    }

    #[test]
    fn blest_waits_for_the_fast_path_when_the_window_is_small() {
        let mut paths = [view(0, 10), view(1, 100)];
        paths[0].availability = Availability::Full;
        let mut pkt = packet();
        pkt.send_window_bytes = 100_000;
        let lets = || -> Vec<Box<dyn Schedulerlet>> { vec![Box::new(MinRtt), Box::new(Blest { lambda: 1.0 })] };
        assert!(run(lets(), &paths, &pkt).is_empty(), "10x slower path would block the receiver");
        pkt.send_window_bytes = 10_000_000;
        assert_eq!(run(lets(), &paths, &pkt), vec![1], "a large window absorbs the slow path");
    }

    #[test]
    fn ecf_waits_when_the_fast_path_finishes_sooner() {
        let mut paths = [view(0, 10), view(1, 100)];
        paths[0].availability = Availability::Full;
        let mut pkt = packet();
        pkt.remaining_bytes = 64 * 1024;
        let lets = || -> Vec<Box<dyn Schedulerlet>> { vec![Box::new(MinRtt), Box::new(Ecf::new(0.25))] };
        assert!(run(lets(), &paths, &pkt).is_empty());
        pkt.remaining_bytes = 64 * 1024 * 1024;
        assert_eq!(run(lets(), &paths, &pkt), vec![1], "a long flow uses both paths");
    }

    #[test]
    fn extended_reinjection_fires_once_at_the_kth_rto() {
        let mut h = Extended { k: 3 };
        let mut v = view(0, 10);
        let now = Instant::now();
        let got: Vec<Reinject> = (1..=4)
            .map(|k| {
                v.rto_count = k;
                h.on_rto(now, &v)
            })
            .collect();
        assert_eq!(got, vec![Reinject::Oldest, Reinject::Oldest, Reinject::AllUnacked, Reinject::Nothing]);
    }
}
