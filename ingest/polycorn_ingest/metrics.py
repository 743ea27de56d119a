"""ingest's Prometheus metrics, in their own registry (tests make one each).

Names follow ``polycorn_<subsystem>_<name>_<unit>[_total]``; label sets are
bounded (record kinds, table names, dead-letter reasons, partitions).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

LAG_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
BATCH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Metrics:
    """Every metric ingest exports."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry if registry is not None else CollectorRegistry()
        self.records = Counter(
            "polycorn_ingest_records_total",
            "Telemetry records consumed, by kind (gps, cell, handover, path, invalid)",
            ["kind"],
            registry=r,
        )
        self.rows_written = Counter(
            "polycorn_ingest_rows_written_total",
            "Rows inserted into LinkDB (duplicates and replays not counted), by table",
            ["table"],
            registry=r,
        )
        self.dead_letters = Counter(
            "polycorn_ingest_dead_letters_total",
            "Records sent to the dead-letter topic, by reason",
            ["reason"],
            registry=r,
        )
        self.batch_seconds = Histogram(
            "polycorn_ingest_batch_seconds",
            "Time to decode, store and commit one batch",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.consumer_lag = Gauge(
            "polycorn_ingest_consumer_lag",
            "Messages behind the partition's high watermark (high watermark - position)",
            ["partition"],
            registry=r,
        )
        self.db_errors = Counter(
            "polycorn_ingest_db_errors_total",
            "Failed database transactions (retried with backoff)",
            registry=r,
        )
        self.kafka_errors = Counter(
            "polycorn_ingest_kafka_errors_total",
            "Kafka consumer, producer and commit errors",
            registry=r,
        )
        self.end_to_end_lag = Histogram(
            "polycorn_ingest_end_to_end_lag_seconds",
            "Database commit time minus record time (train clock), sampled per batch",
            buckets=LAG_BUCKETS,
            registry=r,
        )

    def serve(self, addr: str) -> None:
        """Serve /metrics on ``host:port`` (a daemon thread)."""
        host, _, port = addr.rpartition(":")
        start_http_server(int(port), addr=host.strip("[]") or "127.0.0.1", registry=self.registry)
