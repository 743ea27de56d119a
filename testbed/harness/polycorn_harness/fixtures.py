"""pytest fixtures of the namespace testbed. A suite's ``conftest.py`` loads
them with ``pytest_plugins = ["polycorn_harness.fixtures"]``."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from polycorn_harness import ROOT
from polycorn_harness.topology import Topology, run

#: The release binaries the testbed runs.
BINARIES = (
    "polycorn-emu",
    "polycorn-relay",
    "polycorn-proxy",
    "polycorn-pki",
    "polycorn-loadgen",
    "polycorn-tracegen",
)


@pytest.fixture(scope="session")
def bin_dir() -> Path:
    """``$BIN`` or ``target/release``, built first when a binary is missing."""
    d = Path(os.environ.get("BIN") or ROOT / "target" / "release")
    if not all((d / b).is_file() for b in BINARIES):
        subprocess.run(
            ["cargo", "build", "--release", "--locked", "--workspace"], cwd=ROOT, check=True
        )
    return d


@pytest.fixture(scope="session")
def make_trip(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``make_trip(route_seed, trip_seed, duration_s, ...)``: a generated trip's
    directory (``polycorn-tracegen generate``), made once per arguments."""
    made: dict[tuple[object, ...], Path] = {}

    def make(route_seed: int, trip_seed: int, duration_s: int, *extra: str) -> Path:
        key = (route_seed, trip_seed, duration_s, *extra)
        if key not in made:
            out = tmp_path_factory.mktemp(f"trip-r{route_seed}-t{trip_seed}")
            run(
                [
                    str(bin_dir / "polycorn-tracegen"),
                    "generate",
                    "--route-seed",
                    str(route_seed),
                    "--trip-seed",
                    str(trip_seed),
                    "--duration-s",
                    str(duration_s),
                    "--carriers",
                    "2",
                    *extra,
                    "--out",
                    str(out),
                ]
            )
            made[key] = out
        return made[key]

    return make


@pytest.fixture
def topologies(bin_dir: Path) -> Iterator[Callable[[str, Path], Topology]]:
    """``topologies(prefix, trip)``: a :class:`Topology` (not yet up); every
    one made is torn down after the test, whatever happened."""
    made: list[Topology] = []

    def make(prefix: str, trip: Path) -> Topology:
        t = Topology(prefix, trip, bin_dir)
        made.append(t)
        return t

    yield make
    for t in made:
        t.down()
