//! Time-varying link parameters: one-way delay, Gilbert–Elliott loss parameters and blackouts,
//! plus the line-oriented schedule file the trace generator writes.
//!
//! # Schedule file format
//!
//! UTF-8 text, one directive per line. `#` starts a comment (to the end of the line); blank
//! lines are ignored. Fields are separated by whitespace. All times are milliseconds since the
//! start of the trip (the link's epoch) and may be fractional (`12.5`); they must be finite and
//! non-negative. Probabilities are decimals in `[0, 1]`.
//!
//! ```text
//! # comment
//! delay-mode step|linear            # optional, at most once; default step
//! delay <t_ms> <one_way_delay_ms>
//! loss <t_ms> <p_good_to_bad> <p_bad_to_good> <loss_in_good> <loss_in_bad>
//! blackout <start_ms> <end_ms> hold|flush
//! ```
//!
//! * `delay` points must have strictly increasing `t_ms`. With `step`, the delay at time `t` is
//!   the value of the last point with `t_ms <= t`; with `linear`, it is interpolated between the
//!   surrounding points and constant after the last. Before the first point the first value
//!   applies. No `delay` line: zero delay.
//! * `loss` points must have strictly increasing `t_ms`; each sets the Gilbert–Elliott
//!   parameters from that time on (step semantics; before the first point the first applies).
//!   The chain's state carries over a parameter change. No `loss` line: no random loss. The
//!   transition probabilities are per step of the chain: per [`LOSS_SLOT`] of time with
//!   [`LossKeying::Time`] (the default), per packet with [`LossKeying::Packet`] (see there).
//! * `blackout` intervals are half-open `[start, end)`, need `start < end`, and must be sorted
//!   and non-overlapping (`start >= previous end`). See [`BlackoutKind`] for the semantics.
//!
//! Directives of different kinds may be interleaved. Errors name the 1-based line.
//! [`Schedule`]'s `Display` writes this format, and [`Schedule::parse`] reads it back exactly,
//! so the trace generator can write schedules through this crate.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use thiserror::Error;

use crate::rng::{mix64, splitmix_at, unit_f64, SplitMix64};

/// Why a schedule (file or value) was rejected.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ScheduleError {
    /// A line of a schedule file could not be used.
    #[error("line {line}: {msg}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        msg: String,
    },
    /// A value built in code is invalid.
    #[error("{0}")]
    Invalid(String),
}

/// How the delay between two schedule points is obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Interpolation {
    /// Piecewise constant: the last point at or before `t`.
    #[default]
    Step,
    /// Linear between neighbouring points.
    Linear,
}

/// One-way delay as a function of time (see the module docs for the exact rule).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DelaySchedule {
    points: Vec<(Duration, Duration)>,
    interpolation: Interpolation,
}

impl DelaySchedule {
    /// A fixed delay.
    pub fn constant(delay: Duration) -> Self {
        Self { points: vec![(Duration::ZERO, delay)], interpolation: Interpolation::Step }
    }

    /// A delay from `(time, delay)` points with strictly increasing times.
    pub fn new(points: Vec<(Duration, Duration)>, interpolation: Interpolation) -> Result<Self, ScheduleError> {
        if points.windows(2).any(|w| w[1].0 <= w[0].0) {
            return Err(ScheduleError::Invalid("delay points must have strictly increasing times".into()));
        }
        Ok(Self { points, interpolation })
    }

    /// The points.
    pub fn points(&self) -> &[(Duration, Duration)] {
        &self.points
    }

    /// The one-way delay for a packet leaving the bottleneck at `t`.
    pub fn at(&self, t: Duration) -> Duration {
        let i = self.points.partition_point(|p| p.0 <= t);
        if i == 0 {
            return self.points.first().map_or(Duration::ZERO, |p| p.1);
        }
        let (t0, d0) = self.points[i - 1];
        match (self.interpolation, self.points.get(i)) {
            (Interpolation::Linear, Some(&(t1, d1))) => {
                let frac = (t - t0).as_secs_f64() / (t1 - t0).as_secs_f64();
                let d = d0.as_secs_f64() + (d1.as_secs_f64() - d0.as_secs_f64()) * frac;
                Duration::from_secs_f64(d.max(0.0))
            }
            _ => d0,
        }
    }
}

