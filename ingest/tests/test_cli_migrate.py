"""``polycorn-ingest run --migrate`` at start-up: it waits, with a bound, for a
database that is not up yet, and ends at once on an error that waiting cannot
fix (retrying every error would keep the service looping on a missing database
or a broken migration)."""

from __future__ import annotations

import socket
import subprocess
import sys

from polycorn_schema.testing import base_url, with_database


def ingest_run(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", "from polycorn_ingest.cli import main; raise SystemExit(main())"]
    args = ["run", "--migrate", "--database-url", url, "--bootstrap", "127.0.0.1:9"]
    args += ["--metrics-addr", "", *extra]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120, check=False)


def test_a_missing_database_ends_the_service_at_once() -> None:
    url = with_database(base_url(), "linkdb_no_such_database")
    r = ingest_run(url, "--migrate-timeout-s", "300")
    assert r.returncode != 0
    assert "does not exist" in r.stderr, r.stderr[-2000:]
    assert "still failing" not in r.stderr


def test_a_database_that_never_comes_up_is_waited_for_with_a_bound() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = ingest_run(f"postgresql://postgres@127.0.0.1:{port}/linkdb", "--migrate-timeout-s", "2")
    assert r.returncode != 0
    assert "migrating LinkDB: still failing after 2 s" in r.stderr, r.stderr[-2000:]
