"""Kafka authentication and ACLs against the real broker's SASL_SSL listener
(scripts/infra.sh: SCRAM-SHA-512 users proxy, ingest and trainer, the ACLs of
services/kafka/acls.txt), and the shared client options."""

from __future__ import annotations

import argparse
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    NewTopic,
    ScramMechanism,
    UserScramCredentialDeletion,
)

from polycorn_schema import kafka_acl, kafka_security
from polycorn_schema.kafka_security import KafkaSecurity
from polycorn_schema.startup import kafka_create_topics
from polycorn_schema.testing import kafka_bootstrap, kafka_sasl_bootstrap, kafka_user, tls_ca

ROOT = Path(__file__).resolve().parents[2]


def plaintext() -> str:
    return kafka_bootstrap()


# ------------------------------------------------------------------ options


def test_sasl_ssl_options_read_the_password_from_its_file(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    s = KafkaSecurity(protocol="sasl_ssl", username="ingest", password_file=pw, ca=tmp_path / "ca")
    assert s.config() == {
        "security.protocol": "sasl_ssl",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "ingest",
        "sasl.password": "s3cret",
        "ssl.ca.location": str(tmp_path / "ca"),
        "ssl.endpoint.identification.algorithm": "https",
    }
    assert "s3cret" not in repr(s) and "s3cret" not in s.describe()
    # The default leaves a client exactly as before.
    assert KafkaSecurity().config() == {}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"protocol": "TLS"}, "must be one of"),
        ({"protocol": "SASL_SSL"}, "needs --kafka-sasl-username"),
        ({"protocol": "SASL_SSL", "username": "u"}, "needs --kafka-sasl-password-file"),
        (
            {
                "protocol": "SASL_SSL",
                "username": "u",
                "password_file": Path("p"),
                "mechanism": "PLAIN",
            },
            "--kafka-sasl-mechanism must be one of",
        ),
        ({"username": "u"}, "--kafka-sasl-username needs"),
        (
            {
                "protocol": "SASL_PLAINTEXT",
                "username": "u",
                "password_file": Path("p"),
                "ca": Path("c"),
            },
            "--kafka-ssl-ca needs",
        ),
        ({"protocol": "SSL", "cert": Path("c")}, "go together"),
    ],
)
def test_inconsistent_options_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KafkaSecurity(**kwargs)  # type: ignore[arg-type]


