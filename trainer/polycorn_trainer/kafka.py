"""Producing failure-location tables to the compacted Kafka topic.

One key (``fleet``), so compaction keeps the latest table; the value is the
table's canonical JSON (the bytes the API serves), with its version, ETag and
(when the trainer has a signing key) signature in headers. Idempotent
producer, ``acks=all``; :func:`produce_table` returns only after the broker
acknowledged, and raises otherwise, so a run that could not reach Kafka fails
visibly (the table is in LinkDB all the same, and the
next run produces the current table again: the proxies' version rule makes a
repeat harmless).
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, Producer

from polycorn_schema.failure_table import (
    HEADER_ETAG,
    HEADER_SIGNATURE,
    HEADER_VERSION,
    KAFKA_KEY,
)


class PublishError(RuntimeError):
    pass


def produce_table(
    bootstrap: str,
    topic: str,
    body: bytes,
    *,
    version: int,
    etag: str,
    signature: str | None = None,
    timeout_s: float = 30.0,
    kafka: dict[str, str] | None = None,
) -> None:
    """``signature``: the table's (base64), sent in ``polycorn-signature``;
    ``kafka``: the security settings (``polycorn_schema.kafka_security``)."""
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            **(kafka or {}),
            "enable.idempotence": True,
            "acks": "all",
            "message.timeout.ms": int(timeout_s * 1000),
            "message.max.bytes": max(1_000_000, len(body) + 4096),
            # lz4, not zstd: the proxies' librdkafka is built without zstd
            # (proxy/Cargo.toml) and could not decompress the table at all.
            "compression.type": "lz4",
        }
    )
    errors: list[Any] = []

    def report(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    headers: list[tuple[str, str | bytes | None]] = [
        (HEADER_VERSION, str(version).encode()),
        (HEADER_ETAG, etag.encode()),
    ]
    if signature is not None:
        headers.append((HEADER_SIGNATURE, signature.encode()))
    p.produce(
        topic,
        key=KAFKA_KEY,
        value=body,
        headers=headers,
        on_delivery=report,
    )
    left = p.flush(timeout_s + 5)
    if left:
        raise PublishError(f"table v{version} not delivered to {topic} at {bootstrap} in time")
    if errors:
        raise PublishError(f"table v{version} not delivered to {topic}: {errors[0]}")
