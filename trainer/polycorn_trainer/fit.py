"""The per-cell model and its validation, pure: arrays in, results out.

One *cell* here is POLYCORN's key ⟨carrier, cell, direction of travel⟩ (§3,
footnote 4): the handovers out of one source cell while travelling one way.
Positions are turned into *progress along the direction of travel*
(``x = track_m`` when increasing, ``-track_m`` when decreasing), so that
"later" is always "larger x" and one code path serves both directions.

Per cell (:func:`fit_cell`):

- **Predicted failure location** L̂_HOF: the mean position of the cell's past
  failures (§3: "the average location of all handover failures"). It goes
  into the failure-location table only when the cell has at least
  ``min_failures`` failures and a failure share of at least
  ``min_failure_rate`` (:class:`Params`); otherwise the cell gets no entry
  and the proxies never throttle for it. With ``min_trains`` ≥ 2 (the
  default) the entry must also rest on several trains (:func:`qualifies`,
  :func:`table_location`): failures from at least ``min_trains`` distinct
  trains, no train's failures counted above the runner-up's, and the
  position the latest of those computed without each failing train, so
  that one train (faulty or compromised) cannot put a cell into the fleet's
  table on its own, is at most half of any cell's evidence, and cannot
  move an entry earlier than the other trains' failures put it.
- **Earliest handover position** (EHP, §2.3) and the failure rate.
- **Linear SVMs** (scikit-learn ``LinearSVC``: L2 penalty, squared hinge = L2
  loss, balanced class weights for the rare failures) on the location, on
  the RSRP, and on both, each feature standardised per cell. Their training
  accuracy is the paper's *linear separability* (§3: 72.8/71.4 % by
  location, 73.5/67.1 % by RSRP, 92.6/89.2 % by both). RSRP is an offline
  feature only: it reaches the relay up to 200 ms late, so the online
  predictor uses location alone (§3). The location SVM's decision boundary is
  stored with the model (``boundary_track_m``) for analysis.
- **Fallbacks** (``kind``): ``linear_svc`` needs ``min_handovers`` handovers
  with both outcomes present; ``no_failures`` (nothing to predict),
  ``failures_only`` (every handover failed: L̂ still defined, no SVM) and
  ``too_few`` (fewer than ``min_handovers``: L̂ if the failure thresholds
  hold, no SVM). No input makes it raise: NaN RSRPs leave the RSRP models
  out, a single-trip cell simply has nothing to validate against.

Validation (:func:`validate_cell`), exactly as §3 and Figs. 5–6:
leave-one-trip-out. For every handover of a held-out trip, L̂_HOF is
recomputed from the cell's *other* trips, twice: from any failure history
(``paper``, as §3) and with the table thresholds (``deployed``: what the
proxies would have had), t̂_HOF is when the train passes
it, and Δ = t_HO − t̂_HOF = (x_HO − L̂) / v with v the train's speed at the
handover. With t1 = 0 s and t2 = 2.5 s:

==========  =====================  ===========================================
outcome     Δ                      class
==========  =====================  ===========================================
failure     t1 ≤ Δ ≤ t2            correct (throttled just before it)
failure     Δ < t1 or no L̂         late (not throttled in time)
failure     Δ > t2                 early (throttled too long)
success     Δ < t1 or no L̂         correct (never throttled before it)
success     Δ ≥ t1                 wasted (Fig. 5's case 1)
==========  =====================  ===========================================
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import sklearn
from sklearn.exceptions import ConvergenceWarning
from sklearn.svm import LinearSVC

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]

FEATURES: tuple[str, ...] = ("location", "rsrp", "both")
# Bin edges of the Δ histogram (s): bin 0 is Δ < -10 s, bin i is
# [edge[i-1], edge[i]), the last is Δ ≥ 10 s.
DELTA_EDGES_S: tuple[float, ...] = tuple(x / 2 for x in range(-20, 21))
INCREASING = "increasing"
DECREASING = "decreasing"


@dataclass(frozen=True)
class Params:
    """The trainer's knobs; stored with every model (``models.params``)."""

    # Table thresholds (the stand-in builder of the HRSCH issue used the same).
    min_failures: int = 3
    min_failure_rate: float = 0.2
    # A cell enters the table only on failures from at least this many
    # distinct trains, with no train counted above the runner-up
    # (qualifies); 1: one train's word is enough (a line served by a
    # single train, or a single-train testbed).
    min_trains: int = 2
    # A cell needs this many handovers (with both outcomes) for its SVMs.
    min_handovers: int = 8
    # SVM regularisation (scikit-learn's C) and iteration cap.
    svm_c: float = 1.0
    svm_max_iter: int = 2000
    # Validation windows (§3): t1 = 0 s, t2 = 2.5 s.
    t1_s: float = 0.0
    t2_s: float = 2.5
    # Speed used for Δ when LinkDB has no speed near a handover (300 km/h).
    nominal_speed_mps: float = 83.3
    # HPR's lead (§4.3: RTT + E_GPS / V ≈ 0.2 s + 20 m / 83 m/s): the proxy
    # throttles this long before t̂_HOF, so the validation's second variant
    # counts a failure as correct for Δ in [t1 − lead, t2 − lead].
    lead_s: float = 0.44
    # Where the table puts a cell's failure: q in [0, 1], that quantile of
    # its failures along the direction of travel (0.1, the default since
    # 2026-11-27: earlier than nine in ten), so that HPR's hold begins before
    # the failures that start early on a trip (not in the paper; measured on
    # the railway, docs/trainer.md); None, their mean position (the paper's
    # L̂_HOF).
    location_quantile: float | None = 0.1

    def location(self, x: F64) -> float:
        """The predicted location of failures at direction-normalised positions ``x``."""
        if self.location_quantile is None:
            return float(x.mean())
        return float(np.quantile(x, self.location_quantile))

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass
class CellData:
    """The handovers out of one ⟨carrier, cell, direction⟩."""

    key: int  # cells.id
    carrier: str
    cell_id: int
    direction: str  # increasing | decreasing
    track_m: F64
    rsrp_dbm: F64  # NaN when unknown
    failed: B
    trip: I64  # trips.id; handovers without a trip get a group of their own
    train: I64  # the reporting train (any integer that tells trains apart)
    speed_mps: F64  # NaN when unknown
    # Seconds added to each handover's Δ: None (t_HO is the blackout start,
    # as the trainer validates), or the blackout durations (t_HO is when the
    # UE is connected again; the trace generator's validation reports both).
    delta_offset_s: F64 | None = None

    def __post_init__(self) -> None:
        n = len(self.track_m)
        for name in ("rsrp_dbm", "failed", "trip", "train", "speed_mps"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"cell {self.key}: {name} has {len(getattr(self, name))} values, not {n}"
                )
        if self.delta_offset_s is not None and len(self.delta_offset_s) != n:
            raise ValueError(
                f"cell {self.key}: delta_offset_s has {len(self.delta_offset_s)} values, not {n}"
            )
        if self.direction not in (INCREASING, DECREASING):
            raise ValueError(f"cell {self.key}: direction {self.direction!r}")

    @property
    def sign(self) -> float:
        return 1.0 if self.direction == INCREASING else -1.0

    @property
    def x(self) -> F64:
        """Progress along the direction of travel."""
        return self.sign * self.track_m