def test_options_come_from_flags_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pw = tmp_path / "pw"
    pw.write_text("from-env\n")
    monkeypatch.setenv("POLYCORN_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("POLYCORN_KAFKA_SASL_USERNAME", "trainer")
    monkeypatch.setenv("POLYCORN_KAFKA_SASL_PASSWORD_FILE", str(pw))
    p = argparse.ArgumentParser()
    kafka_security.add_arguments(p)
    c = kafka_security.parse(p, p.parse_args([]))
    assert (c["sasl.username"], c["sasl.password"]) == ("trainer", "from-env")
    c = kafka_security.parse(p, p.parse_args(["--kafka-sasl-username", "ingest"]))
    assert c["sasl.username"] == "ingest"
    empty = tmp_path / "empty"
    empty.write_text("")
    with pytest.raises(SystemExit):  # a usage error, not a traceback
        kafka_security.parse(p, p.parse_args(["--kafka-sasl-password-file", str(empty)]))


# ------------------------------------------------------------------ the broker


@pytest.fixture(scope="module")
def topics() -> Iterator[dict[str, str]]:
    """Fresh copies of the three topics, named so the ACLs' prefixes match."""
    tag = f"test-{secrets.token_hex(4)}"
    names = {
        "telemetry": f"polycorn.telemetry.v1.{tag}",
        "dlq": f"polycorn.telemetry.dlq.{tag}",
        "tables": f"polycorn.failure-tables.v1.{tag}",
    }
    kafka_create_topics(plaintext(), [NewTopic(n, 1, 1) for n in names.values()])
    yield names
    admin = AdminClient({"bootstrap.servers": plaintext()})
    for f in admin.delete_topics(list(names.values())).values():
        f.result(30)


def produce(user: str | KafkaSecurity, topic: str) -> KafkaError | None:
    """One record as ``user`` over SASL_SSL: None when the broker took it,
    else the error of its delivery report."""
    sec = kafka_user(user) if isinstance(user, str) else user
    p = Producer(
        {
            "bootstrap.servers": kafka_sasl_bootstrap(),
            **sec.config(),
            "enable.idempotence": True,
            "acks": "all",
            # A hang guard: a refusal is reported at once.
            "message.timeout.ms": 60_000,
        }
    )
    reports: list[KafkaError | None] = []
    p.produce(topic, key=b"fleet", value=b"{}", on_delivery=lambda e, _m: reports.append(e))
    assert p.flush(90) == 0
    return reports[0]


@pytest.mark.parametrize(
    ("user", "topic", "allowed"),
    [
        ("proxy", "telemetry", True),
        ("proxy", "dlq", True),
        ("proxy", "tables", False),  # the point: a train-facing credential
        ("ingest", "dlq", True),
        ("ingest", "telemetry", False),
        ("ingest", "tables", False),
        ("trainer", "tables", True),
        ("trainer", "telemetry", False),
    ],
)
def test_each_principal_writes_only_its_topics(
    topics: dict[str, str], user: str, topic: str, allowed: bool
) -> None:
    err = produce(user, topics[topic])
    if allowed:
        assert err is None, f"{user} could not write {topic}: {err}"
    else:
        assert err is not None, f"{user} wrote {topic}"
        assert err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err


def test_the_proxy_reads_the_tables_and_the_trainer_cannot(topics: dict[str, str]) -> None:
    assert produce("trainer", topics["tables"]) is None

    def first(user: str, group: str) -> bytes | KafkaError:
        c = Consumer(
            {
                "bootstrap.servers": kafka_sasl_bootstrap(),
                **kafka_user(user).config(),
                "group.id": group,
                "enable.auto.commit": False,
            }
        )
        try:
            c.assign([TopicPartition(topics["tables"], 0, 0)])
            for _ in range(60):  # a hang guard, not a timing assertion
                m = c.poll(1.0)
                if m is None:
                    continue
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                        return err
                    continue
                return m.value() or b""
            raise AssertionError(f"{user}: nothing read and no error")
        finally:
            c.close()

    assert first("proxy", f"polycorn-proxy-tables-test-{secrets.token_hex(4)}") == b"{}"
    refused = first("trainer", f"polycorn-proxy-tables-test-{secrets.token_hex(4)}")
    assert isinstance(refused, KafkaError), refused


def refused(sec: KafkaSecurity | dict[str, str]) -> KafkaError:
    """The error a client gets trying to fetch metadata on SASL_SSL."""
    conf = sec if isinstance(sec, dict) else sec.config()
    errors: list[KafkaError] = []
    full: dict[str, Any] = {"bootstrap.servers": kafka_sasl_bootstrap(), **conf}
    admin = AdminClient(full | {"error_cb": errors.append, "reconnect.backoff.max.ms": 1000})
    with pytest.raises(KafkaException) as e:
        admin.list_topics(timeout=5)
    admin.poll(1)  # serves the error callback
    return kafka_acl.reason(errors, e.value.args[0])


def test_a_wrong_password_is_refused(tmp_path: Path) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-password\n")
    err = refused(kafka_user("proxy", password_file=wrong))
    assert err.code() == KafkaError._AUTHENTICATION, err
    assert "SCRAM" in err.str() or "uthentication" in err.str(), err.str()


def test_an_unauthenticated_client_is_refused_on_the_sasl_port() -> None:
    # No TLS, no SASL: the TLS listener drops it.
    err = refused({})
    assert err.code() in {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN}, err
    # TLS but no SASL: the handshake succeeds, the broker then waits for a
    # SASL handshake that never comes and closes the connection.
    err = refused({"security.protocol": "ssl", "ssl.ca.location": str(tls_ca())})
    assert err.code() in {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN}, err


def test_a_broker_certificate_from_another_ca_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other-ca.crt"
    # Any CA but the infra one: the first of the system's trust store.
    bundle = Path("/etc/ssl/certs/ca-certificates.crt").read_text()
    other.write_text(bundle[: bundle.index("-----END CERTIFICATE-----") + 26])
    u = kafka_user("proxy")
    err = refused(
        KafkaSecurity(
            protocol="SASL_SSL", username="proxy", password_file=u.password_file, ca=other
        )
    )
    assert err.code() == KafkaError._SSL, err


def test_a_user_added_to_the_running_broker_logs_in_and_may_do_nothing(
    tmp_path: Path, topics: dict[str, str]
) -> None:
    # What scripts/infra.sh does for a broker formatted before its users
    # existed: SCRAM credentials through the Admin API.
    user = f"polycorn-test-{secrets.token_hex(4)}"
    (tmp_path / f"{user}.password").write_text(secrets.token_hex(16) + "\n")
    admin = AdminClient({"bootstrap.servers": plaintext()})
    kafka_acl.apply(admin, [], kafka_acl.read_users(tmp_path))
    try:
        kafka_acl.wait_users(kafka_sasl_bootstrap(), tls_ca(), [user], tmp_path, timeout_s=60)
        sec = kafka_user(user, password_file=tmp_path / f"{user}.password")
        assert not set(topics.values()) & set(kafka_acl.authenticates(kafka_sasl_bootstrap(), sec))
        err = produce(sec, topics["telemetry"])
        assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err
    finally:
        deletion = UserScramCredentialDeletion(user, ScramMechanism.SCRAM_SHA_512)
        for f in admin.alter_user_scram_credentials([deletion]).values():
            f.result()


def test_the_acl_file_is_what_the_broker_enforces() -> None:
    # Every ACL of the file is on the broker, and no other for its principals
    # (kafka_acl deletes the rest: a fault seeded by hand does not linger).
    acls = kafka_acl.read_acls(ROOT / "services/kafka/acls.txt")
    assert {b.principal for b in acls} == {"User:proxy", "User:ingest", "User:trainer"}
    admin = AdminClient({"bootstrap.servers": plaintext()})
    kept, deleted = kafka_acl.apply(admin, acls, {})
    assert (kept, deleted) == (len(acls), 0)
