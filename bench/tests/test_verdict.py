"""Verdicts against the paper's numbers come from the interval, never the point estimate."""

from __future__ import annotations

import math

import pytest

from polycorn_bench.verdict import (
    ABOVE,
    BELOW,
    CONSISTENT,
    NO_INTERVAL,
    TEXT,
    compare,
    verdict,
    verdict_text,
)


@pytest.mark.parametrize(
    ("ci", "paper", "expected"),
    [
        ([1.10, 1.40], 1.05, ABOVE),  # lower bound above the paper
        ([0.90, 1.02], 1.31, BELOW),  # upper bound below it
        ([0.90, 1.40], 1.31, CONSISTENT),  # the paper inside
        ([1.31, 1.40], 1.31, CONSISTENT),  # a bound on the paper's number is not beyond it
        ([1.20, 1.31], 1.31, CONSISTENT),
        ([1.6, 1.6], 1.45, ABOVE),  # zero width from several equal pairs: resolved
        ([1.45, 1.45], 1.45, CONSISTENT),
        ([-0.159, -0.045], 0.070, BELOW),  # gains: negative numbers
        ([0.001, 0.114], 0.0, ABOVE),
    ],
)
def test_higher_is_better(ci: list[float], paper: float, expected: str) -> None:
    assert verdict(ci, paper, 150) == expected


@pytest.mark.parametrize(
    ("ci", "paper", "expected"),
    [
        # Message delay changes and overheads: lower is better, so the rule is mirrored.
        ([-0.25, -0.09], -0.45, BELOW),  # hrsch slower than the paper's -45 %: worse
        ([-0.60, -0.50], -0.45, ABOVE),  # faster than the paper's: better
        ([-0.50, -0.40], -0.45, CONSISTENT),
        ([0.040, 0.070], 0.47, ABOVE),  # overhead wholly below the paper's: better
        ([0.50, 0.55], 0.47, BELOW),
        ([0.47, 0.55], 0.47, CONSISTENT),
        ([0.40, 0.47], 0.47, CONSISTENT),
    ],
)
def test_lower_is_better_is_mirrored(ci: list[float], paper: float, expected: str) -> None:
    assert verdict(ci, paper, 5, lower_is_better=True) == expected
    # The same interval the other way round gives the opposite resolved verdict.
    flipped = {ABOVE: BELOW, BELOW: ABOVE, CONSISTENT: CONSISTENT}[expected]
    assert verdict(ci, paper, 5) == flipped


def test_point_estimate_alone_never_decides() -> None:
    # The old rule said "short of the paper" for 0.97 < 1.31 and "reaches" for 1.32 >= 1.31;
    # what counts is the interval.
    assert verdict([0.90, 1.40], 1.31, 150) == CONSISTENT
    assert verdict([1.25, 1.39], 1.31, 150) == CONSISTENT


@pytest.mark.parametrize("n", [None, 0, 1])
def test_fewer_than_two_samples_give_no_interval(n: int | None) -> None:
    # A one-pair bootstrap interval has zero width: it must not resolve anything.
    assert verdict([0.9, 0.9], 1.31, n) == NO_INTERVAL
    assert verdict([0.9, 0.9], 1.31, n, lower_is_better=True) == NO_INTERVAL


@pytest.mark.parametrize(
    "ci",
    [None, [], [1.0], [None, 1.2], [0.8, None], [None, None], [math.nan, 1.2], [0.8, math.inf]],
)
def test_missing_or_broken_interval_gives_no_interval(ci: list[float | None] | None) -> None:
    assert verdict(ci, 1.31, 150) == NO_INTERVAL


def test_no_paper_number_gives_no_verdict() -> None:
    assert verdict([0.9, 1.0], None, 150) is None
    assert verdict(None, None, 0) is None
    assert verdict_text(None) == ""


def test_swapped_bounds_are_a_bug_not_a_verdict() -> None:
    with pytest.raises(ValueError, match="out of order"):
        verdict([1.40, 1.10], 1.31, 150)
    with pytest.raises(ValueError, match="out of order"):
        verdict([0.5, 0.4], 0.47, 5, lower_is_better=True)


def test_non_finite_paper_number_is_rejected() -> None:
    with pytest.raises(ValueError, match="not finite"):
        verdict([0.9, 1.0], math.nan, 150)


def test_words() -> None:
    assert verdict_text(ABOVE) == "above the paper"
    assert verdict_text(CONSISTENT) == "consistent with the paper"
    assert verdict_text(BELOW) == "below the paper"
    assert verdict_text(NO_INTERVAL) == "no interval (n < 2)"
    assert set(TEXT) == {ABOVE, CONSISTENT, BELOW, NO_INTERVAL}


def test_compare_dict() -> None:
    c = compare(0.056, (0.04, 0.07), 5, 0.47, lower_is_better=True)
    assert c == {
        "ours": 0.056,
        "ci95": [0.04, 0.07],
        "n": 5,
        "paper": 0.47,
        "lower_is_better": True,
        "verdict": ABOVE,
    }
    assert compare(None, None, 0, 1.2)["verdict"] == NO_INTERVAL
