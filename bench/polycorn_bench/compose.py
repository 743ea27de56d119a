"""Compose one raw run directory out of several runs of ``make bench-hsr``.

A full run takes hours; when one phase of it turns out to be invalid (a testbed artefact) or a
link set did not run, that part is rerun on its own and composed with the rest instead of
rerunning everything. The composed directory is made of symbolic links to the runs' files, so
nothing is copied or edited, and its ``run.json`` says which run every part came from
(``composed_from``); the analysis reads it like any run. Usage (from the repository root)::

    uv run --project bench --locked python -m polycorn_bench.compose OUT_DIR --base RUN \\
        [--link-set NAME=RUN ...] [--phase PHASE=RUN ...]

* ``--base RUN``: every link set, trip and file of ``RUN``, and its ``run.json``.
* ``--link-set NAME=RUN``: link set ``NAME`` (its directory and its ``run.json`` entry) from
  ``RUN`` instead, or in addition.
* ``--phase PHASE=RUN``: in every link set of the result that ``RUN`` also has, the files of
  ``PHASE`` (``bulk``, ``im``, ``backlog``, ``concurrency``; per trip and scheme, metrics
  snapshots of the phase included) come from ``RUN``, and so does ``run.json``'s block of that
  phase. A trip or scheme that ``RUN`` lacks is an error: a composed run never mixes a phase's
  records of two runs silently.

Exit status 0, or 2 with a message when a run is unusable or the parts do not fit.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

#: Files of each phase in a scheme directory (paths relative to it, shell patterns).
PHASE_FILES: dict[str, tuple[str, ...]] = {
    "bulk": ("bulk.jsonl",),
    "im": ("im-*.jsonl",),
    "backlog": ("backlog.jsonl",),
    "concurrency": ("concurrency-*", "logs/concurrency-*"),
}


#: Directories of a trip that are not schemes: its link files and the budget sweep.
NOT_SCHEMES = frozenset({"trip", "sweep"})


class ComposeError(Exception):
    """The runs cannot be composed as asked."""


def _load(run: Path) -> dict[str, Any]:
    try:
        meta = json.loads((run / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ComposeError(f"{run}: unusable run.json: {e}") from e
    if not isinstance(meta, dict) or not isinstance(meta.get("link_sets"), dict):
        raise ComposeError(f"{run}/run.json: no link_sets")
    return meta


def _phase_of(rel: str) -> str | None:
    for phase, patterns in PHASE_FILES.items():
        if any(fnmatch(rel, p) for p in patterns):
            return phase
    return None


def _link_tree(src: Path, dst: Path, phases: dict[str, Path], rel: Path = Path()) -> None:
    """Mirror ``src`` into ``dst`` with symbolic links; a file of a phase in ``phases`` links to
    the same path under that run's link set directory instead (which must have it)."""
    dst.mkdir(parents=True, exist_ok=True)
    for entry in sorted(src.iterdir()):
        r = rel / entry.name
        if entry.is_dir():
            _link_tree(entry, dst / entry.name, phases, r)
            continue
        # rel = TRIP/SCHEME/...; the phase patterns are relative to the scheme directory.
        scheme_file = len(r.parts) > 2 and r.parts[1] not in NOT_SCHEMES
        in_scheme = Path(*r.parts[2:]).as_posix() if scheme_file else ""
        phase = _phase_of(in_scheme) if in_scheme else None
        if phase in phases:
            continue  # linked from the phase's run below
        (dst / entry.name).symlink_to(entry.resolve())
    for phase, other in phases.items():
        if len(rel.parts) != 2 or rel.parts[1] in NOT_SCHEMES:
            continue
        # A scheme directory: link the phase's files of the other run.
        theirs = other / rel
        if not theirs.is_dir():
            raise ComposeError(f"{theirs}: missing (phase {phase} of {rel} must come from there)")
        found = False  # a record file, not only snapshots
        for pattern in PHASE_FILES[phase]:
            for f in sorted(theirs.glob(pattern)):
                found = found or "/" not in pattern
                target = dst / f.relative_to(theirs)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.symlink_to(f.resolve())
        if not found:
            raise ComposeError(f"{theirs}: no {phase} records")


