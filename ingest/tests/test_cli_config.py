"""``polycorn-ingest run``'s flags reach the Kafka consumer (no broker needed: the
client is created, never connected)."""

from __future__ import annotations

from typing import Any

import pytest

from polycorn_ingest import cli, consumer
from polycorn_ingest.metrics import Metrics


def consumer_config(monkeypatch: pytest.MonkeyPatch, *flags: str) -> dict[str, Any]:
    configs: list[dict[str, Any]] = []
    monkeypatch.setattr(consumer, "Consumer", configs.append)
    monkeypatch.setattr(consumer, "Producer", lambda conf: None)
    argv = ["run", "--bootstrap", "127.0.0.1:1", "--database-url", "postgresql://x/y", *flags]
    a = cli._parser().parse_args(argv)
    consumer.Ingestor(cli.ingest_config(a, {}), sink=None, metrics=Metrics())  # type: ignore[arg-type]
    return configs[0]


def test_the_session_timeout_is_ten_seconds_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    assert consumer_config(monkeypatch)["session.timeout.ms"] == 10_000
    conf = consumer_config(monkeypatch, "--session-timeout-s", "6.5", "--group", "g2")
    assert (conf["session.timeout.ms"], conf["group.id"]) == (6_500, "g2")
