//! Named parameter sets (hsr-facts §15.7). Every field names the hsr-facts section it comes
//! from; "unsourced" marks free parameters the seeds do not constrain.

use serde::Serialize;

/// Parameters of one carrier (A = China Mobile-like, B = China Unicom-like in PC's naming).
#[derive(Debug, Clone, Serialize)]
pub struct CarrierParams {
    /// Label used in logs ("A" or "B").
    pub label: &'static str,
    /// Mean gap between handover boundaries along the track, metres (§15.3.1: D_A = 894 m,
    /// D_B = 631 m for PC; 13.4 s / 8.25 s at 300 / 350 km/h for M19, i.e. 1117 / 802 m).
    pub mean_gap_m: f64,
    /// Gamma shape k_s of the boundary gaps (§15.3.1: unconstrained, default 4, CV 0.5).
    pub gap_shape: f64,
    /// Target overall failed-handover share; β0 is tuned to it (§15.3.3, §6.3, §6.2).
    pub target_fail_share: f64,
    /// Log-odds of failure when RSRP < −95 dBm at HO start (§15.3.3, §7.1: A 1.99, B 0.90).
    pub beta_rsrp: f64,
    /// Log-odds of failure when the trigger is ≥ 200 m past the boundary (§15.3.3: A 0.46, B 0.70).
    pub beta_late: f64,
    /// SD of the route-fixed per-cell log-odds u_cell (§15.3.3; chosen as the logit-scale SD of
    /// the Beta(1.63, 24.5) / Beta(0.91, 15.7) fits there: ≈0.95 / ≈1.2 — a model fit, not data).
    pub sigma_cell: f64,
    /// Weibull shape of the capacity marginal (§15.4: A 0.993, B 1.078).
    pub weibull_k: f64,
    /// Weibull scale of the capacity marginal, Mbit/s (§15.4: A 9.09, B 14.72).
    pub weibull_lambda_mbps: f64,
    /// RTT shifted-gamma shift, ms (§15.5: A 97, B 141; M19-BBR 50).
    pub rtt_shift_ms: f64,
    /// RTT shifted-gamma shape (§15.5: A 0.64, B 0.33; M19-BBR 0.58).
    pub rtt_shape: f64,
    /// RTT shifted-gamma scale, ms (§15.5: A 250, B 518; M19-BBR 333).
    pub rtt_scale_ms: f64,
    /// Mean random loss outside handovers (§15.6: A 0.21%, B 1.35%; static 0.008%).
    pub loss_rate: f64,
}

