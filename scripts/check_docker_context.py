#!/usr/bin/env python3
"""Does Dockerfile.rust copy every Cargo workspace member into its build stage?

    check_docker_context.py [ROOT]

Cargo reads the manifest of every workspace member before it builds anything, even with
``-p`` naming a few packages, so an image build fails when one member's directory is
missing from the build stage, although no image needs that member's binary. Nothing else
notices before ``make test-compose`` builds the images (minutes into the last stage of
``make test``), so this static check compares the members in Cargo.toml with the ``COPY``
sources of the stage that runs ``cargo build``: a member is covered when a source is the
member's directory or one above it (``COPY crates crates`` covers ``crates/core``).

Exits 1 naming each member no COPY covers, 0 otherwise.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path, PurePosixPath

DOCKERFILE = "Dockerfile.rust"
#: A ``COPY`` instruction without ``--from`` (those copy from another stage, not the context).
COPY = re.compile(r"^\s*COPY\s+(?!.*--from)(?P<args>.+)$", re.IGNORECASE)
FROM = re.compile(r"^\s*FROM\s", re.IGNORECASE)


def members(root: Path) -> list[str]:
    manifest = tomllib.loads((root / "Cargo.toml").read_text())
    return list(manifest.get("workspace", {}).get("members", []))


def build_stage_sources(dockerfile: str) -> list[PurePosixPath] | None:
    """The context paths copied into the stage that runs ``cargo build``, None if no stage does."""
    stages: list[list[str]] = []
    for line in dockerfile.splitlines():
        if FROM.match(line):
            stages.append([])
        if stages:
            stages[-1].append(line)
    for stage in stages:
        if not any("cargo build" in line for line in stage):
            continue
        sources: list[PurePosixPath] = []
        for line in stage:
            m = COPY.match(line)
            if m is None:
                continue
            words = [w for w in m.group("args").split() if not w.startswith("--")]
            # The last word is the destination; every other word is a source.
            sources.extend(PurePosixPath(w.rstrip("/")) for w in words[:-1])
        return sources
    return None


def check(root: Path) -> list[str]:
    path = root / DOCKERFILE
    sources = build_stage_sources(path.read_text())
    if sources is None:
        return [f"{DOCKERFILE}: no stage runs `cargo build`"]
    problems = []
    for member in members(root):
        m = PurePosixPath(member)
        if not any(s == m or s in m.parents or str(s) == "." for s in sources):
            problems.append(
                f"{DOCKERFILE}: workspace member {member} is not copied into the build stage"
                f" (cargo reads every member's manifest; add `COPY {member} {member}`)"
            )
    return problems


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else Path(__file__).resolve().parent.parent).resolve()
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"check_docker_context: {len(members(root))} workspace members copied by {DOCKERFILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