/// Gilbert–Elliott parameters: a two-state (good/bad) Markov chain, each state with its own
/// loss probability. The chain steps once per [`LOSS_SLOT`] of time ([`LossKeying::Time`], the
/// default) or once per packet ([`LossKeying::Packet`]); the transition probabilities are per
/// step. A mean bad run of `1 / p_bad_to_good` steps is as many milliseconds with time keying,
/// i.e. about as many full-size packets on a link carrying about one per millisecond
/// (12 Mbit/s of 1500-byte packets).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GeParams {
    /// P(good → bad) per step.
    pub p_good_to_bad: f64,
    /// P(bad → good) per step.
    pub p_bad_to_good: f64,
    /// Loss probability while in the good state.
    pub loss_good: f64,
    /// Loss probability while in the bad state.
    pub loss_bad: f64,
}

impl GeParams {
    /// No loss at all.
    pub const NONE: Self = Self { p_good_to_bad: 0.0, p_bad_to_good: 1.0, loss_good: 0.0, loss_bad: 0.0 };

    /// Checked constructor: every field in `[0, 1]`.
    pub fn new(p_good_to_bad: f64, p_bad_to_good: f64, loss_good: f64, loss_bad: f64) -> Result<Self, ScheduleError> {
        let p = Self { p_good_to_bad, p_bad_to_good, loss_good, loss_bad };
        p.validate()?;
        Ok(p)
    }

    /// The Gilbert model (lose everything in the bad state, nothing in the good one) with a
    /// given long-run loss rate and mean length of a bad run in steps (slots or packets, see
    /// [`LossKeying`]):
    /// `p_bad_to_good = 1 / mean_bad_run`, `p_good_to_bad = rate · p_bad_to_good / (1 − rate)`,
    /// so the stationary bad-state share, which is the loss rate, equals `rate`.
    pub fn from_mean(loss_rate: f64, mean_bad_run: f64) -> Result<Self, ScheduleError> {
        if !(0.0..1.0).contains(&loss_rate) {
            return Err(ScheduleError::Invalid(format!("loss rate {loss_rate} not in [0, 1)")));
        }
        if !(mean_bad_run >= 1.0 && mean_bad_run.is_finite()) {
            return Err(ScheduleError::Invalid(format!("mean bad run {mean_bad_run} must be >= 1 packet")));
        }
        let p_bg = 1.0 / mean_bad_run;
        let p_gb = loss_rate * p_bg / (1.0 - loss_rate);
        if p_gb > 1.0 {
            return Err(ScheduleError::Invalid(format!(
                "loss rate {loss_rate} with mean bad run {mean_bad_run} needs P(good->bad) > 1"
            )));
        }
        Self::new(p_gb, p_bg, 0.0, 1.0)
    }

    /// Long-run loss rate of the chain: `π_G · loss_good + π_B · loss_bad`. With time keying it
    /// is the loss rate of any traffic whose arrival times do not depend on the chain's state
    /// (e.g. a sparse probe); with packet keying, of any traffic.
    pub fn mean_loss(&self) -> f64 {
        let pi_bad = self.stationary_bad();
        (1.0 - pi_bad) * self.loss_good + pi_bad * self.loss_bad
    }

    /// Stationary probability of the bad state, `p_good_to_bad / (p_good_to_bad + p_bad_to_good)`
    /// (0 when both are 0: the chain then stays in the good state it starts in).
    pub fn stationary_bad(&self) -> f64 {
        let denom = self.p_good_to_bad + self.p_bad_to_good;
        if denom == 0.0 {
            0.0
        } else {
            self.p_good_to_bad / denom
        }
    }

