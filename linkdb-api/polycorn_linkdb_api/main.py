"""``polycorn-linkdb-api``: serve the API, make API keys, dump OpenAPI.

    polycorn-linkdb-api serve [--host 127.0.0.1] [--port 8080] [--workers 1]
    polycorn-linkdb-api hash-key NAME {table,read,admin}  # new key + its config entry
    polycorn-linkdb-api hash-key --key KEY NAME SCOPE # entry for an existing key
    polycorn-linkdb-api openapi                       # the OpenAPI document (JSON)

Settings come from the environment (``polycorn_linkdb_api.settings``).
"""

from __future__ import annotations

import argparse
import json
import sys

import uvicorn

from polycorn_linkdb_api.app import create_app
from polycorn_linkdb_api.auth import Scope, hash_key, new_key
from polycorn_linkdb_api.settings import ApiSettings, DatabaseSettings, Settings


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="polycorn-linkdb-api", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    serve = sub.add_parser("serve", help="run the API with uvicorn")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--workers", type=int, default=1)
    serve.add_argument("--log-level", default="info")
    serve.add_argument("--no-access-log", action="store_true", help="no line per request")
    serve.add_argument(
        "--worker-healthcheck-timeout",
        type=int,
        default=30,
        help="seconds a worker may take to answer the supervisor (uvicorn's default, 5, "
        "kills workers still importing on a busy machine)",
    )
    hk = sub.add_parser("hash-key", help="make an API key and its POLYCORN_API_KEYS entry")
    hk.add_argument("name")
    hk.add_argument(
        "scope",
        choices=[s.value for s in Scope],
        help="table: GET /v1/failure-table only (relays and proxies); read: every GET; "
        "admin: also publishing tables",
    )
    hk.add_argument("--key", help="hash this key instead of making a new one")
    sub.add_parser("openapi", help="print the OpenAPI document")
    a = p.parse_args(argv)

    if a.cmd == "hash-key":
        key = a.key or new_key()
        if not a.key:
            print(f"key (give it to the client; it is not stored): {key}", file=sys.stderr)
        print(f"{a.name}:{a.scope}:{hash_key(key)}")
        return 0
    if a.cmd == "openapi":
        app = create_app(
            Settings(DatabaseSettings(url="postgresql://unused@127.0.0.1/x"), ApiSettings())
        )
        print(json.dumps(app.openapi(), indent=2))
        return 0

    uvicorn.run(
        "polycorn_linkdb_api.app:create_app",
        factory=True,
        host=a.host,
        port=a.port,
        workers=a.workers,
        log_level=a.log_level,
        access_log=not a.no_access_log,
        proxy_headers=True,
        timeout_worker_healthcheck=a.worker_healthcheck_timeout,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
