//! The schedulerlet framework (POLYCORN, NSDI'23, §4.2).
//!
//! A scheduler is a [`Pipeline`] of small [`Schedulerlet`]s, each moving
//! paths between three sets: selected `S`, candidates `C` and unavailable
//! `U` (initially every live path is in `C`). The kind of a schedulerlet
//! fixes which moves it may make, and the pipeline enforces it:
//!
//! | kind                 | moves            |
//! |----------------------|------------------|
//! | candidate filter     | `C → U`          |
//! | soft selector        | `C → S`          |
//! | selection filter     | `S → C`          |
//! | hard selector        | `C ∪ U → S`      |
//!
//! After the last schedulerlet, the packet goes on every path in `S` that
//! has room (see [`crate::path::Availability`]); an empty result means the
//! packet waits. A [`ReinjectionHandler`] decides what happens to a path's
//! unacknowledged packets when its retransmission timer fires.
//!
//! Schedulerlets are registered by name in a [`Registry`]; pipelines are
//! composed by name, in configuration. The built-in compositions are
//! [`BUILTIN_PIPELINES`]; writing a new schedulerlet is described in
//! `docs/schedulerlets.md`.
//!
//! HRSCH, the paper's scheduler, and its ablations are compositions too;
//! its schedulerlets and the inputs of handover-failure prediction
//! ([`TrainState`], [`FailureTable`]) are in [`hrsch`].

pub mod hol;
pub mod hrsch;
pub mod lets;
pub mod params;
pub mod registry;
pub mod users;

use std::time::Instant;

use crate::ids::{ConnId, PathId, PathMask, UserId};
use crate::path::{Availability, PathView, StaleThreshold};

pub use hrsch::{FailureTable, TrackDirection, TrainState, TrainTracker};
pub use registry::{
    builtin_pipeline_names, BuiltinPipeline, ConfigError, FromParams, Params, PipelineSpec, Registry, SchedulerletSpec,
    BUILTIN_PIPELINES, DEFAULT_PIPELINE,
};

/// Which set moves a schedulerlet may make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    CandidateFilter,
    SoftSelector,
    SelectionFilter,
    HardSelector,
}

/// The three path sets of one scheduling decision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PathSets {
    pub selected: PathMask,
    pub candidates: PathMask,
    pub unavailable: PathMask,
}

impl PathSets {
    /// Move `p` to `S` if it is in `from` (one of `C`, `U`).
    pub fn select(&mut self, p: PathId) {
        self.candidates.remove(p);
        self.unavailable.remove(p);
        self.selected.insert(p);
    }
    /// Move `p` from `S` back to `C`.
    pub fn deselect(&mut self, p: PathId) {
        if self.selected.contains(p) {
            self.selected.remove(p);
            self.candidates.insert(p);
        }
    }
    /// Move `p` from `C` to `U`.
    pub fn reject(&mut self, p: PathId) {
        if self.candidates.contains(p) {
            self.candidates.remove(p);
            self.unavailable.insert(p);
        }
    }
}

/// The packet being scheduled and its flow, as schedulerlets see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketInfo {
    pub conn: ConnId,
    pub user: UserId,
    /// Data-level sequence number (stream offset) and length.
    pub offset: u64,
    pub len: u32,
    /// The flow's sender has sent FIN or RST: this is a tail packet.
    pub is_tail: bool,
    /// The flow's sender has nothing more *for now*: its shell's last write
    /// emptied the source (a read shorter than its buffer) and no byte came
    /// since, so every unsent byte ends a burst (a response on a kept-alive
    /// connection, a chat message). Only shells that know it say so
    /// ([`crate::Endpoint::send_burst`]); `tail-reject` with `bursts = 1`
    /// treats such packets as tail packets.
    pub is_burst_tail: bool,
    /// This packet has been sent before and is being reinjected.
    pub is_reinjection: bool,
    /// Paths this packet has already been placed on.
    pub paths_used: PathMask,
    /// Bytes of the flow not yet sent, this packet included.
    pub remaining_bytes: u64,
    /// Room in the flow's connection-level send window (peer's limit minus
    /// what is sent and unacknowledged).
    pub send_window_bytes: u64,
}

/// Everything a schedulerlet may read for one decision.
#[derive(Clone, Copy, Debug)]
pub struct Context<'a> {
    pub now: Instant,
    /// Every live path (never `Down` ones), in id order.
    pub paths: &'a [PathView],
    pub packet: &'a PacketInfo,
}

