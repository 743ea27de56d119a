"""``make bench-ingest --replicas``'s bookkeeping, without Kafka or PostgreSQL: each run
stubbed, the order of the runs and the ratios they make."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from polycorn_benchrun import ingest


def test_counts_are_distinct_and_positive() -> None:
    assert ingest._counts("1,2") == [1, 2]
    for bad in ("", "0,1", "2,2", "one"):
        with pytest.raises((argparse.ArgumentTypeError, ValueError)):
            ingest._counts(bad)


def test_the_output_follows_the_mode() -> None:
    assert str(ingest._args([]).out) == "bench/out/ingest.json"
    assert str(ingest._args(["--replicas", "1,2"]).out) == "bench/out/ingest-replicas.json"
    assert str(ingest._args(["--replicas", "1,2", "--out", "/tmp/x.json"]).out) == "/tmp/x.json"


def test_runs_alternate_and_ratios_are_per_repeat(monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[int] = []
    # Two consumers: 1.5x the events/s and half the lag in repeat 0, 2x and the same
    # lag in repeat 1.
    eps = {(0, 1): 1000.0, (0, 2): 1500.0, (1, 1): 1000.0, (1, 2): 2000.0}
    lag = {(0, 1): 400.0, (0, 2): 200.0, (1, 1): 300.0, (1, 2): 300.0}

    def trial(a: argparse.Namespace, bootstrap: str) -> dict[str, Any]:
        order.append(a.consumers)
        rep = (len(order) - 1) // 2
        key = (rep, a.consumers)
        return {
            "events_per_s": eps[key],
            "lag_p50_ms": lag[key],
            "lag_p99_ms": 2 * lag[key],
            "records": a.records,
            "records_read_again": 0,
            "group_settled_s": 0.5,
            "throughput_window_s": 1.0,
            "batches": 3,
            "load_average_1m": 1.0,
            "stage_seconds_throughput_phase": {"cpu": 2.0},
        }

    monkeypatch.setattr(ingest, "_trial", trial)
    a = ingest._args(["--replicas", "1,2", "--repeats", "2", "--records", "100"])
    out = ingest._replicas(a, "kafka:9092")
    assert order == [1, 2, 2, 1]
    r = out["ratios"]["2/1"]
    assert r["events_per_s"]["per_repeat"] == [1.5, 2.0]
    assert r["events_per_s"]["geomean"] == pytest.approx(3**0.5, abs=1e-3)
    assert r["lag_p50_ms"]["per_repeat"] == [0.5, 1.0]
    assert (r["lag_p99_ms"]["min"], r["lag_p99_ms"]["max"]) == (0.5, 1.0)
    assert out["median"]["1"]["events_per_s"] == 1000.0
    assert [(x["repeat"], x["consumers"]) for x in out["runs"]] == [(0, 1), (0, 2), (1, 2), (1, 1)]
