"""Make kubernetes-validate's JSON schemas standalone, for kubeconform offline.

The PyPI package ``kubernetes-validate`` ships one JSON schema per Kubernetes
kind and version (``deployment-apps-v1.json``, ...), but every ``$ref`` in
them points at ``/api/_definitions.json#/$defs/...`` relative to the ``$id``
``https://kubernetes.io/...``: kubeconform cannot resolve that without the
network and then reports the kind as having no schema. This script writes
each kind's schema with the definitions it uses (transitively) inlined under
its own ``$defs``, every ``$ref`` rewritten to ``#/$defs/...`` and the ``$id``
dropped. The file names stay kubeconform's
``{{ .ResourceKind }}{{ .KindSuffix }}.json`` (``deployment-apps-v1.json``).

    python k8s_schemas.py --version 1.37.0 --out DIR [--flavour local-strict]

Exit status: 0 done, 1 the package has no such version or a ``$ref`` points
at a definition that does not exist (the output would be unusable).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

DEFS_REF = "/api/_definitions.json#/$defs/"
LOCAL_REF = "#/$defs/"

Json = Any


class SchemaError(Exception):
    """The package's schemas are not what this converter understands."""


def _refs(node: Json) -> Iterator[str]:
    """Every ``$ref`` value anywhere under ``node``."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                yield v
            else:
                yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)


def _def_name(ref: str) -> str:
    for prefix in (DEFS_REF, LOCAL_REF):
        if ref.startswith(prefix):
            return ref[len(prefix) :]
    raise SchemaError(f"unexpected $ref {ref!r} (expected {DEFS_REF}... or {LOCAL_REF}...)")


def _rewrite(node: Json) -> Json:
    """A copy of ``node`` with every ``$ref`` pointing into the local ``$defs``."""
    if isinstance(node, dict):
        return {
            k: (LOCAL_REF + _def_name(v) if k == "$ref" and isinstance(v, str) else _rewrite(v))
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_rewrite(v) for v in node]
    return node


def standalone(schema: dict[str, Json], defs: dict[str, Json]) -> dict[str, Json]:
    """``schema`` with the definitions it needs inlined; no external ``$ref`` left."""
    needed: set[str] = set()
    todo = [_def_name(r) for r in _refs(schema)]
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        if name not in defs:
            raise SchemaError(f"$ref to a missing definition {name!r}")
        needed.add(name)
        todo.extend(_def_name(r) for r in _refs(defs[name]))
    out = {k: _rewrite(v) for k, v in schema.items() if k not in ("$id", "$defs")}
    if needed:
        out["$defs"] = {n: _rewrite(defs[n]) for n in sorted(needed)}
    return out


def schema_dir(version: str, flavour: str) -> Path:
    root = resources.files("kubernetes_validate") / "kubernetes-json-schema"
    d = Path(str(root)) / f"v{version}-{flavour}"
    if not d.is_dir():
        have = sorted(p.name for p in Path(str(root)).iterdir())
        raise SchemaError(f"kubernetes-validate has no {d.name} (have: {', '.join(have)})")
    return d


def convert(src: Path, out: Path) -> int:
    """Write every kind's standalone schema from ``src`` into ``out``; returns the count."""
    defs = json.loads((src / "_definitions.json").read_text())["$defs"]
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for f in sorted(src.glob("*.json")):
        # _definitions.json is inlined; all.json is a oneOf over every kind
        # that kubeconform never asks for.
        if f.name in ("_definitions.json", "all.json"):
            continue
        schema = json.loads(f.read_text())
        result = standalone(schema, defs)
        leftover = [r for r in _refs(result) if not r.startswith(LOCAL_REF)]
        if leftover:
            raise SchemaError(f"{f.name}: external $ref left after conversion: {leftover[:3]}")
        (out / f.name).write_text(json.dumps(result, separators=(",", ":")))
        n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--version", required=True, help="Kubernetes version, e.g. 1.37.0")
    p.add_argument("--flavour", default="local-strict", choices=("local", "local-strict"))
    p.add_argument("--out", type=Path, required=True, help="output directory")
    a = p.parse_args(argv)
    try:
        n = convert(schema_dir(a.version, a.flavour), a.out)
    except SchemaError as e:
        print(f"k8s_schemas: {e}", file=sys.stderr)
        return 1
    print(f"k8s_schemas: {n} standalone schemas for Kubernetes {a.version} in {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
