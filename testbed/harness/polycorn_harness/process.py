"""Processes and the tree: stopping a process with a grace period, the versions
scripts/setup.sh pins, the wall clock in ms, and the CPU tick counters of /proc the
benchmarks read. The commit a run starts from: :mod:`polycorn_harness.provenance`."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from pathlib import Path

from polycorn_harness import ROOT


def setup_var(name: str) -> str:
    """A pinned version of scripts/setup.sh (``NAME=value``)."""
    m = re.search(rf"^{name}=(\S+)$", (ROOT / "scripts" / "setup.sh").read_text(), re.M)
    if m is None:
        raise KeyError(f"scripts/setup.sh sets no {name}")
    return m.group(1).strip("'\"")


def stop_process(pid: int, grace_s: float = 5) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def now_ms() -> int:
    """Wall-clock UNIX time in ms (the testbed's trip epochs)."""
    return time.time_ns() // 1_000_000


def cpu_ticks(pid: int) -> int:
    """utime + stime of a process, all its threads, in clock ticks (/proc/PID/stat
    fields 14 and 15; the command name before them may hold spaces). OSError when the
    process is gone."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def process_tree(root: int) -> list[int]:
    """``root`` and its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def machine_busy_ticks() -> int:
    """Busy ticks of the whole machine (user + nice + system + irq + softirq + steal
    over every CPU and every namespace)."""
    cpu = Path("/proc/stat").read_text().splitlines()[0].split()
    return sum(int(cpu[i]) for i in (1, 2, 3, 6, 7, 8))
