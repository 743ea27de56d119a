//! Head-of-line recovery schedulerlets: what a multipath sender does when
//! one slow or stalled path holds the connection's window while another
//! path has room (Raiciu et al., "How Hard Can It Be? Designing and
//! Implementing a Deployable Multipath TCP", NSDI 2012, §4.2; and the
//! stale-subflow handling of Linux MPTCP, made fast enough for a train).
//!
//! - `opp-reinject`: opportunistic reinjection. When the window is full
//!   and its head is in flight only on paths slower than an available
//!   path (or stale, or in RTO), send the head once more on that path.
//! - `penalise`: halve the window of the path holding the head, at most
//!   once per its smoothed RTT, when its RTT exceeds that of an available
//!   path (only RTT imbalance; a lone path is never penalised).
//! - `stale-filter`: a stale path ([`crate::path::PathView::stale`]: data
//!   outstanding and no acknowledgement progress for max(2 × SRTT, 300 ms),
//!   or the modem reports no service) gets no new packets, and everything
//!   it holds is reinjected at once; its first acknowledgement makes it
//!   active again (upstream Linux MPTCP waits for 4 RTOs).
//!
//! - `tail-reinject` (not in the paper; XLINK, SIGCOMM 2021, reinjects a
//!   stream's unacknowledged tail on other paths): when a flow's last
//!   packet is placed, its segments still in flight on a path whose queue
//!   would deliver them later than copies on the quickest path with room
//!   are sent again there, once each.
//!
//! All four leave path selection alone (their `apply` moves nothing), so
//! they compose with any pipeline and an ablation removes each by name.

use std::time::Instant;

use super::hrsch::{buf_bytes, TailReject};
use super::params::{ConfigError, FromParams, ParamReader};
use super::{Context, HeadAction, HeadContext, Kind, PathSets, Reinject, Schedulerlet, TailContext};
use crate::ids::PathMask;
use crate::path::{Availability, PathView, StaleThreshold};

/// The smoothed RTT a head copy on `p` is expected to take, or `None` when
/// the path cannot be counted on (stale, in RTO).
fn usable_srtt(p: &PathView) -> Option<u64> {
    (!p.stale && p.rto_count == 0).then_some(p.srtt_us)
}

/// The fastest available path that does not hold the head, if it beats
/// every usable path that does.
fn faster_elsewhere<'a>(ctx: &HeadContext<'a>) -> Option<&'a PathView> {
    let holders = ctx.paths.iter().filter(|p| ctx.head_paths.contains(p.id));
    let best_holder = holders.filter_map(usable_srtt).min();
    ctx.paths
        .iter()
        .filter(|p| !ctx.head_paths.contains(p.id) && p.availability == Availability::Available && !p.stale)
        .min_by_key(|p| (p.srtt_us, p.id))
        .filter(|p| best_holder.is_none_or(|b| p.srtt_us < b))
}

/// Opportunistic reinjection of the window's head.
#[derive(Debug, Default)]
pub struct OppReinject {
    pub reinjections: u64,
}

impl FromParams for OppReinject {
    const NAME: &'static str = "opp-reinject";
    fn from_params(_: &ParamReader<'_>) -> Result<Self, ConfigError> {
        Ok(OppReinject::default())
    }
}

impl Schedulerlet for OppReinject {
    fn name(&self) -> &'static str {
        Self::NAME
    }
    fn kind(&self) -> Kind {
        Kind::CandidateFilter
    }
    fn on_head_blocked(&mut self, ctx: &HeadContext<'_>) -> HeadAction {
        if ctx.head_reinjected || faster_elsewhere(ctx).is_none() {
            return HeadAction::default();
        }
        self.reinjections += 1;
        HeadAction { reinject: true, penalise: PathMask::EMPTY }
    }
    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![("head_reinjections", self.reinjections)]
    }
}

/// Penalisation of the path that holds the head.
#[derive(Debug, Default)]
pub struct Penalise {
    pub requests: u64,
}

impl FromParams for Penalise {
    const NAME: &'static str = "penalise";
    fn from_params(_: &ParamReader<'_>) -> Result<Self, ConfigError> {
        Ok(Penalise::default())
    }
}

impl Schedulerlet for Penalise {
    fn name(&self) -> &'static str {
        Self::NAME
    }
    fn kind(&self) -> Kind {
        Kind::CandidateFilter
    }
    fn on_head_blocked(&mut self, ctx: &HeadContext<'_>) -> HeadAction {
        let Some(fast) = faster_elsewhere(ctx) else { return HeadAction::default() };
        let mut slow = PathMask::EMPTY;
        for p in ctx.paths.iter().filter(|p| ctx.head_paths.contains(p.id) && p.srtt_us > fast.srtt_us) {
            slow.insert(p.id);
        }
        if !slow.is_empty() {
            self.requests += 1;
        }
        HeadAction { reinject: false, penalise: slow }
    }
    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![("penalise_requests", self.requests)]
    }
}