    fn validate(&self) -> Result<(), ScheduleError> {
        for (name, v) in [
            ("p_good_to_bad", self.p_good_to_bad),
            ("p_bad_to_good", self.p_bad_to_good),
            ("loss_good", self.loss_good),
            ("loss_bad", self.loss_bad),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(ScheduleError::Invalid(format!("{name} = {v} not in [0, 1]")));
            }
        }
        Ok(())
    }
}

/// Gilbert–Elliott parameters over time (step function, see the module docs).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LossSchedule {
    points: Vec<(Duration, GeParams)>,
}

impl LossSchedule {
    /// The same parameters for the whole trip.
    pub fn constant(params: GeParams) -> Self {
        Self { points: vec![(Duration::ZERO, params)] }
    }

    /// Parameters from `(time, params)` points with strictly increasing times.
    pub fn new(points: Vec<(Duration, GeParams)>) -> Result<Self, ScheduleError> {
        if points.windows(2).any(|w| w[1].0 <= w[0].0) {
            return Err(ScheduleError::Invalid("loss points must have strictly increasing times".into()));
        }
        for (_, p) in &points {
            p.validate()?;
        }
        Ok(Self { points })
    }

    /// The points.
    pub fn points(&self) -> &[(Duration, GeParams)] {
        &self.points
    }

    /// Parameters in effect at `t` (`None`: no loss schedule at all).
    pub fn at(&self, t: Duration) -> Option<GeParams> {
        let i = self.points.partition_point(|p| p.0 <= t);
        self.points.get(i.saturating_sub(1)).map(|p| p.1)
    }
}

/// Length of one step of the time-keyed Gilbert–Elliott chain ([`LossKeying::Time`]): 1 ms,
/// the resolution of Mahimahi traces and of the schedules the trace generator writes, and
/// about one full-size packet at the generated carriers' capacities (means ≈ 9–14 Mbit/s), so
/// the schedules' burst lengths, given in packets (hsr-facts §15.6: 3–5), keep their meaning.
pub const LOSS_SLOT: Duration = Duration::from_nanos(SLOT_NS);

/// [`LOSS_SLOT`] in nanoseconds.
const SLOT_NS: u64 = 1_000_000;

/// How the Gilbert–Elliott loss process is driven, i.e. what its random draws are keyed by.
///
/// With [`LossKeying::Time`] whether a packet is lost is a function of the seed, its arrival
/// time and its index among the packets reaching the loss stage in the same [`LOSS_SLOT`],
/// not of the packets before it: two links with the same seed and schedule offered different
/// traffic (two schemes compared on one emulated trip) lose exactly the same packets wherever
/// they have an arrival at the same slot and index, and are in the same good or bad state at
/// every instant — common random numbers for paired comparisons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LossKeying {
    /// The chain steps once per [`LOSS_SLOT`] of link time, from time 0, whether or not packets
    /// arrive: the state of slot `s` is drawn from a keyed hash of `(seed, s)` (slot 0 from the
    /// stationary distribution of the parameters at time 0; slot `s ≥ 1` by a transition with
    /// the parameters in force at the slot's start), and the `k`-th packet of slot `s` is lost
    /// with the slot state's loss probability (parameters at its arrival) by a keyed draw of
    /// `(seed, s, k)`. Computed lazily as time advances (O(1) memory, a few ns per slot, ≈ 20 ms
    /// of CPU per hour of link time).
    #[default]
    Time,
    /// The chain of the first versions of the emulator, kept to reproduce earlier results: it
    /// steps once per packet reaching the loss stage, on one SplitMix64 stream seeded with the
    /// seed (the first packet draws its state from the stationary distribution, then the loss is
    /// decided in the current state and the chain transitions). A packet's fate depends on how
    /// many packets came before it.
    Packet,
}

