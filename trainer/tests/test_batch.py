"""The batch path (polycorn_trainer.batch) gives exactly the reference's
results (fit.fit_cell): the same models, parameters and validation counts,
on hand-made cells, degenerate ones and generated fleets."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from polycorn_trainer.batch import Columns, fit_columns
from polycorn_trainer.fit import (
    BetaPrior,
    CellData,
    Counts,
    Params,
    Priors,
    fit_cell,
    location_rows,
    priors_of,
)

PARAMS = {
    "default": Params(),
    "mean": Params(location_quantile=None),
    "one train": Params(min_trains=1),
    "three trains": Params(min_trains=3),
    "every failure": Params(min_failures=1, min_failure_rate=0.0, min_handovers=2),
    "earliest": Params(location_quantile=0.0, min_trains=1, min_failures=1),
    "latest": Params(location_quantile=1.0),
    "median": Params(location_quantile=0.5, min_failures=2, min_failure_rate=0.05),
    "no margin": Params(location_margin_m=0.0),
    "prior": Params(rule="prior"),
    "prior, one train": Params(rule="prior", min_trains=1, failure_cost_ratio=12.0),
}


def cell(
    key: int,
    track: list[float],
    failed: list[bool],
    trip: list[int],
    *,
    train: list[int] | None = None,
    direction: str = "increasing",
    carrier: str = "a",
    rsrp: list[float] | None = None,
    speed: list[float] | None = None,
) -> CellData:
    n = len(track)
    return CellData(
        key=key,
        carrier=carrier,
        cell_id=key + 1000,
        direction=direction,
        track_m=np.asarray(track, dtype=np.float64),
        rsrp_dbm=np.asarray(rsrp if rsrp is not None else [-95.0] * n, dtype=np.float64),
        failed=np.asarray(failed, dtype=np.bool_),
        trip=np.asarray(trip, dtype=np.int64),
        train=np.asarray(trip if train is None else train, dtype=np.int64),
        speed_mps=np.asarray(speed if speed is not None else [80.0] * n, dtype=np.float64),
    )


def generated(seed: int, count: int) -> list[CellData]:
    """Cells like a fleet's, and unlike: few or many handovers, trips with
    several passes, few or many trains, rare or frequent failures, repeated
    positions, unknown RSRPs and speeds, both directions, three carriers."""
    rng = np.random.default_rng(seed)
    out = []
    for key in range(count):
        n = int(rng.choice([1, 2, 3, 5, 8, 9, 20, 60, 100, 140]))
        trips = int(rng.integers(1, n + 1))
        trains = int(rng.integers(1, min(trips, 12) + 1))
        trip = rng.integers(0, trips, n) * 7 - 50
        train = (trip * 31 + 11) % trains * 1_000_003 - 5 * trains
        p_fail = float(rng.choice([0.0, 0.02, 0.06, 0.2, 0.5, 0.9, 1.0]))
        late = rng.exponential(200.0, n)
        failed = rng.random(n) < np.clip(p_fail * (0.5 + late / 400), 0, 1)
        base = float(rng.uniform(1000, 2e6))
        track = base + np.round(late, int(rng.choice([0, 1, 6])))  # ties when rounded
        if rng.random() < 0.1:
            track[:] = track[0]  # one position: no SVM
        rsrp = -100 - 0.01 * late + rng.normal(0, 4, n)
        rsrp[rng.random(n) < float(rng.choice([0.0, 0.1, 0.95]))] = np.nan
        speed = rng.uniform(20, 90, n)
        speed[rng.random(n) < 0.05] = np.nan
        speed[rng.random(n) < 0.03] = 0.2
        direction = "increasing" if rng.random() < 0.5 else "decreasing"
        sign = 1.0 if direction == "increasing" else -1.0
        out.append(
            CellData(
                key=key,
                carrier=str(rng.choice(["cmcc", "unicom", "telecom"])),
                cell_id=key,
                direction=direction,
                track_m=sign * track,
                rsrp_dbm=rsrp,
                failed=failed,
                trip=trip.astype(np.int64),
                train=train.astype(np.int64),
                speed_mps=speed,
            )
        )
    return out


def degenerate() -> list[CellData]:
    """One handover, one class, duplicate points, one trip, one train, the
    positions the batch leaves to the reference (0, non-finite)."""
    return [
        cell(1, [1000.0], [True], [1]),
        cell(2, [1000.0], [False], [1]),
        cell(3, [1000.0, 1000.0], [True, False], [1, 2]),
        cell(4, [5.0] * 10, [True] * 5 + [False] * 5, list(range(10))),
        cell(5, [1.0, 2.0, 3.0], [True, True, True], [1, 1, 1]),
        cell(6, [10.0 * i for i in range(12)], [i % 3 == 0 for i in range(12)], [7] * 12),
        cell(
            7,
            [10.0 * i for i in range(12)],
            [i > 6 for i in range(12)],
            list(range(12)),
            train=[3] * 12,
        ),
        cell(
            8,
            [0.0, 0.0, 10.0, 20.0] * 3,
            [True, False] * 6,
            list(range(12)),
            direction="decreasing",
        ),
        cell(9, [0.0, 5.0, 10.0] * 4, [False, True, True] * 4, list(range(12))),
        cell(10, [np.nan, 1.0, 2.0, 3.0] * 3, [True, False, True, False] * 3, list(range(12))),
        cell(11, [np.inf, 1.0, 2.0, 3.0] * 3, [False, True] * 6, list(range(12))),
        cell(12, [1.0, 2.0] * 6, [True, False] * 6, [1, 2] * 6, rsrp=[np.nan] * 12),
        cell(13, [1.0, 2.0] * 6, [True, False] * 6, [1, 2] * 6, speed=[np.nan, 0.0] * 6),
        cell(
            14,
            [-0.0, 0.0, 1.0, 2.0] * 3,
            [True, True, False, True] * 3,
            list(range(12)),
            train=[1, 2, 3] * 4,
        ),
        cell(15, [], [], []),
    ]


def as_stored(params: dict[str, Any] | str) -> str:
    return params if isinstance(params, str) else json.dumps(params, allow_nan=True)


def assert_same(cells: list[CellData], p: Params) -> None:
    """fit_columns on the batch of ``cells`` equals fit_cell on each (under
    the prior rule, both with the priors of ``cells``)."""
    priors = priors_of(cells) if p.rule == "prior" else None
    want = [fit_cell(c, p, priors) for c in cells]
    got = fit_columns(Columns.of(cells), p, priors)
    assert len(got.models) == len(want)
    for w, g in zip(want, got.models, strict=True):
        assert (g.key, g.kind) == (w.key, w.kind)
        assert as_stored(g.params) == json.dumps(w.params, allow_nan=True), w.key
        pw, pg = w.predicted_failure_track_m, g.predicted_failure_track_m
        assert pg == pw or (pg is not None and pw is not None and np.isnan(pg) and np.isnan(pw))
        assert g.failure_rate == w.failure_rate
    by_carrier: dict[str, tuple[Counts, Counts]] = {}
    for c, r in zip(cells, want, strict=True):
        paper, deployed = by_carrier.setdefault(c.carrier, (Counts(), Counts()))
        paper.add(r.counts)
        deployed.add(r.deployed)
    assert got.counts == by_carrier
    assert got.handovers == sum(len(c.track_m) for c in cells)
    assert sum(got.kinds.values()) == len(cells)


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_degenerate_cells_are_fitted_as_the_reference_fits_them(name: str) -> None:
    assert_same(degenerate(), PARAMS[name])


@pytest.mark.parametrize("name", sorted(PARAMS))
@pytest.mark.parametrize("seed", [1, 2])
def test_generated_cells_are_fitted_as_the_reference_fits_them(name: str, seed: int) -> None:
    assert_same(generated(seed, 150), PARAMS[name])


def test_the_hand_made_cells_of_test_fit_agree() -> None:
    # test_fit.py's cells, one batch.
    cells = [
        cell(1, [1000, 1010, 1100, 1200, 1220], [False, False, True, True, True], [1, 2, 3, 4, 5]),
        cell(
            2,
            [1000, 1100, 1050, 900, 1200, 1300],
            [True, True, True, False, False, True],
            [1, 1, 2, 2, 2, 3],
        ),
        cell(
            3,
            [1000, 1010, 1020, 1030, 900, 910],
            [True] * 4 + [False] * 2,
            [1, 2, 3, 4, 5, 6],
            train=[1, 1, 1, 1, 2, 2],
        ),
        cell(
            4,
            [1300.0, 1330.0, 1360.0, 1390.0] * 2 + [500.0] * 20,
            [True] * 28,
            list(range(28)),
            train=[1, 2, 3, 4] * 2 + [5] * 20,
        ),
        cell(5, [1000.0] * 6, [True] * 6, [1, 2, 3, 4, 5, 6], train=[1, 1, 2, 2, 3, 3]),
    ]
    for p in PARAMS.values():
        assert_same(cells, p)


@pytest.mark.parametrize("q", [0.0, 0.1, 0.25, 1 / 3, 0.5, 0.9, 0.999, 1.0])
@pytest.mark.parametrize("margin", [0.0, 83.0])
def test_location_rows_is_the_reference_location(q: float, margin: float) -> None:
    p = Params(location_quantile=q, location_margin_m=margin)
    rng = np.random.default_rng(int(q * 1000))
    for m in (1, 2, 3, 4, 7, 10, 31):
        xs = np.sort(np.round(rng.normal(1000, 300, m), int(rng.integers(0, 4))))
        kept = rng.random((50, m)) < 0.7
        kept[np.arange(50), rng.integers(0, m, 50)] = True  # every row keeps one
        got = location_rows(xs, kept, p)
        want: npt.NDArray[np.float64] = np.array([p.location(xs[k]) for k in kept])
        assert got.tobytes() == want.tobytes()


def test_the_prior_rule_fits_with_the_priors_it_is_given() -> None:
    cells = [c for c in generated(4, 60) if c.failed.any() and not c.failed.all()]
    cols = Columns.of(cells)
    with pytest.raises(ValueError, match="priors"):
        fit_columns(cols, Params(rule="prior"))
    p = Params(rule="prior", min_trains=1)

    def tabled(prior: BetaPrior) -> int:
        got = fit_columns(cols, p, Priors(prior))
        return sum(m.predicted_failure_track_m is not None for m in got.models)

    # Failures are certain under one prior and never happen under the other.
    assert tabled(BetaPrior(1e6, 1.0)) == len(cells)
    assert tabled(BetaPrior(1.0, 1e6)) == 0


def test_a_batch_splits_into_the_same_cells() -> None:
    cells = generated(5, 40)
    cols = Columns.of(cells)
    pieces = list(cols.split(max_handovers=150, max_cells=7))
    assert all(len(b) <= 7 for b in pieces)
    assert all(b.handovers <= 150 or len(b) == 1 for b in pieces)
    again = [c for b in pieces for c in b.cells()]
    assert [c.key for c in again] == [c.key for c in cells]
    for a, b in zip(cells, again, strict=True):
        assert (a.carrier, a.cell_id, a.direction) == (b.carrier, b.cell_id, b.direction)
        for f in ("track_m", "rsrp_dbm", "failed", "trip", "train", "speed_mps"):
            assert getattr(a, f).tobytes() == getattr(b, f).tobytes()
    with pytest.raises(ValueError, match="bounds"):
        Columns(**{**cols.__dict__, "bounds": cols.bounds[:-1]})
