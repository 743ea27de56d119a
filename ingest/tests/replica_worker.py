"""One ingest replica for test_replicas.py, in a process of its own: the real
:class:`Ingestor` and :class:`LinkDbSink`, holding still at one point of every
batch and saying so on stdout, so that the test can SIGKILL it exactly there.

    python replica_worker.py --bootstrap B --database-url URL --topic T --dlq-topic D
        --group G --pause before-db-write|after-db-commit [--pause-s 0.25]
        [--batch-max 50] [--session-timeout-ms 6000] [--wait]

Lines on stdout (flushed at once):

- ``assigned P,P,...`` / ``revoked P,P,...``: the partitions the group gave or took;
- ``pause POINT N P:O,P:O,...``: batch N (from 1) holds still at POINT for the
  pause; P:O is each partition of the batch with the offset after its last message,
  the offset the consumer commits once the batch is done.

With ``--wait`` it joins the group only once a line arrives on stdin (so that it can
start, which takes seconds of imports, before it is wanted).

``before-db-write`` holds before the batch's database transaction begins,
``after-db-commit`` after it committed and before the offsets are committed. A short
session timeout (6 s, the broker's least) lets the group notice a killed replica
sooner (librdkafka's default is 45 s).
"""

from __future__ import annotations

import argparse
import sys
import time

from confluent_kafka import Consumer, Message, TopicPartition

from polycorn_ingest.consumer import IngestConfig, Ingestor
from polycorn_ingest.metrics import Metrics
from polycorn_ingest.records import Rows
from polycorn_ingest.sink import LinkDbSink, WriteResult

POINTS = ("before-db-write", "after-db-commit")


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class PausingSink(LinkDbSink):
    """The real sink, holding still before or after each transaction."""

    def __init__(self, url: str, point: str, pause_s: float) -> None:
        super().__init__(url)
        self.point = point
        self.pause_s = pause_s
        self.batch = 0
        self.offsets = ""

    def _hold(self, point: str) -> None:
        if point == self.point:
            say(f"pause {point} {self.batch} {self.offsets}")
            time.sleep(self.pause_s)

    def write(self, rows: Rows) -> WriteResult:
        self._hold("before-db-write")
        result = super().write(rows)
        self._hold("after-db-commit")
        return result


class AnnouncingIngestor(Ingestor):
    """The real consumer loop; says what it is given and which offsets a batch ends at."""

    sink: PausingSink

    def _on_assign(self, consumer: Consumer, parts: list[TopicPartition]) -> None:
        super()._on_assign(consumer, parts)
        say("assigned " + ",".join(str(p.partition) for p in parts))

    def _on_revoke(self, consumer: Consumer, parts: list[TopicPartition]) -> None:
        super()._on_revoke(consumer, parts)
        say("revoked " + ",".join(str(p.partition) for p in parts))

    def process(self, msgs: list[Message]) -> bool:
        ends: dict[int, int] = {}
        for m in msgs:
            if m.error() is None:
                p, o = m.partition() or 0, (m.offset() or 0) + 1
                ends[p] = max(ends.get(p, 0), o)
        self.sink.batch += 1
        self.sink.offsets = ",".join(f"{p}:{o}" for p, o in sorted(ends.items()))
        return super().process(msgs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--database-url", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--dlq-topic", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--pause", choices=POINTS, required=True)
    ap.add_argument("--pause-s", type=float, default=0.25)
    ap.add_argument("--batch-max", type=int, default=50)
    ap.add_argument("--session-timeout-ms", type=int, default=6000)
    ap.add_argument("--wait", action="store_true", help="join once a line arrives on stdin")
    a = ap.parse_args()
    cfg = IngestConfig(
        a.bootstrap,
        group=a.group,
        topic=a.topic,
        dlq_topic=a.dlq_topic,
        batch_max=a.batch_max,
        batch_timeout_s=0.2,
        session_timeout_ms=a.session_timeout_ms,
        kafka={
            "heartbeat.interval.ms": 1000,
            "topic.metadata.refresh.interval.ms": 1000,
        },
    )
    ing = AnnouncingIngestor(cfg, PausingSink(a.database_url, a.pause, a.pause_s), Metrics())
    if a.wait:
        say("ready")
        sys.stdin.readline()
    ing.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
