"""ingest as deployed with authentication: telemetry written by the proxy's
principal over SASL_SSL, consumed by the ingest principal over SASL_SSL into
LinkDB over TLS (sslmode=verify-full), on the real broker and PostgreSQL."""

from __future__ import annotations

import secrets
import threading
import time
from typing import Any

import sqlalchemy as sa
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from helpers import T0, counts, line

from polycorn_ingest.consumer import IngestConfig, Ingestor
from polycorn_ingest.metrics import Metrics
from polycorn_ingest.sink import LinkDbSink
from polycorn_schema.startup import kafka_create_topics
from polycorn_schema.testing import (
    fresh_database,
    kafka_bootstrap,
    kafka_sasl_bootstrap,
    kafka_user,
    service_url,
    tls_url,
)

SSL = "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"


def test_ingest_consumes_over_sasl_ssl_into_linkdb_over_tls() -> None:
    tag = f"test-{secrets.token_hex(4)}"
    # Named so that the ACLs' prefixes match (services/kafka/acls.txt).
    topic, dlq = f"polycorn.telemetry.v1.{tag}", f"polycorn.telemetry.dlq.{tag}"
    kafka_create_topics(kafka_bootstrap(), [NewTopic(topic, 2, 1), NewTopic(dlq, 1, 1)])
    try:
        p = Producer({"bootstrap.servers": kafka_sasl_bootstrap(), **kafka_user("proxy").config()})
        recs = line("train-sasl", T0, n=30)
        for r in recs:
            p.produce(topic, key=r.train_id.encode(), value=r.SerializeToString())
        assert p.flush(60) == 0
        with fresh_database() as url:
            sink = LinkDbSink(tls_url(service_url(url, "ingest")))
            kafka: dict[str, Any] = {
                **kafka_user("ingest").config(),
                "topic.metadata.refresh.interval.ms": 1000,
            }
            cfg = IngestConfig(
                kafka_sasl_bootstrap(),
                group=f"polycorn-ingest-{tag}",
                topic=topic,
                dlq_topic=dlq,
                batch_timeout_s=0.2,
                kafka=kafka,
            )
            m = Metrics()
            ing = Ingestor(cfg, sink, m)
            t = threading.Thread(target=ing.run, kwargs={"until_caught_up": True})
            t.start()
            t.join(120)  # a hang guard (a refused consumer would wait forever)
            ing.stop()
            t.join()
            assert counts(url)["gps_fixes"] == 30
            assert m.kafka_errors._value.get() == 0
            # Both of the sink's connections (psycopg, and SQLAlchemy for the
            # partitions: run() closed them, so once more) use TLS.
            assert sink._connection().execute(SSL).fetchone() == (True,)
            # A month this sink has not made yet (near the present: the only ones it makes).
            next_month = int(time.time() * 1000) + 31 * 86_400_000
            sink._ensure_partitions({"gps_fixes": [next_month, next_month]})
            assert sink._engine is not None
            with sink._engine.connect() as c:
                assert c.execute(sa.text(SSL)).one()[0] is True
            sink.close()
    finally:
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap()})
        for f in admin.delete_topics([topic, dlq]).values():
            f.result(30)
