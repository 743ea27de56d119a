"""The per-cell model and the leave-one-trip-out validation, on hand-made cells."""

from __future__ import annotations

import numpy as np
import pytest

from polycorn_trainer.fit import (
    BetaPrior,
    CellData,
    Counts,
    Evidence,
    Params,
    _newton,
    fit_beta_prior,
    fit_cell,
    fit_evidence,
    fit_many,
    fold_tabled,
    priors_of,
    validate_cell,
)


def cell(
    track: list[float],
    failed: list[bool],
    trip: list[int],
    *,
    direction: str = "increasing",
    rsrp: list[float] | None = None,
    speed: float = 80.0,
    train: list[int] | None = None,
) -> CellData:
    """A cell's handovers; each trip by a train of its own unless ``train`` says."""
    n = len(track)
    return CellData(
        key=1,
        carrier="a",
        cell_id=42,
        direction=direction,
        track_m=np.asarray(track, dtype=np.float64),
        rsrp_dbm=np.asarray(rsrp if rsrp is not None else [np.nan] * n, dtype=np.float64),
        failed=np.asarray(failed, dtype=np.bool_),
        trip=np.asarray(trip, dtype=np.int64),
        train=np.asarray(trip if train is None else train, dtype=np.int64),
        speed_mps=np.full(n, speed),
    )


def test_prediction_is_the_mean_failure_location_and_needs_the_thresholds() -> None:
    # One train's word is enough here (min_trains=1): the thresholds and the location alone.
    c = cell([1000, 1010, 1100, 1200, 1220], [False, False, True, True, True], [1, 2, 3, 4, 5])
    r = fit_cell(
        c,
        Params(
            min_trains=1,
            min_failures=3,
            min_failure_rate=0.15,
            min_handovers=4,
            location_quantile=None,
        ),
    )
    assert r.predicted_failure_track_m == pytest.approx(1173.333, abs=1e-3)
    assert r.failure_rate == pytest.approx(0.6)
    assert r.params["earliest_ho_track_m"] == 1000
    assert r.kind == "linear_svc"
    # Only two failures: below min_failures, so no table entry, but the mean is kept.
    r2 = fit_cell(c, Params(min_trains=1, min_failures=4, location_quantile=None))
    assert r2.predicted_failure_track_m is None
    assert r2.params["failure_mean_track_m"] == pytest.approx(1173.333, abs=1e-3)


def test_decreasing_direction_mirrors_positions() -> None:
    c = cell(
        [5000, 4990, 4900, 4800], [False, False, True, True], [1, 2, 3, 4], direction="decreasing"
    )
    r = fit_cell(
        c,
        Params(
            min_trains=1,
            min_failures=1,
            min_failure_rate=0,
            min_handovers=4,
            location_quantile=None,
        ),
    )
    assert r.params["earliest_ho_track_m"] == 5000  # earliest = largest when decreasing
    assert r.predicted_failure_track_m == pytest.approx(4850)
    # The location SVM's boundary lies between the last success and the first failure.
    assert 4800 < r.params["boundary_track_m"] < 4990


def test_loto_classes_follow_figure_5() -> None:
    # Trip 1: failures at 1000 and 1100; the held-out trip 2 fails at 1050 and
    # succeeds at 900 and 1200. Speed 100 m/s: Δ = (x - L̂) / 100.
    c = cell(
        [1000, 1100, 1050, 900, 1200, 1300],
        [True, True, True, False, False, True],
        [1, 1, 2, 2, 2, 3],
        speed=100.0,
    )
    k = validate_cell(c, Params(location_quantile=None))[0]
    # Held-out trip 2: L̂ from trips 1, 3 = (1000 + 1100 + 1300) / 3 = 1133.3
    #   failure at 1050: Δ = -0.83 s → late; success at 900: Δ < 0 → correct;
    #   success at 1200: Δ = 0.67 s ≥ 0 → wasted.
    # Held-out trip 1: L̂ = (1050 + 1300) / 2 = 1175: failures at 1000 (Δ -1.75, late),
    #   1100 (Δ -0.75, late). Held-out trip 3: L̂ = 1050: failure at 1300, Δ 2.5 s → correct.
    assert (k.failure_correct, k.failure_late, k.failure_early) == (1, 3, 0)
    assert (k.success_correct, k.success_wasted) == (1, 1)
    assert k.failures == 4 and k.successes == 2


