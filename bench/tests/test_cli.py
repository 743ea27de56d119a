"""End to end: the command writes JSON, markdown, plots and a table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import RunBuilder, download

from polycorn_bench import provenance
from polycorn_bench.hsr import main

ROOT = Path(__file__).resolve().parents[2]


def test_cli_writes_everything(
    builder: RunBuilder, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    builder.events("r1-t1", [1050.0])
    for trip in ("r1-t1", "r1-t2"):
        for scheme, dur in (("minrtt", 800.0), ("redundant", 900.0), ("single-path", 1200.0)):
            builder.bulk(
                trip,
                scheme,
                [download(0, 1000, dur), download(1, 3000, dur / 4, size=262144)],
                extra=["oops"] if scheme == "redundant" else [],
            )
            builder.im(trip, scheme, 10, [{"user": 0, "msg": 0, "ok": True, "delay_ms": dur / 10}])
    run = builder.finish()
    out, md, plots = tmp_path / "o" / "hsr.json", tmp_path / "o" / "hsr.md", tmp_path / "img"
    rc = main([str(run), "--out", str(out), "--md", str(md), "--plots", str(plots)])
    assert rc == 0
    doc = json.loads(out.read_text())
    for key in ("profile", "link_set", "seeds", "bulk", "im", "link_sets", "generated", "commit"):
        assert key in doc
    s = doc["bulk"]["redundant"]["256KB"]
    for key in ("n", "goodput_mbps_median", "ratio_vs_minrtt", "ci95", "ratio_vs_oracle"):
        assert key in s
    assert set(doc["im"]["minrtt"]["10"]) >= {"mean_ms", "p90_ms", "cov"}
    text = md.read_text()
    assert "× minrtt" in text
    assert "handovers" in text
    names = sorted(p.name for p in plots.iterdir())
    assert names == [
        "hsr-goodput-cdf.png",
        "hsr-handovers.png",
        "hsr-im.png",
        "hsr-ratio-minrtt.png",
        "hsr-ratio-oracle.png",
    ]
    captured = capsys.readouterr()
    assert "redundant" in captured.out
    assert "malformed JSON line" in captured.err


def test_cli_missing_run_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "nope"), "--out", str(tmp_path / "x.json")]) == 2
    assert "cannot read run" in capsys.readouterr().err


def test_cli_odd_run_json_does_not_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(
        json.dumps({"profile": "demo", "schemes": "minrtt", "bulk": "x", "link_sets": {"hsr": 3}})
    )
    out = tmp_path / "hsr.json"
    assert main([str(run), "--out", str(out), "--md", str(tmp_path / "r.md")]) == 0
    doc = json.loads(out.read_text())
    assert doc["link_set"] == "hsr"
    assert doc["bulk"] == {}
    assert "no bulk downloads" in capsys.readouterr().out


def test_cli_missing_trip_dir_is_reported(builder: RunBuilder, tmp_path: Path) -> None:
    builder.meta["link_sets"]["hsr"]["trips"].append("r9-t9")
    builder.bulk("r1-t1", "minrtt", [download(0, 1000, 100.0)])
    out = tmp_path / "hsr.json"
    assert main([str(builder.finish()), "--out", str(out), "--quiet"]) == 0
    doc = json.loads(out.read_text())
    assert doc["issues"]["by_kind"]["missing trip directory"] == 1
    assert doc["seeds"] == ["r1-t1", "r1-t2"]


def test_the_result_carries_the_runs_provenance_looked_at_again(
    builder: RunBuilder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The analysis writes what the run's run.json recorded at its start (commit, clean), and
    a run of another commit than the tree's HEAD now is a result no single commit gave."""
    monkeypatch.delenv("POLYCORN_BENCH_START", raising=False)
    builder.bulk("r1-t1", "minrtt", [download(0, 1000, 100.0)])
    builder.meta |= {"commit": "0" * 40, "clean": True}
    run = builder.finish()
    out, md = tmp_path / "hsr.json", tmp_path / "hsr.md"
    assert main([str(run), "--out", str(out), "--md", str(md), "--quiet"]) == 0
    doc = json.loads(out.read_text())
    assert list(doc)[:2] == ["commit", "clean"]
    assert doc["commit"] == "0" * 40 and doc["clean"] is False
    assert doc["dirty_allowed"] is True and doc["commit_at_end"] != doc["commit"]
    assert f"Commit `{'0' * 40}`, **not clean**" in md.read_text()


def test_the_analysis_refuses_to_write_a_result_that_is_not_clean_into_bench_out(
    builder: RunBuilder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("POLYCORN_BENCH_ALLOW_DIRTY", raising=False)
    monkeypatch.delenv("POLYCORN_BENCH_START", raising=False)
    builder.bulk("r1-t1", "minrtt", [download(0, 1000, 100.0)])
    run = builder.finish()  # commit abc123: not the tree's HEAD
    out = ROOT / "bench" / "out" / "never-written-by-a-test.json"
    try:
        with pytest.raises(provenance.DirtyTree, match="the run started at commit abc123"):
            main([str(run), "--out", str(out), "--quiet"])
        assert not out.exists()
    finally:
        out.unlink(missing_ok=True)
