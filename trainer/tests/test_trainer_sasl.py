"""The trainer as deployed with authentication: it reads LinkDB over TLS
(sslmode=verify-full) and publishes its table over SASL_SSL as the trainer
principal; the proxy principal reads it back (services/kafka/acls.txt)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from test_run import seed

from polycorn_schema.failure_table import HEADER_VERSION, KAFKA_KEY
from polycorn_schema.startup import kafka_create_topics
from polycorn_schema.testing import (
    fresh_database,
    kafka_bootstrap,
    kafka_sasl_bootstrap,
    kafka_user,
    service_url,
    tls_url,
)
from polycorn_trainer import cli


def test_the_trainer_publishes_over_sasl_ssl_from_linkdb_over_tls(tmp_path: Path) -> None:
    topic = f"polycorn.failure-tables.v1.test-{secrets.token_hex(4)}"
    kafka_create_topics(
        kafka_bootstrap(), [NewTopic(topic, 1, 1, config={"cleanup.policy": "compact"})]
    )
    trainer = kafka_user("trainer")
    try:
        with fresh_database(prefix="linkdb_test_trainer") as url:
            seed(url)
            # The command line as the chart runs it: the password from a file
            # (--min-trains=1: seed's fleet is one train).
            rc = cli.main(
                [
                    "--log-level=WARNING",
                    "run",
                    "--once",
                    "--workers=1",
                    "--min-trains=1",
                    f"--database-url={tls_url(service_url(url, 'trainer'))}",
                    f"--bootstrap={kafka_sasl_bootstrap()}",
                    f"--topic={topic}",
                    "--kafka-security-protocol=SASL_SSL",
                    "--kafka-sasl-username=trainer",
                    f"--kafka-sasl-password-file={trainer.password_file}",
                    f"--kafka-ssl-ca={trainer.ca}",
                    f"--summary-json={tmp_path / 'summary.json'}",
                ]
            )
            assert rc == 0
            version = json.loads((tmp_path / "summary.json").read_text())["table"]["version"]
        c = Consumer(
            {
                "bootstrap.servers": kafka_sasl_bootstrap(),
                **kafka_user("proxy").config(),
                "group.id": f"polycorn-proxy-tables-test-{secrets.token_hex(4)}",
                "enable.auto.commit": False,
            }
        )
        try:
            c.assign([TopicPartition(topic, 0, 0)])
            m = None
            for _ in range(60):  # a hang guard, not a timing assertion
                m = c.poll(1.0)
                if m is not None and m.error() is None:
                    break
            assert m is not None and m.error() is None, m and m.error()
            assert m.key() == KAFKA_KEY
            assert dict(m.headers() or [])[HEADER_VERSION] == str(version).encode()
        finally:
            c.close()
    finally:
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap()})
        for f in admin.delete_topics([topic]).values():
            f.result(30)