@dataclass
class Counts:
    """Validation counts (additive across cells, trips and workers)."""

    failure_correct: int = 0
    failure_late: int = 0
    failure_early: int = 0
    success_correct: int = 0
    success_wasted: int = 0
    # Separability: handovers classified right / handovers, per feature set,
    # over cells with both outcomes and enough handovers.
    sep_right: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FEATURES, 0))
    sep_total: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FEATURES, 0))
    sep_cells: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FEATURES, 0))
    speed_fallbacks: int = 0
    # The same classes with HPR's lead counted (Params.lead_s).
    lead_failure_correct: int = 0
    lead_failure_late: int = 0
    lead_failure_early: int = 0
    lead_success_correct: int = 0
    # Failures of cells that had not failed in any other trip: no prediction.
    failures_without_prediction: int = 0
    # Δ of the handovers that had a prediction, in DELTA_EDGES_S bins (Fig. 6).
    delta_failures: list[int] = field(default_factory=lambda: [0] * (len(DELTA_EDGES_S) + 1))
    delta_successes: list[int] = field(default_factory=lambda: [0] * (len(DELTA_EDGES_S) + 1))

    def add(self, o: Counts) -> None:
        self.failure_correct += o.failure_correct
        self.failure_late += o.failure_late
        self.failure_early += o.failure_early
        self.success_correct += o.success_correct
        self.success_wasted += o.success_wasted
        self.speed_fallbacks += o.speed_fallbacks
        self.lead_failure_correct += o.lead_failure_correct
        self.lead_failure_late += o.lead_failure_late
        self.lead_failure_early += o.lead_failure_early
        self.lead_success_correct += o.lead_success_correct
        self.failures_without_prediction += o.failures_without_prediction
        for i, v in enumerate(o.delta_failures):
            self.delta_failures[i] += v
        for i, v in enumerate(o.delta_successes):
            self.delta_successes[i] += v
        for f in FEATURES:
            self.sep_right[f] += o.sep_right[f]
            self.sep_total[f] += o.sep_total[f]
            self.sep_cells[f] += o.sep_cells[f]

    @property
    def failures(self) -> int:
        return self.failure_correct + self.failure_late + self.failure_early

    @property
    def successes(self) -> int:
        return self.success_correct + self.success_wasted

    def summary(self) -> dict[str, Any]:
        """Fractions 0–1 (``None`` when there is nothing to divide by)."""

        def frac(a: int, b: int) -> float | None:
            return round(a / b, 6) if b else None

        f, s = self.failures, self.successes
        fp = f - self.failures_without_prediction
        return {
            "failure_correct": frac(self.failure_correct, f),
            "failure_late": frac(self.failure_late, f),
            "failure_early": frac(self.failure_early, f),
            "success_correct": frac(self.success_correct, s),
            # HPR's lead counted (docs/trainer.md, "Validation").
            "with_lead": {
                "failure_correct": frac(self.lead_failure_correct, f),
                "failure_late": frac(self.lead_failure_late, f),
                "failure_early": frac(self.lead_failure_early, f),
                "success_correct": frac(self.lead_success_correct, s),
            },
            # Over the failures whose cell failed in another trip (Fig. 6 is a
            # distribution of Δ, which exists only then).
            "with_prediction": {
                "failure_correct": frac(self.failure_correct, fp),
                "failure_late": frac(self.failure_late - self.failures_without_prediction, fp),
                "failure_early": frac(self.failure_early, fp),
            },
            "with_lead_with_prediction": {
                "failure_correct": frac(self.lead_failure_correct, fp),
                "failure_late": frac(self.lead_failure_late - self.failures_without_prediction, fp),
                "failure_early": frac(self.lead_failure_early, fp),
            },
            "failures_without_prediction": self.failures_without_prediction,
            "failures": f,
            "successes": s,
            "separability": {k: frac(self.sep_right[k], self.sep_total[k]) for k in FEATURES},
            "separability_cells": dict(self.sep_cells),
            "separability_handovers": dict(self.sep_total),
            "speed_fallbacks": self.speed_fallbacks,
            "delta_histogram": {
                "edges_s": list(DELTA_EDGES_S),
                "failures": list(self.delta_failures),
                "successes": list(self.delta_successes),
            },
        }


