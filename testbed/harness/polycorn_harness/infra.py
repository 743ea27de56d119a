"""PostgreSQL + PostGIS, Kafka and Prometheus for real, through ``scripts/infra.sh``
(which knows how to install, start, wait for and stop them on this machine).

A set of servers is named by its environment: ``POLYCORN_INFRA_DIR`` (state) and
the ``POLYCORN_*_PORT`` variables. :func:`up` starts (or reuses) one and returns
the environment that reaches it (``POLYCORN_DATABASE_URL``,
``POLYCORN_KAFKA_BOOTSTRAP``, ...); pass that environment back to the other calls.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from polycorn_harness.topology import run


def environment(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """``os.environ`` with ``overrides`` and the variables that name the servers
    (``infra.sh env``), whether they run yet or not."""
    env = {**os.environ, **(overrides or {})}
    out = run(["bash", "scripts/infra.sh", "env"], env=env).stdout
    for line in out.splitlines():
        name, sep, val = line.removeprefix("export ").partition("=")
        if sep:
            env[name] = val.strip("'\"")
    return env


def start(env: Mapping[str, str], services: Sequence[str] = ()) -> None:
    """``infra.sh up [SERVICES]`` (every server when none is named): started, or reused
    when running, and waited for."""
    run(["bash", "scripts/infra.sh", "up", *services], env=dict(env), timeout=600)


def up(overrides: Mapping[str, str] | None = None, services: Sequence[str] = ()) -> dict[str, str]:
    """:func:`start`, then :func:`environment`."""
    start({**os.environ, **(overrides or {})}, services)
    return environment(overrides)


def restart(env: Mapping[str, str], service: str) -> None:
    """``infra.sh restart SERVICE`` (``pg``, ``kafka`` or ``prom``): back and ready."""
    run(["bash", "scripts/infra.sh", "restart", service], env=dict(env), timeout=600)


def wipe(env: Mapping[str, str]) -> None:
    """``infra.sh wipe``: the servers stopped and their state removed."""
    run(["bash", "scripts/infra.sh", "wipe"], env=dict(env), timeout=300)
