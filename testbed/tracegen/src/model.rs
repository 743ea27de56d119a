//! The trip simulation (hsr-facts §15.2–§15.6) at a 10 ms step.

use crate::preset::{CarrierParams, FailureModel, FailureV2, Preset};
use crate::random::{normal_sf, stream, GammaQuantile, Rng};

/// Simulation step, ms (§15.1).
pub const STEP_MS: u64 = 10;
/// Time constant of the RSRP shadowing OU, seconds (unsourced).
pub const RSRP_SHADOW_TAU_S: f64 = 2.0;
/// RSRP of the serving cell at a cell edge and its rise towards the cell centre, dBm / dB
/// (unsourced; chosen so the −95 dBm threshold of §7.1 splits handovers into two populated bins).
pub const RSRP_EDGE_DBM: f64 = -100.0;
/// See [`RSRP_EDGE_DBM`].
pub const RSRP_RISE_DB: f64 = 15.0;
/// RSRP threshold of the failure model, dBm (§15.3.3, §7.1).
pub const RSRP_LOW_DBM: f64 = -95.0;

// Stream tags: route streams use the route seed, trip streams the trip seed.
const TAG_LAYOUT: u64 = 1;
const TAG_JITTER: u64 = 2;
const TAG_OUTCOME: u64 = 3;
const TAG_FADING: u64 = 4;
const TAG_RTT: u64 = 5;
const TAG_RSRP: u64 = 6;
const TAG_GPS: u64 = 7;
const TAG_TUNE: u64 = 8;
// Failure model v2's route-fixed extras (a stream of their own, so v1 layouts stay as they were).
const TAG_EDGE: u64 = 9;

/// What to generate.
#[derive(Debug, Clone)]
pub struct TripConfig {
    /// Parameter set.
    pub preset: Preset,
    /// Seed of the route-fixed randomness (cell layout, per-cell failure propensity).
    pub route_seed: u64,
    /// Seed of everything else (fading, jitter, outcomes, durations, GPS noise).
    pub trip_seed: u64,
    /// Trip length, seconds.
    pub duration_s: u64,
    /// Number of carriers (carrier i uses the preset's parameters `i % 2`).
    pub carriers: usize,
}

/// Route-fixed handover layout of one carrier (§15.3.1). Cell `k` spans
/// `[boundaries[k-1], boundaries[k])` (cell 0 starts at the route origin); leaving cell `k`
/// happens at boundary `k` and has failure propensity `u_cell[k]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// Boundary positions, metres, increasing.
    pub boundaries: Vec<f64>,
    /// Per-⟨cell, direction⟩ log-odds u_cell ~ N(0, σ_cell²) (§15.3.3); one direction only.
    pub u_cell: Vec<f64>,
    /// Failure model v2 only (empty for v1): overlap-zone length w per boundary, metres; the
    /// coverage edge is `boundaries[k] + overlap_m[k]` (§15.3 item 2a).
    pub overlap_m: Vec<f64>,
    /// Failure model v2 only: the source cell's RSRP at its trigger point, dBm.
    pub rsrp_trigger_dbm: Vec<f64>,
}