@dataclass
class CellResult:
    """One cell's model: a ``cell_models`` row."""

    key: int
    kind: str
    predicted_failure_track_m: float | None
    failure_rate: float
    params: dict[str, Any]
    counts: Counts  # validation as the paper: L̂ from any failure history
    deployed: Counts  # validation of what is published: the table thresholds


def _svm(x: F64, y: B, p: Params) -> tuple[LinearSVC, F64, F64] | None:
    """A standardised balanced linear SVM, or ``None`` when it cannot be fit
    (one class, or a constant feature)."""
    if y.all() or not y.any():
        return None
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    if (scale <= 0).any() or not np.isfinite(scale).all():
        return None
    m = LinearSVC(
        penalty="l2",
        loss="squared_hinge",
        C=p.svm_c,
        dual="auto",
        max_iter=p.svm_max_iter,
    )
    with (
        warnings.catch_warnings(),
        sklearn.config_context(
            # The inputs are checked here (finite, standardised); scikit-learn's
            # own per-call validation would cost more than the fit itself on a
            # cell's hundred handovers.
            assume_finite=True,
            skip_parameter_validation=True,
        ),
    ):
        # A non-converged fit is still a valid linear boundary; its accuracy
        # is what separability measures.
        warnings.simplefilter("ignore", ConvergenceWarning)
        # Balanced class weights (n / (2 n_class), scikit-learn's
        # "balanced") as sample weights: the same fit, without the
        # per-call label encoding of class_weight="balanced".
        n_fail = int(y.sum())
        w = np.where(y, len(y) / (2.0 * n_fail), len(y) / (2.0 * (len(y) - n_fail)))
        m.fit((x - mean) / scale, y, sample_weight=w)
    return m, mean, scale


