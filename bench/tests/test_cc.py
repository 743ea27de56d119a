"""The controller benchmark's summary (polycorn_bench.cc): shares and the paired ratio."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from polycorn_bench import cc, provenance

#: The harness's module, which polycorn_bench.provenance imports from the tree.
helper = sys.modules[provenance.Run.__module__]


def rows(shares: dict[str, list[float]]) -> list[dict[str, Any]]:
    """Two trips x two carriers per variant, shares in that order."""
    out = []
    for v, xs in shares.items():
        for i, x in enumerate(xs):
            out.append(
                {
                    "variant": v,
                    "trip": f"t{i // 2}",
                    "carrier": i % 2,
                    "share": x,
                    "sojourn_p50_ms": 10.0 * (i + 1),
                    "sojourn_p95_ms": 100.0,
                }
            )
    return out


def test_shares_are_means_over_trips_and_ratios_are_paired(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cc, "VARIANTS", {"railway": "", "other": ""})
    s = cc.summarise(rows({"railway": [0.5, 0.4, 0.6, 0.8], "other": [1.0, 0.8, 1.2, 1.6]}))
    assert s["trips"] == ["t0", "t1"]
    v = s["variants"]
    assert v["railway"]["share"]["mean"] == pytest.approx(0.575)
    assert v["other"]["share_vs_default"]["ratio"] == pytest.approx(2.0)
    assert v["other"]["share_vs_default"]["n"] == 4
    assert v["railway"]["per_carrier_share"]["1"]["mean"] == pytest.approx(0.6)
    assert v["railway"]["sojourn_p95_ms"]["mean"] == pytest.approx(100.0)


def test_a_zero_share_is_left_out_of_the_ratio(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cc, "VARIANTS", {"railway": "", "other": ""})
    s = cc.summarise(rows({"railway": [0.0, 0.4, 0.6, 0.8], "other": [1.0, 0.8, 1.2, 1.6]}))
    assert s["variants"]["other"]["share_vs_default"]["n"] == 3


def test_a_dirty_tree_does_not_write_into_bench_out(monkeypatch: pytest.MonkeyPatch) -> None:
    dirty = helper.TreeState("c" * 40, ("bench/polycorn_bench/cc.py",))
    monkeypatch.setattr(helper, "tree_state", lambda root: dirty)
    monkeypatch.delenv("BENCH_OUT", raising=False)
    monkeypatch.delenv("POLYCORN_BENCH_ALLOW_DIRTY", raising=False)
    monkeypatch.delenv("POLYCORN_BENCH_START", raising=False)
    with pytest.raises(provenance.DirtyTree, match="uncommitted changes: bench/polycorn_bench/cc"):
        cc.main()
