"""polycorn_schema.startup: which errors mean "still starting", the bounded
retry, the coordinator mapping, and the readiness probes against the real
PostgreSQL and Kafka of scripts/infra.sh."""

from __future__ import annotations

import os
import secrets
import socket

import psycopg
import psycopg.errors
import pytest
import sqlalchemy.exc
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from polycorn_schema import startup
from polycorn_schema.startup import (
    NotReadyError,
    group_partition,
    java_string_hash,
    kafka_retriable,
    pg_retriable,
    retry,
)
from polycorn_schema.testing import base_url, with_database


def kafka_exc(code: int) -> KafkaException:
    return KafkaException(KafkaError(code, "test"))


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


# The errors a starting broker or a just-created topic answers with.
STARTING = [
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
]


@pytest.mark.parametrize("code", STARTING)
def test_starting_broker_errors_are_retriable(code: int) -> None:
    assert kafka_retriable(kafka_exc(code))


@pytest.mark.parametrize(
    "exc",
    [
        kafka_exc(KafkaError.TOPIC_AUTHORIZATION_FAILED),
        kafka_exc(KafkaError.INVALID_REPLICATION_FACTOR),
        kafka_exc(KafkaError.TOPIC_ALREADY_EXISTS),
        ValueError("not Kafka"),
    ],
)
def test_other_errors_are_not(exc: Exception) -> None:
    assert not kafka_retriable(exc)


def test_retry_until_the_coordinator_answers() -> None:
    t = FakeTime()
    errors = [
        kafka_exc(KafkaError.COORDINATOR_LOAD_IN_PROGRESS),
        kafka_exc(KafkaError.NOT_COORDINATOR),
    ]

    def fn() -> int:
        if errors:
            raise errors.pop(0)
        return 7

    assert retry(fn, what="committed offsets", clock=t.clock, sleep=t.sleep) == 7
    assert t.sleeps == [0.2, 0.4]


def test_retry_is_bounded_with_a_clear_message() -> None:
    t = FakeTime()
    attempts = 0

    def fn() -> None:
        nonlocal attempts
        attempts += 1
        raise kafka_exc(KafkaError.NOT_COORDINATOR)

    with pytest.raises(NotReadyError) as e:
        retry(fn, what="group g committing", timeout_s=30, clock=t.clock, sleep=t.sleep)
    msg = str(e.value)
    assert msg.startswith("group g committing: still failing after 30 s")
    assert "NOT_COORDINATOR" in msg
    assert isinstance(e.value.__cause__, KafkaException)
    # Exponential backoff capped at 5 s, never sleeping past the deadline.
    assert t.now == pytest.approx(30)
    assert max(t.sleeps) == 5.0 and attempts == len(t.sleeps) + 1


def test_a_non_retriable_error_propagates_at_once() -> None:
    t = FakeTime()
    attempts = 0

    def fn() -> None:
        nonlocal attempts
        attempts += 1
        raise kafka_exc(KafkaError.TOPIC_AUTHORIZATION_FAILED)

    with pytest.raises(KafkaException):
        retry(fn, what="x", clock=t.clock, sleep=t.sleep)
    assert attempts == 1 and t.sleeps == []


def test_pg_classification() -> None:
    assert pg_retriable(psycopg.errors.CannotConnectNow("the database system is starting up"))
    assert pg_retriable(psycopg.errors.AdminShutdown("terminating connection"))
    assert pg_retriable(
        psycopg.OperationalError(
            'connection failed: connection to server at "127.0.0.1", port 1 failed: '
            "Connection refused"
        )
    )
    assert not pg_retriable(
        psycopg.OperationalError('FATAL:  password authentication failed for user "x"')
    )
    assert not pg_retriable(psycopg.errors.UndefinedTable("no such table"))
    assert not pg_retriable(kafka_exc(KafkaError.NOT_COORDINATOR))


def test_pg_classification_looks_inside_sqlalchemy_errors() -> None:
    # Alembic's migrations raise SQLAlchemy's wrappers of the driver's error.
    refused = psycopg.OperationalError("connection failed: Connection refused")
    assert pg_retriable(sqlalchemy.exc.OperationalError("SELECT 1", {}, refused))
    broken = psycopg.errors.SyntaxError('syntax error at or near "CREAT"')
    assert not pg_retriable(sqlalchemy.exc.ProgrammingError("CREAT TABLE", {}, broken))
    assert not pg_retriable(sqlalchemy.exc.OperationalError("SELECT 1", {}, ValueError("x")))


def test_java_string_hash() -> None:
    # Values of java.lang.String.hashCode().
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112
    assert java_string_hash("\u00e9") == 233
    assert java_string_hash("\U0001f600") == 0xD83D * 31 + 0xDE00  # two UTF-16 units
    assert java_string_hash("polygenelubricants") == -(1 << 31)


def test_group_partition_matches_kafka() -> None:
    # Kafka's Utils.abs maps Integer.MIN_VALUE to 0.
    assert group_partition("polygenelubricants", 50) == 0
    assert group_partition("hello", 50) == 99162322 % 50
    assert group_partition("polycorn-ready-probe", 4) == abs(-217402323) % 4


# ---------------------------------------------------------------- real servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_pg_connect_waits_then_says_so() -> None:
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/linkdb"
    with pytest.raises(NotReadyError, match=r"connecting to PostgreSQL at .*failing after 1 s"):
        startup.pg_connect(url, timeout_s=1)


def test_pg_missing_database_is_not_waited_for() -> None:
    url = with_database(base_url(), f"missing_{secrets.token_hex(4)}")
    with pytest.raises(psycopg.OperationalError) as e:
        startup.pg_connect(url, timeout_s=600)
    assert not isinstance(e.value, NotReadyError)
    assert "does not exist" in str(e.value)


def test_pg_ready_cli() -> None:
    assert startup.main(["--timeout-s", "10", "pg", "--url", base_url(), "--postgis"]) == 0


def test_kafka_ready_probes_every_coordinator() -> None:
    bootstrap = os.environ["POLYCORN_KAFKA_BOOTSTRAP"]
    n = startup.kafka_wait_ready(bootstrap, timeout_s=60)
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    assert n == len(md.topics["__consumer_offsets"].partitions)


def test_kafka_create_topics_is_idempotent_and_waits_for_leaders() -> None:
    bootstrap = os.environ["POLYCORN_KAFKA_BOOTSTRAP"]
    name = f"test.startup.{secrets.token_hex(4)}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        for _ in range(2):
            startup.kafka_create_topics(bootstrap, [NewTopic(name, 3, 1)], timeout_s=60)
            t = admin.list_topics(topic=name, timeout=10).topics[name]
            assert len(t.partitions) == 3
            assert all(p.leader >= 0 for p in t.partitions.values())
    finally:
        for f in admin.delete_topics([name], operation_timeout=30).values():
            f.result()


def test_kafka_unreachable_is_bounded() -> None:
    with pytest.raises(NotReadyError, match="still failing after 2 s"):
        startup.kafka_wait_leaders(f"127.0.0.1:{free_port()}", ["x"], timeout_s=2)


def test_linkdb_cli_waits_then_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    from polycorn_schema.linkdb import cli

    url = f"postgresql://postgres@127.0.0.1:{free_port()}/linkdb"
    assert cli.main(["--url", url, "--wait-s", "1", "upgrade"]) == 1
    assert "polycorn-linkdb: connecting to PostgreSQL at" in capsys.readouterr().err
