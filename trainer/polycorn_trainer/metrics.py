"""The trainer's Prometheus metrics (own registry; tests make one each)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

RUN_BUCKETS = (1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
# A failure's way into a table: the ingest lag, a poll interval, the refit
# of a few cells; the bound is a minute.
DELAY_BUCKETS = (1, 2.5, 5, 10, 15, 20, 30, 45, 60, 90, 120, 300, 600)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry if registry is not None else CollectorRegistry()
        self.run_seconds = Histogram(
            "polycorn_trainer_run_seconds",
            "Duration of a trainer run (load, fit, validate, store, publish)",
            buckets=RUN_BUCKETS,
            registry=r,
        )
        self.runs = Counter(
            "polycorn_trainer_runs_total",
            "Trainer runs, by result (ok, error)",
            ["result"],
            registry=r,
        )
        self.cells = Gauge(
            "polycorn_trainer_cells",
            "Cells of the last run, by model kind "
            "(linear_svc, too_few, no_failures, failures_only)",
            ["kind"],
            registry=r,
        )
        self.cells_fitted = Gauge(
            "polycorn_trainer_cells_fitted", "Cells with a fitted SVM in the last run", registry=r
        )
        self.handovers = Gauge(
            "polycorn_trainer_handovers_used", "Handovers the last run learned from", registry=r
        )
        self.validation = Gauge(
            "polycorn_trainer_validation_ratio",
            "Leave-one-trip-out validation of the last run (fractions 0-1), by metric",
            ["metric"],
            registry=r,
        )
        self.table_version = Gauge(
            "polycorn_trainer_table_version", "Version of the last table published", registry=r
        )
        self.table_entries = Gauge(
            "polycorn_trainer_table_entries", "Entries of the last table published", registry=r
        )
        self.last_success = Gauge(
            "polycorn_trainer_last_success_timestamp_seconds",
            "Unix time of the last successful run",
            registry=r,
        )
        self.table_refused = Counter(
            "polycorn_trainer_table_refused_total",
            "Runs that refused to sign or build on the current failure_tables row: its stored "
            "bytes are not the canonical form of its body (a row not written by a publisher)",
            registry=r,
        )
        self.model_id = Gauge("polycorn_trainer_model_id", "models.id of the last run", registry=r)
        # polycorn-trainer follow (follow.py).
        self.follow_polls = Counter(
            "polycorn_trainer_follow_polls_total",
            "Follower polls, by result: idle (no new failure), unchanged (cells refitted, no "
            "entry moved), published (a new table version), error",
            ["result"],
            registry=r,
        )
        self.follow_failures = Counter(
            "polycorn_trainer_follow_failures_total",
            "New handover failures the follower has read",
            registry=r,
        )
        self.follow_cells = Counter(
            "polycorn_trainer_follow_cells_refitted_total",
            "Cells the follower has refitted (the cells of new failures)",
            registry=r,
        )
        self.follow_backlog = Gauge(
            "polycorn_trainer_follow_backlog_cells",
            "Cells with new failures left for the next poll (over --max-cells)",
            registry=r,
        )
        self.follow_delay = Histogram(
            "polycorn_trainer_follow_failure_to_table_seconds",
            "From a handover failure's start (the train's clock) to the table version whose "
            "entry it moved being published (LinkDB; Kafka follows at once)",
            buckets=DELAY_BUCKETS,
            registry=r,
        )

    def serve(self, addr: str) -> None:
        host, _, port = addr.rpartition(":")
        start_http_server(int(port), addr=host.strip("[]") or "127.0.0.1", registry=self.registry)
