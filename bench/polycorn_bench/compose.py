"""Compose one raw run directory out of several runs of ``make bench-hsr``.

A full run takes hours; when one phase of it turns out to be invalid (a testbed artefact) or a
link set did not run, that part is rerun on its own and composed with the rest instead of
rerunning everything. The composed directory is made of symbolic links to the runs' files, so
nothing is copied or edited, and its ``run.json`` says which run every part came from
(``composed_from``); the analysis reads it like any run. Its provenance is the base's
(``commit``, ``clean``), and clean only if every part is a clean run of that same commit: parts
of other commits make a result that no single commit gave. Usage (from the repository root)::

    uv run --project bench --locked python -m polycorn_bench.compose OUT_DIR --base RUN \\
        [--link-set NAME=RUN ...] [--phase PHASE=RUN ...] [--drop PHASE@LINK_SET ...]

* ``--base RUN``: every link set, trip and file of ``RUN``, and its ``run.json``.
* ``--link-set NAME=RUN``: link set ``NAME`` (its directory and its ``run.json`` entry) from
  ``RUN`` instead, or in addition.
* ``--phase PHASE=RUN``: in every link set of the result that ``RUN`` also has, the files of
  ``PHASE`` (``bulk``, ``im``, ``backlog``, ``concurrency``, or one window ``concurrency-<N>``;
  per trip and scheme, metrics snapshots of the phase included) come only from ``RUN``: a
  scheme ``RUN`` left out has no records of that phase (the phase's records of two runs are
  never mixed), and a scheme directory of ``RUN`` without them is an error. ``run.json``'s
  block of a whole phase comes from ``RUN`` too.
* ``--drop PHASE@LINK_SET``: leave that phase's files of that link set out (a window found
  invalid and not rerun).

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

#: Files of each phase in a scheme directory (paths relative to it, shell patterns); a window of
#: the concurrency phase alone is ``concurrency-<N>`` (:func:`phase_patterns`).
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


def phase_patterns(phase: str) -> tuple[str, ...]:
    """The file patterns of ``phase``: one of :data:`PHASE_FILES`, or ``concurrency-<N>``."""
    if phase in PHASE_FILES:
        return PHASE_FILES[phase]
    n = phase.removeprefix("concurrency-")
    if n != phase and n.isdigit():
        return (f"concurrency-{n}.*", f"logs/concurrency-{n}.*")
    raise ComposeError(f"unknown phase {phase!r}: use {sorted(PHASE_FILES)} or concurrency-<N>")


def _load(run: Path) -> dict[str, Any]:
    try:
        meta = json.loads((run / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ComposeError(f"{run}: unusable run.json: {e}") from e
    if not isinstance(meta, dict) or not isinstance(meta.get("link_sets"), dict):
        raise ComposeError(f"{run}/run.json: no link_sets")
    return meta


def _matches(rel: str, phases: list[str]) -> bool:
    return any(fnmatch(rel, p) for phase in phases for p in phase_patterns(phase))


def _link_tree(
    src: Path, dst: Path, phases: dict[str, Path], dropped: list[str], rel: Path = Path()
) -> None:
    """Mirror ``src`` into ``dst`` with symbolic links, leaving out the files of ``dropped``
    phases and of the phases in ``phases``, whose files come from that run's link set directory
    instead (every scheme directory it has must hold the phase's records)."""
    dst.mkdir(parents=True, exist_ok=True)
    for entry in sorted(src.iterdir()):
        r = rel / entry.name
        if entry.is_dir():
            _link_tree(entry, dst / entry.name, phases, dropped, r)
            continue
        # rel = TRIP/SCHEME/...; the phase patterns are relative to the scheme directory.
        in_scheme = len(r.parts) > 2 and r.parts[1] not in NOT_SCHEMES
        if in_scheme and _matches(Path(*r.parts[2:]).as_posix(), [*phases, *dropped]):
            continue
        (dst / entry.name).symlink_to(entry.resolve())
    if len(rel.parts) != 2 or rel.parts[1] in NOT_SCHEMES:
        return
    for phase, other in phases.items():
        theirs = other / rel
        if not theirs.is_dir():
            continue  # a scheme the rerun left out: no records of this phase
        found = False  # a record file, not only snapshots
        for pattern in phase_patterns(phase):
            for f in sorted(theirs.glob(pattern)):
                found = found or "/" not in pattern
                target = dst / f.relative_to(theirs)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.symlink_to(f.resolve())
        if not found:
            raise ComposeError(f"{theirs}: no {phase} records")


def compose(
    out: Path,
    base: Path,
    link_sets: dict[str, Path],
    phases: dict[str, Path],
    drops: list[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """Build ``out`` (which must not exist yet); returns its ``run.json``. ``drops``: (phase,
    link set) pairs whose files are left out (a window found invalid and not rerun)."""
    if out.exists():
        raise ComposeError(f"{out} exists: compose into a new directory")
    drops = drops or []
    for phase in [*phases, *(p for p, _ in drops)]:
        phase_patterns(phase)
    meta = _load(base)
    metas = {run: _load(run) for run in {*link_sets.values(), *phases.values()}}
    sets = _link_set_sources(base, meta, metas, link_sets)
    for phase, ls in drops:
        if ls not in sets:
            raise ComposeError(f"--drop {phase}@{ls}: no link set {ls!r}")
    composed_from = _composed_from(
        base, meta, metas, link_sets=link_sets, phases=phases, drops=drops
    )
    for phase, run in phases.items():
        if phase in metas[run]:
            meta[phase] = metas[run][phase]
    out.mkdir(parents=True)
    try:
        for name, (run, entry) in sets.items():
            mine = {p: r / name for p, r in phases.items() if name in metas[r]["link_sets"]}
            dropped = [p for p, ls in drops if ls == name]
            src = run / name
            _check_link_set(src, entry)
            _link_tree(src, out / name, mine, dropped)
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
    meta |= _provenance(meta, [metas[r] for r in {*link_sets.values(), *phases.values()}])
    (out / "run.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    return meta


def _link_set_sources(
    base: Path,
    meta: dict[str, Any],
    metas: dict[Path, dict[str, Any]],
    link_sets: dict[str, Path],
) -> dict[str, tuple[Path, dict[str, Any]]]:
    """Link set -> (the run it comes from, its entry in that run's run.json): the base's,
    replaced by those ``link_sets`` takes from other runs."""
    sets: dict[str, tuple[Path, dict[str, Any]]] = {
        name: (base, entry) for name, entry in meta["link_sets"].items()
    }
    for name, run in link_sets.items():
        entry = metas[run]["link_sets"].get(name)
        if not isinstance(entry, dict):
            raise ComposeError(f"{run}/run.json has no link set {name!r}")
        sets[name] = (run, entry)
    return sets


def _composed_from(
    base: Path,
    meta: dict[str, Any],
    metas: dict[Path, dict[str, Any]],
    *,
    link_sets: dict[str, Path],
    phases: dict[str, Path],
    drops: list[tuple[str, str]],
) -> list[dict[str, Any]]:
    """Where each part of the composed run comes from (its ``composed_from``)."""
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
                "schemes": metas[run].get("schemes"),
            }
        )
    for phase, ls in drops:
        composed_from.append({"run": None, "commit": None, "used_for": f"dropped {phase}@{ls}"})
    return composed_from


def _provenance(base: dict[str, Any], parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The composed run's start: the base's, not clean unless every part is a clean run of the
    base's commit."""
    out: dict[str, Any] = {"commit": base.get("commit")}
    out["clean"] = all(m.get("clean") is True for m in [base, *parts]) and all(
        m.get("commit") == base.get("commit") for m in parts
    )
    if not out["clean"]:
        paths = {p for m in [base, *parts] for p in m.get("dirty_paths") or []}
        out["dirty_paths"] = sorted(paths)
        out["dirty_allowed"] = True
    return out


def _check_link_set(src: Path, entry: dict[str, Any]) -> None:
    """A link set's directory and every trip its entry lists are there."""
    if not src.is_dir():
        raise ComposeError(f"{src}: missing link set directory")
    for trip in entry.get("trips", []):
        if not (src / str(trip)).is_dir():
            raise ComposeError(f"{src / str(trip)}: missing trip directory")


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
    p.add_argument("--drop", action="append", default=[], help="PHASE@LINK_SET")
    args = p.parse_args(argv)
    try:
        drops = []
        for d in args.drop:
            phase, sep, ls = d.partition("@")
            if not sep or not phase or not ls:
                raise ComposeError(f"--drop {d!r}: use PHASE@LINK_SET")
            drops.append((phase, ls))
        meta = compose(
            args.out,
            args.base,
            _pairs(args.link_set, "link-set"),
            _pairs(args.phase, "phase"),
            drops,
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