/// A complete parameter set for one trip.
#[derive(Debug, Clone, Serialize)]
pub struct Preset {
    /// Preset name (§15.7).
    pub name: &'static str,
    /// Cruise speed, km/h (§15.2: 300 PC, 350 M19; 0 static).
    pub cruise_kmh: f64,
    /// Acceleration and braking at stations, m/s² (§15.2: no figure in the seeds; unsourced).
    pub accel_mps2: f64,
    /// Distance between station stops, metres; `None` = no stops (§15.2 "optional"; unsourced:
    /// 200 km, roughly an express service; the first stop is 200 km after the trip start).
    pub station_spacing_m: Option<f64>,
    /// Dwell time at a station, seconds (unsourced).
    pub dwell_s: f64,
    /// Capacity speed factor s(v) as (km/h, factor) points, interpolated linearly (§15.4).
    pub speed_factor: &'static [(f64, f64)],
    /// Whether handovers happen at all (`static`: none, §15.7).
    pub handovers: bool,
    /// Mean trigger jitter m_δ past the boundary, metres (§15.3.2: 150–250 m).
    pub mean_jitter_m: f64,
    /// Threshold for the "late" indicator, metres (§15.3.3 / §7.1: 200 m).
    pub late_threshold_m: f64,
    /// Share of failures that are type II (RLF), the rest type III (§15.3.3: 53% at 300 km/h,
    /// 57% at 350 km/h).
    pub type_ii_share: f64,
    /// Share of type I durations drawn from the lognormal tail (§15.3.4: 15%).
    pub type_i_tail_share: f64,
    /// Median of the type I tail, seconds (§15.3.4: 0.5–0.65 s; 0.5 s in the §15.3.6 fit).
    pub type_i_tail_median_s: f64,
    /// Lognormal σ of the type I tail (§15.3.4: 1.0), capped at 5 s.
    pub type_i_tail_sigma: f64,
    /// Type II lognormal median, seconds (§15.3.4: 0.85 s at 350; ×2.09/1.91 at 300).
    pub type_ii_median_s: f64,
    /// Type II lognormal σ (§15.3.4: 1.28).
    pub type_ii_sigma: f64,
    /// Type III lognormal median, seconds (§15.3.4: 1.85 s at 350; ×3.98/5.49 at 300).
    pub type_iii_median_s: f64,
    /// Type III lognormal σ (§15.3.4: 1.48).
    pub type_iii_sigma: f64,
    /// Truncation of failure blackouts, seconds (§15.3.4 PC preset: [1, 10] s).
    pub failure_truncation_s: Option<(f64, f64)>,
    /// SD of the capacity latent Z (1 on HSR, §15.4; 0 for `static` = constant median capacity,
    /// an unsourced simplification of "stable").
    pub fading_sd: f64,
    /// Fast OU time constant τ_f, seconds (§15.4 two-time-scale variant: 0.4–0.5 s).
    pub tau_fast_s: f64,
    /// Weight w of the slow spatial component (§15.4: ≈0.7).
    pub slow_weight: f64,
    /// Spatial correlation length ℓ of the slow component, metres (§15.4: ≈10 km).
    pub slow_length_m: f64,
    /// Uplink capacity as a multiple of downlink (unsourced: §15 has no uplink figures).
    pub uplink_factor: f64,
    /// Time constant τ_r of the 2nd-order Gauss–Markov RTT latent, seconds (§15.5: 0.2–0.25 s).
    pub tau_rtt_s: f64,
    /// Multiplier on the RTT gamma scale (1 on HSR; `static` uses 0.1 for "stable", unsourced).
    pub rtt_jitter_factor: f64,
    /// Mean bad-state run of the Gilbert–Elliott chain (§15.6: "bursty", length not given; the
    /// 3–5 packets there are a guess). In 1 ms slots under the emulator's default time keying
    /// (packets under `--loss-keying packet`). v1 presets and `static`: 4. v2 HSR presets: fitted
    /// to §15.8 item 12 (RTO share under BBR) on development trips, so a loss burst outlasts a
    /// retransmission timeout at the same mean loss (docs/hsr-model.md).
    pub mean_bad_run: f64,
    /// GPS error bound, metres (§15.2: E_GPS = 20 m maximum).
    pub gps_error_max_m: f64,
    /// Maximum RSRP reporting delay, ms (§15.2 / §7.2: 0–200 ms).
    pub rsrp_delay_max_ms: f64,
    /// RSRP sampling period, ms (unsourced).
    pub rsrp_period_ms: u64,
    /// SD of the RSRP shadowing OU, dB (unsourced; §7.2 only says RSRP "fluctuates heavily").
    pub rsrp_shadow_sd_db: f64,
    /// Where and why handovers fail: `V1` (the first model) or `V2` (§15.3 item 2a).
    pub failure_model: FailureModel,
    /// Loss around every handover's interruption (hsr-facts §5.1, S18); `None` (every preset):
    /// none. An experiment's knob (`--set handover_loss.KEY=VALUE`): it was measured not to
    /// produce the RTOs of §15.8 item 12 (docs/hsr-model.md, "Loss around handovers").
    pub handover_loss: Option<HandoverLoss>,
    /// The two carrier parameter sets; carrier i uses `carriers[i % 2]`.
    pub carriers: [CarrierParams; 2],
}

/// Loss bursts around handovers (hsr-facts §5.1: S18 measured a packet loss rate of 0 without a
/// handoff and above 70 % during one, and "packet loss bursts often happen around moments when
/// handoffs occur"; PC: performance "already starts to degrade when approaching the handover
/// point"; M19 and PC: lost uplink ACKs and the spurious RTOs they cause). Every handover of a
/// carrier, successful or failed, has a window of `rate` loss, in both directions, from
/// `before_ms` before its interruption starts to `after_ms` after it ends (the interruption itself
/// keeps its blackout semantics: held for types I and II, flushed for III). The seeds give the
/// level, not the length. Tried as the source of §15.8 item 12's RTOs on development routes
/// (`tools/fit_handover_loss.py`): Linux BBR recovers such losses without a timeout, so no
/// preset uses it (docs/hsr-model.md, "Loss around handovers").
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandoverLoss {
    /// Loss probability of a packet inside the window (S18: above 70 %).
    pub rate: f64,
    /// Window before the interruption starts, ms (fitted).
    pub before_ms: u64,
    /// Window after the interruption ends, ms (fitted).
    pub after_ms: u64,
}

