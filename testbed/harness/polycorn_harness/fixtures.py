"""pytest fixtures of the namespace testbed, registered as a pytest plugin
(the package's ``pytest11`` entry point), so every suite has them."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from polycorn_harness import ROOT
from polycorn_harness.infra import up as infra_up
from polycorn_harness.topology import BINARIES, Topology, run

#: ``make_trip(route_seed, trip_seed, duration_s, *generate_args)``.
MakeTrip = Callable[..., Path]
#: ``topologies(prefix, trip)``.
Topologies = Callable[[str, Path], Topology]


def require_binaries(*names: str) -> Path:
    """``$POLYCORN_BIN`` or ``target/release``, where ``names`` must be: a test
    that needs one that is missing fails under CI (make test builds them
    first) and is skipped elsewhere (a developer's tree may not have them
    yet)."""
    d = Path(os.environ.get("POLYCORN_BIN", ROOT / "target" / "release"))
    missing = [b for b in names if not (d / b).is_file()]
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"{missing} missing in {d}")
        pytest.skip(f"{missing} missing in {d} (cargo build --release --locked)")
    return d


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
def topologies(bin_dir: Path) -> Iterator[Topologies]:
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


@pytest.fixture(scope="session")
def infra() -> dict[str, str]:
    """PostgreSQL + PostGIS, Kafka and Prometheus for real (``scripts/infra.sh
    up``: started, or reused when running, and waited for), and the
    environment that names them (``POLYCORN_DATABASE_URL``,
    ``POLYCORN_KAFKA_BOOTSTRAP``, ...). ``POLYCORN_INFRA_DIR`` and the
    ``POLYCORN_*_PORT`` variables choose another set of servers; a suite that
    restarts its servers starts its own with :func:`polycorn_harness.infra.up`."""
    return infra_up()
