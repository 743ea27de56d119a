"""``python -m polycorn_benchrun.trainer_curve``, small: 4 short trips per development
route. The file must carry its provenance, both rules' curves for every amount of
training data, and the full set's curve at the top level (what docs/trainer.md's
tables read); numbers are not judged."""

from __future__ import annotations

import json
from pathlib import Path

from polycorn_benchrun import trainer_curve
from polycorn_harness.fixtures import require_binaries


def test_a_small_curve_has_both_rules_for_each_training_size(tmp_path: Path) -> None:
    require_binaries("polycorn-tracegen")
    out = tmp_path / "curve.json"
    assert trainer_curve.main(["--trips", "8", "--trip-s", "300", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert len(doc["commit"]) == 40 and isinstance(doc["clean"], bool)
    assert doc["trips"] == 24
    assert sorted(doc["by_training_trips"], key=int) == ["6", "7"]
    assert doc["by_training_trips"]["7"]["curve"] == doc["curve"]
    assert doc["by_training_trips"]["6"]["trips"] == 21
    for run in doc["by_training_trips"].values():
        assert {r["failure_cost_ratio"] for r in run["prior_curve"]} >= {4}
        assert {r["min_trains"] for r in run["prior_curve"]} == {1, 2}
        chosen = [
            r
            for r in run["curve"]
            if (r["min_failures"], r["min_failure_rate"])
            == (doc["chosen"]["min_failures"], doc["chosen"]["min_failure_rate"])
        ]
        assert len(chosen) == 1
        assert run["prior"]["a"] > 0 and run["prior"]["b"] > 0
