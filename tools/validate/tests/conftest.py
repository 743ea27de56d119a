"""Render charts/polycorn with `helm template` for the template tests.

The helm binary is the one scripts/setup.sh chart builds (POLYCORN_HELM, or
${POLYCORN_CACHE:-/var/cache/polycorn}/go/bin/helm).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "polycorn"

Obj = dict[str, Any]


def helm_bin() -> str:
    cache = os.environ.get("POLYCORN_CACHE", "/var/cache/polycorn")
    return os.environ.get("POLYCORN_HELM", f"{cache}/go/bin/helm")


# A real Ed25519 public key (`polycorn-pki table-key`; its private half was
# thrown away): the proxies' table verify key in the template tests.
TABLE_VERIFY_KEY = (
    "-----BEGIN PUBLIC KEY-----\n"
    "MCowBQYDK2VwAyEAnPvtCgwpDOmgc+v0F5mN20sEXxjvqUEySD2y6eGCrxw=\n"
    "-----END PUBLIC KEY-----\n"
)

# The least a render needs (ci/minimal-values.yaml without its train).
BASE: Obj = {
    "kafka": {
        "bootstrap": "kafka:9092",
        "security": {
            "caSecret": {"name": "kafka-ca"},
            "users": {c: {"secret": f"kafka-{c}"} for c in ("proxy", "ingest", "trainer")},
        },
    },
    "postgresql": {
        # One login per component (docs/operations.md, "LinkDB roles").
        "users": {
            c: {"secret": f"linkdb-url-{c.lower()}", "key": "database-url"}
            for c in ("migrations", "ingest", "linkdbApi", "trainer")
        },
        "caSecret": {"name": "linkdb-ca"},
    },
    "tableSigning": {"signingKeySecret": {"name": "table-signing"}, "verifyKeys": TABLE_VERIFY_KEY},
    "proxy": {"caSecret": {"name": "pki-ca"}},
    "envoy": {"api": {"tlsSecret": "api-tls"}},
}


def merge(a: Obj, b: Obj) -> Obj:
    """``b`` deep-merged over ``a`` (lists replaced), as Helm merges values."""
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _run(values: Obj, extra: list[str]) -> subprocess.CompletedProcess[str]:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(values, f)
        f.flush()
        return subprocess.run(
            [helm_bin(), "template", "polycorn", str(CHART), "-n", "fleet", "-f", f.name, *extra],
            capture_output=True,
            text=True,
            check=False,
        )


def render(values: Obj, *extra: str, base: bool = True) -> list[Obj]:
    """The objects `helm template` renders for ``values`` (over BASE)."""
    r = _run(merge(BASE, values) if base else values, list(extra))
    if r.returncode != 0:
        raise AssertionError(f"helm template failed:\n{r.stderr}")
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def render_error(values: Obj, base: bool = True) -> str:
    """`helm template`'s error for ``values``; fails the test if it renders."""
    r = _run(merge(BASE, values) if base else values, [])
    if r.returncode == 0:
        raise AssertionError("helm template accepted values it should reject")
    return r.stderr


def of_kind(objs: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind]


def named(objs: list[Obj], kind: str, name: str) -> Obj:
    found = [o for o in of_kind(objs, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}: found {len(found)}"
    return found[0]


def envoy_bootstrap(objs: list[Obj]) -> Obj:
    (cm,) = [o for o in of_kind(objs, "ConfigMap") if "envoy.yaml" in o.get("data", {})]
    boot = yaml.safe_load(cm["data"]["envoy.yaml"])
    assert isinstance(boot, dict)
    return boot


def pod_specs(objs: list[Obj]) -> Iterator[tuple[str, Obj]]:
    """(where, pod spec) of every workload."""
    for o in objs:
        where = f"{o['kind']} {o['metadata']['name']}"
        if o["kind"] in ("Deployment", "StatefulSet", "Job"):
            yield where, o["spec"]["template"]["spec"]
        elif o["kind"] == "CronJob":
            yield where, o["spec"]["jobTemplate"]["spec"]["template"]["spec"]


@pytest.fixture(scope="session")
def helm() -> str:
    h = helm_bin()
    if not Path(h).is_file():
        pytest.fail(f"{h} not found: run `bash scripts/setup.sh chart`")
    return h