def qualifies(f: F64, n: F64, p: Params) -> B:
    """Whether the evidence of each row qualifies a cell for the table: ``f``
    and ``n`` are the failures and handovers per train (rows × trains; a
    row is one training set), and the thresholds (``min_failures``,
    ``min_failure_rate``) apply to the row's total. With ``min_trains`` ≥ 2,
    failures must come from that many distinct trains, and no train counts
    for more than the runner-up: each train's failures are capped at the
    count of the train with the second most failures in the row, and its
    handovers scaled by the same factor (a capped train's failure share
    stays its own, so flooding failures cannot dilute a cell out either).
    One train's reports are then at most half of the evidence counted: it
    can add a cell only where the other trains' failures already reach half
    the threshold, and a single train's failures count for nothing."""
    failing_trains = (f > 0).sum(axis=1)
    if p.min_trains > 1:
        second = np.sort(f, axis=1)[:, -2] if f.shape[1] > 1 else np.zeros(len(f))
        capped = np.minimum(f, second[:, None])
        n = n * np.divide(capped, f, out=np.ones_like(f), where=f > 0)
        f = capped
    tf = f.sum(axis=1)
    tn = n.sum(axis=1)
    share = np.divide(tf, tn, out=np.zeros_like(tf), where=tn > 0)
    ok: B = (tf > 0) & (tf >= p.min_failures) & (share >= p.min_failure_rate)
    if p.min_trains > 1:
        ok &= failing_trains >= p.min_trains
    return ok


def _per_train(y: B, train_idx: I64, trains: int) -> tuple[F64, F64]:
    f = np.bincount(train_idx, weights=y.astype(np.float64), minlength=trains).astype(np.float64)
    n = np.bincount(train_idx, minlength=trains).astype(np.float64)
    return f[None, :], n[None, :]


def table_location(x: F64, y: B, train_idx: I64, p: Params) -> float:
    """Where the table puts a qualifying cell's failures, in progress along
    the direction of travel: :meth:`Params.location` of its failures, and
    with ``min_trains`` ≥ 2 the latest of the locations computed without
    each train that failed there, so that no train's reports can move the
    entry (and the throttle before it) earlier than the other trains'
    failures put it. The cell must qualify (:func:`qualifies`): then at
    least two trains failed there, and failures remain whichever is left
    out."""
    if p.min_trains <= 1:
        return p.location(x[y])
    xf = x[y]
    order = np.argsort(xf, kind="stable")
    xs, owner = xf[order], train_idx[y][order]
    # One row per failing train: the failures kept when it is left out.
    kept = owner[None, :] != np.unique(owner)[:, None]
    m = kept.sum(axis=1)
    if p.location_quantile is None:
        return float(((kept * xs).sum(axis=1) / m).max())
    # np.quantile's default (linear) rule on each row's kept failures: the
    # k-th kept one is where the row's running count first reaches k + 1.
    pos = p.location_quantile * (m - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, m - 1)
    run = np.cumsum(kept, axis=1)
    x_lo = xs[np.argmax(run >= (lo + 1)[:, None], axis=1)]
    x_hi = xs[np.argmax(run >= (hi + 1)[:, None], axis=1)]
    return float((x_lo + (x_hi - x_lo) * (pos - lo)).max())


