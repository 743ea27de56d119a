"""Processes and pinned tools: stopping a process with a grace period, the versions
scripts/setup.sh pins."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time

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