impl HandoverLoss {
    /// What `--set handover_loss.KEY=VALUE` starts from: S18's level, 150 ms on each side.
    pub const DEFAULT: HandoverLoss = HandoverLoss { rate: 0.7, before_ms: 150, after_ms: 150 };

    /// Sets one parameter by name (`polycorn-tracegen generate --set handover_loss.KEY=VALUE`).
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        let mut next = *self;
        set_by_name(&mut next, "handover-loss", key, value)?;
        if !(0.0..=1.0).contains(&next.rate) {
            return Err(format!("handover_loss.{key}={value}: not in [0, 1]"));
        }
        *self = next;
        Ok(())
    }

    /// The loss windows `[from, to)`, ms, of handover interruptions `[start, end)`, merged where
    /// they overlap and cut where another interruption lies (its blackout rules there), within
    /// `[0, duration_ms)`.
    pub fn windows(&self, interruptions: &[(u64, u64)], duration_ms: u64) -> Vec<(u64, u64)> {
        let mut raw: Vec<(u64, u64)> = Vec::with_capacity(interruptions.len() * 2);
        for &(s, e) in interruptions {
            raw.push((s.saturating_sub(self.before_ms), s));
            raw.push((e, e.saturating_add(self.after_ms).min(duration_ms)));
        }
        raw.retain(|&(a, b)| a < b);
        raw.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(raw.len());
        for (a, b) in raw {
            match merged.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        let mut blackouts: Vec<(u64, u64)> = interruptions.to_vec();
        blackouts.sort_unstable();
        let mut out = Vec::with_capacity(merged.len());
        for (mut a, b) in merged {
            for &(s, e) in &blackouts {
                if e <= a || s >= b {
                    continue;
                }
                if s > a {
                    out.push((a, s));
                }
                a = a.max(e);
            }
            if a < b {
                out.push((a, b));
            }
        }
        out
    }
}

/// Sets field `key` of a parameter struct to `value` (a JSON value) through its serde form,
/// so that `--set` knows every field by its name and type without a list of its own; `what`
/// names the struct in the error for an unknown key.
fn set_by_name<T: Serialize + serde::de::DeserializeOwned>(
    params: &mut T,
    what: &str,
    key: &str,
    value: &str,
) -> Result<(), String> {
    let mut v = serde_json::to_value(&*params).map_err(|e| e.to_string())?;
    let obj = v.as_object_mut().ok_or("not an object")?;
    if !obj.contains_key(key) {
        return Err(format!("unknown {what} parameter {key:?}; known: {:?}", obj.keys().collect::<Vec<_>>()));
    }
    let parsed: serde_json::Value =
        serde_json::from_str(value).map_err(|e| format!("{key}={value}: not a JSON value: {e}"))?;
    obj.insert(key.to_string(), parsed);
    *params = serde_json::from_value(v).map_err(|e| format!("{key}={value}: {e}"))?;
    Ok(())
}

/// The failure model (hsr-facts §15.3 items 2, 2a and 3).
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "version", rename_all = "lowercase")]
pub enum FailureModel {
    /// The first model: every handover starts at b + δ, δ ~ Exp(`mean_jitter_m`), and one logit
    /// decides its outcome. A cell's failures spread over about 2.5 s of travel, so they are not
    /// location-predictable. Kept so that earlier results stay reproducible (`*-v1` presets).
    V1,
    /// Failures bound to a place (§15.3 item 2a).
    V2(FailureV2),
}

