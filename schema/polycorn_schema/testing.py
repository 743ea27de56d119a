"""Test support shared by the services' test suites: throw-away LinkDB databases
on the real PostgreSQL + PostGIS that ``scripts/infra.sh up pg`` starts.

Tests read ``POLYCORN_DATABASE_URL`` (``scripts/infra.sh env``) and fail, not
skip, when it is missing: a silently skipped database test proves nothing.
"""

from __future__ import annotations

import os
import secrets
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from polycorn_schema.kafka_security import KafkaSecurity
from polycorn_schema.linkdb.cli import upgrade
from polycorn_schema.startup import kafka_create_topics, pg_connect


def base_url() -> str:
    url = os.environ.get("POLYCORN_DATABASE_URL")
    if not url:
        raise RuntimeError(
            "POLYCORN_DATABASE_URL is not set: start PostGIS with `scripts/infra.sh up pg` and "
            'run `eval "$(scripts/infra.sh env)"` (make test-py does both)'
        )
    return url


def with_database(url: str, dbname: str) -> str:
    """``url`` naming database ``dbname`` (its query, e.g. sslmode, kept)."""
    u = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(u._replace(path=f"/{dbname}"))


def infra_env(var: str) -> str:
    v = os.environ.get(var)
    if not v:
        raise RuntimeError(
            f"{var} is not set: start the servers with `scripts/infra.sh up pg kafka` and "
            'run `eval "$(scripts/infra.sh env)"` (make test-py does both)'
        )
    return v


def kafka_bootstrap() -> str:
    """The infra broker's PLAINTEXT listener (``POLYCORN_KAFKA_BOOTSTRAP``):
    User:ANONYMOUS, a super user."""
    return infra_env("POLYCORN_KAFKA_BOOTSTRAP")


def tls_ca() -> Path:
    """The CA of the infra servers' certificates (``POLYCORN_INFRA_TLS_CA``)."""
    return Path(infra_env("POLYCORN_INFRA_TLS_CA"))


def tls_url(url: str, *, host: str | None = None, **params: str) -> str:
    """``url`` with ``sslmode=verify-full`` and the infra CA as
    ``sslrootcert`` (and ``host`` in place of its host, other libpq
    parameters from ``params``)."""
    u = urllib.parse.urlsplit(url)
    if host is not None:
        user = u.netloc.rpartition("@")[0]
        u = u._replace(netloc=f"{user}@{host}:{u.port}" if user else f"{host}:{u.port}")
    q = dict(urllib.parse.parse_qsl(u.query))
    q |= {"sslmode": "verify-full", "sslrootcert": str(tls_ca()), **params}
    return urllib.parse.urlunsplit(u._replace(query=urllib.parse.urlencode(q)))


def kafka_sasl_bootstrap() -> str:
    """The infra broker's SASL_SSL listener (``POLYCORN_KAFKA_SASL_BOOTSTRAP``)."""
    return infra_env("POLYCORN_KAFKA_SASL_BOOTSTRAP")


def kafka_user(user: str, *, password_file: Path | None = None) -> KafkaSecurity:
    """SASL_SSL as one of the infra broker's users (proxy, ingest, trainer)."""
    users = Path(infra_env("POLYCORN_KAFKA_USERS_DIR"))
    return KafkaSecurity(
        protocol="SASL_SSL",
        username=user,
        password_file=password_file or users / f"{user}.password",
        ca=tls_ca(),
    )


# The LOGIN role each service logs in as on the test server (trust
# authentication: no password) and the groups of migration 0010 it is a
# member of; deployments make theirs with ``polycorn-linkdb login``.
SERVICE_LOGINS: dict[str, tuple[str, ...]] = {
    "ingest": ("linkdb_ingest",),
    "api": ("linkdb_reader",),
    "api-publisher": ("linkdb_reader", "linkdb_publisher"),
    "trainer": ("linkdb_trainer",),
}


def service_url(url: str, service: str) -> str:
    """``url`` (a migrated LinkDB, as a superuser) logging in as ``service``'s
    role instead (``SERVICE_LOGINS``), which is made if missing."""
    groups = SERVICE_LOGINS[service]
    login = "polycorn_test_" + service.replace("-", "_")
    with pg_connect(url, autocommit=True) as c:
        # Roles are the cluster's: tests in parallel may race to make one.
        c.execute(
            f"DO $$ BEGIN CREATE ROLE {login} LOGIN; "
            "EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
        )
        for g in groups:
            c.execute(f"GRANT {g} TO {login}")
    u = urllib.parse.urlsplit(url)
    host = u.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(u._replace(netloc=f"{login}@{host}"))


@contextmanager
def fresh_database(migrate: bool = True, prefix: str = "linkdb_test") -> Iterator[str]:
    """A new, empty database (PostGIS enabled, migrated to head unless
    ``migrate`` is false) on the test server; dropped afterwards."""
    admin = with_database(base_url(), "postgres")
    name = f"{prefix}_{secrets.token_hex(4)}"
    with pg_connect(admin, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    url = with_database(base_url(), name)
    try:
        with pg_connect(url, autocommit=True) as c:
            c.execute("CREATE EXTENSION IF NOT EXISTS postgis")
        if migrate:
            upgrade(url)
        yield url
    finally:
        with pg_connect(admin, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def compacted_topic(prefix: str = "test.failure-tables") -> Iterator[str]:
    """A new compacted topic of one partition on the infra broker (as the
    failure-table topic is), deleted afterwards."""
    bootstrap = kafka_bootstrap()
    name = f"{prefix}.{secrets.token_hex(4)}"
    kafka_create_topics(bootstrap, [NewTopic(name, 1, 1, config={"cleanup.policy": "compact"})])
    try:
        yield name
    finally:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for f in admin.delete_topics([name], operation_timeout=30).values():
            f.result()