def table_entry(c: CellData, p: Params) -> float | None:
    """The cell's table position (``track_m``), or ``None`` when it does not
    qualify."""
    y = c.failed.astype(bool)
    if not y.any():
        return None
    _, tinv = np.unique(c.train, return_inverse=True)
    f, n = _per_train(y, tinv, int(tinv.max()) + 1)
    if not qualifies(f, n, p)[0]:
        return None
    return c.sign * table_location(c.x, y, tinv, p)


def fit_cell(c: CellData, p: Params) -> CellResult:
    """The cell's model and its validation counts."""
    n = len(c.track_m)
    x = c.x
    y = c.failed.astype(bool)
    nf = int(y.sum())
    rate = nf / n if n else 0.0
    ehp = float(c.sign * x.min()) if n else None
    mean_fail = float(c.sign * x[y].mean()) if nf else None
    location = c.sign * p.location(x[y]) if nf else None
    params: dict[str, Any] = {
        "handovers": n,
        "failures": nf,
        "trips": len(np.unique(c.trip)) if n else 0,
        "trains": len(np.unique(c.train)) if n else 0,
        "failure_trains": len(np.unique(c.train[y])) if nf else 0,
        "earliest_ho_track_m": ehp,
        "failure_mean_track_m": mean_fail,
        "failure_location_track_m": location,
    }
    counts, deployed = validate_cell(c, p)
    if nf == 0:
        kind = "no_failures"
    elif nf == n:
        kind = "failures_only"
    elif n < p.min_handovers:
        kind = "too_few"
    else:
        kind = "linear_svc"
        svms: dict[str, Any] = {}
        rsrp_ok = np.isfinite(c.rsrp_dbm)
        sets: dict[str, tuple[F64, B]] = {"location": (x[:, None], y)}
        if rsrp_ok.sum() >= p.min_handovers:
            r = c.rsrp_dbm[rsrp_ok]
            sets["rsrp"] = (r[:, None], y[rsrp_ok])
            sets["both"] = (np.column_stack([x[rsrp_ok], r]), y[rsrp_ok])
        for name, (feat, lab) in sets.items():
            fitted = _svm(feat, lab, p)
            if fitted is None:
                continue
            m, mean, scale = fitted
            # The fitted boundary's own decision (m.predict, without its
            # per-call input checks).
            decision = ((feat - mean) / scale) @ m.coef_[0] + m.intercept_[0]
            acc = float(((decision > 0) == lab).mean())
            right = round(acc * len(lab))
            for k in (counts, deployed):
                k.sep_right[name] += right
                k.sep_total[name] += len(lab)
                k.sep_cells[name] += 1
            coef = [float(v) for v in m.coef_[0]]
            svms[name] = {
                "coef": coef,
                "intercept": float(m.intercept_[0]),
                "mean": [float(v) for v in mean],
                "scale": [float(v) for v in scale],
                "accuracy": round(acc, 6),
            }
            if name == "location" and coef[0] != 0.0:
                # decision = coef * (x - mean) / scale + intercept = 0
                xb = float(mean[0] - m.intercept_[0] * scale[0] / coef[0])
                if math.isfinite(xb):
                    params["boundary_track_m"] = c.sign * xb
        params["svm"] = svms
    predicted = table_entry(c, p)
    return CellResult(c.key, kind, predicted, rate, params, counts, deployed)


