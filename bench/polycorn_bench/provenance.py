"""Where a result came from: the harness's helper (testbed/harness/polycorn_harness/
provenance.py), which every driver writing into ``bench/out`` uses. It is standard library
only; this project does not install the harness, so it is imported from the tree.

The analysis of a raw run writes a result of that run: it resumes from the start the run
recorded in its ``run.json`` (``commit``, ``clean``, ``dirty_paths``), and the tree is looked
at again when writing, so a result analysed at another commit than the run's says so.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

_HARNESS = Path(__file__).resolve().parents[2] / "testbed" / "harness"
if str(_HARNESS) not in sys.path:
    sys.path.append(str(_HARNESS))

from polycorn_harness.provenance import (  # noqa: E402
    ALLOW_DIRTY,
    KEYS,
    DirtyTree,
    Run,
    describe,
    resume,
    start,
)

__all__ = ["ALLOW_DIRTY", "KEYS", "DirtyTree", "Run", "describe", "of_run", "resume", "start"]


def of_run(run_dir: Path, *outs: Path) -> Run:
    """The provenance of results computed from the raw run ``run_dir``, written to ``outs``:
    the start its ``run.json`` recorded (none: not clean), resumed (:func:`resume`)."""
    meta: Any = {}
    with contextlib.suppress(OSError, ValueError):
        meta = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    return resume(meta if isinstance(meta, dict) else {}, *outs)