impl<'a> Context<'a> {
    pub fn path(&self, id: PathId) -> Option<&'a PathView> {
        self.paths.iter().find(|p| p.id == id)
    }
    /// Live paths that are members of `set`.
    pub fn in_set(&self, set: PathMask) -> impl Iterator<Item = &'a PathView> + 'a {
        self.paths.iter().filter(move |p| set.contains(p.id))
    }
    /// The live path with the lowest smoothed RTT, room or not.
    pub fn fastest(&self) -> Option<&'a PathView> {
        self.paths.iter().min_by_key(|p| (p.srtt_us, p.id))
    }
}

/// A unit of scheduling logic. Implementations are small, pure functions of
/// the context plus whatever state they keep in `self`.
pub trait Schedulerlet: Send {
    /// The name it is registered under.
    fn name(&self) -> &'static str;
    fn kind(&self) -> Kind;
    /// Move paths between the sets. Moves not allowed for [`Self::kind`] are
    /// undone by the pipeline. A schedulerlet that acts only through the
    /// hooks below (head-of-line recovery) keeps this default, which moves
    /// nothing.
    fn apply(&mut self, _ctx: &Context<'_>, _sets: &mut PathSets) {}
    /// Feedback after the decision: the paths the packet was placed on.
    fn on_scheduled(&mut self, _ctx: &Context<'_>, _placed: PathMask) {}
    /// Head-of-line recovery: a connection's new data waits only for the
    /// peer's window, whose head (lowest unacknowledged segment) is in
    /// flight. Called once per scheduling round while that lasts; the
    /// endpoint reinjects the head at most once.
    fn on_head_blocked(&mut self, _ctx: &HeadContext<'_>) -> HeadAction {
        HeadAction::default()
    }
    /// Tail recovery: a connection's sender is done for now (FIN, or a
    /// burst's end), everything it wrote is placed, and some of it is
    /// unacknowledged. Returns the paths whose share of it should be sent
    /// again on other paths (each segment at most once). Called when the
    /// connection's last packet has been placed.
    fn on_tail_in_flight(&mut self, _ctx: &TailContext<'_>) -> PathMask {
        PathMask::EMPTY
    }
    /// `path` just became stale ([`PathView::stale`]): what to do with its
    /// unacknowledged packets.
    fn on_stale(&mut self, _now: Instant, _path: &PathView) -> Reinject {
        Reinject::Nothing
    }
    /// Event counters for metrics (name, total since start), e.g. how many
    /// paths a filter rejected.
    fn counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
    /// The stale threshold this schedulerlet needs the endpoint's paths to
    /// use ([`Self::on_stale`]); `None` leaves the endpoint's
    /// [`crate::path::PathConfig`] as it is.
    fn stale_threshold(&self) -> Option<StaleThreshold> {
        None
    }
}

/// A connection blocked by the peer's window, as head-of-line recovery
/// schedulerlets see it ([`Schedulerlet::on_head_blocked`]).
#[derive(Clone, Copy, Debug)]
pub struct HeadContext<'a> {
    pub now: Instant,
    /// Every live path, in id order.
    pub paths: &'a [PathView],
    pub conn: ConnId,
    /// The head of the window: the lowest unacknowledged segment.
    pub head_offset: u64,
    pub head_len: u32,
    /// Paths the head was placed on.
    pub head_paths: PathMask,
    /// The head was already reinjected once for head-of-line recovery.
    pub head_reinjected: bool,
}

/// A connection whose tail is in flight, as tail-recovery schedulerlets
/// see it ([`Schedulerlet::on_tail_in_flight`]).
#[derive(Clone, Copy, Debug)]
pub struct TailContext<'a> {
    pub now: Instant,
    /// Every live path, in id order.
    pub paths: &'a [PathView],
    pub conn: ConnId,
}

/// What head-of-line recovery asks of the endpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeadAction {
    /// Send the head again, on a path it has not used (once per segment).
    pub reinject: bool,
    /// Halve these paths' windows for one RTT (at most once per RTT each).
    pub penalise: PathMask,
}

/// What to do with a path's unacknowledged packets after an RTO (ordered:
/// a stronger action includes the weaker).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reinject {
    Nothing,
    /// Reinject the oldest unacknowledged packet (MPTCP's opportunistic
    /// retransmission).
    Oldest,
    /// Return every unacknowledged packet of the path to its connection's
    /// send buffer (lazy, batched).
    AllUnacked,
}

/// Decides reinjection when a path's retransmission timer fires.
pub trait ReinjectionHandler: Send {
    fn name(&self) -> &'static str;
    /// `path.rto_count` is already incremented for this timeout.
    fn on_rto(&mut self, now: Instant, path: &PathView) -> Reinject;
}