def test_early_prediction_and_no_history() -> None:
    # Held-out failure at 1500 with L̂ = 1000 from the other trip: Δ = 5 s > 2.5 → early.
    c = cell([1000, 1500], [True, True], [1, 2], speed=100.0)
    k = validate_cell(c, Params(location_quantile=None))[0]
    assert k.failure_early == 1 and k.failure_late == 1  # trip 1 held out: L̂ = 1500 → Δ -5 → late
    # A single trip has no other trip to learn from: its failures are late, successes correct.
    one = validate_cell(
        cell([1, 2, 3], [True, False, False], [7, 7, 7]), Params(location_quantile=None)
    )[0]
    assert (one.failure_late, one.success_correct) == (1, 2)


def test_deployed_thresholds_suppress_rare_failures() -> None:
    c = cell([10.0 * i for i in range(20)], [i == 10 for i in range(20)], list(range(20)))
    assert (
        validate_cell(c, Params(location_quantile=None))[0].failure_late == 1
    )  # nothing else ever failed
    r = fit_cell(c, Params(location_quantile=None))
    assert r.predicted_failure_track_m is None  # 1 failure < min_failures
    assert r.deployed.success_correct == 19


def test_separability_uses_rsrp_when_known() -> None:
    rng = np.random.default_rng(3)
    n = 60
    track = rng.uniform(0, 1000, n)
    rsrp = rng.uniform(-110, -80, n)
    failed = (track > 600) & (rsrp < -95)  # separable only with both features
    c = cell(list(track), list(failed), list(range(n)), rsrp=list(rsrp))
    r = fit_cell(c, Params(min_handovers=8, location_quantile=None))
    sep = {k: r.counts.sep_right[k] / r.counts.sep_total[k] for k in ("location", "rsrp", "both")}
    assert sep["both"] > 0.9
    assert sep["both"] > sep["location"] and sep["both"] > sep["rsrp"]
    assert set(r.params["svm"]) == {"location", "rsrp", "both"}


@pytest.mark.parametrize(
    ("track", "failed", "kind"),
    [
        ([1.0, 2.0, 3.0], [False, False, False], "no_failures"),
        ([1.0, 2.0, 3.0], [True, True, True], "failures_only"),
        ([1.0, 2.0, 3.0], [True, False, False], "too_few"),
        ([5.0] * 10, [True] * 5 + [False] * 5, "linear_svc"),  # constant position: no SVM, no crash
        ([], [], "no_failures"),
    ],
)
def test_fallbacks_never_crash(track: list[float], failed: list[bool], kind: str) -> None:
    r = fit_cell(
        cell(track, failed, list(range(len(track)))),
        Params(min_handovers=8, location_quantile=None),
    )
    assert r.kind == kind
    if kind == "linear_svc":
        assert r.params["svm"] == {}  # nothing separable to fit
        assert r.counts.sep_total["location"] == 0


def test_unknown_speed_falls_back_to_nominal() -> None:
    c = cell([1000, 1100], [True, True], [1, 2])
    c.speed_mps[:] = np.nan
    k = validate_cell(c, Params(nominal_speed_mps=50.0, location_quantile=None))[0]
    assert k.speed_fallbacks == 2
    assert k.failure_late == 1 and k.failure_correct == 1  # Δ = ±2 s at 50 m/s


def test_counts_add_and_summary_fractions() -> None:
    a, b = Counts(failure_correct=3, failure_late=1), Counts(failure_early=4, success_correct=2)
    a.add(b)
    s = a.summary()
    assert s["failure_correct"] == pytest.approx(3 / 8)
    assert s["success_correct"] == 1.0
    assert Counts().summary()["failure_correct"] is None


def test_mismatched_arrays_are_refused() -> None:
    with pytest.raises(ValueError, match="rsrp_dbm"):
        CellData(
            1,
            "a",
            1,
            "increasing",
            np.zeros(2),
            np.zeros(3),
            np.zeros(2, bool),
            np.zeros(2, np.int64),
            np.zeros(2, np.int64),
            np.zeros(2),
        )
    with pytest.raises(ValueError, match="direction"):
        cell([1.0], [True], [1], direction="up")


