"""A stand-in for ``fit_many`` that takes long (test_stop.py): a worker running it
writes ``<pid>.started`` in the directory given as its ``params``, sleeps, and then
writes ``<pid>.done``. Its own module so that the forkserver's workers (and a
trainer started as a subprocess) can import it."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

SLEEP_S = 60.0


def slow_fit(cells: list[Any], params: Any) -> list[Any]:
    d = Path(str(params))
    (d / f"{os.getpid()}.started").touch()
    time.sleep(SLEEP_S)
    (d / f"{os.getpid()}.done").touch()
    return []


def alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