/// A composed scheduler.
pub struct Pipeline {
    name: String,
    lets: Vec<Box<dyn Schedulerlet>>,
    reinjection: Box<dyn ReinjectionHandler>,
    /// Paths of the last decision that only a hard selector put in `S`.
    last_copies: PathMask,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<_> = self.lets.iter().map(|l| l.name()).collect();
        f.debug_struct("Pipeline")
            .field("name", &self.name)
            .field("schedulerlets", &names)
            .field("reinjection", &self.reinjection.name())
            .finish()
    }
}

impl Pipeline {
    /// Every schedulerlet's event counters: (schedulerlet, event, total).
    pub fn counters(&self) -> Vec<(&'static str, &'static str, u64)> {
        self.lets.iter().flat_map(|l| l.counters().into_iter().map(|(e, v)| (l.name(), e, v))).collect()
    }

    pub fn new(
        name: impl Into<String>,
        lets: Vec<Box<dyn Schedulerlet>>,
        reinjection: Box<dyn ReinjectionHandler>,
    ) -> Self {
        Pipeline { name: name.into(), lets, reinjection, last_copies: PathMask::EMPTY }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn schedulerlet_names(&self) -> Vec<&'static str> {
        self.lets.iter().map(|l| l.name()).collect()
    }

    /// The stale threshold the first schedulerlet that sets one asks for
    /// ([`Schedulerlet::stale_threshold`]).
    pub fn stale_threshold(&self) -> Option<StaleThreshold> {
        self.lets.iter().find_map(|l| l.stale_threshold())
    }

    /// Run the pipeline for one packet; returns the paths to place it on
    /// (only paths with room, never a path a reinjection already used).
    pub fn select(&mut self, ctx: &Context<'_>) -> PathMask {
        let mut live = PathMask::EMPTY;
        let mut ready = PathMask::EMPTY;
        for p in ctx.paths {
            live.insert(p.id);
            if p.availability == Availability::Available {
                ready.insert(p.id);
            }
        }
        let excluded = if ctx.packet.is_reinjection { ctx.packet.paths_used } else { PathMask::EMPTY };
        let mut sets = PathSets {
            selected: PathMask::EMPTY,
            candidates: live.minus(excluded),
            unavailable: live.intersect(excluded),
        };
        let mut hard = PathMask::EMPTY;
        for l in &mut self.lets {
            let before = sets;
            l.apply(ctx, &mut sets);
            sets = enforce(l.kind(), before, sets, live);
            if l.kind() == Kind::HardSelector {
                hard = hard.union(sets.selected.minus(before.selected));
            }
        }
        let placed = sets.selected.intersect(ready).minus(excluded);
        // Copies are what hard selectors added next to a packet placed
        // elsewhere too; alone, what they selected is the packet's path.
        self.last_copies = if placed.minus(hard).is_empty() { PathMask::EMPTY } else { placed.intersect(hard) };
        if !placed.is_empty() {
            for l in &mut self.lets {
                l.on_scheduled(ctx, placed);
            }
        }
        placed
    }

    pub fn on_rto(&mut self, now: Instant, path: &PathView) -> Reinject {
        self.reinjection.on_rto(now, path)
    }

    /// Every schedulerlet's head-of-line action, combined.
    pub fn on_head_blocked(&mut self, ctx: &HeadContext<'_>) -> HeadAction {
        self.lets.iter_mut().fold(HeadAction::default(), |acc, l| {
            let a = l.on_head_blocked(ctx);
            HeadAction { reinject: acc.reinject || a.reinject, penalise: acc.penalise.union(a.penalise) }
        })
    }

    /// Every schedulerlet's tail-recovery paths, combined.
    pub fn on_tail_in_flight(&mut self, ctx: &TailContext<'_>) -> PathMask {
        self.lets.iter_mut().fold(PathMask::EMPTY, |acc, l| acc.union(l.on_tail_in_flight(ctx)))
    }

    /// The strongest reinjection any schedulerlet asks for a path that just
    /// became stale.
    pub fn on_stale(&mut self, now: Instant, path: &PathView) -> Reinject {
        self.lets.iter_mut().map(|l| l.on_stale(now, path)).max().unwrap_or(Reinject::Nothing)
    }

    /// Of the paths the last [`Self::select`] returned, those only a hard
    /// selector chose while the packet was placed on other paths as well:
    /// redundant copies, for accounting (`redundant_bytes`).
    pub fn last_copies(&self) -> PathMask {
        self.last_copies
    }
}