impl LossKeying {
    /// `time` or `packet`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Time => "time",
            Self::Packet => "packet",
        }
    }
}

impl fmt::Display for LossKeying {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LossKeying {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "time" => Ok(Self::Time),
            "packet" => Ok(Self::Packet),
            other => Err(format!("loss keying must be time or packet, not {other:?}")),
        }
    }
}

/// The loss process of a link, in either keying.
#[derive(Debug, Clone)]
pub(crate) enum LossProcess {
    Time(SlotChain),
    Packet { ge: GilbertElliott, rng: SplitMix64 },
}

impl LossProcess {
    pub(crate) fn new(keying: LossKeying, seed: u64) -> Self {
        match keying {
            LossKeying::Time => Self::Time(SlotChain::new(seed)),
            LossKeying::Packet => Self::Packet { ge: GilbertElliott::new(), rng: SplitMix64::new(seed) },
        }
    }

    /// Decides the fate (`true` = lost) of a packet reaching the loss stage at `now`, with the
    /// parameters `p` in force at `now`, of the schedule `loss`. `now` never decreases.
    pub(crate) fn lose(&mut self, now: Duration, p: &GeParams, loss: &LossSchedule) -> bool {
        match self {
            Self::Time(chain) => chain.lose(now, p, &loss.points),
            Self::Packet { ge, rng } => ge.lose(p, rng),
        }
    }
}

/// Key tags (domain separation of the keyed draws).
const TAG_STATE: u64 = 0;
const TAG_LOSS: u64 = 1;

/// The time-keyed Gilbert–Elliott chain ([`LossKeying::Time`]): the state of the current slot
/// and what is needed to step it forward.
#[derive(Debug, Clone)]
pub(crate) struct SlotChain {
    /// Key of the per-slot state draws.
    state_key: u64,
    /// Key of the per-packet loss draws.
    loss_key: u64,
    /// Whether the state of slot `slot` has been drawn yet (it is at the first packet).
    started: bool,
    /// The slot whose state `bad` is.
    slot: u64,
    bad: bool,
    /// Index of the loss point in force at the start of `slot`.
    seg: usize,
    /// Packets that reached the loss stage in `slot` so far.
    offered: u64,
}

impl SlotChain {
    fn new(seed: u64) -> Self {
        // Keys: draws of a SplitMix64 stream keyed by the hashed seed, so that seeds differing
        // by a pattern (carrier i uses seed + i, a downlink seed ^ γ) give unrelated keys.
        let base = mix64(seed ^ 0x706F_6C79_6C6F_7373); // "polyloss"
        Self {
            state_key: splitmix_at(base, TAG_STATE),
            loss_key: splitmix_at(base, TAG_LOSS),
            started: false,
            slot: 0,
            bad: false,
            seg: 0,
            offered: 0,
        }
    }

    /// The uniform draw of the state of slot `s`.
    fn state_draw(&self, s: u64) -> f64 {
        unit_f64(splitmix_at(self.state_key, s))
    }

    fn lose(&mut self, now: Duration, p: &GeParams, points: &[(Duration, GeParams)]) -> bool {
        let slot = u64::try_from(now.as_nanos() / u128::from(SLOT_NS)).unwrap_or(u64::MAX);
        if !self.started {
            self.started = true;
            self.bad = points.first().is_some_and(|(_, p0)| self.state_draw(0) < p0.stationary_bad());
        }
        if slot != self.slot {
            debug_assert!(slot > self.slot, "link time went backwards");
            self.advance_to(slot, points);
            self.offered = 0;
        }
        let k = self.offered;
        self.offered += 1;
        let u = unit_f64(splitmix_at(splitmix_at(self.loss_key, slot), k));
        u < if self.bad { p.loss_bad } else { p.loss_good }
    }

