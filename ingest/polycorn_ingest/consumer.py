"""The Kafka side: a thin consumer-group adapter around decode → sink → commit.

One loop, one batch at a time, nothing in flight between batches:

1. ``consume(num_messages, timeout)`` a batch (auto-commit off);
2. decode and validate every message (:mod:`polycorn_ingest.records`);
3. store the valid rows in one database transaction
   (:class:`polycorn_ingest.sink.LinkDbSink`), retrying with exponential
   backoff while the database is unreachable; if the database refuses the
   batch for a data reason, bisect it to find the row(s) it refuses;
4. forward the rejected messages to the dead-letter topic (original key and
   value, headers ``polycorn-error``, ``polycorn-source-topic``,
   ``polycorn-source-partition``, ``polycorn-source-offset``) and wait for
   the broker's acknowledgement, retrying while Kafka is unreachable;
5. only then commit the batch's offsets, synchronously.

A crash anywhere before 5 replays the batch, which changes nothing (the
sink is idempotent). A failed offset commit is logged and counted, not
retried: the next batch's commit covers it, and a replay is harmless.
Rebalance callbacks run inside ``consume()``, between batches, when every
consumed message's offset is already committed, so a revoked partition
never has unflushed work; a shutdown during a retry leaves the batch
uncommitted for the next owner.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from polycorn_ingest.metrics import Metrics
from polycorn_ingest.records import InvalidRecordError, Rows, decode
from polycorn_ingest.sink import DataRejectedError, LinkDbSink, TransientDbError, WriteResult

log = logging.getLogger(__name__)


@dataclass
class IngestConfig:
    """Settings of one ingest process (the CLI fills them from flags and env)."""

    bootstrap: str
    group: str = "polycorn-ingest"
    topic: str = "polycorn.telemetry.v1"
    dlq_topic: str = "polycorn.telemetry.dlq"
    batch_max: int = 50_000
    batch_timeout_s: float = 0.5
    retry_initial_s: float = 0.2
    retry_max_s: float = 30.0
    # While the database is down the loop does not poll Kafka; past this the
    # broker drops the consumer from the group (it rejoins and replays).
    max_poll_interval_ms: int = 600_000
    # How long a replica that died (SIGKILL, OOM, a lost node) keeps its
    # partitions before the group hands them on. librdkafka's heartbeats run
    # on its own thread, so a long batch or a stalled database does not
    # count against it. The broker accepts 6 s at least by default.
    session_timeout_ms: int = 10_000
    lag_every_s: float = 1.0
    # Extra librdkafka settings (tests, bench).
    kafka: dict[str, Any] | None = None


@dataclass
class Rejected:
    msg: Message
    reason: str
    detail: str


class Ingestor:
    """Consumes ``cfg.topic`` into LinkDB until :meth:`stop` (or caught up)."""

    def __init__(
        self,
        cfg: IngestConfig,
        sink: LinkDbSink,
        metrics: Metrics | None = None,
        on_commit: Callable[[Rows, float], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.sink = sink
        self.metrics = metrics or Metrics()
        self.on_commit = on_commit
        self._stop = threading.Event()
        self._assignment: set[tuple[str, int]] = set()
        self._last_lag = 0.0
        common = {"bootstrap.servers": cfg.bootstrap, **(cfg.kafka or {})}
        self.consumer = Consumer(
            {
                **common,
                "group.id": cfg.group,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
                # Only committed records of transactional producers.
                "isolation.level": "read_committed",
                "max.poll.interval.ms": cfg.max_poll_interval_ms,
                "session.timeout.ms": cfg.session_timeout_ms,
                "partition.assignment.strategy": "cooperative-sticky",
                "fetch.min.bytes": 1,
                "queued.max.messages.kbytes": 65536,
                "error_cb": self._kafka_error,
            }
        )
        self.producer = Producer(
            {
                **common,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "error_cb": self._kafka_error,
            }
        )
        self.batches = 0
        # Wall time per stage (decode, db, dlq, commit), for the benchmark's profile.
        self.stage_seconds: dict[str, float] = {"decode": 0.0, "db": 0.0, "dlq": 0.0, "commit": 0.0}

    # ------------------------------------------------------------ callbacks

    def _kafka_error(self, err: KafkaError) -> None:
        self.metrics.kafka_errors.inc()
        log.warning("kafka: %s", err)

    def _on_assign(self, consumer: Consumer, parts: list[TopicPartition]) -> None:
        self._assignment |= {(p.topic, p.partition) for p in parts}
        log.info("assigned %s", sorted(p.partition for p in parts))

    def _on_revoke(self, consumer: Consumer, parts: list[TopicPartition]) -> None:
        # Every consumed offset is committed before consume() runs again, so
        # there is nothing to flush or abort here.
        for p in parts:
            self._assignment.discard((p.topic, p.partition))
            with contextlib.suppress(KeyError):
                self.metrics.consumer_lag.remove(str(p.partition))
        log.info("revoked %s", sorted(p.partition for p in parts))

    # ------------------------------------------------------------ loop

    def stop(self) -> None:
        self._stop.set()

    def run(self, *, until_caught_up: bool = False, max_idle_polls: int | None = None) -> None:
        """Consume until :meth:`stop`; with ``until_caught_up``, return once
        every assigned partition's position reached its high watermark."""
        self.consumer.subscribe(
            [self.cfg.topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_revoke,
        )
        idle = 0
        try:
            while not self._stop.is_set():
                msgs = self.consumer.consume(self.cfg.batch_max, self.cfg.batch_timeout_s)
                if msgs:
                    idle = 0
                    if not self.process(msgs):
                        break
                else:
                    idle += 1
                    if max_idle_polls is not None and idle >= max_idle_polls:
                        break
                self._update_lag(force=not msgs)
                if until_caught_up and not msgs and self._caught_up():
                    break
        finally:
            self.close()

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):  # already closed
            self.consumer.close()
        self.producer.flush(5)
        self.sink.close()

    def _caught_up(self) -> bool:
        if not self._assignment:
            return False
        parts = [TopicPartition(t, p) for t, p in sorted(self._assignment)]
        try:
            positions = self.consumer.position(parts)
            for tp in positions:
                _, high = self.consumer.get_watermark_offsets(tp, timeout=5, cached=False)
                pos = tp.offset if tp.offset >= 0 else self._committed(tp)
                if pos < high:
                    return False
        except KafkaException as e:
            self._kafka_error(e.args[0])
            return False
        return True

    def _committed(self, tp: TopicPartition) -> int:
        (c,) = self.consumer.committed([TopicPartition(tp.topic, tp.partition)], timeout=5)
        return int(c.offset) if c.offset >= 0 else 0

    def _update_lag(self, force: bool = False) -> None:
        now = time.monotonic()
        if not self._assignment or (not force and now - self._last_lag < self.cfg.lag_every_s):
            return
        self._last_lag = now
        parts = [TopicPartition(t, p) for t, p in sorted(self._assignment)]
        try:
            for tp in self.consumer.position(parts):
                _, high = self.consumer.get_watermark_offsets(tp, cached=True)
                if tp.offset >= 0 and high >= 0:
                    self.metrics.consumer_lag.labels(str(tp.partition)).set(high - tp.offset)
        except KafkaException as e:
            self._kafka_error(e.args[0])

    # ------------------------------------------------------------ one batch

    def process(self, msgs: list[Message]) -> bool:
        """Store, dead-letter and commit one batch. False: stopped before the
        database commit (offsets left uncommitted)."""
        t0 = time.monotonic()
        good: list[Message] = []
        rejected: list[Rejected] = []
        rows = Rows()
        for m in msgs:
            err = m.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    self._kafka_error(err)
                continue
            try:
                decode(m.key(), m.value(), rows)
                good.append(m)
            except InvalidRecordError as e:
                rejected.append(Rejected(m, e.reason, e.detail))
        offsets = _next_offsets(msgs)
        if not offsets:
            return True
        st = self.stage_seconds
        t1 = time.monotonic()
        st["decode"] += t1 - t0
        if rows:
            stored = self._store(good, rows)
            if stored is None:
                return False
            rejected.extend(stored)
        t2 = time.monotonic()
        st["db"] += t2 - t1
        if rejected and not self._dead_letter(rejected):
            return False
        t3 = time.monotonic()
        st["dlq"] += t3 - t2
        self._commit(offsets)
        st["commit"] += time.monotonic() - t3
        self._count(rows, rejected)
        self.metrics.batch_seconds.observe(time.monotonic() - t0)
        self.batches += 1
        return True

    def _store(self, msgs: list[Message], rows: Rows) -> list[Rejected] | None:
        """Write the rows; on a data error, bisect the messages to isolate the
        ones the database refuses. None: stopped while the database was down."""
        try:
            result = self._write_retrying(rows)
        except DataRejectedError as e:
            if len(msgs) == 1:
                return [Rejected(msgs[0], "db_rejected", str(e))]
            mid = len(msgs) // 2
            out: list[Rejected] = []
            for half in (msgs[:mid], msgs[mid:]):
                part = Rows()
                for m in half:
                    decode(m.key(), m.value(), part)
                got = self._store(half, part)
                if got is None:
                    return None
                out.extend(got)
            return out
        if result is None:
            return None
        commit_s = time.time()
        for table, n in result.inserted.items():
            if n:
                self.metrics.rows_written.labels(table).inc(n)
        times = rows.times
        step = max(1, len(times) // 256)
        for t_ms in times[::step]:
            self.metrics.end_to_end_lag.observe(max(0.0, commit_s - t_ms / 1000))
        if self.on_commit is not None:
            self.on_commit(rows, commit_s)
        return []

    def _write_retrying(self, rows: Rows) -> WriteResult | None:
        delay = self.cfg.retry_initial_s
        while True:
            try:
                return self.sink.write(rows)
            except TransientDbError as e:
                self.metrics.db_errors.inc()
                log.warning("database unavailable (%s); retrying in %.1f s", e, delay)
                if self._stop.wait(delay):
                    return None
                delay = min(delay * 2, self.cfg.retry_max_s)

    def _dead_letter(self, rejected: list[Rejected]) -> bool:
        """Forward to the DLQ and wait until the broker has them all."""
        pending = list(rejected)
        delay = self.cfg.retry_initial_s
        while pending:
            failed: list[Rejected] = []
            for r in pending:
                m = r.msg
                headers: list[tuple[str, str | bytes | None]] = [
                    ("polycorn-error", f"{r.reason}: {r.detail}".encode()),
                    ("polycorn-source-topic", (m.topic() or "").encode()),
                    ("polycorn-source-partition", str(m.partition()).encode()),
                    ("polycorn-source-offset", str(m.offset()).encode()),
                ]
                while True:
                    try:
                        self.producer.produce(
                            self.cfg.dlq_topic,
                            key=m.key(),
                            value=m.value(),
                            headers=headers,
                            on_delivery=_delivery(failed, r),
                        )
                        break
                    except BufferError:
                        self.producer.poll(0.1)
            left = self.producer.flush(30)
            if left == 0 and not failed:
                return True
            self.metrics.kafka_errors.inc()
            log.warning("dead-letter topic: %d not acknowledged; retrying", len(failed) + left)
            if left:
                # Undelivered messages stay queued in the producer; wait more.
                while self.producer.flush(5) > 0:
                    if self._stop.is_set():
                        return False
            pending = failed
            if self._stop.wait(delay):
                return False
            delay = min(delay * 2, self.cfg.retry_max_s)
        return True

    def _commit(self, offsets: list[TopicPartition]) -> None:
        try:
            self.consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as e:
            # The next batch's commit covers these offsets; a replay is harmless.
            self._kafka_error(e.args[0])

    def _count(self, rows: Rows, rejected: list[Rejected]) -> None:
        m = self.metrics.records
        for kind, n in (
            ("gps", len(rows.fixes)),
            ("cell", len(rows.samples)),
            ("handover", len(rows.handovers)),
            ("path", len(rows.paths)),
        ):
            if n:
                m.labels(kind).inc(n)
        if rejected:
            m.labels("invalid").inc(len(rejected))
            for r in rejected:
                self.metrics.dead_letters.labels(r.reason).inc()


def _delivery(failed: list[Rejected], r: Rejected) -> Callable[[KafkaError | None, Message], None]:
    def report(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            failed.append(r)

    return report


def _next_offsets(msgs: list[Message]) -> list[TopicPartition]:
    nxt: dict[tuple[str, int], int] = {}
    for m in msgs:
        if m.error() is not None:
            continue
        key = (m.topic() or "", m.partition() or 0)
        off = (m.offset() or 0) + 1
        if off > nxt.get(key, -1):
            nxt[key] = off
    return [TopicPartition(t, p, o) for (t, p), o in sorted(nxt.items())]
