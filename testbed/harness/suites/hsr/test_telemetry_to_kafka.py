"""The harness's example (docs/testing.md, "The harness"): a test that needs
Kafka and a topology. The relay replays the trip's radio log as telemetry;
the proxy produces it to a fresh topic of the real Kafka."""

from __future__ import annotations

import secrets

from confluent_kafka import Consumer
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

from polycorn_harness.fixtures import MakeTrip, Topologies
from polycorn_harness.wait import wait_until
from polycorn_schema.startup import kafka_create_topics


def test_the_proxy_produces_telemetry_to_kafka(
    infra: dict[str, str], topologies: Topologies, make_trip: MakeTrip
) -> None:
    bootstrap, topic = infra["POLYCORN_KAFKA_BOOTSTRAP"], f"harness-{secrets.token_hex(4)}"
    kafka_create_topics(bootstrap, [NewTopic(topic, 1, 1)])
    t = topologies("pcx", make_trip(1, 3, 120)).up(
        "minrtt",
        proxy_args=[f"--kafka-brokers={bootstrap}", f"--kafka-topic={topic}"],
        forward_ports=[int(bootstrap.rsplit(":", 1)[1])],
    )
    produced = "polycorn_proxy_telemetry_produced_total"
    wait_until("the proxy produced telemetry", lambda: t.metric(produced), 90)
    c = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": topic, "auto.offset.reset": "earliest"}
    )
    c.subscribe([topic])
    msg = wait_until("a record on the topic", lambda: c.poll(1.0), 60)
    c.close()
    assert msg.error() is None and msg.value()