impl Layout {
    /// Draws the layout of `carrier` up to `length_m`. It depends only on the route seed and the
    /// carrier index, and is prefix-stable: a longer route extends, never changes, the layout.
    pub fn new(preset: &Preset, route_seed: u64, carrier: usize, length_m: f64) -> Self {
        let c = preset.carrier(carrier);
        let mut rng = stream(route_seed, TAG_LAYOUT << 32 | carrier as u64);
        let (mut boundaries, mut u_cell) = (Vec::new(), Vec::new());
        if !preset.handovers {
            return Self { boundaries, u_cell, overlap_m: Vec::new(), rsrp_trigger_dbm: Vec::new() };
        }
        let mut x = 0.0;
        loop {
            x += rng.gamma(c.gap_shape, c.mean_gap_m / c.gap_shape);
            let sigma_cell = match &preset.failure_model {
                FailureModel::V1 => c.sigma_cell,
                FailureModel::V2(f) => f.sigma_cell[carrier % 2],
            };
            let u = sigma_cell * rng.normal();
            if x > length_m {
                break;
            }
            boundaries.push(x);
            u_cell.push(u);
        }
        let (mut overlap_m, mut rsrp_trigger_dbm) = (Vec::new(), Vec::new());
        if let FailureModel::V2(f) = &preset.failure_model {
            let mut rng = stream(route_seed, TAG_EDGE << 32 | carrier as u64);
            for _ in &boundaries {
                overlap_m.push(rng.gamma(f.overlap_shape, f.overlap_mean_m / f.overlap_shape));
                rsrp_trigger_dbm.push(f.rsrp_at_trigger_dbm.0 + f.rsrp_at_trigger_dbm.1 * rng.normal());
            }
        }
        Self { boundaries, u_cell, overlap_m, rsrp_trigger_dbm }
    }

    /// Failure model v2: the serving cell `k`'s RSRP before shadowing at `x`. Before its
    /// boundary it rises from the trigger-point value towards the cell centre (as
    /// [`Layout::rsrp_mean`]); past the boundary, while its handover has not completed, it falls
    /// by `fall_db` over the overlap zone and keeps falling beyond the coverage edge.
    pub fn rsrp_v2(&self, k: usize, x: f64, fall_db: f64) -> f64 {
        let Some(&b) = self.boundaries.get(k) else {
            return RSRP_EDGE_DBM + RSRP_RISE_DB;
        };
        let r = self.rsrp_trigger_dbm[k];
        if x >= b {
            return r - fall_db * (x - b) / self.overlap_m[k].max(1.0);
        }
        let lo = if k == 0 { 0.0 } else { self.boundaries[k - 1] };
        let half = ((b - lo) / 2.0).max(1.0);
        r + RSRP_RISE_DB * ((b - x) / half).min(1.0)
    }

    /// Index of the cell containing `x`.
    pub fn cell_at(&self, x: f64) -> usize {
        self.boundaries.partition_point(|&b| b <= x)
    }

    /// Serving-cell RSRP before shadowing: edge value at a boundary, rising linearly to the
    /// centre of the cell (unsourced geometry, see [`RSRP_EDGE_DBM`]).
    pub fn rsrp_mean(&self, x: f64) -> f64 {
        if self.boundaries.is_empty() {
            return RSRP_EDGE_DBM + RSRP_RISE_DB;
        }
        let k = self.cell_at(x);
        let lo = if k == 0 { 0.0 } else { self.boundaries[k - 1] };
        let hi = self.boundaries.get(k).copied().unwrap_or(lo + 1000.0);
        let half = ((hi - lo) / 2.0).max(1.0);
        let d = (x - lo).min(hi - x).max(0.0);
        RSRP_EDGE_DBM + RSRP_RISE_DB * (d / half).min(1.0)
    }
}

/// Handover outcome (§6.2 / §15.3.3): the event log's type.
pub use polycorn_telemetry::events::Outcome;

/// One handover of one carrier.
#[derive(Debug, Clone, PartialEq)]
pub struct Handover {
    /// Source cell (= boundary index).
    pub from_cell: usize,
    /// Blackout start, ms.
    pub start_ms: u64,
    /// Blackout end (exclusive), ms.
    pub end_ms: u64,
    /// Outcome and type.
    pub outcome: Outcome,
    /// Train position at the trigger, metres.
    pub x_m: f64,
    /// Trigger jitter δ past the boundary, metres.
    pub delta_m: f64,
    /// True RSRP at the trigger, dBm.
    pub rsrp_dbm: f64,
    /// Failure probability the logit model gave.
    pub p_fail: f64,
    /// Failure model v2 only: where the handover was triggered, metres (the blackout of a
    /// too-late failure starts later, at the coverage edge).
    pub trigger_m: Option<f64>,
    /// Failure model v2 only: whether a failure was too late (else random); `None` for
    /// successes and for v1.
    pub too_late: Option<bool>,
    /// Whether the blackout flushes the carrier's queues (type III; types I and II hold them,
    /// §15.3 item 5).
    pub flush: bool,
}

