"""make validate-tracegen's pass/fail logic (testbed/tracegen/tools/validate_tracegen.py) and the
guard that docs/hsr-model.md's generated tables say what bench/out/tracegen-validation.json
says."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "testbed" / "tracegen" / "tools" / "validate_tracegen.py"
# The issue's format: every leaf of the JSON has these.
REQUIRED = ("name", "published", "generated", "tolerance", "pass", "expected_failure")


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("validate_tracegen", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["validate_tracegen"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


vt = _load()


def test_docs_agree_with_bench_out() -> None:
    """CI's guard: the generated regions of docs/hsr-model.md are what
    bench/out/tracegen-validation.json gives, and the JSON's published values, tolerances and
    expected-failure marks are the script's. If this fails, rerun `make validate-tracegen`
    (or, when only the rendering changed,
    `python3 testbed/tracegen/tools/validate_tracegen.py docs`)."""
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "docs", "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr


def test_committed_json_has_the_issue_format() -> None:
    doc = json.loads((ROOT / "bench" / "out" / "tracegen-validation.json").read_text())
    assert doc["preset"] == "pc-gateway-300"
    assert doc["profile"] == "full"
    for k in ("commit", "date", "fleets"):
        assert doc["provenance"][k]
    for tree in [doc, *doc["comparison"].values()]:
        for key, leaf in tree["items"].items():
            for field in REQUIRED:
                assert field in leaf, (key, field)
            assert isinstance(leaf["pass"], bool)
    # Every check of the script is in the committed run, with the script's tolerance.
    assert set(doc["items"]) == {c.key for c in vt.CHECKS}


def _check(**kw: Any) -> Any:
    base: dict[str, Any] = {
        "key": "1.A.p50",
        "item": "1",
        "group": "throughput",
        "stat": "p50",
        "carrier": "A",
        "fleet": "pc",
        "published": 10.0,
        "unit": "Mbit/s",
        "source": "PC",
        "src": vt.Src("validate", "pc", ("carriers", 0, "x")),
    }
    return vt.Check(**(base | kw))


def _results(x: float | None) -> dict[str, Any]:
    return {"pc": {"carriers": [{"x": x}]}}


def _judge(check: Any, x: float | None, profile: str = "full", **kw: Any) -> Any:
    return vt.judge(check, _results(x), {}, profile, {"pc": "pc-gateway-300"}, **kw)


@pytest.mark.parametrize(
    ("kind", "value", "published", "bounds"),
    [
        ("relative", 0.2, 10.0, (8.0, 12.0)),
        ("points", 10.0, 1.3, (-8.7, 11.3)),
        ("factor", 1.5, 1.8, (1.2, 2.7)),
        ("max", 1.0, 0.0, (float("-inf"), 1.0)),
        ("direction", 2.0, 1.59, (1.0, 3.18)),
    ],
)
def test_tolerance_bounds(
    kind: str, value: float, published: float, bounds: tuple[float, float]
) -> None:
    lo, hi = vt.Tol(kind, value).bounds(published)
    assert lo == pytest.approx(bounds[0])
    assert hi == pytest.approx(bounds[1])


def test_direction_needs_an_odds_ratio_above_one() -> None:
    # Published 0.8 (not a real case): the bound p/2 = 0.4 must not let 0.9 pass.
    c = _check(published=0.8, tol=vt.DIRECTION, unit="×")
    assert _judge(c, 0.9)["status"] == "FAIL"
    assert _judge(c, 1.2)["status"] == "pass"


def test_statuses_pass_fail_xfail_xpass() -> None:
    plain = _check()
    assert _judge(plain, 11.0)["status"] == "pass"
    assert _judge(plain, 13.0)["status"] == "FAIL"
    assert _judge(plain, None)["status"] == "FAIL"  # nothing generated is a failure
    xf = _check(xfail="the model cannot")
    failing = _judge(xf, 13.0)
    assert (failing["status"], failing["pass"]) == ("xfail", False)
    assert failing["expected_failure"] is True
    assert _judge(xf, 11.0)["status"] == "XPASS"
    s = vt.summarize({"a": _judge(plain, 13.0), "b": failing, "c": _judge(xf, 11.0)})
    assert s["verdict"] == "FAIL"
    assert s["gating_failures"] == ["a"]
    assert s["expected_failures"] == ["b"]
    assert s["unexpected_passes"] == ["c"]
    # Expected failures and unexpected passes alone do not gate.
    assert vt.summarize({"b": failing, "c": _judge(xf, 11.0)})["verdict"] == "PASS"


def test_seeded_fault_fails_the_gate() -> None:
    c = _check()
    computed = vt.Computed(results=_results(10.0))
    fleets = {"pc": vt.FLEETS["pc"]}
    ok = vt.evaluate(computed, fleets, "full", [c])
    assert ok["1.A.p50"]["status"] == "pass"
    bad = vt.evaluate(computed, fleets, "full", [c], seed_fault="1.A.p50")
    assert bad["1.A.p50"]["status"] == "FAIL"
    assert vt.summarize(bad)["verdict"] == "FAIL"
    with pytest.raises(vt.RunError):
        vt.evaluate(computed, fleets, "full", [c], seed_fault="no.such.key")


def test_ci_widens_bounds_by_three_standard_errors() -> None:
    c = _check(ci=True)
    per_trip = {"pc": [{"carriers": [{"x": x}]} for x in (12.0, 14.0, 12.0, 14.0)]}
    args = (c, _results(13.0), per_trip)
    full = vt.judge(*args, "full", {"pc": "p"})
    ci = vt.judge(*args, "ci", {"pc": "p"})
    se = 2 / 3**0.5 / 2  # SD of (12, 14, 12, 14) is 2/√3; four trips
    assert full["status"] == "FAIL"
    assert full["sampling_margin"] == 0
    assert ci["se"] == pytest.approx(se, rel=1e-3)
    assert ci["bounds"][1] == pytest.approx(12 + 3 * se, rel=1e-4)
    assert ci["status"] == "pass"
    # The CI profile judges only the checks marked for it.
    computed = vt.Computed(results=_results(10.0))
    assert vt.evaluate(computed, {"pc": vt.FLEET_CI}, "ci", [_check()]) == {}


def test_render_rewrites_only_the_regions_and_reports_stale_ones(tmp_path: Path) -> None:
    doc = json.loads((ROOT / "bench" / "out" / "tracegen-validation.json").read_text())
    names = list(vt.regions(doc))
    text = "# Title\n\nprose stays\n\n" + "".join(
        f"<!-- generated:{n} -->\nold\n<!-- /generated -->\n\nmore prose\n\n" for n in names
    )
    new, changed = vt.render(text, doc)
    assert sorted(changed) == sorted(names)
    assert new.startswith("# Title\n\nprose stays\n\n")
    assert new.count("more prose") == len(names)
    again, changed_again = vt.render(new, doc)
    assert (again, changed_again) == (new, [])
    with pytest.raises(vt.RunError, match="tracegen-bogus"):
        vt.render(new + "<!-- generated:tracegen-bogus -->\n<!-- /generated -->\n", doc)
    with pytest.raises(vt.RunError, match="no such region"):
        vt.render("no regions here\n", doc)


def test_stale_tolerances_are_found() -> None:
    doc = json.loads((ROOT / "bench" / "out" / "tracegen-validation.json").read_text())
    assert vt.stale_tolerances(doc) == []
    key = next(iter(doc["items"]))
    doc["items"][key]["tolerance"] = 0.5
    assert [p.split(":")[0] for p in vt.stale_tolerances(doc)] == [key]


def test_stale_binary_is_refused(tmp_path: Path) -> None:
    src, exe = tmp_path / "src with space.rs", tmp_path / "bin"
    src.write_text("fn main() {}")
    exe.write_text("")
    dep = tmp_path / "bin.d"
    dep.write_text(f"{exe}: {str(src).replace(' ', chr(92) + ' ')}\n\n{src}:\n")
    assert vt.depinfo_sources(dep) == [src]
    os.utime(exe, (1_000, 1_000))
    os.utime(src, (2_000, 2_000))
    assert vt.stale_binary(exe, [src]) == [src]
    os.utime(exe, (3_000, 3_000))
    assert vt.stale_binary(exe, [src]) == []
    assert vt.stale_binary(exe, [tmp_path / "gone.rs"]) == [tmp_path / "gone.rs"]


def test_the_summary_says_whether_the_run_was_clean() -> None:
    doc = json.loads((ROOT / "bench" / "out" / "tracegen-validation.json").read_text())
    old = vt.summary_lines(doc)[0]  # no top-level fields: provenance.dirty says
    assert "uncommitted" not in old
    clean = vt.summary_lines(doc | {"commit": "a" * 40, "clean": True})[0]
    assert clean == old
    moved = doc | {
        "commit": "a" * 40,
        "clean": False,
        "dirty_paths": ["crates/x.rs"],
        "commit_at_end": "b" * 40,
    }
    assert (
        "(uncommitted changes to `crates/x.rs`; HEAD moved to `bbbbbbbbbbbb` during the run)"
        in vt.summary_lines(moved)[0]
    )