/// Parameters of the location-bound failure model (§15.3 item 2a). Route-fixed per
/// ⟨cell, direction⟩: the trigger point b (the boundary), the coverage edge e = b + w past which
/// the source link cannot survive, the cell's RSRP at b and its failure propensity u_cell. Per
/// trip: the trigger jitter (mostly tight, a minority late), the edge jitter ε of GPS scale, and
/// the outcome. A *too-late* failure (the handover has not completed when the train reaches
/// e + ε) starts its blackout at e + ε, the same place on every trip; a *random* radio-link
/// failure starts at the trigger. The values are fitted on development routes
/// (docs/hsr-model.md, "Failure model v2"); the seeds constrain only the statistics they
/// reproduce (§15.8 items 8, 9, 14–16).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailureV2 {
    /// Mean length w of the overlap zone (trigger point to coverage edge), metres (§15.3 item 2a:
    /// 200–300 m).
    pub overlap_mean_m: f64,
    /// Gamma shape of w (unsourced).
    pub overlap_shape: f64,
    /// SD σ_t of the tight trigger jitter |N(0, σ_t)|, metres (§15.3 item 2a: a few tens).
    pub jitter_sd_m: f64,
    /// Share of late triggers (item 2a: a minority; PC Table 1's ≥ 200 m bin must stay populated).
    pub late_trigger_share: f64,
    /// A late trigger is `late_threshold_m` + Exp(this) past b, metres (unsourced).
    pub late_trigger_extra_mean_m: f64,
    /// SD σ_e of where a too-late failure starts around e, metres (item 2a: GPS scale, 15–25 m).
    pub edge_sd_m: f64,
    /// Distance scale of the too-late logit in the margin e − trigger, metres: the failure
    /// probability rises by e per this many metres less margin (unsourced; "rises steeply").
    pub too_late_scale_m: f64,
    /// Log-odds of a too-late failure over a random one at zero margin (unsourced; with
    /// `too_late_scale_m` it sets the share of the two mechanisms). One intercept β0, tuned to
    /// the carrier's failure share as in v1, is shared by both logits.
    pub too_late_offset: f64,
    /// Mean and SD of a cell's RSRP at its trigger point, dBm (unsourced; chosen so the −95 dBm
    /// threshold of PC Table 1 splits handovers into two populated bins).
    pub rsrp_at_trigger_dbm: (f64, f64),
    /// Fall of the source cell's RSRP from the trigger point to the coverage edge, dB (unsourced).
    pub rsrp_fall_to_edge_db: f64,
    /// SD of u_cell for carriers A and B under this model (replaces `CarrierParams::sigma_cell`,
    /// which is v1's fit; refitted to §15.8 item 9).
    pub sigma_cell: [f64; 2],
}

impl FailureV2 {
    /// Sets one parameter by name (`polycorn-tracegen generate --set`, for fitting experiments
    /// on development routes; `trip.json` records the result).
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        set_by_name(self, "failure-model", key, value)
    }

    /// The fitted default (docs/hsr-model.md, "Failure model v2").
    pub const DEFAULT: FailureV2 = FailureV2 {
        overlap_mean_m: 450.0,
        overlap_shape: 6.0,
        jitter_sd_m: 30.0,
        late_trigger_share: 0.10,
        late_trigger_extra_mean_m: 60.0,
        edge_sd_m: 20.0,
        too_late_scale_m: 30.0,
        too_late_offset: 0.0,
        rsrp_at_trigger_dbm: (-95.0, 4.0),
        rsrp_fall_to_edge_db: 12.0,
        sigma_cell: [0.95, 1.2],
    };
}

/// §15.4 speed factor table (relative to 300 km/h): static 1.65, 200 km/h 1.15, 300 km/h 1.
const SPEED_FACTOR_FIG4: &[(f64, f64)] = &[(0.0, 1.65), (200.0, 1.15), (300.0, 1.0), (350.0, 0.57)];

const PC_A: CarrierParams = CarrierParams {
    label: "A",
    mean_gap_m: 894.0,
    gap_shape: 4.0,
    target_fail_share: 0.0622,
    beta_rsrp: 1.99,
    beta_late: 0.46,
    sigma_cell: 0.95,
    weibull_k: 0.993,
    weibull_lambda_mbps: 9.09,
    rtt_shift_ms: 97.0,
    rtt_shape: 0.64,
    rtt_scale_ms: 250.0,
    loss_rate: 0.0021,
};