def compose(
    out: Path, base: Path, link_sets: dict[str, Path], phases: dict[str, Path]
) -> dict[str, Any]:
    """Build ``out`` (which must not exist yet); returns its ``run.json``."""
    if out.exists():
        raise ComposeError(f"{out} exists: compose into a new directory")
    unknown = sorted(set(phases) - set(PHASE_FILES))
    if unknown:
        raise ComposeError(f"unknown phase(s) {unknown}: use {sorted(PHASE_FILES)}")
    meta = _load(base)
    metas = {run: _load(run) for run in {*link_sets.values(), *phases.values()}}
    sets: dict[str, tuple[Path, dict[str, Any]]] = {
        name: (base, entry) for name, entry in meta["link_sets"].items()
    }
    for name, run in link_sets.items():
        entry = metas[run]["link_sets"].get(name)
        if not isinstance(entry, dict):
            raise ComposeError(f"{run}/run.json has no link set {name!r}")
        sets[name] = (run, entry)
    composed_from: list[dict[str, Any]] = [
        {"run": str(base.resolve()), "commit": meta.get("commit"), "used_for": "the rest"}
    ]
    for name, run in link_sets.items():
        composed_from.append(
            {"run": str(run.resolve()), "commit": metas[run].get("commit"), "used_for": name}
        )
    for phase, run in phases.items():
        composed_from.append(
            {
                "run": str(run.resolve()),
                "commit": metas[run].get("commit"),
                "used_for": f"phase {phase}",
            }
        )
        if phase in metas[run]:
            meta[phase] = metas[run][phase]
    out.mkdir(parents=True)
    try:
        for name, (run, entry) in sets.items():
            mine = {p: r / name for p, r in phases.items() if name in metas[r]["link_sets"]}
            src = run / name
            if not src.is_dir():
                raise ComposeError(f"{src}: missing link set directory")
            for trip in entry.get("trips", []):
                if not (src / str(trip)).is_dir():
                    raise ComposeError(f"{src / str(trip)}: missing trip directory")
            _link_tree(src, out / name, mine)
    except ComposeError:
        shutil.rmtree(out)  # nothing half-built left behind (links only, never their targets)
        raise
    given = meta.get("phases")
    phase_list: list[Any] = list(given) if isinstance(given, list) else []
    for m in metas.values():
        for ph in m.get("phases") or []:
            if ph not in phase_list:
                phase_list.append(ph)
    meta["phases"] = phase_list
    meta["link_sets"] = {name: entry for name, (_, entry) in sets.items()}
    meta["composed_from"] = composed_from
    (out / "run.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    return meta


def _pairs(values: list[str], what: str) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for v in values:
        key, sep, path = v.partition("=")
        if not sep or not key or not path:
            raise ComposeError(f"--{what} {v!r}: use NAME=RUN_DIR")
        out[key] = Path(path)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="polycorn_bench.compose", description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path, help="new directory for the composed run")
    p.add_argument("--base", type=Path, required=True, help="run that gives everything else")
    p.add_argument("--link-set", action="append", default=[], help="NAME=RUN_DIR")
    p.add_argument("--phase", action="append", default=[], help="PHASE=RUN_DIR")
    args = p.parse_args(argv)
    try:
        meta = compose(
            args.out, args.base, _pairs(args.link_set, "link-set"), _pairs(args.phase, "phase")
        )
    except ComposeError as e:
        print(f"polycorn_bench.compose: {e}", file=sys.stderr)
        return 2
    for part in meta["composed_from"]:
        print(f"{part['used_for']}: {part['run']} (commit {part['commit']})")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
