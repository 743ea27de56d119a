"""``make bench-hsr`` end to end on its smallest profile (ci), and its
teardown after Ctrl-C. Apart from the topology tests (test_hsr_testbed.py)
so that ``make test`` runs the two side by side: these use namespaces of
their own (prefix hbit), and the other module's clean-up before each of its
tests must not see them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from polycorn_harness import ROOT
from polycorn_harness.metrics import value
from polycorn_harness.topology import leftovers
from polycorn_harness.wait import wait_until


def _bench(tmp: Path, log: Path, schemes: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "BENCH_PREFIX": "hbit",
        "BENCH_WORK": str(tmp),
        "PROFILE": "ci",
        "SCHEMES": schemes,
    }
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "polycorn_benchrun.hsr"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=out,
        )


def test_bench_hsr_ci_runs_every_phase_and_leaves_nothing(tmp_path: Path) -> None:
    """make bench-hsr PROFILE=ci: minrtt, hrsch (with a stand-in failure table
    and the radio replay), kernel-mptcp, kernel-mptcp-conn and direct-c0 (no
    tunnel) side by side: results for every size, the backlog, concurrency and
    budget-sweep phases, each carrier's share used, no budget exceeded, nothing
    left behind."""
    log = tmp_path / "bench.log"
    schemes = "minrtt hrsch kernel-mptcp kernel-mptcp-conn direct-c0"
    proc = _bench(tmp_path / "bench", log, schemes)
    assert proc.wait(timeout=3600) == 0, log.read_text()[-3000:]
    doc = json.loads((tmp_path / "bench/out/hsr.json").read_text())
    assert doc["profile"] == "ci" and len(doc["bulk"]) == 5 and len(doc["im"]) == 5
    assert (
        min(per[size]["n"] for per in doc["bulk"].values() for size in ("256KB", "1MB", "4MB")) >= 1
    )
    assert doc["bulk"]["minrtt"]["overall"]["ratio_vs_minrtt"] == 1
    # hrsch ran with the stand-in table and the relay's radio replay: the proxy
    # loaded the table, got the train's telemetry and exports hof-reject's counters.
    run_json = json.loads((tmp_path / "bench/run-ci/run.json").read_text())
    assert run_json["failure_table"]["previous_trips"] >= 1
    # The result carries the run's provenance, the start run.json recorded.
    assert doc["commit"] == run_json["commit"] and isinstance(doc["clean"], bool)
    (m,) = (tmp_path / "bench/run-ci/hsr").glob("*/hrsch/logs/proxy.metrics")
    text = m.read_text()
    assert value(text, "polycorn_failure_table_loads_total") == 1
    assert (value(text, "polycorn_telemetry_received_records_total") or 0) > 0
    assert (
        value(
            text,
            "polycorn_sched_schedulerlet_events_total",
            schedulerlet="hof-reject",
            event="rejections",
        )
        is not None
    )
    # The backlog: an always-busy download for every scheme, with bytes.
    assert all(b["n"] >= 1 and b["bytes"] > 0 for b in doc["backlog"].values()), doc["backlog"]
    # Concurrency (1, 10, 100 passengers) and the budget sweep; no budget exceeded.
    conc = doc["concurrency"]
    assert sorted(conc) == ["1", "10", "100"]
    assert all(c["minrtt"]["goodput_mbps_total"] > 0 for c in conc.values())
    assert 0 < conc["100"]["minrtt"]["jain"] <= 1
    assert len(doc["budget_sweep"]) >= 2
    assert all(s["minrtt"]["backlog_goodput_mbps"] > 0 for s in doc["budget_sweep"].values())
    assert doc["budget_check"]["ok"] is True
    # Every scheme's share of each carrier, from the train's counters: the direct
    # scheme's traffic crossed carrier 0's emulated link and nothing else.
    share = doc["capacity_share"]
    assert sorted(share) == sorted(schemes.split())
    assert all(s["carriers"] and s["goodput_share"]["mean"] > 0 for s in share.values()), share
    assert share["direct-c0"]["carriers"]["0"]["mean"] > 0.05
    assert share["direct-c0"]["carriers"]["1"]["mean"] < 0.001
    assert doc["extra_traffic"]["direct-c0"] is None
    assert not any("direct-c0" in e for e in doc["issues"]["examples"]), doc["issues"]
    assert [x for k in range(8) for x in leftovers(f"hbit{k}")] == []


def test_ctrl_c_during_bench_hsr_tears_every_topology_down(tmp_path: Path) -> None:
    log = tmp_path / "bench-int.log"
    proc = _bench(tmp_path / "bench-int", log, "minrtt kernel-mptcp")
    try:
        wait_until(
            "bench-hsr started its load",
            lambda: "load from trip time" in log.read_text() or proc.poll() is not None,
            600,
        )
        assert proc.poll() is None, log.read_text()[-2000:]
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=300)
    assert rc != 0
    assert leftovers("hbit0") + leftovers("hbit1") == []
