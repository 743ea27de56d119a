"""Parse every rendered container's command line with the real CLI's parser.

    uv run --all-packages --locked python tools/validate/cli_args.py RENDERED.yaml...
        [--proxy-bin target/release/polycorn-proxy]

Runs in the services' uv workspace, so the parsers are the ones the images
ship: ``polycorn-ingest`` and ``polycorn-trainer`` through their
``_parser().parse_args``, ``polycorn-linkdb-api`` and ``polycorn-linkdb``
through ``main()`` with the call that would start the server or touch the
database replaced by a recorder. Types and choices are checked, not only the
flag names (``--batch-timeout-s=abc`` or ``--shard=8/8`` fail). Kubernetes'
``$(VAR)`` references are replaced by a value the variable can take
(``JOB_COMPLETION_INDEX`` by 0). With ``--proxy-bin``, each proxy's command
line is given to the real binary followed by ``--help``: clap parses (and
type-checks) every flag before it reaches ``--help``, so exit status 0 means
the command line is valid. Every rendered failure-table verify key
(the ConfigMap the proxies mount for ``--failure-table-verify-key``) is
loaded with ``cryptography``, the library the trainer signs with: each
``PUBLIC KEY`` block must be an Ed25519 key (``--help`` does not read the
file; tools/validate/edge_smoke.py runs the real proxy on a rendered one).
Exit status: 0 every command line parses, 1 one does not, 2 bad usage.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import yaml

# A value each $(VAR) can take inside a pod.
K8S_VARS = {"JOB_COMPLETION_INDEX": "0"}


def _expand(arg: str) -> str:
    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in K8S_VARS:
            raise KeyError(f"$({name}) has no sample value in cli_args.K8S_VARS")
        return K8S_VARS[name]

    return re.sub(r"\$\(([A-Z_][A-Z0-9_]*)\)", sub, arg)


def _parse_with(parser_factory: Callable[[], argparse.ArgumentParser], args: list[str]) -> None:
    parser_factory().parse_args(args)


def _ingest(args: list[str]) -> None:
    from polycorn_ingest.cli import _parser

    _parse_with(_parser, args)


def _trainer(args: list[str]) -> None:
    from polycorn_trainer.cli import _parser

    _parse_with(_parser, args)


def _linkdb_api(args: list[str]) -> None:
    from polycorn_linkdb_api import main as api_main

    with mock.patch.object(api_main.uvicorn, "run") as run:
        rc = api_main.main(args)
    if rc != 0 or (args[:1] == ["serve"] and not run.called):
        raise RuntimeError(f"polycorn-linkdb-api {args}: exit {rc}, server started: {run.called}")


def _linkdb(args: list[str]) -> None:
    from polycorn_schema.linkdb import cli

    env = {"POLYCORN_DATABASE_URL": "postgresql://check@127.0.0.1:1/linkdb"}
    # No database here: the wait for a starting server is not what is checked.
    with (
        mock.patch.dict(os.environ, env),
        mock.patch.object(cli, "pg_connect"),
        mock.patch.object(cli.command, "upgrade") as upgrade,
    ):
        rc = cli.main(args)
    if rc != 0 or (args[:1] == ["upgrade"] and not upgrade.called):
        raise RuntimeError(f"polycorn-linkdb {args}: exit {rc}, upgrade ran: {upgrade.called}")


PYTHON_CLIS: dict[str, Callable[[list[str]], None]] = {
    "polycorn-ingest": _ingest,
    "polycorn-trainer": _trainer,
    "polycorn-linkdb-api": _linkdb_api,
    "polycorn-linkdb": _linkdb,
}


def containers(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    for o in yaml.safe_load_all(path.read_text()):
        if not o:
            continue
        spec = o.get("spec", {})
        if o["kind"] == "CronJob":
            spec = spec["jobTemplate"]["spec"]
        pod = spec.get("template", {}).get("spec")
        if pod is None:
            continue
        for c in pod["containers"]:
            yield f"{path.name}: {o['kind']} {o['metadata']['name']}", c


PEM_BLOCK = re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----.*?-----END \1-----\n?", re.S)


def _verify_keys(text: str) -> int:
    """The number of Ed25519 public keys in a verify-key file's text."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    blocks = list(PEM_BLOCK.finditer(text))
    if not blocks:
        raise ValueError("no PEM block")
    for i, m in enumerate(blocks, 1):
        if m.group(1) != "PUBLIC KEY":
            raise ValueError(f"block {i} is a {m.group(1)}, not a PUBLIC KEY")
        key = load_pem_public_key(m.group(0).encode())
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError(f"block {i} is a {type(key).__name__}, not an Ed25519 key")
    return len(blocks)


def check(path: Path, proxy_bin: Path | None) -> tuple[int, list[str]]:
    n, errors = check_verify_keys(path)
    for where, c in containers(path):
        (cmd,) = c["command"]
        args = [_expand(a) for a in c.get("args", [])]
        if cmd == "envoy":
            continue  # tools/validate/envoy checks its configuration
        try:
            if cmd in PYTHON_CLIS:
                _parse_python(PYTHON_CLIS[cmd], args)
            elif cmd == "polycorn-proxy":
                if proxy_bin is None:
                    continue
                _parse_proxy(proxy_bin, args)
            else:
                raise RuntimeError(f"no parser known for command {cmd!r}")
        except Exception as e:
            errors.append(f"{where}: {cmd} {' '.join(args)}: {e}")
            continue
        n += 1
    return n, errors


def check_verify_keys(path: Path) -> tuple[int, list[str]]:
    """The table-signing verify keys in a manifest's ConfigMaps: (how many are valid,
    what is wrong with the others)."""
    n = 0
    errors = []
    for o in yaml.safe_load_all(path.read_text()):
        if o and o["kind"] == "ConfigMap" and "table-signing.pub" in o.get("data", {}):
            where = f"{path.name}: ConfigMap {o['metadata']['name']}"
            try:
                _verify_keys(o["data"]["table-signing.pub"])
            except Exception as e:  # ValueError, cryptography's UnsupportedAlgorithm
                errors.append(f"{where}: table-signing.pub: {e}")
                continue
            n += 1
    return n, errors


def _parse_python(cli: Callable[[list[str]], None], args: list[str]) -> None:
    """A Python service's command line through its own parser (its output kept quiet);
    raises RuntimeError with that output if the parser rejects it."""
    out = io.StringIO()
    with contextlib.redirect_stderr(out), contextlib.redirect_stdout(out):
        try:
            cli(args)
        except SystemExit as e:
            if e.code not in (0, None):
                raise RuntimeError(out.getvalue().strip() or f"exit {e.code}") from None


def _parse_proxy(proxy_bin: Path, args: list[str]) -> None:
    """The proxy's command line through its binary (with --help appended)."""
    r = subprocess.run(
        [str(proxy_bin), *args, "--help"], capture_output=True, text=True, check=False
    )
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("rendered", type=Path, nargs="+", help="helm template output")
    p.add_argument("--proxy-bin", type=Path, help="the polycorn-proxy binary, if built")
    a = p.parse_args(argv)
    total = 0
    failed = []
    for f in a.rendered:
        n, errors = check(f, a.proxy_bin)
        total += n
        failed += errors
    for e in failed:
        print(f"FAIL {e}", file=sys.stderr)
    proxy = "with the real polycorn-proxy" if a.proxy_bin else "without the proxy binary"
    print(
        f"cli_args: {total} command lines parsed by the real CLIs ({proxy}), {len(failed)} failed"
    )
    return 1 if failed or total == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
