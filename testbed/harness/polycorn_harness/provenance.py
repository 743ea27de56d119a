"""Where a benchmark result came from: the commit it was made at, and whether the working
tree held anything that commit does not.

Every driver that writes a result into ``bench/out`` goes through this module, so that a
number the docs quote traces back to exactly one commit of clean code (docs/benchmarks.md,
"Provenance"):

- :func:`start`, before any work: HEAD and the tree's state. It refuses
  (:class:`DirtyTree`) when a result is to go into the repository's ``bench/out`` and the
  tree is not clean, unless ``POLYCORN_BENCH_ALLOW_DIRTY=1``. Results written anywhere
  else (a temporary directory, ``BENCH_OUT=/tmp/x``, tests) are always allowed.
- :meth:`Run.fields` (:meth:`Run.stamp`), when writing: the tree is looked at again, and
  every result carries at its top level ``commit`` (HEAD at the start, 40 hex digits)
  and ``clean``; when not clean also ``dirty_paths`` (the first :data:`MAX_PATHS`) and
  ``dirty_allowed: true``, and ``commit_at_end`` when HEAD moved during the run.
- :func:`resume`: a run started in another process (the analysis of a raw run, a report
  folded from pieces) goes on from the fields recorded at its start.

Clean: no modified, staged or untracked (not ignored) file outside :data:`IGNORED`
(``bench/out/``, ``docs/img/``): the results and their plots go there, so a run that
writes several results, or a result not yet committed, does not make the next one dirty.

Standard library only, and nothing else of the harness: the stdlib-only scripts
(scripts/fuzz.py, validate_tracegen.py, bench/tools/report.py) and the analysis project
(bench/), which does not install the harness, import it with ``testbed/harness`` on their
path. ``python3 provenance.py start OUT...`` checks from a shell (a make recipe) and
prints the start's fields for :data:`START`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The repository this module is part of.
ROOT = Path(__file__).resolve().parents[3]
#: Set to 1: write into bench/out from a tree that is not clean (the result says so).
ALLOW_DIRTY = "POLYCORN_BENCH_ALLOW_DIRTY"
#: The fields of a run started by another process (``provenance.py start``), as JSON:
#: :func:`start` goes on from them instead of starting anew.
START = "POLYCORN_BENCH_START"
#: Where results and their plots are written: changes there leave a tree clean.
IGNORED = ("bench/out/", "docs/img/")
#: At most this many paths in ``dirty_paths``.
MAX_PATHS = 50
#: The top-level fields this module writes into a result.
KEYS = ("commit", "clean", "dirty_paths", "dirty_allowed", "commit_at_end")


class DirtyTree(SystemExit):
    """A result meant for bench/out from a tree that is not clean: uncaught, the program
    exits 1 with the message."""


@dataclass(frozen=True)
class TreeState:
    """HEAD (None outside a git checkout) and the paths that make the tree dirty."""

    commit: str | None
    dirty: tuple[str, ...] = ()
    clean: bool = False


def _git(root: Path, *args: str) -> str | None:
    try:
        r = subprocess.run(
            ["git", "-C", str(root), *args],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError:
        return None
    return r.stdout if r.returncode == 0 else None


def dirty_paths(porcelain: str) -> tuple[str, ...]:
    """The paths of ``git status --porcelain=v1 -z`` output outside :data:`IGNORED`
    (a rename or copy counts both its paths)."""
    entries = porcelain.split("\0")
    out: set[str] = set()
    i = 0
    while i < len(entries):
        entry = entries[i]
        i += 1
        if len(entry) < 4:
            continue
        paths = [entry[3:]]
        if "R" in entry[:2] or "C" in entry[:2]:
            paths.append(entries[i] if i < len(entries) else "")
            i += 1
        out.update(p for p in paths if p and not p.startswith(IGNORED))
    return tuple(sorted(out))


def tree_state(root: Path = ROOT) -> TreeState:
    """HEAD of ``root`` and whether its working tree is clean."""
    head = _git(root, "rev-parse", "--verify", "HEAD")
    status = _git(root, "status", "--porcelain=v1", "-z", "--untracked-files=all")
    if head is None or status is None:
        return TreeState(None)
    dirty = dirty_paths(status)
    return TreeState(head.strip(), dirty, clean=not dirty)


def state_of(fields: Mapping[str, Any]) -> TreeState:
    """The start a result (or a run.json) recorded: clean only if it says so."""
    commit = fields.get("commit")
    paths = fields.get("dirty_paths")
    return TreeState(
        commit if isinstance(commit, str) else None,
        tuple(str(p) for p in paths) if isinstance(paths, list) else (),
        clean=fields.get("clean") is True and not fields.get("commit_at_end"),
    )


def fields_of(start: TreeState, end: TreeState) -> dict[str, Any]:
    """The top-level fields of a result begun at ``start`` and written at ``end``."""
    out: dict[str, Any] = {"commit": start.commit}
    out["clean"] = start.clean and end.clean and end.commit == start.commit
    if not out["clean"]:
        out["dirty_paths"] = sorted(set(start.dirty) | set(end.dirty))[:MAX_PATHS]
        out["dirty_allowed"] = True
    if end.commit != start.commit:
        out["commit_at_end"] = end.commit
    return out


def into_bench_out(path: Path | str, root: Path = ROOT) -> bool:
    """Whether ``path`` (a file or a directory) is in the repository's ``bench/out``
    (``root``'s or this checkout's)."""
    p = Path(path).resolve()
    return any(p.is_relative_to((r / "bench" / "out").resolve()) for r in {root, ROOT})


def _listed(paths: tuple[str, ...] | list[str], n: int = 5) -> str:
    return ", ".join(paths[:n]) + (" …" if len(paths) > n else "")


def why_not_clean(start: TreeState, end: TreeState) -> str:
    """What keeps a result of ``start`` written at ``end`` from being clean."""
    if end.commit is None:
        return "the working tree is not a git checkout (or git failed)"
    reasons = []
    if end.dirty:
        reasons.append(f"the working tree has uncommitted changes: {_listed(end.dirty)}")
    if start.commit != end.commit:
        reasons.append(f"the run started at commit {start.commit}, HEAD is {end.commit}")
    elif not start.clean and start != end:
        started = f": {_listed(start.dirty)}" if start.dirty else ""
        reasons.append(f"the run started from a tree that was not clean{started}")
    return "; ".join(reasons)


@dataclass(frozen=True)
class Run:
    """A run's start, and the repository it runs from."""

    start: TreeState
    root: Path = field(default=ROOT)

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any], root: Path = ROOT) -> Run:
        return cls(state_of(fields), root)

    def started(self) -> dict[str, Any]:
        """The fields of the start, for the record a later process resumes from (a run's
        run.json, :data:`START`)."""
        return fields_of(self.start, self.start)

    def fields(self) -> dict[str, Any]:
        """The top-level fields of a result written now (the tree looked at again)."""
        return fields_of(self.start, tree_state(self.root))

    def stamp(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        """``doc`` with :meth:`fields` first (any it had replaced)."""
        return self.fields() | {k: v for k, v in doc.items() if k not in KEYS}


def _check(run: Run, end: TreeState, outs: tuple[Path | str, ...], env: Mapping[str, str]) -> None:
    if env.get(ALLOW_DIRTY) == "1" or fields_of(run.start, end)["clean"]:
        return
    into = [o for o in outs if into_bench_out(o, run.root)]
    if into:
        fix = "commit them" if end.dirty else "run it again from one clean commit"
        raise DirtyTree(
            f"{into[0]}: {why_not_clean(run.start, end)}; {fix}, or set "
            f"{ALLOW_DIRTY}=1 to write a result marked clean: false"
        )


def start(*outs: Path | str, root: Path = ROOT, environ: Mapping[str, str] | None = None) -> Run:
    """A run that will write ``outs`` (files or directories): refuses (:class:`DirtyTree`)
    when one is in bench/out and the tree is not clean, unless :data:`ALLOW_DIRTY`. With
    :data:`START` set, the run goes on from the fields there, already checked."""
    env = os.environ if environ is None else environ
    recorded = env.get(START)
    if recorded:
        return Run.from_fields(json.loads(recorded), root)
    run = Run(tree_state(root), root)
    _check(run, run.start, outs, env)
    return run


def resume(
    fields: Mapping[str, Any],
    *outs: Path | str,
    root: Path = ROOT,
    environ: Mapping[str, str] | None = None,
) -> Run:
    """A run begun elsewhere with the recorded ``fields`` (its run.json, its meta), whose
    results ``outs`` are written now: refuses as :func:`start` does when a result written
    now would not be clean (HEAD moved since, the tree is dirty now or was then). A driver
    that hands its run to another process to write sets :data:`ALLOW_DIRTY` for it: it
    checked at its start, and a change during the run is recorded, not refused."""
    run = Run.from_fields(fields, root)
    _check(run, tree_state(root), outs, os.environ if environ is None else environ)
    return run


def describe(doc: Mapping[str, Any]) -> str:
    """One sentence for a Markdown report: the commit and whether the tree was clean."""
    commit = doc.get("commit")
    if "clean" not in doc:
        return f"Commit `{commit}`; whether the tree was clean is not recorded."
    if doc["clean"] is True:
        return f"Commit `{commit}`, clean working tree."
    text = f"Commit `{commit}`, **not clean**"
    paths = doc.get("dirty_paths") or []
    if paths:
        text += f" (uncommitted changes: {_listed(paths)})"
    if doc.get("commit_at_end"):
        text += f"; HEAD was `{doc['commit_at_end']}` at the end"
    return text + "."


def main(argv: list[str]) -> int:
    """``start OUT...``: the check of :func:`start`, from a shell; prints the fields."""
    if len(argv) < 3 or argv[1] != "start":
        print(f"usage: {argv[0]} start OUT...", file=sys.stderr)
        return 2
    print(json.dumps(start(*argv[2:]).started()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