/// Stale paths get nothing new and give back what they hold. With a
/// `threshold` (parameters `srtt_factor`, `min_ms`) it also says when a path
/// is stale; without, the endpoint's path configuration does.
#[derive(Debug, Default)]
pub struct StaleFilter {
    pub rejected: u64,
    pub stale_events: u64,
    pub threshold: Option<StaleThreshold>,
}

impl FromParams for StaleFilter {
    const NAME: &'static str = "stale-filter";
    const PARAMS: &'static [&'static str] = &["srtt_factor", "min_ms"];
    /// Without parameters the endpoint's path configuration decides when a
    /// path is stale (2 x SRTT, at least 300 ms); with either, the other
    /// takes that default.
    fn from_params(p: &ParamReader<'_>) -> Result<Self, ConfigError> {
        let threshold = if p.is_empty() {
            None
        } else {
            let d = crate::path::PathConfig::default().stale_threshold();
            const FACTOR: &str = "an integer from 1 to 16";
            let factor = p.get("srtt_factor", f64::from(d.srtt_factor), 1.0..=16.0, FACTOR)?;
            if factor.fract() != 0.0 {
                return Err(p.bad("srtt_factor", factor, FACTOR));
            }
            let min_ms = p.get("min_ms", d.min.as_secs_f64() * 1e3, 10.0..=60_000.0, "10 to 60000 ms")?;
            Some(StaleThreshold { srtt_factor: factor as u32, min: std::time::Duration::from_secs_f64(min_ms / 1e3) })
        };
        Ok(StaleFilter { threshold, ..StaleFilter::default() })
    }
}

impl Schedulerlet for StaleFilter {
    fn name(&self) -> &'static str {
        Self::NAME
    }
    fn kind(&self) -> Kind {
        Kind::CandidateFilter
    }
    fn apply(&mut self, ctx: &Context<'_>, sets: &mut PathSets) {
        // Never every path: with all of them stale, the least bad one still
        // carries data (its acknowledgement ends the staleness).
        if ctx.in_set(sets.candidates).all(|p| p.stale) {
            return;
        }
        for p in ctx.in_set(sets.candidates).filter(|p| p.stale) {
            sets.reject(p.id);
            self.rejected += 1;
        }
    }
    fn on_stale(&mut self, _now: Instant, _path: &PathView) -> Reinject {
        self.stale_events += 1;
        Reinject::AllUnacked
    }
    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![("rejected", self.rejected), ("stale_paths", self.stale_events)]
    }
    fn stale_threshold(&self) -> Option<StaleThreshold> {
        self.threshold
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use crate::ids::{ConnId, PathId};

    fn head<'a>(paths: &'a [PathView], on: u8, reinjected: bool) -> HeadContext<'a> {
        HeadContext {
            now: Instant::now(),
            paths,
            conn: ConnId(1),
            head_offset: 0,
            head_len: 16_000,
            head_paths: PathMask::single(PathId(on)),
            head_reinjected: reinjected,
        }
    }

    fn ids(m: PathMask) -> Vec<u8> {
        m.iter().map(|p| p.0).collect()
    }

    fn tail(paths: &[PathView]) -> TailContext<'_> {
        TailContext { now: Instant::now(), paths, conn: ConnId(1) }
    }

    #[test]
    fn a_tail_is_copied_only_from_a_path_that_would_deliver_it_later() {
        // Path 0: 40 ms, 5 MB/s, room. Path 1: 20 ms but 0.125 MB/s with
        // 64 KB queued: its last byte arrives after 10 + 512 ms; copies of
        // all 64 KB on path 0 after 20 + 13 ms.
        let mut fast = view(0, 40);
        fast.delivery_rate_bps = 5_000_000;
        let mut slow = view(1, 20);
        slow.delivery_rate_bps = 125_000;
        slow.in_flight_bytes = 48_000;
        slow.queued_bytes = 16_000;
        let mut t = TailReinject::default();
        assert_eq!(ids(t.on_tail_in_flight(&tail(&[fast, slow]))), vec![1]);
        assert_eq!(t.counters(), vec![("tail_copies", 1)]);
        // Equal carriers, one of them with the tail in flight: nothing.
        let mut other = view(1, 40);
        other.delivery_rate_bps = 5_000_000;
        other.in_flight_bytes = 64_000;
        assert!(t.on_tail_in_flight(&tail(&[fast, other])).is_empty());
        // A stale path's share is copied whatever its estimates say.
        other.stale = true;
        assert_eq!(ids(t.on_tail_in_flight(&tail(&[fast, other]))), vec![1]);
        // No path with room: nothing (the copies would only wait).
        fast.availability = Availability::Full;
        assert!(t.on_tail_in_flight(&tail(&[fast, slow])).is_empty());
    }

    #[test]
    fn the_head_is_reinjected_once_and_only_from_a_slower_path() {
        let paths = [view(0, 20), view(1, 80)];
        let mut o = OppReinject::default();
        assert!(o.on_head_blocked(&head(&paths, 1, false)).reinject, "head on the slow path");
        assert!(!o.on_head_blocked(&head(&paths, 1, true)).reinject, "once per head");
        assert!(!o.on_head_blocked(&head(&paths, 0, false)).reinject, "head already on the fastest path");
        let mut stalled = paths;
        stalled[0].stale = true;
        assert!(o.on_head_blocked(&head(&stalled, 0, false)).reinject, "a stale holder counts as slowest");
        let mut full = paths;
        full[0].availability = Availability::Full;
        assert!(!o.on_head_blocked(&head(&full, 1, false)).reinject, "the fast path has no room");
        assert_eq!(o.counters(), vec![("head_reinjections", 2)]);
    }

    #[test]
    fn only_the_slower_holder_is_penalised() {
        let paths = [view(0, 20), view(1, 80)];
        let mut p = Penalise::default();
        assert_eq!(p.on_head_blocked(&head(&paths, 1, false)).penalise, PathMask::single(PathId(1)));
        assert_eq!(p.on_head_blocked(&head(&paths, 0, false)).penalise, PathMask::EMPTY);
        let alone = [view(1, 80)];
        assert_eq!(p.on_head_blocked(&head(&alone, 1, false)).penalise, PathMask::EMPTY, "no imbalance alone");
    }

    #[test]
    fn stale_paths_are_filtered_unless_every_path_is() {
        let mut paths = [view(0, 20), view(1, 80)];
        paths[0].stale = true;
        let pkt = packet();
        let ctx = Context { now: Instant::now(), paths: &paths, packet: &pkt };
        let mut f = StaleFilter::default();
        let mut sets = PathSets { candidates: PathMask(0b11), ..PathSets::default() };
        f.apply(&ctx, &mut sets);
        assert_eq!(sets.candidates, PathMask::single(PathId(1)));
        paths[1].stale = true;
        let ctx = Context { now: Instant::now(), paths: &paths, packet: &pkt };
        let mut sets = PathSets { candidates: PathMask(0b11), ..PathSets::default() };
        f.apply(&ctx, &mut sets);
        assert_eq!(sets.candidates, PathMask(0b11));
        assert_eq!(f.on_stale(Instant::now(), &paths[0]), Reinject::AllUnacked);
    }
}

