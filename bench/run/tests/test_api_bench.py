"""``make bench-api``'s CPU accounting, without a database or a load."""

from __future__ import annotations

import os
import subprocess
import sys

from polycorn_benchrun import api
from polycorn_harness.process import process_tree


def test_cpu_per_request_counts_new_processes_from_zero_and_ended_ones_not_at_all() -> None:
    tck = os.sysconf("SC_CLK_TCK")
    before = {"api": {1: 100, 2: 50}, "postgres": {7: 10}}
    # Process 2 ended, 3 started in the window.
    after = {"api": {1: 100 + tck, 3: tck}, "postgres": {7: 10 + tck // 2}}
    got = api.cpu_ms_per_request(before, after, 1000)
    assert got == {"api": 2.0, "postgres": round(1000 * (tck // 2) / tck / 1000, 3), "total": 2.5}


def test_the_process_tree_holds_the_children() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        tree = process_tree(os.getpid())
        assert tree[0] == os.getpid()
        assert child.pid in tree
        snap = api.cpu_snapshot({"me": tree, "gone": [2**22 + 7]})
        assert os.getpid() in snap["me"] and snap["gone"] == {}
    finally:
        child.kill()
        child.wait()