    /// Steps the chain from `self.slot` to `target`, one transition per slot. Transitions that
    /// cannot happen (probability 0) are skipped up to the next parameter change: the draws are
    /// keyed by slot, so skipping them changes nothing else.
    fn advance_to(&mut self, target: u64, points: &[(Duration, GeParams)]) {
        while self.slot < target {
            let next = self.slot + 1;
            let start = Duration::from_nanos(next.saturating_mul(SLOT_NS));
            while points.get(self.seg + 1).is_some_and(|(t, _)| *t <= start) {
                self.seg += 1;
            }
            let Some((_, p)) = points.get(self.seg) else {
                self.slot = target;
                return;
            };
            let p_leave = if self.bad { p.p_bad_to_good } else { p.p_good_to_bad };
            if p_leave <= 0.0 {
                // Stuck until the slot that starts at or after the next parameter change.
                let last_same = match points.get(self.seg + 1) {
                    Some((t, _)) => {
                        let first_after = t.as_nanos().div_ceil(u128::from(SLOT_NS));
                        u64::try_from(first_after).unwrap_or(u64::MAX).saturating_sub(1)
                    }
                    None => u64::MAX,
                };
                self.slot = target.min(last_same.max(next));
                continue;
            }
            if self.state_draw(next) < p_leave {
                self.bad = !self.bad;
            }
            self.slot = next;
        }
    }
}

/// The per-packet Gilbert–Elliott chain's running state ([`LossKeying::Packet`]).
#[derive(Debug, Clone)]
pub(crate) struct GilbertElliott {
    bad: Option<bool>,
}

impl GilbertElliott {
    pub(crate) fn new() -> Self {
        Self { bad: None }
    }

    /// Decides one packet's fate (`true` = lost) and steps the chain. The first packet draws the
    /// state from the chain's stationary distribution; then the loss is decided in the current
    /// state and the chain transitions.
    pub(crate) fn lose(&mut self, p: &GeParams, rng: &mut SplitMix64) -> bool {
        let bad = match self.bad {
            Some(b) => b,
            None => {
                let denom = p.p_good_to_bad + p.p_bad_to_good;
                let pi_bad = if denom == 0.0 { 0.0 } else { p.p_good_to_bad / denom };
                rng.bernoulli(pi_bad)
            }
        };
        let lost = rng.bernoulli(if bad { p.loss_bad } else { p.loss_good });
        let next_bad = if bad { !rng.bernoulli(p.p_bad_to_good) } else { rng.bernoulli(p.p_good_to_bad) };
        self.bad = Some(next_bad);
        lost
    }
}

/// What a blackout does to the bottleneck queue (hsr-facts §15.3 item 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlackoutKind {
    /// Handover types I and II: the queue is not drained during the interval; arrivals are still
    /// queued (subject to loss and the buffer limit); nothing is lost because of the blackout,
    /// and the backlog leaves at link rate afterwards.
    Hold,
    /// Type III: at the start every queued packet (including one partly transmitted) is dropped,
    /// and arrivals during the interval are dropped.
    Flush,
}

/// A blackout over `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blackout {
    /// First instant of the blackout.
    pub start: Duration,
    /// First instant after it.
    pub end: Duration,
    /// Hold or flush.
    pub kind: BlackoutKind,
}

impl Blackout {
    /// Whether `t` lies in `[start, end)`.
    pub fn contains(&self, t: Duration) -> bool {
        self.start <= t && t < self.end
    }
}

/// Everything time-varying about one direction of one carrier except its capacity.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Schedule {
    /// One-way delay.
    pub delay: DelaySchedule,
    /// Random loss.
    pub loss: LossSchedule,
    /// Sorted, non-overlapping blackouts.
    pub blackouts: Vec<Blackout>,
}

impl Schedule {
    /// Checks the invariants the link relies on (sorted, non-overlapping, non-empty blackouts).
    pub fn validate(&self) -> Result<(), ScheduleError> {
        for b in &self.blackouts {
            if b.start >= b.end {
                return Err(ScheduleError::Invalid(format!("blackout {b:?} is empty")));
            }
        }
        if self.blackouts.windows(2).any(|w| w[1].start < w[0].end) {
            return Err(ScheduleError::Invalid("blackouts must be sorted and non-overlapping".into()));
        }
        Ok(())
    }