/// One RSRP report.
#[derive(Debug, Clone, PartialEq)]
pub struct RsrpSample {
    /// When it was measured, ms.
    pub measured_ms: u64,
    /// When it is reported (measured + 0–200 ms), ms.
    pub reported_ms: u64,
    /// Serving cell (changes when a handover ends).
    pub cell: usize,
    /// Value, dBm: the position-based RSRP of the cell layout (see [`Layout::rsrp_mean`]) plus
    /// shadowing; between a boundary and the end of its handover it already describes the new
    /// cell (a simplification).
    pub rsrp_dbm: f64,
}

/// Everything generated for one carrier.
#[derive(Debug, Clone, PartialEq)]
pub struct CarrierTrip {
    /// Route layout.
    pub layout: Layout,
    /// Tuned intercept β0 of the failure logit.
    pub beta0: f64,
    /// Downlink capacity per step before the blackout indicator, Mbit/s.
    pub down_mbps: Vec<f32>,
    /// Uplink capacity per step before the blackout indicator, Mbit/s.
    pub up_mbps: Vec<f32>,
    /// One-way delay per step, ms (RTT / 2, §15.5).
    pub delay_ms: Vec<f32>,
    /// Handovers in time order, with non-overlapping blackouts.
    pub handovers: Vec<Handover>,
    /// RSRP reports.
    pub rsrp: Vec<RsrpSample>,
}

/// A generated trip.
#[derive(Debug, Clone, PartialEq)]
pub struct Trip {
    /// Train position per step, metres.
    pub x_m: Vec<f64>,
    /// Train speed per step, m/s.
    pub v_mps: Vec<f64>,
    /// Per carrier.
    pub carriers: Vec<CarrierTrip>,
}

/// A handover whose blackout starts at this step: (failed, v2 only: (too late, trigger
/// position), δ, p_fail).
type Decision = (bool, Option<(bool, f64)>, f64, f64);

/// Logistic function.
fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// Tunes β0 so that the mean failure probability over the model's own distribution of
/// (u_cell, RSRP-low, late) equals the preset's target share (§15.3.3). Monte Carlo with a
/// fixed seed plus bisection, so it is deterministic.
pub fn tune_beta0(preset: &Preset, c: &CarrierParams) -> f64 {
    if let FailureModel::V2(f) = &preset.failure_model {
        return tune_beta0_v2(preset, c, f);
    }
    let mut rng = stream(0x7475_6E65, TAG_TUNE);
    let samples: Vec<f64> = (0..20_000)
        .map(|_| {
            let u = c.sigma_cell * rng.normal();
            let delta = rng.exponential(preset.mean_jitter_m);
            let gap = rng.gamma(c.gap_shape, c.mean_gap_m / c.gap_shape);
            let d = delta.min((gap - delta).max(0.0));
            let rsrp =
                RSRP_EDGE_DBM + RSRP_RISE_DB * (d / (gap / 2.0)).min(1.0) + preset.rsrp_shadow_sd_db * rng.normal();
            u + if rsrp < RSRP_LOW_DBM { c.beta_rsrp } else { 0.0 }
                + if delta >= preset.late_threshold_m { c.beta_late } else { 0.0 }
        })
        .collect();
    bisect(|b| samples.iter().map(|s| sigmoid(b + s)).sum::<f64>() / samples.len() as f64, c.target_fail_share)
}