const PC_B: CarrierParams = CarrierParams {
    label: "B",
    mean_gap_m: 631.0,
    gap_shape: 4.0,
    target_fail_share: 0.0547,
    beta_rsrp: 0.90,
    beta_late: 0.70,
    sigma_cell: 1.2,
    weibull_k: 1.078,
    weibull_lambda_mbps: 14.72,
    rtt_shift_ms: 141.0,
    rtt_shape: 0.33,
    rtt_scale_ms: 518.0,
    loss_rate: 0.0135,
};

/// M19 carriers: M19 gap and failure share, PC odds ratios and capacity, M19-BBR RTT fit.
const fn m19(base: CarrierParams, gap_m: f64, fail: f64) -> CarrierParams {
    CarrierParams {
        mean_gap_m: gap_m,
        target_fail_share: fail,
        rtt_shift_ms: 50.0,
        rtt_shape: 0.58,
        rtt_scale_ms: 333.0,
        ..base
    }
}

impl Preset {
    /// Names accepted by [`Preset::by_name`].
    pub const NAMES: [&'static str; 7] = [
        "pc-gateway-300",
        "m19-phone-300",
        "m19-phone-350",
        "static",
        "pc-gateway-300-v1",
        "m19-phone-300-v1",
        "m19-phone-350-v1",
    ];

    /// PC gateway at 300 km/h (§15.7 row 1); the default.
    pub fn pc_gateway_300() -> Self {
        Self {
            name: "pc-gateway-300",
            cruise_kmh: 300.0,
            accel_mps2: 0.5,
            station_spacing_m: Some(200_000.0),
            dwell_s: 120.0,
            speed_factor: SPEED_FACTOR_FIG4,
            handovers: true,
            mean_jitter_m: 200.0,
            late_threshold_m: 200.0,
            type_ii_share: 0.53,
            type_i_tail_share: 0.15,
            type_i_tail_median_s: 0.5,
            type_i_tail_sigma: 1.0,
            type_ii_median_s: 0.85 * 2.09 / 1.91,
            type_ii_sigma: 1.28,
            type_iii_median_s: 1.85 * 3.98 / 5.49,
            type_iii_sigma: 1.48,
            failure_truncation_s: Some((1.0, 10.0)),
            fading_sd: 1.0,
            tau_fast_s: 0.45,
            slow_weight: 0.7,
            slow_length_m: 10_000.0,
            uplink_factor: 1.0,
            tau_rtt_s: 0.22,
            rtt_jitter_factor: 1.0,
            mean_bad_run: 300.0,
            gps_error_max_m: 20.0,
            rsrp_delay_max_ms: 200.0,
            rsrp_period_ms: 500,
            rsrp_shadow_sd_db: 4.0,
            failure_model: FailureModel::V2(FailureV2::DEFAULT),
            handover_loss: None,
            carriers: [PC_A, PC_B],
        }
    }

    /// [`Preset::pc_gateway_300`] with the first failure model (the default until 2026-11-26).
    pub fn pc_gateway_300_v1() -> Self {
        Self { name: "pc-gateway-300-v1", failure_model: FailureModel::V1, mean_bad_run: 4.0, ..Self::pc_gateway_300() }
    }

    /// [`Preset::m19_phone_300`] with the first failure model.
    pub fn m19_phone_300_v1() -> Self {
        Self { name: "m19-phone-300-v1", failure_model: FailureModel::V1, mean_bad_run: 4.0, ..Self::m19_phone_300() }
    }

    /// [`Preset::m19_phone_350`] with the first failure model.
    pub fn m19_phone_350_v1() -> Self {
        Self { name: "m19-phone-350-v1", failure_model: FailureModel::V1, mean_bad_run: 4.0, ..Self::m19_phone_350() }
    }

    /// M19 phones at 300 km/h (§15.7 row 3): 13.4 s mean gap, 16.1% failures, capacity ×1.
    pub fn m19_phone_300() -> Self {
        Self {
            name: "m19-phone-300",
            failure_truncation_s: None,
            type_i_tail_median_s: 0.5,
            carriers: [m19(PC_A, 13.4 * 300.0 / 3.6, 0.161), m19(PC_B, 13.4 * 300.0 / 3.6, 0.161)],
            ..Self::pc_gateway_300()
        }
    }