    /// Parses the schedule file format described in the module docs.
    pub fn parse(text: &str) -> Result<Self, ScheduleError> {
        let mut delay = Vec::new();
        let mut mode: Option<Interpolation> = None;
        let mut loss = Vec::new();
        let mut blackouts: Vec<Blackout> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let err = |msg: String| ScheduleError::Line { line, msg };
            let content = raw.split('#').next().unwrap_or("");
            let f: Vec<&str> = content.split_whitespace().collect();
            let Some(&kw) = f.first() else { continue };
            let want = |n: usize| {
                if f.len() == n + 1 {
                    Ok(())
                } else {
                    Err(err(format!("`{kw}` takes {n} fields, found {}", f.len() - 1)))
                }
            };
            match kw {
                "delay-mode" => {
                    want(1)?;
                    if mode.is_some() {
                        return Err(err("`delay-mode` given twice".into()));
                    }
                    mode = Some(match f[1] {
                        "step" => Interpolation::Step,
                        "linear" => Interpolation::Linear,
                        other => return Err(err(format!("delay-mode must be step or linear, not {other:?}"))),
                    });
                }
                "delay" => {
                    want(2)?;
                    let t = ms(f[1]).map_err(&err)?;
                    let d = ms(f[2]).map_err(&err)?;
                    if let Some(&(prev, _)) = delay.last() {
                        if t <= prev {
                            return Err(err("delay times must be strictly increasing".into()));
                        }
                    }
                    delay.push((t, d));
                }
                "loss" => {
                    want(5)?;
                    let t = ms(f[1]).map_err(&err)?;
                    let mut p = [0.0; 4];
                    for (slot, s) in p.iter_mut().zip(&f[2..]) {
                        *slot = prob(s).map_err(&err)?;
                    }
                    if let Some(&(prev, _)) = loss.last() {
                        if t <= prev {
                            return Err(err("loss times must be strictly increasing".into()));
                        }
                    }
                    loss.push((
                        t,
                        GeParams { p_good_to_bad: p[0], p_bad_to_good: p[1], loss_good: p[2], loss_bad: p[3] },
                    ));
                }
                "blackout" => {
                    want(3)?;
                    let start = ms(f[1]).map_err(&err)?;
                    let end = ms(f[2]).map_err(&err)?;
                    let kind = match f[3] {
                        "hold" => BlackoutKind::Hold,
                        "flush" => BlackoutKind::Flush,
                        other => return Err(err(format!("blackout kind must be hold or flush, not {other:?}"))),
                    };
                    if start >= end {
                        return Err(err("blackout end must be after its start".into()));
                    }
                    if let Some(prev) = blackouts.last() {
                        if start < prev.end {
                            return Err(err("blackouts must be sorted and non-overlapping".into()));
                        }
                    }
                    blackouts.push(Blackout { start, end, kind });
                }
                other => return Err(err(format!("unknown directive {other:?}"))),
            }
        }
        Ok(Self {
            delay: DelaySchedule { points: delay, interpolation: mode.unwrap_or_default() },
            loss: LossSchedule { points: loss },
            blackouts,
        })
    }
}

impl std::fmt::Display for Schedule {
    /// Writes the schedule in the file format of the module docs; [`Schedule::parse`] reads it
    /// back exactly (times are written in milliseconds with nanosecond precision, probabilities
    /// in Rust's shortest round-trip form).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.delay.interpolation == Interpolation::Linear {
            writeln!(f, "delay-mode linear")?;
        }
        for (t, d) in &self.delay.points {
            writeln!(f, "delay {} {}", Ms(*t), Ms(*d))?;
        }
        for (t, p) in &self.loss.points {
            writeln!(f, "loss {} {} {} {} {}", Ms(*t), p.p_good_to_bad, p.p_bad_to_good, p.loss_good, p.loss_bad)?;
        }
        for b in &self.blackouts {
            let kind = match b.kind {
                BlackoutKind::Hold => "hold",
                BlackoutKind::Flush => "flush",
            };
            writeln!(f, "blackout {} {} {kind}", Ms(b.start), Ms(b.end))?;
        }
        Ok(())
    }
}