/// The β0 at which the increasing function `mean_fail` of β0 reaches `target` (bisection).
fn bisect(mean_fail: impl Fn(f64) -> f64, target: f64) -> f64 {
    let (mut lo, mut hi) = (-20.0, 10.0);
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if mean_fail(mid) < target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// One trip's trigger jitter δ past the boundary under failure model v2 (§15.3 item 2a): mostly
/// |N(0, σ_t)|, a minority late (≥ the late threshold).
fn jitter_v2(p: &Preset, f: &FailureV2, rng: &mut Rng) -> f64 {
    if rng.bernoulli(f.late_trigger_share) {
        p.late_threshold_m + rng.exponential(f.late_trigger_extra_mean_m)
    } else {
        (f.jitter_sd_m * rng.normal()).abs()
    }
}

/// Failure model v2's two failure probabilities at a trigger: (random, too late). `margin_m` is
/// the distance from the trigger to where the source link dies (e + ε); at or below 0 the
/// handover is certainly too late.
fn p_fail_v2(beta0: f64, u: f64, rsrp_low: bool, margin_m: f64, c: &CarrierParams, f: &FailureV2) -> (f64, f64) {
    let base = beta0 + u + if rsrp_low { c.beta_rsrp } else { 0.0 };
    let p_random = sigmoid(base);
    let p_late = if margin_m <= 0.0 { 1.0 } else { sigmoid(base + f.too_late_offset - margin_m / f.too_late_scale_m) };
    (p_random, p_late)
}

/// [`tune_beta0`] for failure model v2: the mean over the model's own distribution of (u_cell,
/// overlap, jitter, edge jitter, RSRP) of P(random) + (1 − P(random)) · P(too late).
fn tune_beta0_v2(p: &Preset, c: &CarrierParams, f: &FailureV2) -> f64 {
    let mut rng = stream(0x7475_6E65, TAG_TUNE);
    let sigma_cell = f.sigma_cell[usize::from(c.label == "B")];
    let samples: Vec<(f64, bool, f64)> = (0..20_000)
        .map(|_| {
            let u = sigma_cell * rng.normal();
            let w = rng.gamma(f.overlap_shape, f.overlap_mean_m / f.overlap_shape);
            let delta = jitter_v2(p, f, &mut rng);
            let eps = f.edge_sd_m * rng.normal();
            let rsrp = f.rsrp_at_trigger_dbm.0 + f.rsrp_at_trigger_dbm.1 * rng.normal()
                - f.rsrp_fall_to_edge_db * delta / w.max(1.0)
                + p.rsrp_shadow_sd_db * rng.normal();
            (u, rsrp < RSRP_LOW_DBM, w + eps - delta)
        })
        .collect();
    bisect(
        |b| {
            samples
                .iter()
                .map(|&(u, low, margin)| {
                    let (pr, pl) = p_fail_v2(b, u, low, margin, c, f);
                    pr + (1.0 - pr) * pl
                })
                .sum::<f64>()
                / samples.len() as f64
        },
        c.target_fail_share,
    )
}

/// Train kinematics (§15.2): cruise, linear braking into stations, dwell, linear acceleration.
/// The trip starts at cruise speed at position 0, the first station `station_spacing_m` ahead.
pub fn kinematics(preset: &Preset, steps: usize) -> (Vec<f64>, Vec<f64>) {
    let dt = STEP_MS as f64 / 1000.0;
    let cruise = preset.cruise_kmh / 3.6;
    let a = preset.accel_mps2;
    let (mut x, mut v) = (0.0, cruise);
    let mut next_station = preset.station_spacing_m;
    let mut dwell_left = 0.0;
    let (mut xs, mut vs) = (Vec::with_capacity(steps), Vec::with_capacity(steps));
    for _ in 0..steps {
        xs.push(x);
        vs.push(v);
        if dwell_left > 0.0 {
            dwell_left -= dt;
            continue;
        }
        match next_station {
            Some(s) if s - x <= v * v / (2.0 * a) + v * dt => {
                v = (v - a * dt).max(0.0);
                if v == 0.0 || x >= s {
                    x = x.max(s);
                    v = 0.0;
                    dwell_left = preset.dwell_s;
                    next_station = preset.station_spacing_m.map(|d| s + d);
                }
            }
            _ => v = (v + a * dt).min(cruise),
        }
        x += v * dt;
    }
    (xs, vs)
}

/// Draws a handover duration in seconds (§15.3.4).
fn duration_s(preset: &Preset, outcome: Outcome, rng: &mut Rng) -> f64 {
    let (median, sigma) = match outcome {
        Outcome::Success => {
            return if rng.bernoulli(preset.type_i_tail_share) {
                rng.lognormal(preset.type_i_tail_median_s, preset.type_i_tail_sigma).min(5.0)
            } else {
                0.02 + 0.08 * rng.uniform()
            };
        }
        Outcome::Rlf => (preset.type_ii_median_s, preset.type_ii_sigma),
        Outcome::Nas => (preset.type_iii_median_s, preset.type_iii_sigma),
    };
    match preset.failure_truncation_s {
        None => rng.lognormal(median, sigma),
        Some((lo, hi)) => {
            for _ in 0..1000 {
                let d = rng.lognormal(median, sigma);
                if (lo..=hi).contains(&d) {
                    return d;
                }
            }
            median.clamp(lo, hi)
        }
    }
}

/// Runs the whole model.
pub fn generate(cfg: &TripConfig) -> Trip {
    let p = &cfg.preset;
    let steps = (cfg.duration_s * 1000 / STEP_MS) as usize;
    let dt = STEP_MS as f64 / 1000.0;
    let (x_m, v_mps) = kinematics(p, steps);
    let route_len = x_m.last().copied().unwrap_or(0.0) + 5_000.0;
    let carriers = (0..cfg.carriers).map(|i| carrier(cfg, i, &x_m, &v_mps, route_len, dt)).collect();
    Trip { x_m, v_mps, carriers }
}

fn carrier(cfg: &TripConfig, i: usize, x_m: &[f64], v_mps: &[f64], route_len: f64, dt: f64) -> CarrierTrip {
    let p = &cfg.preset;
    let c = p.carrier(i);
    let tag = |t: u64| t << 32 | i as u64;
    let layout = Layout::new(p, cfg.route_seed, i, route_len);
    let beta0 = if p.handovers { tune_beta0(p, c) } else { 0.0 };

    // Per-trip trigger positions b + δ, kept in route order (§15.3.2; v2: §15.3 item 2a), and
    // v2's edge jitter ε.
    let mut jitter = stream(cfg.trip_seed, tag(TAG_JITTER));
    let mut prev = f64::NEG_INFINITY;
    let v2 = match &p.failure_model {
        FailureModel::V1 => None,
        FailureModel::V2(f) => Some(f),
    };
    let triggers: Vec<(f64, f64)> = layout
        .boundaries
        .iter()
        .map(|&b| {
            let delta = match v2 {
                None => jitter.exponential(p.mean_jitter_m),
                Some(f) => jitter_v2(p, f, &mut jitter),
            };
            let pos = (b + delta).max(prev + 1.0);
            prev = pos;
            (pos, delta)
        })
        .collect();
    // Where the source link of boundary k dies on this trip (v2): e + ε.
    let death: Vec<f64> = match v2 {
        None => Vec::new(),
        Some(f) => (0..layout.boundaries.len())
            .map(|k| layout.boundaries[k] + layout.overlap_m[k] + f.edge_sd_m * jitter.normal())
            .collect(),
    };
    // v2: a too-late handover waiting for the train to reach `death[k]`: (trigger, δ, p_fail).
    let mut pending: Option<(f64, f64, f64)> = None;

    let mut fading = stream(cfg.trip_seed, tag(TAG_FADING));
    let mut rtt_rng = stream(cfg.trip_seed, tag(TAG_RTT));
    let mut rsrp_rng = stream(cfg.trip_seed, tag(TAG_RSRP));
    let mut outcome_rng = stream(cfg.trip_seed, tag(TAG_OUTCOME));
    let gq = GammaQuantile::new(c.rtt_shape);

    let a_fast = (-dt / p.tau_fast_s).exp();
    let b_fast = (1.0 - a_fast * a_fast).sqrt();
    let a_rtt = (-dt / p.tau_rtt_s).exp();
    let b_rtt = (1.0 - a_rtt * a_rtt) / (1.0 + a_rtt * a_rtt).sqrt();
    let a_sh = (-dt / RSRP_SHADOW_TAU_S).exp();
    let (mut zf_down, mut zf_up, mut zs) = (fading.normal(), fading.normal(), fading.normal());
    let (mut y1, mut y2) = (rtt_rng.normal(), rtt_rng.normal());
    let mut shadow = rsrp_rng.normal();

    let weibull = |z: f64| c.weibull_lambda_mbps * (-normal_sf(z).ln()).powf(1.0 / c.weibull_k);
    let n = x_m.len();
    let (mut down, mut up, mut delay) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
    let mut handovers = Vec::new();
    let mut rsrp = Vec::new();
    let mut next_trigger = 0;
    let mut busy_until = 0;
    for k in 0..n {
        let t_ms = k as u64 * STEP_MS;
        let x = x_m[k];
        if k > 0 {
            let dx = (x - x_m[k - 1]).max(0.0);
            zf_down = a_fast * zf_down + b_fast * fading.normal();
            zf_up = a_fast * zf_up + b_fast * fading.normal();
            let a_s = (-dx / p.slow_length_m).exp();
            zs = a_s * zs + (1.0 - a_s * a_s).sqrt() * fading.normal();
            y1 = a_rtt * y1 + (1.0 - a_rtt * a_rtt).sqrt() * rtt_rng.normal();
            y2 = a_rtt * y2 + b_rtt * y1;
            shadow = a_sh * shadow + (1.0 - a_sh * a_sh).sqrt() * rsrp_rng.normal();
        }
        let w = p.slow_weight;
        let s = p.speed_factor_at(v_mps[k] * 3.6);
        let z_down = p.fading_sd * ((1.0 - w).sqrt() * zf_down + w.sqrt() * zs);
        let z_up = p.fading_sd * ((1.0 - w).sqrt() * zf_up + w.sqrt() * zs);
        down.push((weibull(z_down) * s) as f32);
        up.push((weibull(z_up) * s * p.uplink_factor) as f32);
        let rtt = c.rtt_shift_ms + p.rtt_jitter_factor * c.rtt_scale_ms * gq.at(1.0 - normal_sf(y2));
        delay.push((rtt / 2.0) as f32);
        let rsrp_now = match v2 {
            None => layout.rsrp_mean(x),
            Some(f) => layout.rsrp_v2(next_trigger, x, f.rsrp_fall_to_edge_db),
        } + p.rsrp_shadow_sd_db * shadow;
        if t_ms % p.rsrp_period_ms == 0 {
            let lag = (rsrp_rng.uniform() * p.rsrp_delay_max_ms).round() as u64;
            rsrp.push(RsrpSample {
                measured_ms: t_ms,
                reported_ms: t_ms + lag,
                // Serving cell: the source cell until its handover ends.
                cell: handovers.len() - usize::from(handovers.last().is_some_and(|h: &Handover| h.end_ms > t_ms)),
                rsrp_dbm: (rsrp_now * 10.0).round() / 10.0,
            });
        }
        let mut start: Option<Decision> = None;
        if let (Some(f), true) = (v2, next_trigger < triggers.len() && t_ms >= busy_until) {
            // Failure model v2 (§15.3 item 2a).
            let k = next_trigger;
            // The first step after a blackout, with this handover's trigger already passed.
            let deferred = t_ms > 0 && t_ms - STEP_MS < busy_until && pending.is_none();
            let (trigger, delta) = triggers[k];
            let low = rsrp_now < RSRP_LOW_DBM;
            if let Some((tr, d, pf)) = pending {
                if x >= death[k] {
                    start = Some((true, Some((true, tr)), d, pf));
                    pending = None;
                }
            } else if x >= trigger.min(death[k]) && deferred {
                // The trigger came during the previous handover's blackout: the UE attaches to
                // the best cell when it ends, so only a random failure can hit it (a too-late
                // failure of a handover the UE never had to make would chain blackouts).
                let (pr, _) = p_fail_v2(beta0, layout.u_cell[k], low, 1.0, c, f);
                start = Some((outcome_rng.bernoulli(pr), Some((false, x)), delta, pr));
            } else if x >= death[k] {
                // Not even triggered before the source link died.
                start = Some((true, Some((true, trigger)), delta, 1.0));
            } else if x >= trigger {
                let (pr, pl) = p_fail_v2(beta0, layout.u_cell[k], low, death[k] - x, c, f);
                let p_fail = pr + (1.0 - pr) * pl;
                if outcome_rng.bernoulli(pr) {
                    start = Some((true, Some((false, x)), delta, p_fail));
                } else if outcome_rng.bernoulli(pl) {
                    pending = Some((x, delta, p_fail));
                } else {
                    start = Some((false, Some((false, x)), delta, p_fail));
                }
            }
        } else if v2.is_none() && next_trigger < triggers.len() && x >= triggers[next_trigger].0 && t_ms >= busy_until {
            // Failure model v1 (§15.3 items 2–3).
            let delta = triggers[next_trigger].1;
            let late = delta >= p.late_threshold_m;
            let logit = beta0
                + layout.u_cell[next_trigger]
                + if rsrp_now < RSRP_LOW_DBM { c.beta_rsrp } else { 0.0 }
                + if late { c.beta_late } else { 0.0 };
            let p_fail = sigmoid(logit);
            start = Some((outcome_rng.bernoulli(p_fail), None, delta, p_fail));
        }
        if let Some((failed, v2_info, delta, p_fail)) = start {
            let outcome = if !failed {
                Outcome::Success
            } else if outcome_rng.bernoulli(p.type_ii_share) {
                Outcome::Rlf
            } else {
                Outcome::Nas
            };
            let d_ms = ((duration_s(p, outcome, &mut outcome_rng) * 1000.0).round() as u64).max(1);
            handovers.push(Handover {
                from_cell: next_trigger,
                start_ms: t_ms,
                end_ms: t_ms + d_ms,
                outcome,
                x_m: x,
                delta_m: delta,
                rsrp_dbm: rsrp_now,
                p_fail,
                trigger_m: v2_info.map(|(_, tr)| tr),
                too_late: v2_info.and_then(|(tl, _)| failed.then_some(tl)),
                flush: outcome == Outcome::Nas,
            });
            busy_until = t_ms + d_ms;
            next_trigger += 1;
        }
    }
    CarrierTrip { layout, beta0, down_mbps: down, up_mbps: up, delay_ms: delay, handovers, rsrp }
}

/// GPS fix noise: isotropic Gaussian with σ = bound / 3 per axis, radially clipped to the bound
/// (§15.2: E_GPS is a maximum, not a distribution). Returns (east, north) metres.
pub fn gps_error(rng: &mut Rng, bound_m: f64) -> (f64, f64) {
    let (e, n) = (rng.normal() * bound_m / 3.0, rng.normal() * bound_m / 3.0);
    let r = (e * e + n * n).sqrt();
    if r > bound_m {
        (e * bound_m / r, n * bound_m / r)
    } else {
        (e, n)
    }
}

/// The GPS noise stream of a trip.
pub fn gps_rng(trip_seed: u64) -> Rng {
    stream(trip_seed, TAG_GPS << 32)
}
