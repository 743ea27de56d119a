"""LinkDB over TLS: the infra PostgreSQL runs with ssl=on and a certificate
for localhost and 127.0.0.1 signed by the infra CA (scripts/infra.sh). The
clients take sslmode and sslrootcert from the URL: psycopg as libpq does, and
SQLAlchemy (polycorn_schema.linkdb.cli.sqlalchemy_url, migrations) passes the
URL's query on to psycopg."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from polycorn_schema.linkdb.cli import sqlalchemy_url, upgrade
from polycorn_schema.startup import pg_connect
from polycorn_schema.testing import fresh_database, tls_url, with_database

SSL = "SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()"


def test_psycopg_and_sqlalchemy_verify_the_server_and_use_tls() -> None:
    with fresh_database(migrate=False) as url:
        tls = tls_url(url)
        assert "sslmode=verify-full" in tls
        with pg_connect(tls) as c:
            row: Any = c.execute(SSL).fetchone()
            assert row[0] is True and row[1].startswith("TLSv1."), row
        engine = sa.create_engine(sqlalchemy_url(tls), poolclass=sa.NullPool)
        try:
            with engine.connect() as c:
                assert c.execute(sa.text(SSL)).one()[0] is True
        finally:
            engine.dispose()
        # The migrations (alembic through SQLAlchemy) over TLS.
        upgrade(tls)
        with pg_connect(tls) as c:
            assert c.execute("SELECT count(*) FROM alembic_version").fetchone() == (1,)
        # with_database keeps the query (sslmode, sslrootcert).
        assert with_database(tls, "other").endswith("/other?" + tls.split("?", 1)[1])


def test_verify_full_refuses_a_certificate_for_another_host_name() -> None:
    with fresh_database(migrate=False) as url:
        # The same server (hostaddr), dialled under a name its certificate
        # does not carry: verify-full refuses it, require (no check) does not.
        wrong = tls_url(url, host="linkdb.wrong.invalid", hostaddr="127.0.0.1")
        with pytest.raises(psycopg.OperationalError, match="does not match host name"):
            psycopg.connect(wrong, connect_timeout=10)
        with psycopg.connect(wrong.replace("sslmode=verify-full", "sslmode=require")) as c:
            assert c.execute(SSL).fetchone()[0] is True  # type: ignore[index]
        # A server certificate from a CA the client does not trust.
        untrusted = tls_url(url, sslrootcert="/etc/ssl/certs/ca-certificates.crt")
        with pytest.raises(psycopg.OperationalError, match="certificate verify failed"):
            psycopg.connect(untrusted, connect_timeout=10)