def test_sample_weights_are_scikit_learns_balanced_class_weights() -> None:
    from sklearn.svm import LinearSVC

    from polycorn_trainer.fit import _svm

    rng = np.random.default_rng(5)
    x = rng.normal(size=(80, 2))
    y = (x[:, 0] + 0.5 * rng.normal(size=80)) > 1.2  # rare positives
    fitted = _svm(x, y, Params(location_quantile=None))
    assert fitted is not None
    ours, mean, scale = fitted
    ref = LinearSVC(C=1.0, class_weight="balanced", dual="auto", max_iter=2000)
    ref.fit((x - mean) / scale, y)
    np.testing.assert_allclose(ours.coef_, ref.coef_, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(ours.intercept_, ref.intercept_, rtol=1e-6, atol=1e-9)


def test_delta_histogram_bins_the_predicted_handovers() -> None:
    from polycorn_trainer.fit import DELTA_EDGES_S

    c = cell([1000, 1500, 1200], [True, True, False], [1, 2, 3], speed=100.0)
    k = validate_cell(c, Params(location_quantile=None))[0]
    # Trip 1 held out: L̂ = 1500 → Δ = -5 s; trip 2: L̂ = 1000 → Δ = 5 s;
    # trip 3 (success at 1200): L̂ = 1250 → Δ = -0.5 s.
    edges = list(DELTA_EDGES_S)
    assert sum(k.delta_failures) == 2 and sum(k.delta_successes) == 1
    assert k.delta_failures[edges.index(-5.0) + 1] == 1
    assert k.delta_failures[edges.index(5.0) + 1] == 1
    assert k.delta_successes[edges.index(-0.5) + 1] == 1
    s = k.summary()["delta_histogram"]
    assert len(s["failures"]) == len(s["edges_s"]) + 1


def test_a_location_quantile_moves_the_prediction_and_its_validation() -> None:
    # One failure per trip; the held-out trip's failure is judged against the others'.
    c = cell([1000, 1100, 1200, 1000], [True] * 4, [1, 2, 3, 4])
    mean = Params(min_trains=1, min_failures=1, min_failure_rate=0, location_quantile=None)
    early = Params(
        min_trains=1, min_failures=1, min_failure_rate=0, location_quantile=0.0, location_margin_m=0
    )
    assert fit_cell(c, mean).predicted_failure_track_m == pytest.approx(1075)
    r = fit_cell(c, early)
    assert r.predicted_failure_track_m == pytest.approx(1000)
    assert r.params["failure_mean_track_m"] == pytest.approx(1075)
    assert r.params["failure_location_track_m"] == pytest.approx(1000)
    # Against the others' mean, trips 1 and 4 (at 1000) fail 1.25 s before it: late. Against
    # the others' earliest failure every trip is within [0, 2.5] s: correct.
    paper_mean, _ = validate_cell(c, mean)
    paper_early, deployed_early = validate_cell(c, early)
    assert (paper_mean.failure_correct, paper_mean.failure_late) == (2, 2)
    assert (paper_early.failure_correct, paper_early.failure_late) == (4, 0)
    assert deployed_early.failure_correct == 4
    # Decreasing: the quantile runs along the direction of travel (earliest = largest).
    d = cell([5000, 4900, 4800], [True] * 3, [1, 2, 3], direction="decreasing")
    assert fit_cell(d, early).predicted_failure_track_m == pytest.approx(5000)


def test_the_default_places_a_failure_before_its_earliest_by_a_margin_that_shrinks() -> None:
    """The deployed default (docs/trainer.md): the earliest failure while a
    cell has at most ten, the ⌈n/10⌉-th earliest after, moved earlier by
    83 m / n; the paper's mean stays one flag away."""
    one_train = Params(min_trains=1, min_failures=1, min_failure_rate=0)
    assert (one_train.location_quantile, one_train.location_margin_m) == (0.1, 83.0)
    xs = [1000.0, 1100.0, 1200.0, 1300.0, 1400.0]
    c = cell(xs, [True] * 5, [1, 2, 3, 4, 5])
    assert fit_cell(c, one_train).predicted_failure_track_m == pytest.approx(1000 - 83 / 5)
    many = [float(v) for v in range(1000, 1250, 10)]  # 25 failures: the 3rd earliest
    c25 = cell(many, [True] * 25, list(range(25)))
    assert fit_cell(c25, one_train).predicted_failure_track_m == pytest.approx(1020 - 83 / 25)
    # 0.28 · 25 is a rounding error above 7: still the 7th of 25.
    q28 = Params(min_trains=1, min_failures=1, min_failure_rate=0, location_quantile=0.28)
    assert fit_cell(c25, q28).predicted_failure_track_m == pytest.approx(1060 - 83 / 25)
    # Against the direction of travel the margin moves the entry to a larger track_m.
    d = cell([-v for v in xs], [True] * 5, [1, 2, 3, 4, 5], direction="decreasing")
    assert fit_cell(d, one_train).predicted_failure_track_m == pytest.approx(-1000 + 83 / 5)
    paper = Params(min_trains=1, min_failures=1, min_failure_rate=0, location_quantile=None)
    assert fit_cell(c, paper).predicted_failure_track_m == pytest.approx(1200)


def test_the_margin_turns_a_late_failure_of_a_thin_cell_into_a_correct_one() -> None:
    """Trips 1-3 fail at 1000, 1010 and 990 m. Held out, trip 3's failure
    lies 10 m before the earliest of the other two: late (the class without
    HPR's lead). The margin, 83 m over 2 failures, puts every held-out
    failure inside [0, 2.5] s."""
    c = cell([1000, 1010, 990], [True] * 3, [1, 2, 3])
    base = Params(min_trains=1, min_failures=1, min_failure_rate=0)
    bare, _ = validate_cell(c, Params(**{**base.as_dict(), "location_margin_m": 0.0}))
    margin, _ = validate_cell(c, base)
    assert (bare.failure_correct, bare.failure_late) == (2, 1)
    assert (margin.failure_correct, margin.failure_late, margin.failure_early) == (3, 0, 0)


def test_the_cli_takes_a_quantile_or_mean() -> None:
    import argparse

    from polycorn_trainer.cli import _quantile

    assert (_quantile("0.25"), _quantile("mean"), _quantile("MEAN")) == (0.25, None, None)
    with pytest.raises((argparse.ArgumentTypeError, ValueError)):
        _quantile("1.5")


def test_the_cli_passes_the_location_margin_and_refuses_a_bad_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from polycorn_trainer.cli import _options, _parser

    def params(*extra: str) -> Params:
        a = _parser().parse_args(["validate", "--database-url", "postgresql://x/y", *extra])
        return _options(a, store=False, publish=False).params

    assert params().location_margin_m == Params().location_margin_m
    assert params("--location-margin-m", "0").location_margin_m == 0.0
    for bad in ("-1", "nan", "inf", "20000"):
        with pytest.raises(SystemExit):
            params("--location-margin-m", bad)
    assert "--location-margin-m" in capsys.readouterr().err


def test_one_trains_failures_alone_put_no_cell_in_the_table() -> None:
    """Train 1 fails on each of its four trips (days count for nothing: the
    same train), train 2 passes twice: the thresholds hold, the several-trains
    rule keeps the cell out. One train's word is enough only with min_trains=1."""
    c = cell(
        [1000, 1010, 1020, 1030, 900, 910],
        [True, True, True, True, False, False],
        [1, 2, 3, 4, 5, 6],
        train=[1, 1, 1, 1, 2, 2],
    )
    assert Params().min_trains == 2
    r = fit_cell(c, Params())
    assert r.predicted_failure_track_m is None
    assert (r.params["trains"], r.params["failure_trains"]) == (2, 1)
    assert fit_cell(c, Params(min_trains=1)).predicted_failure_track_m is not None


def test_no_train_counts_for_more_than_the_runner_up() -> None:
    # Failures from two trains, 4 in all, but 3 of them train 1's: counted as
    # many as train 2's one, 2 < 3.
    tracks = [1000.0, 1010, 1020, 1030, 1040, 1050]
    failed = [True, True, True, True, False, False]
    trips = [1, 2, 3, 4, 5, 6]
    lopsided = cell(tracks, failed, trips, train=[1, 1, 1, 2, 2, 2])
    assert fit_cell(lopsided, Params()).predicted_failure_track_m is None
    assert fit_cell(lopsided, Params(min_trains=1)).predicted_failure_track_m is not None
    # Three failures from each of two trains: in; a third train is required with min_trains=3.
    both = cell(tracks * 2, failed * 2, [*trips, 7, 8, 9, 10, 11, 12], train=[1] * 6 + [2] * 6)
    assert fit_cell(both, Params()).predicted_failure_track_m is not None
    assert fit_cell(both, Params(min_trains=3)).predicted_failure_track_m is None


def test_one_train_adds_at_most_half_the_evidence_and_cannot_dilute_a_cell_out() -> None:
    """Trains 1 and 2 fail once each in four passes (2 < 3 failures): out.
    Train 3's 40 failures count as one (the runner-up's), so the cell is in:
    one train can complete evidence that is half the threshold, no more.
    Where trains 1 and 2 fail twice each (in on their own), train 3's 40
    failures in 200 passes count as 2 in 10: capped with its handovers, they
    cannot dilute the failure share (6 of 208) and push the cell out."""
    honest_x = [1000.0, 1100, 1200, 1300] * 2
    honest_y = [True, False, False, False] * 2
    honest_t = [1] * 4 + [2] * 4
    short = cell(honest_x, honest_y, list(range(8)), train=honest_t)
    assert fit_cell(short, Params()).predicted_failure_track_m is None
    flooded = cell(
        honest_x + [1000.0] * 40,
        honest_y + [True] * 40,
        list(range(48)),
        train=honest_t + [3] * 40,
    )
    assert fit_cell(flooded, Params()).predicted_failure_track_m is not None
    one = cell(
        honest_x[:4] + [1000.0] * 40,
        honest_y[:4] + [True] * 40,
        list(range(44)),
        train=[1] * 4 + [3] * 40,
    )
    assert fit_cell(one, Params()).predicted_failure_track_m is None, "1 honest failure: out"
    twice = [True, True, False, False] * 2
    dense = cell(
        honest_x + [1000.0] * 40 + [1200.0] * 160,
        twice + [True] * 40 + [False] * 160,
        list(range(208)),
        train=honest_t + [3] * 200,
    )
    assert fit_cell(
        cell(honest_x, twice, list(range(8)), train=honest_t), Params()
    ).predicted_failure_track_m
    # Train 3: 40 failures in 200 passes (20 %), capped to 2 failures in 10 passes.
    assert fit_cell(dense, Params()).predicted_failure_track_m is not None


def test_one_train_cannot_move_an_entry_earlier() -> None:
    """Four trains fail between 1300 and 1390 m; a fifth reports 20 failures at
    500 m. The entry is no earlier than the four trains' own failures put it
    (the table's quantile of them); with one train's word enough it would
    follow the fifth train to 500 m."""
    honest_x = [1300.0, 1330.0, 1360.0, 1390.0] * 2
    honest_train = [1, 2, 3, 4] * 2
    x = honest_x + [500.0] * 20
    train = honest_train + [5] * 20
    c = cell(x, [True] * len(x), list(range(len(x))), train=train)
    honest = Params().location(np.array(honest_x))
    got = fit_cell(c, Params()).predicted_failure_track_m
    assert got is not None and got >= honest
    fifth = 500 - Params().location_margin_m / len(x)
    assert fit_cell(c, Params(min_trains=1)).predicted_failure_track_m == pytest.approx(fifth)
    # Decreasing: "earlier" is the larger track_m, and the bound mirrors.
    d = cell(
        [-v for v in x], [True] * len(x), list(range(len(x))), train=train, direction="decreasing"
    )
    got_d = fit_cell(d, Params()).predicted_failure_track_m
    assert got_d is not None and got_d <= -honest


def test_the_deployed_validation_applies_the_train_rule_to_each_fold() -> None:
    # Train 1's four trips fail, train 2's two succeed: the paper's predictor has
    # the other trips' failures for every failure, the deployed one (the table)
    # never predicts: one train's failures.
    c = cell(
        [1000, 1000, 1000, 1000, 1000, 1000],
        [True, True, True, True, False, False],
        [1, 2, 3, 4, 5, 6],
        train=[1, 1, 1, 1, 2, 2],
    )
    paper, deployed = validate_cell(c, Params(location_quantile=None))
    assert paper.failures_without_prediction == 0
    assert deployed.failures_without_prediction == 4
    # With trips of three trains each failing, every fold keeps two trains'
    # failures (3 of 5 trips): the deployed predictor predicts them all.
    c3 = cell([1000.0] * 6, [True] * 6, [1, 2, 3, 4, 5, 6], train=[1, 1, 2, 2, 3, 3])
    _, deployed3 = validate_cell(c3, Params(location_quantile=None))
    assert deployed3.failures_without_prediction == 0


def population(seed: int, a: float, b: float, cells: int = 80, passes: int = 12) -> list[CellData]:
    """``cells`` cells passed once on each of ``passes`` trips (each trip its
    own train), their failure probabilities drawn from Beta(a, b)."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(cells):
        c = cell(
            list(np.linspace(1000.0, 1100.0, passes)),
            list(rng.random(passes) < rng.beta(a, b)),
            list(range(1, passes + 1)),
        )
        c.key = 100 + k
        out.append(c)
    return out


def test_the_default_rule_is_the_threshold_and_the_prior_bar_is_one_in_five() -> None:
    assert Params().rule == "threshold"
    # C_fail / C_hold = 4 (docs/trainer.md: about 3-5): rest when p > 1 / 5.
    assert Params().failure_cost_ratio == 4.0
    assert Params().hold_bar == pytest.approx(0.2)
    assert Params(failure_cost_ratio=1.0).hold_bar == pytest.approx(0.5)


def test_the_prior_fit_recovers_a_known_beta() -> None:
    rng = np.random.default_rng(7)
    a, b = 2.0, 8.0
    n = rng.integers(5, 40, size=3000).astype(np.float64)
    f = rng.binomial(n.astype(np.int64), rng.beta(a, b, size=len(n))).astype(np.float64)
    got = fit_beta_prior(f, n)
    assert got.a == pytest.approx(a, rel=0.2)
    assert got.b == pytest.approx(b, rel=0.2)
    assert got.a / (got.a + got.b) == pytest.approx(a / (a + b), abs=0.01)
    # Deterministic.
    assert fit_beta_prior(f, n) == got


def test_a_sparse_cell_enters_under_the_prior_only_where_failures_are_common() -> None:
    """One failure in two passes: too little for the thresholds, but where
    cells fail often (pooled failure probability 0.6) the posterior is high,
    and where they rarely do (0.03) it is not."""
    sparse = cell([1000.0, 1010.0], [True, False], [1, 2])
    prior_rule = Params(rule="prior", min_trains=1)
    results = {}
    for name, (a, b) in {"common": (6.0, 4.0), "rare": (1.0, 30.0)}.items():
        fitted = fit_many([sparse, *population(3, a, b)], prior_rule)
        results[name] = fitted[0].predicted_failure_track_m
    assert results["common"] == pytest.approx(1000.0 - prior_rule.location_margin_m)
    assert results["rare"] is None
    assert fit_cell(sparse, Params(min_trains=1)).predicted_failure_track_m is None


def test_the_prior_rule_still_needs_failures_from_several_trains() -> None:
    """Three failures, all train 1's, among failure-prone cells: out with
    min_trains 2, in with 1."""
    lone = cell([1000.0, 1010, 1020, 1030], [True, True, True, False], [1, 2, 3, 4])
    lone.train = np.array([1, 1, 1, 2], dtype=np.int64)
    others = population(5, 6.0, 4.0)
    assert fit_many([lone, *others], Params(rule="prior"))[0].predicted_failure_track_m is None
    one = fit_many([lone, *others], Params(rule="prior", min_trains=1))[0]
    assert one.predicted_failure_track_m is not None
    # Two trains' failures: enough for min_trains 2, not for 3.
    two = cell([1000.0, 1010, 1020, 1030], [True, True, True, False], [1, 2, 3, 4])
    two.train = np.array([1, 1, 2, 3], dtype=np.int64)
    assert fit_many([two, *others], Params(rule="prior"))[0].predicted_failure_track_m is not None
    three = fit_many([two, *others], Params(rule="prior", min_trains=3))[0]
    assert three.predicted_failure_track_m is None


def test_each_fold_is_judged_with_the_prior_fitted_without_its_trip() -> None:
    cells = population(11, 2.0, 6.0, cells=40, passes=6)
    priors = priors_of(cells)
    for t in (1, 4):
        without = []
        for c in cells:
            keep = c.trip != t
            without.append(cell(list(c.track_m[keep]), list(c.failed[keep]), list(c.trip[keep])))
        want = priors_of(without).all
        assert priors.fold(t).a == pytest.approx(want.a, rel=1e-6)
        assert priors.fold(t).b == pytest.approx(want.b, rel=1e-6)
    # validate_cell's deployed reading uses those fold priors: a prior that
    # makes every fold's posterior high for trip 1 only tables that fold.
    c = cell([1000.0, 1010, 1020, 1030], [True, True, False, False], [1, 2, 3, 4])
    p = Params(rule="prior", min_trains=1)
    low = BetaPrior(1.0, 1000.0)
    rigged = priors.__class__(low, {1: BetaPrior(1000.0, 1.0)})
    _, _, ok = fold_tabled(c, p, rigged)
    assert ok.tolist() == [True, False, False, False]
    _, deployed = validate_cell(c, p, rigged)
    assert deployed.failures_without_prediction == 1  # trip 2's failure: no table


def test_the_prior_does_not_depend_on_where_its_search_starts() -> None:
    rng = np.random.default_rng(5)
    n = rng.integers(1, 40, 3000).astype(np.float64)
    f = np.minimum(rng.binomial(n.astype(int), rng.beta(0.8, 9.0, 3000)), n).astype(np.float64)
    e = Evidence.of(f, n)
    assert e.cells.sum() == 3000 and len(e.fs) < 3000, "cells with the same evidence merged"
    best = fit_evidence(e)
    for sa, sb in ((1.4, 0.7), (0.8, 1.2), (1.0, 1.0)):
        # Newton's method converges from near the maximum (a fold starts at
        # the whole set's), not only the slow path from afar.
        got = _newton(e, best.a * sa, best.b * sb)
        assert got is not None
        assert got.a == pytest.approx(best.a, rel=1e-9)
        assert got.b == pytest.approx(best.b, rel=1e-9)
    # A fold's evidence: the whole set's with some cells replaced.
    k = slice(0, 500)
    fk, nk = f.copy(), n.copy()
    fk[k], nk[k] = np.maximum(f[k] - 1, 0), n[k] - 1
    old, new = Evidence.of(f[k], n[k]), Evidence.of(fk[k], nk[k])
    fold = Evidence.counted(
        np.concatenate([e.fs, old.fs, new.fs]),
        np.concatenate([e.ss, old.ss, new.ss]),
        np.concatenate([e.cells, -old.cells, new.cells]),
    )
    direct = Evidence.of(fk, nk)
    for name in ("fs", "ss", "cells"):
        assert getattr(fold, name).tolist() == getattr(direct, name).tolist()


def test_the_prior_never_raises_nor_returns_nan() -> None:
    empty = np.zeros(0)
    for f, n in (
        (empty, empty),
        (np.zeros(50), np.full(50, 10.0)),  # no failure at all
        (np.full(50, 10.0), np.full(50, 10.0)),  # nothing but failures
        (np.array([1.0, 0.0]), np.array([3.0, 2.0])),  # too few cells
        (np.array([np.nan, 1.0, 2.0]), np.array([3.0, np.inf, 0.0])),
    ):
        pr = fit_beta_prior(f, n)
        assert np.isfinite([pr.a, pr.b]).all() and pr.a > 0 and pr.b > 0
    assert priors_of([]).without_trip == {}
    p = Params(rule="prior")
    assert fit_many([], p) == []
    quiet = population(2, 1.0, 1e9, cells=20)  # no failures
    for r in fit_many(quiet, p):
        assert r.predicted_failure_track_m is None
        assert r.deployed.failures == 0
    alone = fit_cell(cell([1000.0, 1010], [False, False], [1, 2]), p)
    assert alone.predicted_failure_track_m is None