def validate_cell(c: CellData, p: Params) -> tuple[Counts, Counts]:
    """Leave-one-trip-out validation counts of one cell (module docstring),
    for the two predictors: ``paper`` predicts from any failure history, as
    §3 does; ``deployed`` applies the table's rule (:func:`qualifies`,
    :func:`table_location`) to each fold, i.e. validates the table the
    proxies get. The folds' sums and the
    speeds are computed once for both."""
    n = len(c.track_m)
    if n == 0:
        return Counts(), Counts()
    x = c.x
    y = c.failed.astype(bool)
    groups, inv = np.unique(c.trip, return_inverse=True)
    g = len(groups)
    f_g = np.bincount(inv, weights=y.astype(np.float64), minlength=g)
    s_g = np.bincount(inv, weights=np.where(y, x, 0.0), minlength=g)
    # Training folds: everything but the held-out trip.
    tr_f = f_g.sum() - f_g
    tr_s = s_g.sum() - s_g
    if p.location_quantile is None:
        l_fold = tr_s / np.where(tr_f > 0, tr_f, 1.0)
    else:
        # Each fold's quantile of the other trips' failures (NaN without any:
        # masked below, as tr_f = 0 is never predicted).
        l_fold = np.full(g, np.nan)
        for i in range(g):
            m = y & (inv != i)
            if m.any():
                l_fold[i] = p.location(x[m])
    speed = c.speed_mps.copy()
    bad = ~np.isfinite(speed) | (speed <= 0.5)
    speed[bad] = p.nominal_speed_mps
    paper = tr_f > 0
    # The table's rule on each fold: per-train counts of the other trips.
    _, tinv = np.unique(c.train, return_inverse=True)
    t = int(tinv.max()) + 1
    fold_train = inv * t + tinv
    f_gt = np.bincount(fold_train, weights=y.astype(np.float64), minlength=g * t).reshape(g, t)
    n_gt = np.bincount(fold_train, minlength=g * t).reshape(g, t).astype(np.float64)
    deployed = paper & qualifies(f_gt.sum(axis=0) - f_gt, n_gt.sum(axis=0) - n_gt, p)
    l_dep = l_fold
    if p.min_trains > 1:
        l_dep = np.full(g, np.nan)
        for j in np.flatnonzero(deployed):
            m = inv != j
            l_dep[j] = table_location(x[m], y[m], tinv[m], p)
    out = []
    for has, lh in ((paper, l_fold), (deployed, l_dep)):
        k = _classify(x, y, np.where(has, lh, np.nan)[inv], speed, p, offset_s=c.delta_offset_s)
        k.speed_fallbacks = int(bad.sum())
        out.append(k)
    return out[0], out[1]


def _classify(
    x: F64, y: B, lh: F64, speed: F64, p: Params, *, offset_s: F64 | None = None
) -> Counts:
    """The Fig. 5 classes of handovers at ``x`` (outcome ``y``) against the
    predicted failure locations ``lh`` (NaN: no prediction)."""
    out = Counts()
    pred = np.isfinite(lh)
    delta = np.where(pred, (x - np.where(pred, lh, 0.0)) / speed, np.nan)
    if offset_s is not None:
        delta = delta + offset_s
    fail = y
    out.failure_late = int((fail & (~pred | (delta < p.t1_s))).sum())
    out.failure_early = int((fail & pred & (delta > p.t2_s)).sum())
    out.failure_correct = int((fail & pred & (delta >= p.t1_s) & (delta <= p.t2_s)).sum())
    succ = ~fail
    out.success_correct = int((succ & (~pred | (delta < p.t1_s))).sum())
    out.success_wasted = int((succ & pred & (delta >= p.t1_s)).sum())
    lo, hi = p.t1_s - p.lead_s, p.t2_s - p.lead_s
    out.lead_failure_late = int((fail & (~pred | (delta < lo))).sum())
    out.lead_failure_early = int((fail & pred & (delta > hi)).sum())
    out.lead_failure_correct = int((fail & pred & (delta >= lo) & (delta <= hi)).sum())
    out.lead_success_correct = int((succ & (~pred | (delta < lo))).sum())
    out.failures_without_prediction = int((fail & ~pred).sum())
    bins = np.searchsorted(np.asarray(DELTA_EDGES_S), delta[pred], side="right")
    nb = len(DELTA_EDGES_S) + 1
    out.delta_failures = np.bincount(bins[fail[pred]], minlength=nb).tolist()
    out.delta_successes = np.bincount(bins[succ[pred]], minlength=nb).tolist()
    return out


def fit_many(cells: list[CellData], p: Params) -> list[CellResult]:
    return [fit_cell(c, p) for c in cells]
