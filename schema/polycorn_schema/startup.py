"""Waiting for a starting server: the errors Kafka, PostgreSQL and Prometheus
answer while they start, retried with a bound.

A freshly formatted Kafka broker accepts connections and serves metadata
seconds before its group coordinator does (``NOT_COORDINATOR``,
``COORDINATOR_LOAD_IN_PROGRESS``), a topic has no leader for a moment after
it is created (``LEADER_NOT_AVAILABLE``, ``UNKNOWN_TOPIC_OR_PART``), and
PostgreSQL answers "the database system is starting up" (SQLSTATE 57P03)
until recovery ends. Every client in the project that runs once and exits
(scripts, benchmarks, the demo, tests, one-shot service commands) goes
through :func:`retry` for those calls: the documented retriable errors are
retried with exponential backoff until a deadline, then :class:`NotReadyError`
says what was waited for, for how long, and the last error. Anything else
is raised at once; a wrong password or a missing database is not a starting
server.

Long-running services (ingest, the trainer's service mode, the API) keep
their own unbounded retry loops with metrics and do not use this module.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import psycopg.errors
import sqlalchemy.exc
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

log = logging.getLogger("polycorn.startup")

T = TypeVar("T")

#: Default bound of one wait: a cold KRaft broker on a 2-core machine loads its
#: coordinator in well under this; a server that takes longer is broken.
DEFAULT_TIMEOUT_S = 120.0

#: Kafka errors a starting broker (or a just-created topic) answers with. The
#: client library marks some of them retriable itself; these are retriable
#: here whatever it says (``committed()`` on a fresh broker raises
#: NOT_COORDINATOR).
KAFKA_STARTING = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.NOT_CONTROLLER,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.BROKER_NOT_AVAILABLE,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError._WAIT_COORD,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._UNKNOWN_TOPIC,
    }
)

#: SQLSTATEs of a PostgreSQL server that is starting, stopping or recovering.
PG_STARTING_SQLSTATES = frozenset(
    {
        "57P03",  # cannot_connect_now: "the database system is starting up"
        "57P01",  # admin_shutdown (a restart in progress)
        "08001",  # sqlclient_unable_to_establish_sqlconnection
        "08006",  # connection_failure
    }
)


class NotReadyError(RuntimeError):
    """The server still answered with a retriable error when the bound ran out."""


def kafka_error(exc: BaseException) -> KafkaError | None:
    """The :class:`KafkaError` inside a confluent-kafka exception, if any."""
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


def kafka_retriable(exc: BaseException) -> bool:
    """A Kafka error that a starting broker or a new topic answers with."""
    err = kafka_error(exc)
    if err is None:
        return False
    return err.code() in KAFKA_STARTING or bool(err.retriable())


def pg_retriable(exc: BaseException) -> bool:
    """A PostgreSQL error that means "not up yet": starting, restarting, or
    refusing connections (no server on the port yet). Authentication and
    missing databases are not. An SQLAlchemy error (Alembic's migrations
    raise those) is judged by the driver's error inside it."""
    orig = getattr(exc, "orig", None)
    if isinstance(exc, sqlalchemy.exc.DBAPIError) and isinstance(orig, BaseException):
        exc = orig
    if not isinstance(exc, psycopg.OperationalError):
        return False
    if isinstance(exc, psycopg.errors.CannotConnectNow | psycopg.errors.AdminShutdown):
        return True
    state = getattr(exc, "sqlstate", None)
    if state in PG_STARTING_SQLSTATES:
        return True
    msg = str(exc)
    # Connection-level failures carry no SQLSTATE; these are the server not
    # listening yet or going away under us, as libpq words them.
    return state is None and any(
        s in msg
        for s in (
            "the database system is starting up",
            "the database system is shutting down",
            "the database system is in recovery mode",
            "Connection refused",
            "server closed the connection unexpectedly",
            "No such file or directory",  # the Unix socket is not there yet
        )
    )


def starting_server(exc: BaseException) -> bool:
    """Kafka or PostgreSQL still starting (the default for :func:`retry`)."""
    return kafka_retriable(exc) or pg_retriable(exc)