/// A duration written as milliseconds, fractional part only when needed.
struct Ms(Duration);

impl std::fmt::Display for Ms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ns = self.0.as_nanos();
        let (whole, frac) = (ns / 1_000_000, ns % 1_000_000);
        if frac == 0 {
            write!(f, "{whole}")
        } else {
            let frac = format!("{frac:06}");
            write!(f, "{whole}.{}", frac.trim_end_matches('0'))
        }
    }
}

fn ms(s: &str) -> Result<Duration, String> {
    let v: f64 = s.parse().map_err(|_| format!("not a number of milliseconds: {s:?}"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("milliseconds must be finite and non-negative: {s:?}"));
    }
    Ok(Duration::from_nanos((v * 1e6).round() as u64))
}

fn prob(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("not a probability: {s:?}"))?;
    if !(0.0..=1.0).contains(&v) {
        return Err(format!("probability not in [0, 1]: {s:?}"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn schedule_file_parses_every_directive() {
        let s = Schedule::parse(
            "# trip 1\n\ndelay-mode linear\ndelay 0 20\ndelay 1000 40.5 # ramp\nloss 0 0.01 0.5 0 1\n\
             blackout 2000 3000 hold\nblackout 3000 3500.25 flush\n",
        )
        .unwrap();
        assert_eq!(s.delay.at(MS(500)), Duration::from_micros(30_250));
        assert_eq!(s.delay.at(MS(5000)), Duration::from_micros(40_500));
        assert_eq!(s.loss.at(MS(7)).unwrap().p_bad_to_good, 0.5);
        assert_eq!(s.blackouts.len(), 2);
        assert_eq!(s.blackouts[1].end, Duration::from_micros(3_500_250));
        assert_eq!(s.blackouts[1].kind, BlackoutKind::Flush);
        s.validate().unwrap();
    }

    #[test]
    fn written_schedule_reads_back_identically() {
        let s = Schedule {
            delay: DelaySchedule::new(
                vec![(MS(0), Duration::from_nanos(20_000_001)), (Duration::from_micros(1500), MS(7))],
                Interpolation::Linear,
            )
            .unwrap(),
            loss: LossSchedule::new(vec![(MS(3), GeParams::from_mean(0.013, 3.7).unwrap())]).unwrap(),
            blackouts: vec![
                Blackout { start: MS(10), end: Duration::from_nanos(10_250_000), kind: BlackoutKind::Hold },
                Blackout { start: MS(3_600_000), end: MS(3_601_000), kind: BlackoutKind::Flush },
            ],
        };
        let text = s.to_string();
        assert!(text.contains("delay 0 20.000001\n"), "{text}");
        assert!(text.contains("blackout 10 10.25 hold\n"), "{text}");
        assert_eq!(Schedule::parse(&text).unwrap(), s);
        assert_eq!(Schedule::parse(&Schedule::default().to_string()).unwrap(), Schedule::default());
    }

    #[test]
    fn schedule_errors_name_the_line() {
        let line_of = |text: &str| match Schedule::parse(text) {
            Err(ScheduleError::Line { line, .. }) => line,
            other => panic!("expected a line error, got {other:?}"),
        };
        assert_eq!(line_of("delay 0 10\ndelay x 10\n"), 2);
        assert_eq!(line_of("delay 5 10\ndelay 5 10\n"), 2);
        assert_eq!(line_of("\n\nloss 0 0.1 0.2 0 1.5\n"), 3);
        assert_eq!(line_of("blackout 10 5 hold\n"), 1);
        assert_eq!(line_of("blackout 0 10 hold\nblackout 5 20 flush\n"), 2);
        assert_eq!(line_of("blackout 0 10 drop\n"), 1);
        assert_eq!(line_of("delay 0\n"), 1);
        assert_eq!(line_of("delay -1 3\n"), 1);
        assert_eq!(line_of("delay inf 3\n"), 1);
        assert_eq!(line_of("speed 0 3\n"), 1);
    }

    #[test]
    fn step_delay_uses_last_point_and_first_before_start() {
        let d = DelaySchedule::new(vec![(MS(10), MS(50)), (MS(20), MS(5))], Interpolation::Step).unwrap();
        assert_eq!(d.at(MS(0)), MS(50));
        assert_eq!(d.at(MS(19)), MS(50));
        assert_eq!(d.at(MS(20)), MS(5));
        assert_eq!(DelaySchedule::default().at(MS(3)), Duration::ZERO);
    }

    /// The state of slot `s` by the definition: every slot stepped from 0, no skipping.
    fn reference_states(seed: u64, loss: &LossSchedule, slots: u64) -> Vec<bool> {
        let chain = SlotChain::new(seed);
        let p0 = loss.at(Duration::ZERO).unwrap();
        let mut bad = chain.state_draw(0) < p0.stationary_bad();
        let mut out = vec![bad];
        for s in 1..slots {
            let p = loss.at(Duration::from_nanos(s * SLOT_NS)).unwrap();
            let p_leave = if bad { p.p_bad_to_good } else { p.p_good_to_bad };
            if chain.state_draw(s) < p_leave {
                bad = !bad;
            }
            out.push(bad);
        }
        out
    }

    #[test]
    fn slot_chain_state_is_a_function_of_the_slot_whatever_the_arrivals() {
        let ge = |a, b, lg, lb| GeParams::new(a, b, lg, lb).unwrap();
        // Segments where the state cannot change (skipped lazily), changes off slot boundaries.
        let loss = LossSchedule::new(vec![
            (MS(2), ge(0.0, 0.3, 0.0, 1.0)),
            (Duration::from_micros(50_500), ge(0.1, 0.2, 0.0, 1.0)),
            (MS(120), ge(0.3, 0.0, 0.1, 0.9)),
            (MS(300), ge(0.2, 0.2, 0.0, 1.0)),
            (Duration::from_micros(420_001), ge(0.0, 0.0, 0.5, 0.5)),
        ])
        .unwrap();
        for seed in 0..20 {
            let want = reference_states(seed, &loss, 600);
            assert!(want.contains(&true) && want.contains(&false));
            for every in [1, 2, 7, 49, 130, 599] {
                let mut chain = SlotChain::new(seed);
                for s in (0..600).step_by(every) {
                    let t = Duration::from_nanos(s * SLOT_NS + 123);
                    chain.lose(t, &loss.at(t).unwrap(), &loss.points);
                    assert_eq!(chain.bad, want[s as usize], "seed {seed}, every {every} slots, slot {s}");
                }
            }
        }
    }

    #[test]
    fn loss_keying_parses_and_prints() {
        for k in [LossKeying::Time, LossKeying::Packet] {
            assert_eq!(k.to_string().parse::<LossKeying>(), Ok(k));
        }
        assert_eq!(LossKeying::default(), LossKeying::Time);
        assert!("slot".parse::<LossKeying>().is_err());
    }

    #[test]
    fn from_mean_hits_the_requested_rate() {
        let p = GeParams::from_mean(0.02, 4.0).unwrap();
        assert!((p.mean_loss() - 0.02).abs() < 1e-12);
        assert_eq!(p.p_bad_to_good, 0.25);
        assert!(GeParams::from_mean(1.0, 2.0).is_err());
        assert!(GeParams::from_mean(0.1, 0.5).is_err());
    }
}
