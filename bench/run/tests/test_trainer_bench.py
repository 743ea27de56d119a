"""``make bench-trainer``'s scale part: its sizes, the seed at several lines, the report
of repeated refits (median and range), and one small run end to end (the real seed,
trainer and measurement, against scripts/infra.sh's PostgreSQL)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from polycorn_benchrun import trainer_fleet as tf
from polycorn_harness import ROOT, provenance
from polycorn_schema.testing import fresh_database

VALIDATION = {"failure_correct": 0.5, "failures": 10}


def test_scales_set_size_lines_parts_and_output() -> None:
    assert (tf.SCALES["1x"].cells, tf.SCALES["1x"].handovers, tf.SCALES["1x"].lines) == (
        10_000,
        1_000_000,
        1,
    )
    assert (tf.SCALES["10x"].cells, tf.SCALES["10x"].handovers, tf.SCALES["10x"].lines) == (
        100_000,
        10_000_000,
        10,
    )
    assert tf.Scale(15_000, 1, 0, "").lines == 2  # at most 2,500 boundaries a line
    assert tf._defaults("1x")["parts"] == "fleet scale"
    assert tf._defaults("10x")["parts"] == "scale"
    assert (tf._out_name("1x"), tf._out_name("10x")) == ("trainer.json", "trainer-10x.json")


def write_refits(work: Path, refit_s: list[float], *, same: bool = True) -> None:
    """The pieces of ``len(refit_s)`` refits, as _scale_part leaves them."""
    meta = {
        **provenance.start(work / "out").started(),
        "date": "2026-11-30 12:00 UTC",
        "loadavg_start": ["0.5", "0.4", "0.3"],
        "workers": 0,
        "cpus": 2,
        "seed": 0.42,
        "scale": "10x",
        "lines": 10,
        "repeats": len(refit_s),
        "seed_s": None,
        "scale_db": {"name": "bench_db", "seeded_this_run": False, "kept": True},
    }
    meta["scale_db"]["bytes_before_first_run"] = 15 * 2**30
    (work / "meta.json").write_text(json.dumps(meta))
    (work / "scale-data.json").write_text(json.dumps({"cells": 100_000}))
    for i, r in enumerate(refit_s):
        validation = VALIDATION if same or i == 0 else {**VALIDATION, "failures": 11}
        summary = {
            "model_id": i + 1,
            "cells": 100_000,
            "cells_fitted": 90_000,
            "kinds": {"linear_svc": 90_000, "no_failures": 10_000},
            "handovers": 10_000_000,
            "refit_s": r,
            "load_s": r / 2,
            "fit_s": r / 4,
            "store_s": r / 4,
            "fit_cpu_s": r,
            "validation": validation,
        }
        measure = {
            "command": ["polycorn-trainer", "run"],
            "wall_s": r + 2,
            "peak_tree_pss_mib": 500.0 + i,
            "peak_tree_rss_mib": 700.0,
            "peak_single_process_rss_mib": 300.0 - i,
            "peak_single_process_pss_mib": 280.0,
            "processes_max": 4,
        }
        before = {"loadavg": [str(1.0 + i), "0.9", "0.8"], "db_bytes": 15 * 2**30 + i}
        (work / f"scale-summary-{i}.json").write_text(json.dumps(summary))
        (work / f"scale-measure-{i}.json").write_text(json.dumps(measure))
        (work / f"scale-before-{i}.json").write_text(json.dumps(before))


def test_the_report_has_every_refit_and_their_median_and_range(tmp_path: Path) -> None:
    write_refits(tmp_path, [120.0, 100.0, 190.0])
    out = tmp_path / "out" / "trainer-10x.json"
    assert tf.main(["report", "--work", str(tmp_path), "--scale", "--out", str(out)]) == 0
    r: dict[str, Any] = json.loads(out.read_text())
    assert (r["cells"], r["handovers"], r["refit_s"], r["goal_refit_s"]) == (
        100_000,
        10_000_000,
        120.0,
        300,
    )
    assert r["peak_rss_mb"] == 501.0
    sc = r["scale"]
    assert [run["refit_s"] for run in sc["runs"]] == [120.0, 100.0, 190.0]
    assert sc["stats"]["refit_s"] == {"median": 120.0, "min": 100.0, "max": 190.0}
    assert sc["stats"]["load_s"] == {"median": 60.0, "min": 50.0, "max": 95.0}
    assert sc["stats"]["peak_single_process_rss_mib"]["max"] == 300.0
    assert [run["loadavg_before"][0] for run in sc["runs"]] == ["1.0", "2.0", "3.0"]
    assert sc["runs"][2]["db_bytes_before"] == 15 * 2**30 + 2
    assert sc["validation_same_in_every_run"] is True
    assert "validation" not in r and "fleet" not in r  # the scale part alone
    assert "commit" in r
    md = out.with_suffix(".md").read_text()
    assert "120.0 s [100.0, 190.0] (goal < 300 s)" in md
    assert "| 3 | 190.0 | 95.0 |" in md
    assert "`bench_db`, seeded before this run; 15.0 GiB" in md


def test_a_refit_that_validates_otherwise_is_reported(tmp_path: Path) -> None:
    write_refits(tmp_path, [10.0, 11.0], same=False)
    out = tmp_path / "trainer.json"
    tf.main(["report", "--work", str(tmp_path), "--scale", "--out", str(out)])
    assert json.loads(out.read_text())["scale"]["validation_same_in_every_run"] is False


def seed_args(cells: int, handovers: int) -> argparse.Namespace:
    return argparse.Namespace(cells=cells, handovers=handovers, seed="0.42")


def test_the_seed_lays_out_lines_of_their_own(tmp_path: Path) -> None:
    """Two lines: each its own trains and cells, every key a handover per trip of
    its direction on its line, and a database of another size or another fleet is
    told apart."""
    with fresh_database(prefix="linkdb_test_trainer_seed") as url:
        a = seed_args(80, 4000)
        subprocess.run(
            ["psql", url, "-q", "-v", "cells=80", "-v", "handovers=4000", "-v", "carriers=2"]
            + ["-v", "lines=2", "-v", "seed=0.42", "-f", str(tf.SEED_SQL)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        with psycopg.connect(url) as c:
            counts = c.execute(
                "SELECT (SELECT count(*) FROM cells), (SELECT count(*) FROM handovers), "
                "(SELECT count(*) FROM trains), (SELECT count(*) FROM trips), "
                "(SELECT count(DISTINCT handovers) FROM cells), "
                "(SELECT count(DISTINCT cell_id >> 20 & 4095) FROM cells), "
                "(SELECT count(*) FROM handovers h JOIN cells c ON c.id = h.cell "
                " WHERE (c.cell_id >> 20 & 4095) <> split_part(h.train_id, '-', 2)::int / 20)"
            ).fetchone()
            indexes = c.execute(
                "SELECT count(*) FROM pg_indexes WHERE tablename IN ('cells', 'handovers')"
            ).fetchone()
        assert counts == (80, 4000, 40, 200, 1, 2, 0)
        assert indexes is not None and indexes[0] >= 10  # rebuilt after the load
        assert tf._holds_seed(url, a) is None
        assert "not 80 cells" in (tf._holds_seed(url, seed_args(80, 8000)) or "")


@pytest.mark.skipif(not os.environ.get("POLYCORN_DATABASE_URL"), reason="needs infra.sh env")
def test_a_small_scale_run_end_to_end(tmp_path: Path) -> None:
    """bench --parts scale at 80 keys, twice, into a named database that it makes and
    keeps, then again reusing it: a diagnostic run, its report in the work directory."""
    db = f"trainerscale_test_{os.getpid()}"
    env = {**os.environ, "BENCH_OUT": str(tmp_path / "never")}
    cmd = [sys.executable, "-m", "polycorn_benchrun.trainer_fleet", "bench"]
    args = ["--parts", "scale", "--cells", "80", "--handovers", "4000", "--repeats", "2"]
    base = os.environ["POLYCORN_DATABASE_URL"].rsplit("/", 1)[0]
    try:
        for i in (1, 2):
            work = tmp_path / f"work{i}"
            subprocess.run(
                [*cmd, *args, "--db", db, "--work", str(work)], env=env, check=True, cwd=ROOT
            )
            r = json.loads((work / "out" / "trainer.json").read_text())
            assert r["cells"] == 80 and r["handovers"] == 4000
            assert len(r["scale"]["runs"]) == 2 and r["scale"]["validation_same_in_every_run"]
            assert r["scale"]["database"]["seeded_this_run"] is (i == 1)
            runs = r["scale"]["runs"]
            assert runs[1]["db_bytes_before"] >= runs[0]["db_bytes_before"] > 0
            assert all(run["peak_tree_pss_mib"] > 0 for run in runs)
        assert not (tmp_path / "never").exists()
        with psycopg.connect(f"{base}/{db}") as c:
            row = c.execute("SELECT count(*) FROM models").fetchone()
        assert row == (4,)
    finally:
        with psycopg.connect(f"{base}/postgres", autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def test_a_failed_run_keeps_its_pieces_and_a_lost_server_does_not_hide_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "scale-summary-0.json").write_text("{}")
    a = argparse.Namespace(keep=False)
    gone = "postgresql://postgres@127.0.0.1:1/postgres"  # nothing listens there
    tf._clean_up(a, ["trainerscale_gone"], gone, work, keep_work=True)
    assert (work / "scale-summary-0.json").exists()
    assert "could not drop database trainerscale_gone" in capsys.readouterr().err
    tf._clean_up(a, [], gone, work, keep_work=False)
    assert not work.exists()