def retry(
    fn: Callable[[], T],
    *,
    what: str,
    retriable: Callable[[BaseException], bool] = starting_server,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    initial_delay_s: float = 0.2,
    max_delay_s: float = 5.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``fn()``, retried while it raises a retriable error, for at most
    ``timeout_s``. Raises :class:`NotReadyError` (from the last error) when the
    bound is hit; a non-retriable error propagates at once."""
    deadline = clock() + timeout_s
    delay = initial_delay_s
    attempts = 0
    while True:
        attempts += 1
        try:
            return fn()
        except Exception as e:
            if not retriable(e):
                raise
            left = deadline - clock()
            if left <= 0:
                raise NotReadyError(
                    f"{what}: still failing after {timeout_s:.0f} s and {attempts} attempts; "
                    f"last error: {e}"
                ) from e
            # Quiet for the first moments (a topic just created has no
            # leader for a few ms), then a line every ten attempts.
            if attempts % 10 == 3:
                log.warning("%s: %s; retrying for up to %.0f s more", what, e, left)
            sleep(min(delay, left))
            delay = min(delay * 2, max_delay_s)


def pg_connect(
    url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, **kwargs: Any
) -> psycopg.Connection[Any]:
    """``psycopg.connect`` that waits (bounded) for a starting server."""
    kwargs.setdefault("connect_timeout", 10)
    return retry(
        lambda: psycopg.connect(url, **kwargs),
        what=f"connecting to PostgreSQL at {_redact(url)}",
        retriable=pg_retriable,
        timeout_s=timeout_s,
    )


def http_ready(url: str, *, what: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> bytes:
    """GET ``url`` until it answers 2xx (Prometheus answers 503 until its
    TSDB is open, and nothing while it binds its port)."""

    def get() -> bytes:
        with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 (the caller's own URL)
            body: bytes = r.read()
            return body

    def starting(e: BaseException) -> bool:
        if isinstance(e, urllib.error.HTTPError):
            return e.code in (502, 503, 504)
        return isinstance(e, urllib.error.URLError | ConnectionError | TimeoutError)

    return retry(get, what=what, retriable=starting, timeout_s=timeout_s)


def _redact(url: str) -> str:
    """The URL without a password, for messages."""
    head, sep, tail = url.partition("@")
    if not sep or ":" not in head.split("//", 1)[-1]:
        return url
    scheme, _, userinfo = head.rpartition("//")
    user = userinfo.split(":", 1)[0]
    return f"{scheme}//{user}:***@{tail}"


# ---------------------------------------------------------------- Kafka


def kafka_create_topics(
    bootstrap: str, topics: list[NewTopic], *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> None:
    """Create ``topics`` (those that exist already are left as they are) and
    wait until every partition of each has a leader."""
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def create() -> None:
        futures = admin.create_topics(topics, operation_timeout=30, request_timeout=30)
        for f in futures.values():
            try:
                f.result(60)
            except KafkaException as e:
                err = kafka_error(e)
                if err is None or err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise

    retry(
        create,
        what=f"creating Kafka topics at {bootstrap}",
        retriable=kafka_retriable,
        timeout_s=timeout_s,
    )
    kafka_wait_leaders(bootstrap, [t.topic for t in topics], timeout_s=timeout_s)


def kafka_wait_leaders(
    bootstrap: str, topics: list[str], *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> None:
    """Wait until every partition of ``topics`` exists and has a leader."""
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def check() -> None:
        md = admin.list_topics(timeout=10)
        for name in topics:
            t = md.topics.get(name)
            if t is None:
                raise KafkaException(
                    KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, f"topic {name} unknown")
                )
            if t.error is not None:
                raise KafkaException(t.error)
            for p in t.partitions.values():
                if p.error is not None:
                    raise KafkaException(p.error)
                if p.leader < 0:
                    raise KafkaException(
                        KafkaError(KafkaError.LEADER_NOT_AVAILABLE, f"{name}[{p.id}] has no leader")
                    )

    retry(
        check,
        what=f"leaders of {', '.join(topics)} at {bootstrap}",
        retriable=kafka_retriable,
        timeout_s=timeout_s,
    )


def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode`` (UTF-16 code units), which Kafka uses to map
    a consumer group to its ``__consumer_offsets`` partition."""
    data = s.encode("utf-16-be")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def group_partition(group: str, partitions: int) -> int:
    """The ``__consumer_offsets`` partition (its leader is the group's
    coordinator) of ``group``: Kafka's ``Utils.abs(hashCode) % partitions``."""
    h = java_string_hash(group)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


PROBE_TOPIC = "polycorn.ready-probe"


def kafka_wait_ready(bootstrap: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
    """Wait until the broker can do what the project does with it: a consumer
    group commits an offset and reads it back, on every partition of
    ``__consumer_offsets`` (so whatever group a client uses finds its
    coordinator loaded). Returns the number of coordinators probed."""
    kafka_create_topics(bootstrap, [NewTopic(PROBE_TOPIC, 1, 1)], timeout_s=timeout_s)
    _commit_probe(bootstrap, "polycorn-ready-probe", timeout_s)
    # The first commit made the broker create __consumer_offsets.
    admin = AdminClient({"bootstrap.servers": bootstrap})
    offsets = admin.list_topics(topic="__consumer_offsets", timeout=10).topics.get(
        "__consumer_offsets"
    )
    n = len(offsets.partitions) if offsets is not None and offsets.partitions else 1
    groups = {group_partition("polycorn-ready-probe", n): "polycorn-ready-probe"}
    i = 0
    while len(groups) < n:
        g = f"polycorn-ready-probe-{i}"
        groups.setdefault(group_partition(g, n), g)
        i += 1
    for part, g in sorted(groups.items()):
        if g != "polycorn-ready-probe":
            _commit_probe(bootstrap, g, timeout_s)
        log.debug("coordinator for __consumer_offsets[%d] answers (group %s)", part, g)
    return len(groups)


def _commit_probe(bootstrap: str, group: str, timeout_s: float) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        tp = [TopicPartition(PROBE_TOPIC, 0, 0)]

        def commit_and_read() -> int:
            c.commit(offsets=tp, asynchronous=False)
            (got,) = c.committed([TopicPartition(PROBE_TOPIC, 0)], timeout=10)
            if got.error is not None:
                raise KafkaException(got.error)
            if got.offset != 0:
                raise KafkaException(
                    KafkaError(
                        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                        f"committed offset reads back as {got.offset}",
                    )
                )
            return int(got.offset)

        return retry(
            commit_and_read,
            what=f"consumer group {group} committing an offset at {bootstrap}",
            retriable=kafka_retriable,
            timeout_s=timeout_s,
        )
    finally:
        c.close()


def read_topics_file(path: str) -> list[NewTopic]:
    """``services/kafka/topics.txt``: ``name partitions key=value...`` per line."""
    out: list[NewTopic] = []
    with Path(path).open(encoding="utf-8") as f:
        for line in f:
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            name, parts, *conf = fields
            out.append(NewTopic(name, int(parts), 1, config=dict(c.split("=", 1) for c in conf)))
    return out


# ---------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    """``python -m polycorn_schema.startup kafka|pg|http ...``: wait until a
    server is ready for the project (scripts/infra.sh up runs these)."""
    p = argparse.ArgumentParser(prog="python -m polycorn_schema.startup", description=main.__doc__)
    p.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S)
    sub = p.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser(
        "kafka", help="topics created, leaders elected, every group coordinator commits"
    )
    k.add_argument("--bootstrap", required=True)
    k.add_argument("--topics-file", help="create these topics first (services/kafka/topics.txt)")
    g = sub.add_parser("pg", help="a query runs (and PostGIS is there if --postgis)")
    g.add_argument("--url", required=True)
    g.add_argument("--postgis", action="store_true")
    h = sub.add_parser("http", help="a URL answers 2xx")
    h.add_argument("--url", required=True)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="startup: %(message)s")
    t0 = time.monotonic()
    try:
        if a.cmd == "kafka":
            if a.topics_file:
                kafka_create_topics(
                    a.bootstrap, read_topics_file(a.topics_file), timeout_s=a.timeout_s
                )
            n = kafka_wait_ready(a.bootstrap, timeout_s=a.timeout_s)
            what = f"Kafka at {a.bootstrap}: topics led, {n} group coordinator(s) commit"
        elif a.cmd == "pg":
            with pg_connect(a.url, timeout_s=a.timeout_s) as c:
                c.execute("SELECT 1")
                if a.postgis:
                    c.execute("SELECT postgis_version()")
            what = f"PostgreSQL at {_redact(a.url)}"
        else:
            http_ready(a.url, what=f"GET {a.url}", timeout_s=a.timeout_s)
            what = f"{a.url}"
    except NotReadyError as e:
        print(f"startup: ERROR: {e}", file=sys.stderr)
        return 1
    print(f"startup: ready in {time.monotonic() - t0:.1f} s: {what}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
