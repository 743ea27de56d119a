"""Fitting a batch of cells at once: what a trainer run does.

:mod:`polycorn_trainer.fit` states the method one cell at a time
(:func:`~polycorn_trainer.fit.fit_cell`), and stays the reference. This
module computes exactly the same results for many cells, faster: a refit of
a large fleet (100,000 cells, ten million handovers) fits a few hundred
thousand SVMs and validates ten million held-out handovers, and the
per-cell code spends most of its time in NumPy's and scikit-learn's
per-call overhead, not in arithmetic.

What differs from :func:`~polycorn_trainer.fit.fit_cell`, and why the
results do not:

- **The handovers arrive as flat arrays** (:class:`Columns`, cell after
  cell), as LinkDB's reader produces them and as worker processes receive
  them: a few arrays per batch instead of ten per cell.
- **Leave-one-trip-out folds.** A fold's prediction depends on the other
  trips' *failures* only, so every fold whose held-out trip did not fail
  gets the cell's own prediction; only folds of trips that failed (a few
  per cell) are computed apart, all of a cell's at once with the
  reference's own :func:`~polycorn_trainer.fit.location_rows`. The per-fold
  table rule (``qualifies``, ``table_location``) is the reference's own code,
  under the ``prior`` rule with each fold's prior from the training set's
  :class:`~polycorn_trainer.fit.Priors`, which the caller passes in (a
  batch is not the training set).
- **The Fig. 5 classes and the Δ histogram** are counted for the whole
  batch in one pass per predictor (elementwise arithmetic, integer counts),
  per carrier, since only the carriers' sums are reported.
- **The SVMs** are ``LinearSVC``'s solver called directly
  (:mod:`polycorn_trainer.liblinear`, bit for bit the same coefficients).
- A cell with a non-finite position, or a failure exactly at position 0
  (where a sort may put either zero's sign first), is fitted by
  :func:`~polycorn_trainer.fit.fit_cell` itself.

Floating-point sums (means, standard deviations, the table rule's scaled
counts) are computed with the same NumPy calls on arrays of the same
length, order and layout as in the reference, so they round the same way.
``tests/test_batch.py`` checks the equality on hand-made cells and a
generated fleet, and ``tests/test_fast_path.py`` a whole run against the
reference run over LinkDB.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from polycorn_trainer.fit import (
    DECREASING,
    DELTA_EDGES_S,
    F64,
    FEATURES,
    I64,
    INCREASING,
    B,
    CellData,
    Counts,
    Params,
    Priors,
    _per_train,
    fit_cell,
    location_rows,
    qualifies,
    table_location,
)
from polycorn_trainer.liblinear import linear_svc

I32 = npt.NDArray[np.int32]
IP = npt.NDArray[np.intp]
EDGES = np.asarray(DELTA_EDGES_S)
BINS = len(DELTA_EDGES_S) + 1


@dataclass
class Columns:
    """A batch of cells and their handovers as flat arrays: cell ``i``'s
    handovers are ``[bounds[i], bounds[i + 1])`` of every per-handover
    array, in the order the reference reads them (start time, then id)."""

    key: I64  # cells.id
    carrier: I32  # index into carriers
    carriers: tuple[str, ...]
    cell_id: I64
    increasing: B  # direction of travel
    bounds: I64  # len(key) + 1 offsets
    track_m: F64
    rsrp_dbm: F64  # NaN when unknown
    failed: B
    trip: I64
    train: I64
    speed_mps: F64  # NaN when unknown

    def __post_init__(self) -> None:
        c = len(self.key)
        for name in ("carrier", "cell_id", "increasing"):
            if len(getattr(self, name)) != c:
                raise ValueError(f"{name} has {len(getattr(self, name))} values, not {c}")
        if len(self.bounds) != c + 1 or (c and self.bounds[0] != 0):
            raise ValueError("bounds must be len(key) + 1 offsets from 0")
        n = int(self.bounds[-1]) if c else 0
        for name in ("track_m", "rsrp_dbm", "failed", "trip", "train", "speed_mps"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} values, not {n}")

    def __len__(self) -> int:
        return len(self.key)

    @property
    def handovers(self) -> int:
        return int(self.bounds[-1]) if len(self.key) else 0

    def cell(self, i: int) -> CellData:
        """Cell ``i`` as the reference takes it (views, not copies)."""
        s, e = int(self.bounds[i]), int(self.bounds[i + 1])
        return CellData(
            key=int(self.key[i]),
            carrier=self.carriers[int(self.carrier[i])],
            cell_id=int(self.cell_id[i]),
            direction=INCREASING if self.increasing[i] else DECREASING,
            track_m=self.track_m[s:e],
            rsrp_dbm=self.rsrp_dbm[s:e],
            failed=self.failed[s:e],
            trip=self.trip[s:e],
            train=self.train[s:e],
            speed_mps=self.speed_mps[s:e],
        )

    def cells(self) -> list[CellData]:
        return [self.cell(i) for i in range(len(self))]

    def take(self, lo: int, hi: int) -> Columns:
        """Cells ``lo`` to ``hi`` (exclusive) as a batch of their own (copies:
        what a worker process is sent)."""
        s, e = int(self.bounds[lo]), int(self.bounds[hi])
        return Columns(
            key=self.key[lo:hi].copy(),
            carrier=self.carrier[lo:hi].copy(),
            carriers=self.carriers,
            cell_id=self.cell_id[lo:hi].copy(),
            increasing=self.increasing[lo:hi].copy(),
            bounds=self.bounds[lo : hi + 1] - s,
            track_m=self.track_m[s:e].copy(),
            rsrp_dbm=self.rsrp_dbm[s:e].copy(),
            failed=self.failed[s:e].copy(),
            trip=self.trip[s:e].copy(),
            train=self.train[s:e].copy(),
            speed_mps=self.speed_mps[s:e].copy(),
        )

    def split(self, max_handovers: int, max_cells: int) -> Iterator[Columns]:
        """Consecutive pieces of at most ``max_cells`` cells and, unless one
        cell alone has more, ``max_handovers`` handovers, each copied as it
        is taken."""
        lo, c = 0, len(self)
        while lo < c:
            limit = int(self.bounds[lo]) + max_handovers
            hi = int(np.searchsorted(self.bounds, limit, side="right")) - 1
            hi = min(max(hi, lo + 1), lo + max_cells, c)
            yield self.take(lo, hi)
            lo = hi

    @classmethod
    def of(cls, cells: list[CellData]) -> Columns:
        """The batch of ``cells`` (tests; the reader builds batches itself)."""
        if any(c.delta_offset_s is not None for c in cells):
            raise ValueError("a batch has no delta offsets (t_HO is the blackout start)")
        carriers = tuple(sorted({c.carrier for c in cells}))
        index = {k: i for i, k in enumerate(carriers)}
        counts = np.fromiter((len(c.track_m) for c in cells), np.int64, len(cells))

        def cat(name: str, dtype: type) -> Any:
            parts: list[npt.NDArray[Any]] = [
                np.asarray(getattr(c, name), dtype=dtype) for c in cells
            ]
            return np.concatenate(parts) if parts else np.zeros(0, dtype)

        return cls(
            key=np.fromiter((c.key for c in cells), np.int64, len(cells)),
            carrier=np.fromiter((index[c.carrier] for c in cells), np.int32, len(cells)),
            carriers=carriers,
            cell_id=np.fromiter((c.cell_id for c in cells), np.int64, len(cells)),
            increasing=np.fromiter((c.direction == INCREASING for c in cells), bool, len(cells)),
            bounds=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
            track_m=cat("track_m", np.float64),
            rsrp_dbm=cat("rsrp_dbm", np.float64),
            failed=cat("failed", np.bool_),
            trip=cat("trip", np.int64),
            train=cat("train", np.int64),
            speed_mps=cat("speed_mps", np.float64),
        )


class CellModel(NamedTuple):
    """One cell's model, as stored (a ``cell_models`` row). ``params`` is
    already JSON text (a worker sends a hundred thousand of them, and text
    is a tenth of the dict's size), or the dict itself when it holds a
    number JSON cannot carry: storing it then fails, as the reference's
    does."""

    key: int
    kind: str
    params: str | dict[str, Any]
    predicted_failure_track_m: float | None
    failure_rate: float


def _as_json(params: dict[str, Any]) -> str | dict[str, Any]:
    try:
        return json.dumps(params, allow_nan=False)
    except ValueError:
        return params


@dataclass
class Fitted:
    """A batch's models and its validation counts per carrier (paper,
    deployed: :class:`~polycorn_trainer.fit.CellResult`'s two)."""

    models: list[CellModel] = field(default_factory=list)
    counts: dict[str, tuple[Counts, Counts]] = field(default_factory=dict)
    kinds: Counter[str] = field(default_factory=Counter)
    handovers: int = 0
    cpu_s: float = 0.0  # the fitting's CPU time

    def add(self, o: Fitted) -> None:
        self.models.extend(o.models)
        for carrier, (paper, deployed) in o.counts.items():
            mine = self.counts.setdefault(carrier, (Counts(), Counts()))
            mine[0].add(paper)
            mine[1].add(deployed)
        self.kinds.update(o.kinds)
        self.handovers += o.handovers
        self.cpu_s += o.cpu_s


def _svm(x: F64, y: B, p: Params) -> tuple[F64, float, F64, F64] | None:
    """:func:`polycorn_trainer.fit._svm` with the solver called directly:
    coefficients, intercept, the features' means and scales."""
    if y.all() or not y.any():
        return None
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    if (scale <= 0).any() or not np.isfinite(scale).all():
        return None
    n_fail = int(y.sum())
    w = np.where(y, len(y) / (2.0 * n_fail), len(y) / (2.0 * (len(y) - n_fail)))
    coef, intercept, _ = linear_svc((x - mean) / scale, y, w, c=p.svm_c, max_iter=p.svm_max_iter)
    return coef, intercept, mean, scale


def _svms(
    x: F64, y: B, rsrp: F64, *, sign: float, p: Params, params: dict[str, Any], sep: Counts
) -> None:
    """The cell's SVMs into ``params`` and their separability into ``sep``
    (fit_cell's ``linear_svc`` branch)."""
    svms: dict[str, Any] = {}
    rsrp_ok = np.isfinite(rsrp)
    sets: dict[str, tuple[F64, B]] = {"location": (x[:, None], y)}
    if rsrp_ok.sum() >= p.min_handovers:
        r = rsrp[rsrp_ok]
        sets["rsrp"] = (r[:, None], y[rsrp_ok])
        sets["both"] = (np.column_stack([x[rsrp_ok], r]), y[rsrp_ok])
    for name, (feat, lab) in sets.items():
        fitted = _svm(feat, lab, p)
        if fitted is None:
            continue
        w, intercept, mean, scale = fitted
        decision = ((feat - mean) / scale) @ w + intercept
        acc = float(((decision > 0) == lab).mean())
        sep.sep_right[name] += round(acc * len(lab))
        sep.sep_total[name] += len(lab)
        sep.sep_cells[name] += 1
        coef = [float(v) for v in w]
        svms[name] = {
            "coef": coef,
            "intercept": intercept,
            "mean": [float(v) for v in mean],
            "scale": [float(v) for v in scale],
            "accuracy": round(acc, 6),
        }
        if name == "location" and coef[0] != 0.0:
            xb = float(mean[0] - intercept * scale[0] / coef[0])
            if math.isfinite(xb):
                params["boundary_track_m"] = sign * xb
    params["svm"] = svms


@dataclass
class _Cell:
    """One cell of a batch on the fast path: its handovers' positions along
    the direction of travel, outcomes, trip and train groups, and its table
    location once computed (shared by its folds and its table entry)."""

    x: F64
    y: B
    inv: IP  # trip group of each handover
    g: int
    tinv: IP  # train group of each handover
    t: int
    table: float | None = None

    def table_location(self, p: Params) -> float:
        if self.table is None:
            self.table = table_location(self.x, self.y, self.tinv, p)
        return self.table


def _folds(c: _Cell, p: Params, prior: tuple[F64, F64] | None) -> tuple[F64, F64]:
    """:func:`polycorn_trainer.fit.validate_cell`'s two predictions (paper,
    deployed) for every handover of the cell; NaN: none. ``prior``: the
    ``prior`` rule's (a, b) of each trip group's fold."""
    x, y, inv, g = c.x, c.y, c.inv, c.g
    yf = y.astype(np.float64)
    f_g = np.bincount(inv, weights=yf, minlength=g)
    nf = int(np.count_nonzero(y))
    tr_f = f_g.sum() - f_g
    paper = tr_f > 0
    if p.location_quantile is None:
        s_g = np.bincount(inv, weights=np.where(y, x, 0.0), minlength=g)
        tr_s = s_g.sum() - s_g
        l_fold = tr_s / np.where(tr_f > 0, tr_f, 1.0)
    elif nf == 0:
        l_fold = np.full(g, np.nan)
    else:
        # A fold keeps every failure unless its trip failed: then the others.
        l_fold = np.full(g, p.location(x[y]))
        failing = np.flatnonzero((f_g > 0) & paper)
        if failing.size:
            xf = x[y]
            order = np.argsort(xf, kind="stable")
            kept = inv[y][order][None, :] != failing[:, None]
            l_fold[failing] = location_rows(xf[order], kept, p)
        l_fold[~paper] = np.nan
    if nf < (max(p.min_failures, 1) if p.rule == "threshold" else 1):
        # The table's rule needs a failure (the threshold rule min_failures)
        # in the training trips.
        deployed = np.zeros(g, dtype=bool)
    else:
        fold_train = inv * c.t + c.tinv
        f_gt = np.bincount(fold_train, weights=yf, minlength=g * c.t).reshape(g, c.t)
        n_gt = np.bincount(fold_train, minlength=g * c.t).reshape(g, c.t).astype(np.float64)
        deployed = paper & qualifies(f_gt.sum(axis=0) - f_gt, n_gt.sum(axis=0) - n_gt, p, prior)
    l_dep = l_fold
    if p.min_trains > 1:
        l_dep = np.full(g, np.nan)
        for j in np.flatnonzero(deployed):
            if f_g[j] == 0:
                # Leaving out a trip without failures leaves the cell's own.
                l_dep[j] = c.table_location(p)
            else:
                m = inv != j
                l_dep[j] = table_location(x[m], y[m], c.tinv[m], p)
    return np.where(paper, l_fold, np.nan)[inv], np.where(deployed, l_dep, np.nan)[inv]


def _fit_fast(
    cols: Columns, i: int, x: F64, p: Params, sep: Counts, *, priors: Priors | None
) -> tuple[CellModel, F64, F64]:
    """Cell ``i`` of ``cols`` (``x``: its positions along the direction of
    travel): its model, as :func:`~polycorn_trainer.fit.fit_cell` makes it,
    and its handovers' two predictions; its SVMs' separability into ``sep``.
    ``priors``: the training set's, under the ``prior`` rule."""
    s, e = int(cols.bounds[i]), int(cols.bounds[i + 1])
    y = cols.failed[s:e]
    sign = 1.0 if cols.increasing[i] else -1.0
    n = e - s
    nf = int(np.count_nonzero(y))
    xf = x[y]
    groups, inv = np.unique(cols.trip[s:e], return_inverse=True)
    _, tinv = np.unique(cols.train[s:e], return_inverse=True)
    c = _Cell(x, y, inv, int(inv.max()) + 1, tinv, int(tinv.max()) + 1)
    fold_prior = None if priors is None else priors.folds(groups)
    params: dict[str, Any] = {
        "handovers": n,
        "failures": nf,
        "trips": c.g,
        "trains": c.t,
        "failure_trains": len(np.unique(tinv[y])) if nf else 0,
        "earliest_ho_track_m": float(sign * x.min()),
        "failure_mean_track_m": float(sign * xf.mean()) if nf else None,
        "failure_location_track_m": sign * p.location(xf) if nf else None,
    }
    lh_paper, lh_deployed = _folds(c, p, fold_prior)
    if nf == 0:
        kind = "no_failures"
    elif nf == n:
        kind = "failures_only"
    elif n < p.min_handovers:
        kind = "too_few"
    else:
        kind = "linear_svc"
        _svms(x, y, cols.rsrp_dbm[s:e], sign=sign, p=p, params=params, sep=sep)
    predicted = None
    if nf:
        f, nt = _per_train(y, tinv, c.t)
        if qualifies(f, nt, p, None if priors is None else priors.all)[0]:
            predicted = sign * c.table_location(p)
    model = CellModel(int(cols.key[i]), kind, _as_json(params), predicted, nf / n)
    return model, lh_paper, lh_deployed


def _classify(
    x: F64, y: B, lh: F64, speed: F64, *, carrier: I32, k: int, p: Params, bad: I64
) -> list[Counts]:
    """:func:`polycorn_trainer.fit._classify` for every handover of a batch
    at once, counted per carrier (``carrier``: each handover's, ``k``
    carriers); ``bad`` is each carrier's count of speed fallbacks."""

    def per(mask: B) -> I64:
        got: I64 = np.bincount(carrier[mask], minlength=k)
        return got

    pred = np.isfinite(lh)
    delta = np.where(pred, (x - np.where(pred, lh, 0.0)) / speed, np.nan)
    fail, succ = y, ~y
    t1 = p.t1_s
    lo, hi = p.t1_s - p.lead_s, p.t2_s - p.lead_s
    cols = {
        "failure_late": per(fail & (~pred | (delta < t1))),
        "failure_early": per(fail & pred & (delta > p.t2_s)),
        "failure_correct": per(fail & pred & (delta >= t1) & (delta <= p.t2_s)),
        "success_correct": per(succ & (~pred | (delta < t1))),
        "success_wasted": per(succ & pred & (delta >= t1)),
        "lead_failure_late": per(fail & (~pred | (delta < lo))),
        "lead_failure_early": per(fail & pred & (delta > hi)),
        "lead_failure_correct": per(fail & pred & (delta >= lo) & (delta <= hi)),
        "lead_success_correct": per(succ & (~pred | (delta < lo))),
        "failures_without_prediction": per(fail & ~pred),
    }
    bins = np.searchsorted(EDGES, delta[pred], side="right")
    cp, fp = carrier[pred], fail[pred]
    hist_f = np.bincount(cp[fp] * BINS + bins[fp], minlength=k * BINS).reshape(k, BINS)
    hist_s = np.bincount(cp[~fp] * BINS + bins[~fp], minlength=k * BINS).reshape(k, BINS)
    out = []
    for i in range(k):
        c = Counts()
        for name, v in cols.items():
            setattr(c, name, int(v[i]))
        c.speed_fallbacks = int(bad[i])
        c.delta_failures = hist_f[i].tolist()
        c.delta_successes = hist_s[i].tolist()
        out.append(c)
    return out


def _exact_elsewhere(x: F64, y: B) -> bool:
    """Whether the cell goes to the reference instead (module docstring)."""
    return len(x) == 0 or not np.isfinite(x).all() or bool((x[y] == 0).any())


def fit_columns(cols: Columns, p: Params, priors: Priors | None = None) -> Fitted:
    """Every cell of ``cols`` fitted and validated: the same models and the
    same validation counts as :func:`~polycorn_trainer.fit.fit_cell` on each
    cell (module docstring). The ``prior`` rule needs ``priors``, the whole
    training set's (:func:`~polycorn_trainer.fit.priors_of`, a LinkDB
    run's ``data.fleet_priors``), which a batch cannot compute from its own
    cells."""
    if p.rule == "prior" and priors is None:
        raise ValueError("fit_columns: the prior rule needs the training set's priors")
    if p.rule != "prior":
        priors = None
    cpu0 = time.process_time()
    out = Fitted(handovers=cols.handovers)
    k = len(cols.carriers)
    per_cell = np.diff(cols.bounds)
    x_all = np.repeat(np.where(cols.increasing, 1.0, -1.0), per_cell) * cols.track_m
    lh = np.full((2, cols.handovers), np.nan)  # the two predictions per handover
    ours = np.ones(cols.handovers, dtype=bool)  # counted here, not by the reference
    sep = [Counts() for _ in range(k)]
    reference = [(Counts(), Counts()) for _ in range(k)]
    for i in range(len(cols)):
        s, e = int(cols.bounds[i]), int(cols.bounds[i + 1])
        carrier = int(cols.carrier[i])
        if _exact_elsewhere(x_all[s:e], cols.failed[s:e]):
            r = fit_cell(cols.cell(i), p, priors)
            reference[carrier][0].add(r.counts)
            reference[carrier][1].add(r.deployed)
            ours[s:e] = False
            model = CellModel(r.key, r.kind, r.params, r.predicted_failure_track_m, r.failure_rate)
        else:
            model, lh[0, s:e], lh[1, s:e] = _fit_fast(
                cols, i, x_all[s:e], p, sep[carrier], priors=priors
            )
        out.models.append(model)
        out.kinds[model.kind] += 1
    carrier_of = np.repeat(cols.carrier, per_cell)[ours]
    x, y = x_all[ours], cols.failed[ours]
    speed = cols.speed_mps[ours].copy()
    bad = ~np.isfinite(speed) | (speed <= 0.5)
    speed[bad] = p.nominal_speed_mps
    bad_per = np.bincount(carrier_of[bad], minlength=k)
    counted = [
        _classify(x, y, lh[j, ours], speed, carrier=carrier_of, k=k, p=p, bad=bad_per)
        for j in (0, 1)
    ]
    for j in np.flatnonzero(np.bincount(cols.carrier, minlength=k)).tolist():
        for mine, ref in zip((counted[0][j], counted[1][j]), reference[j], strict=True):
            mine.add(ref)
            for f in FEATURES:
                mine.sep_right[f] += sep[j].sep_right[f]
                mine.sep_total[f] += sep[j].sep_total[f]
                mine.sep_cells[f] += sep[j].sep_cells[f]
        out.counts[cols.carriers[j]] = (counted[0][j], counted[1][j])
    out.cpu_s = time.process_time() - cpu0
    return out
