#!/usr/bin/env python3
"""Do `cargo build` and `cargo test` compile the same crates alike?

Cargo turns a dependency's features on when anything in the build asks for
them, and a test build also has the dev-dependencies asking (proptest's regex
support, criterion's serde, tokio's test clock). Every crate whose features
then differ, and every crate above it (hyper, axum, the relay, the proxy...),
is compiled twice: once for the tests, once for the binaries. This check
lists the packages whose features differ between the two graphs
(`cargo tree` without and with dev-dependencies: a package the binaries
build with features the test build does not); the fix is to turn the same
features on for the binaries (crates/net/Cargo.toml) or to drop what needs
them. Packages that only the tests use are fine: they are compiled once.

Exits 1 with the differing packages, 0 when there are none.
"""

# ruff: noqa: S603  (runs cargo)
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(r"^(?P<pkg>\S+ v\S+(?: \([^)]*\))?) \[(?P<features>[^\]]*)\]")


def graph(edges: str) -> dict[str, set[frozenset[str]]]:
    out = subprocess.run(
        [
            os.environ.get("CARGO", "cargo"),
            "tree",
            "--workspace",
            "--locked",
            "-e",
            edges,
            "--prefix",
            "none",
            "-f",
            "{p} [{f}]",
        ],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        sys.exit(f"check_features: cargo tree failed:\n{out.stderr}")
    found: dict[str, set[frozenset[str]]] = {}
    for line in out.stdout.splitlines():
        m = LINE.match(line)
        if m:
            features = frozenset(f for f in m["features"].split(",") if f)
            found.setdefault(m["pkg"], set()).add(features)
    return found


def main() -> int:
    build = graph("normal,build")
    test = graph("normal,build,dev")
    # A feature set of the binaries' build that the test build lacks was
    # replaced; a set only the test build has is a crate only the tests use
    # (or use on the other side of build scripts and proc-macros).
    differ = sorted(p for p in build if not build[p] <= test.get(p, set()))
    for p in differ:
        added = set().union(*test.get(p, set())) - set().union(*build[p])
        print(f"check_features: {p}: the test build adds {sorted(added) or 'another feature set'}")
    if differ:
        print(
            "check_features: these crates (and all above them) would be compiled twice;"
            " turn the same features on for the binaries (crates/net/Cargo.toml)"
        )
        return 1
    print(f"check_features: {len(build)} packages, built alike by cargo build and cargo test")
    return 0


if __name__ == "__main__":
    sys.exit(main())
