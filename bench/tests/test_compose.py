"""Composing one run out of several: links, run.json provenance, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import RunBuilder, backlog, write_jsonl

from polycorn_bench.analysis import analyse
from polycorn_bench.compose import ComposeError, compose, main
from polycorn_bench.records import read_run

SCHEMES = ["minrtt", "single-path-c0"]


def conc(b: RunBuilder, trip: str, scheme: str, nbytes: int) -> None:
    sdir = b.scheme_dir(trip, scheme)
    write_jsonl(sdir / "concurrency-1.jsonl", [backlog(nbytes, 300_000.0, 310_000.0)])
    (sdir / "logs").mkdir(parents=True, exist_ok=True)
    (sdir / "logs" / "concurrency-1.relay.metrics").write_text(f"# {nbytes}\n", encoding="utf-8")


def base_run(root: Path) -> Path:
    b = RunBuilder(root, SCHEMES, ["r1-t1"])
    b.meta["commit"] = "aaa"
    b.meta["phases"] = ["backlog", "concurrency"]
    b.meta["concurrency"] = {"users": [1], "seconds": 60}
    for s in SCHEMES:
        write_jsonl(b.scheme_dir("r1-t1", s) / "backlog.jsonl", [backlog(50_000_000)])
        conc(b, "r1-t1", s, 1_000)  # the invalid phase
        b.metrics("r1-t1", s, "# relay end of trip\n", None)
    return b.finish()


def conc_run(root: Path) -> Path:
    b = RunBuilder(root, SCHEMES, ["r1-t1"])
    b.meta["commit"] = "bbb"
    b.meta["phases"] = ["concurrency"]
    b.meta["concurrency"] = {"users": [1], "seconds": 90}
    for s in SCHEMES:
        conc(b, "r1-t1", s, 9_000_000)
    return b.finish()


def other_set_run(root: Path) -> Path:
    b = RunBuilder(root, SCHEMES, ["tmobile-verizon"], link_set="mahimahi")
    b.meta["commit"] = "ccc"
    b.meta["phases"] = ["bulk", "backlog"]
    for s in SCHEMES:
        write_jsonl(b.scheme_dir("tmobile-verizon", s) / "backlog.jsonl", [backlog(7_000_000)])
    return b.finish()


def test_a_phase_and_a_link_set_from_other_runs(tmp_path: Path) -> None:
    base, c, m = base_run(tmp_path / "a"), conc_run(tmp_path / "b"), other_set_run(tmp_path / "c")
    out = tmp_path / "out"
    meta = compose(out, base, {"mahimahi": m}, {"concurrency": c})
    sdir = out / "hsr" / "r1-t1" / "minrtt"
    # The phase's records and snapshots come from the other run, the rest from the base.
    assert (sdir / "concurrency-1.jsonl").resolve() == (
        c / "hsr" / "r1-t1" / "minrtt" / "concurrency-1.jsonl"
    ).resolve()
    assert (sdir / "logs" / "concurrency-1.relay.metrics").read_text() == "# 9000000\n"
    assert (sdir / "backlog.jsonl").resolve().is_relative_to(base.resolve())
    assert (sdir / "logs" / "relay.metrics").read_text() == "# relay end of trip\n"
    assert (out / "hsr" / "r1-t1" / "trip" / "c0.down").resolve().is_relative_to(base.resolve())
    assert all(p.is_symlink() for p in out.rglob("*") if p.is_file() and p.name != "run.json")
    written = json.loads((out / "run.json").read_text())
    assert written == meta
    assert set(written["link_sets"]) == {"hsr", "mahimahi"}
    assert written["concurrency"]["seconds"] == 90
    assert written["commit"] == "aaa"
    used = {p["used_for"]: p["commit"] for p in written["composed_from"]}
    assert used == {"the rest": "aaa", "mahimahi": "ccc", "phase concurrency": "bbb"}
    assert set(written["phases"]) == {"backlog", "concurrency", "bulk"}
    doc = analyse(read_run(out))
    conc1 = doc["link_sets"]["hsr"]["concurrency"]["1"]["minrtt"]
    assert conc1["goodput_mbps_total"] == pytest.approx(9_000_000 * 8 / 10_000 / 1000)
    assert doc["link_sets"]["mahimahi"]["backlog"]["minrtt"]["goodput_mbps_mean"] > 0


def test_a_phase_missing_in_the_other_run_is_refused_and_nothing_is_left(tmp_path: Path) -> None:
    base, c = base_run(tmp_path / "a"), conc_run(tmp_path / "b")
    # Snapshots without the records are not the phase.
    (c / "hsr" / "r1-t1" / "single-path-c0" / "concurrency-1.jsonl").unlink()
    out = tmp_path / "out"
    with pytest.raises(ComposeError, match="no concurrency records"):
        compose(out, base, {}, {"concurrency": c})
    assert not out.exists()
    assert (c / "hsr" / "r1-t1" / "minrtt" / "concurrency-1.jsonl").exists(), "targets untouched"


def test_one_window_from_a_rerun_of_fewer_schemes_and_a_dropped_window(tmp_path: Path) -> None:
    base = base_run(tmp_path / "a")
    b = RunBuilder(tmp_path / "b", ["minrtt"], ["r1-t1"])
    b.meta["concurrency"] = {"users": [1], "seconds": 60}
    conc(b, "r1-t1", "minrtt", 7_000_000)
    rerun = b.finish()
    m = other_set_run(tmp_path / "c")
    sdir = m / "mahimahi" / "tmobile-verizon" / "minrtt"
    write_jsonl(sdir / "concurrency-1.jsonl", [backlog(1, 300_000.0, 310_000.0)])
    out = tmp_path / "out"
    compose(out, base, {"mahimahi": m}, {"concurrency-1": rerun}, [("concurrency-1", "mahimahi")])
    hsr = out / "hsr" / "r1-t1"
    # The rerun's scheme gets its window; the scheme it left out gets none (not the base's).
    assert (hsr / "minrtt" / "logs" / "concurrency-1.relay.metrics").read_text() == "# 7000000\n"
    assert not (hsr / "single-path-c0" / "concurrency-1.jsonl").exists()
    assert not (hsr / "single-path-c0" / "logs" / "concurrency-1.relay.metrics").exists()
    assert (hsr / "single-path-c0" / "backlog.jsonl").exists()
    assert not (out / "mahimahi" / "tmobile-verizon" / "minrtt" / "concurrency-1.jsonl").exists()
    used = [p["used_for"] for p in json.loads((out / "run.json").read_text())["composed_from"]]
    assert used == ["the rest", "mahimahi", "phase concurrency-1", "dropped concurrency-1@mahimahi"]
    doc = analyse(read_run(out))
    per = doc["link_sets"]["hsr"]["concurrency"]["1"]
    assert set(per) == {"minrtt"}
    assert doc["link_sets"]["mahimahi"]["concurrency"] is None


def test_cli_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = base_run(tmp_path / "a")
    assert main([str(tmp_path / "o1"), "--base", str(base), "--phase", "sweep=x"]) == 2
    assert "unknown phase" in capsys.readouterr().err
    assert main([str(tmp_path / "o5"), "--base", str(base), "--drop", "concurrency-1"]) == 2
    assert "PHASE@LINK_SET" in capsys.readouterr().err
    assert main([str(tmp_path / "o6"), "--base", str(base), "--drop", "bulk@nowhere"]) == 2
    assert "no link set 'nowhere'" in capsys.readouterr().err
    assert main([str(tmp_path / "o2"), "--base", str(base), "--link-set", "mahimahi"]) == 2
    assert "NAME=RUN_DIR" in capsys.readouterr().err
    assert main([str(tmp_path / "o3"), "--base", str(base), "--link-set", f"x={base}"]) == 2
    assert "no link set 'x'" in capsys.readouterr().err
    assert main([str(base), "--base", str(base)]) == 2
    assert "exists" in capsys.readouterr().err
    assert main([str(tmp_path / "o4"), "--base", str(base)]) == 0


def test_a_composed_run_is_clean_only_when_every_part_is_a_clean_run_of_one_commit(
    tmp_path: Path,
) -> None:
    base, c = base_run(tmp_path / "a"), conc_run(tmp_path / "b")
    for run, commit in ((base, "a" * 40), (c, "a" * 40)):
        meta = json.loads((run / "run.json").read_text())
        (run / "run.json").write_text(json.dumps(meta | {"commit": commit, "clean": True}))
    same = compose(tmp_path / "same", base, {}, {"concurrency": c})
    assert (same["commit"], same["clean"]) == ("a" * 40, True)
    meta = json.loads((c / "run.json").read_text())
    (c / "run.json").write_text(json.dumps(meta | {"commit": "b" * 40}))
    mixed = compose(tmp_path / "mixed", base, {}, {"concurrency": c})
    assert (mixed["commit"], mixed["clean"], mixed["dirty_allowed"]) == ("a" * 40, False, True)
    (c / "run.json").write_text(json.dumps(meta | {"clean": False, "dirty_paths": ["crates/x.rs"]}))
    dirty = compose(tmp_path / "dirty", base, {}, {"concurrency": c})
    assert (dirty["clean"], dirty["dirty_paths"]) == (False, ["crates/x.rs"])