    /// M19 phones at 350 km/h (§15.7 row 2): 8.25 s gap, 19.2% failures (II:III = 57:43),
    /// capacity ×0.57 (the "Fig. 4" variant of §15.4).
    pub fn m19_phone_350() -> Self {
        Self {
            name: "m19-phone-350",
            cruise_kmh: 350.0,
            type_ii_share: 0.57,
            type_i_tail_median_s: 0.65,
            type_ii_median_s: 0.85,
            type_iii_median_s: 1.85,
            failure_truncation_s: None,
            carriers: [m19(PC_A, 8.25 * 350.0 / 3.6, 0.192), m19(PC_B, 8.25 * 350.0 / 3.6, 0.192)],
            ..Self::pc_gateway_300()
        }
    }

    /// Stationary train (§15.7 row 5): no handovers, capacity ×1.65, stable RTT, 0.008% loss.
    pub fn static_() -> Self {
        let mut carriers = [PC_A, PC_B];
        for c in &mut carriers {
            c.loss_rate = 0.00008;
        }
        Self {
            name: "static",
            cruise_kmh: 0.0,
            station_spacing_m: None,
            handovers: false,
            fading_sd: 0.0,
            rtt_jitter_factor: 0.1,
            // Not the HSR bursts (§15.6 gives no burst length for a stationary train).
            mean_bad_run: 4.0,
            carriers,
            ..Self::pc_gateway_300()
        }
    }

    /// Looks a preset up by name.
    pub fn by_name(name: &str) -> Option<Self> {
        match name {
            "pc-gateway-300" => Some(Self::pc_gateway_300()),
            "m19-phone-300" => Some(Self::m19_phone_300()),
            "m19-phone-350" => Some(Self::m19_phone_350()),
            "static" => Some(Self::static_()),
            "pc-gateway-300-v1" => Some(Self::pc_gateway_300_v1()),
            "m19-phone-300-v1" => Some(Self::m19_phone_300_v1()),
            "m19-phone-350-v1" => Some(Self::m19_phone_350_v1()),
            _ => None,
        }
    }

    /// Parameters of carrier `i`.
    pub fn carrier(&self, i: usize) -> &CarrierParams {
        &self.carriers[i % 2]
    }

    /// s(v) by linear interpolation in the table (clamped at the ends).
    pub fn speed_factor_at(&self, kmh: f64) -> f64 {
        let t = self.speed_factor;
        if kmh <= t[0].0 {
            return t[0].1;
        }
        for w in t.windows(2) {
            if kmh <= w[1].0 {
                let f = (kmh - w[0].0) / (w[1].0 - w[0].0);
                return w[0].1 + f * (w[1].1 - w[0].1);
            }
        }
        t[t.len() - 1].1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: HandoverLoss = HandoverLoss { rate: 0.7, before_ms: 100, after_ms: 50 };

    #[test]
    fn windows_surround_each_interruption_but_not_the_interruption() {
        assert_eq!(L.windows(&[(1_000, 1_040)], 10_000), vec![(900, 1_000), (1_040, 1_090)]);
    }

    #[test]
    fn windows_merge_and_stop_at_another_interruption_and_the_trip_ends() {
        // The second handover's pre-window starts inside the first one's post-window, and the
        // first one's post-window runs into the second interruption.
        let w = L.windows(&[(1_000, 1_040), (1_100, 1_130), (9_990, 9_995)], 10_000);
        assert_eq!(w, vec![(900, 1_000), (1_040, 1_100), (1_130, 1_180), (9_890, 9_990), (9_995, 10_000)]);
        // At the trip start the pre-window is cut at 0.
        assert_eq!(L.windows(&[(30, 60)], 10_000), vec![(0, 30), (60, 110)]);
    }

    #[test]
    fn set_checks_names_and_ranges() {
        let mut l = L;
        l.set("before_ms", "250").unwrap();
        l.set("rate", "0.9").unwrap();
        assert_eq!((l.before_ms, l.rate), (250, 0.9));
        assert!(l.set("rate", "1.5").is_err());
        assert!(l.set("length", "3").is_err());
        assert!(l.set("after_ms", "-1").is_err());
    }

    #[test]
    fn no_preset_loses_packets_around_handovers() {
        for name in Preset::NAMES {
            assert_eq!(Preset::by_name(name).unwrap().handover_loss, None, "{name}");
        }
    }
}