/// Tail reinjection: when a flow's tail is in flight, copy what is queued
/// on a slow path onto the quickest path with room. A path is slow for the
/// tail when the last of its queued bytes would arrive later (T⁻, as in
/// `tail-reject`: owd + buf / bw) than copies of all of them sent now on
/// the quickest path (T⁻ there plus their bytes at its rate), or when it is
/// stale or in timeout. On paths of equal speed nothing is copied.
#[derive(Debug, Default)]
pub struct TailReinject {
    /// Flows whose tail was copied from at least one path.
    pub requests: u64,
}

impl FromParams for TailReinject {
    const NAME: &'static str = "tail-reinject";
    fn from_params(_: &ParamReader<'_>) -> Result<Self, ConfigError> {
        Ok(TailReinject::default())
    }
}

impl Schedulerlet for TailReinject {
    fn name(&self) -> &'static str {
        Self::NAME
    }
    fn kind(&self) -> Kind {
        Kind::CandidateFilter
    }
    fn on_tail_in_flight(&mut self, ctx: &TailContext<'_>) -> PathMask {
        let quickest = ctx
            .paths
            .iter()
            .filter(|p| p.availability == Availability::Available && usable_srtt(p).is_some())
            .min_by(|a, b| TailReject::t_minus(a).total_cmp(&TailReject::t_minus(b)).then(a.id.cmp(&b.id)));
        let Some(best) = quickest else { return PathMask::EMPTY };
        let t_best = TailReject::t_minus(best);
        let rate = best.bandwidth_bps().max(1) as f64;
        let mut slow = PathMask::EMPTY;
        for p in ctx.paths.iter().filter(|p| p.id != best.id && buf_bytes(p) > 0.0) {
            let copies = t_best + buf_bytes(p) / rate;
            if usable_srtt(p).is_none() || TailReject::t_minus(p) > copies {
                slow.insert(p.id);
            }
        }
        if !slow.is_empty() {
            self.requests += 1;
        }
        slow
    }
    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![("tail_copies", self.requests)]
    }
}