/// Keep only the moves `kind` allows; everything else stays where it was.
fn enforce(kind: Kind, before: PathSets, after: PathSets, live: PathMask) -> PathSets {
    let after = PathSets {
        selected: after.selected.intersect(live),
        candidates: after.candidates.intersect(live),
        unavailable: after.unavailable.intersect(live),
    };
    let mut out = before;
    match kind {
        Kind::CandidateFilter => {
            let moved = before.candidates.intersect(after.unavailable);
            out.candidates = before.candidates.minus(moved);
            out.unavailable = before.unavailable.union(moved);
        }
        Kind::SoftSelector => {
            let moved = before.candidates.intersect(after.selected);
            out.candidates = before.candidates.minus(moved);
            out.selected = before.selected.union(moved);
        }
        Kind::SelectionFilter => {
            let moved = before.selected.intersect(after.candidates);
            out.selected = before.selected.minus(moved);
            out.candidates = before.candidates.union(moved);
        }
        Kind::HardSelector => {
            let moved = before.candidates.union(before.unavailable).intersect(after.selected);
            out.candidates = before.candidates.minus(moved);
            out.unavailable = before.unavailable.minus(moved);
            out.selected = before.selected.union(moved);
        }
    }
    debug_assert!(
        out.selected.intersect(out.candidates).is_empty()
            && out.selected.intersect(out.unavailable).is_empty()
            && out.candidates.intersect(out.unavailable).is_empty(),
        "path sets must stay disjoint"
    );
    out
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::*;
    use crate::wire::LinkState;

    pub fn view(id: u8, srtt_ms: u64) -> PathView {
        PathView {
            id: PathId(id),
            availability: Availability::Available,
            srtt_us: srtt_ms * 1000,
            rttvar_us: srtt_ms * 100,
            min_rtt_us: srtt_ms * 1000,
            in_flight_bytes: 0,
            cwnd_bytes: 64 * 1024,
            queued_bytes: 0,
            delivery_rate_bps: 1_000_000,
            rto_count: 0,
            idle_us: 0,
            bytes_since_use: 0,
            link_state: LinkState::Connected,
            cell: 0,
            stale: false,
            failure: None,
        }
    }

    pub fn packet() -> PacketInfo {
        PacketInfo {
            conn: ConnId(1),
            user: UserId([0; 16]),
            offset: 0,
            len: 1400,
            is_tail: false,
            is_burst_tail: false,
            is_reinjection: false,
            paths_used: PathMask::EMPTY,
            remaining_bytes: 1400,
            send_window_bytes: 1 << 20,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;

    /// A misbehaving schedulerlet that tries every move.
    struct Greedy(Kind);
    impl Schedulerlet for Greedy {
        fn name(&self) -> &'static str {
            "greedy"
        }
        fn kind(&self) -> Kind {
            self.0
        }
        fn apply(&mut self, _: &Context<'_>, sets: &mut PathSets) {
            let all = sets.selected.union(sets.candidates).union(sets.unavailable);
            *sets = PathSets { selected: all, candidates: PathMask::EMPTY, unavailable: PathMask::EMPTY };
        }
    }
    struct NoReinject;
    impl ReinjectionHandler for NoReinject {
        fn name(&self) -> &'static str {
            "none"
        }
        fn on_rto(&mut self, _: Instant, _: &PathView) -> Reinject {
            Reinject::Nothing
        }
    }

    #[test]
    fn a_selection_filter_cannot_select_paths() {
        let paths = [view(0, 10), view(1, 20)];
        let pkt = packet();
        let ctx = Context { now: Instant::now(), paths: &paths, packet: &pkt };
        let mut p = Pipeline::new("t", vec![Box::new(Greedy(Kind::SelectionFilter))], Box::new(NoReinject));
        assert!(p.select(&ctx).is_empty());
        let mut p = Pipeline::new("t", vec![Box::new(Greedy(Kind::SoftSelector))], Box::new(NoReinject));
        assert_eq!(p.select(&ctx).len(), 2);
    }

    #[test]
    fn a_reinjection_never_returns_to_a_used_path_even_through_a_hard_selector() {
        let paths = [view(0, 10), view(1, 20)];
        let mut pkt = packet();
        pkt.is_reinjection = true;
        pkt.paths_used = PathMask::single(PathId(0));
        let ctx = Context { now: Instant::now(), paths: &paths, packet: &pkt };
        let mut p = Pipeline::new("t", vec![Box::new(Greedy(Kind::HardSelector))], Box::new(NoReinject));
        assert_eq!(p.select(&ctx), PathMask::single(PathId(1)));
    }

    #[test]
    fn full_paths_are_not_placed_on() {
        let mut paths = [view(0, 10), view(1, 20)];
        paths[0].availability = Availability::Full;
        let pkt = packet();
        let ctx = Context { now: Instant::now(), paths: &paths, packet: &pkt };
        let mut p = Pipeline::new("t", vec![Box::new(Greedy(Kind::SoftSelector))], Box::new(NoReinject));
        assert_eq!(p.select(&ctx), PathMask::single(PathId(1)));
    }
}
