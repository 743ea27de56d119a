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
//!   The chain's state carries over a parameter change. No `loss` line: no random loss.
//! * `blackout` intervals are half-open `[start, end)`, need `start < end`, and must be sorted
//!   and non-overlapping (`start >= previous end`). See [`BlackoutKind`] for the semantics.
//!
//! Directives of different kinds may be interleaved. Errors name the 1-based line.
//! [`Schedule`]'s `Display` writes this format, and [`Schedule::parse`] reads it back exactly,
//! so the trace generator can write schedules through this crate.

use std::time::Duration;

use thiserror::Error;

use crate::rng::SplitMix64;

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

/// Gilbert–Elliott parameters: a two-state Markov chain stepped once per packet.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GeParams {
    /// P(good → bad) per packet.
    pub p_good_to_bad: f64,
    /// P(bad → good) per packet.
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
    /// given long-run loss rate and mean length of a bad run in packets:
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

    /// Long-run loss rate of the chain: `π_G · loss_good + π_B · loss_bad`.
    pub fn mean_loss(&self) -> f64 {
        let denom = self.p_good_to_bad + self.p_bad_to_good;
        let pi_bad = if denom == 0.0 { 0.0 } else { self.p_good_to_bad / denom };
        (1.0 - pi_bad) * self.loss_good + pi_bad * self.loss_bad
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

/// The Gilbert–Elliott chain's running state.
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

    #[test]
    fn from_mean_hits_the_requested_rate() {
        let p = GeParams::from_mean(0.02, 4.0).unwrap();
        assert!((p.mean_loss() - 0.02).abs() < 1e-12);
        assert_eq!(p.p_bad_to_good, 0.25);
        assert!(GeParams::from_mean(1.0, 2.0).is_err());
        assert!(GeParams::from_mean(0.1, 0.5).is_err());
    }
}
