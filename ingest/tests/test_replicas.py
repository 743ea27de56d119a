"""Two ingest replicas in one consumer group keep exactly-once into LinkDB when one
is SIGKILLed in the middle of the stream and the group rebalances, against the real
Kafka and PostGIS (scripts/infra.sh).

A known stream (18 trains: fixes, cell samples, path statistics, handovers on shared
cells) goes into a 6-partition topic in two halves. The survivor is the real
``polycorn-ingest run``; the others are replica_worker.py (the real Ingestor and
sink in a process of their own), which holds still at one point of every batch and
says so, so that the test can SIGKILL it exactly there:

1. the victim and the survivor split the partitions; the first half goes in; the
   victim is killed **before the database write** of a batch of its own partitions
   (consumed, not stored: its next owner must read it again, so its offsets must not
   have been committed, or it is lost);
2. the group notices (the victim's session timeout, 6 s) and rebalances; a
   replacement joins and takes some partitions; the second half goes in; the
   replacement is killed **after the database commit** of a batch, before its
   offsets (stored, not committed: its next owner stores it a second time, which
   must change nothing: no row twice, no handover counted twice in a cell, no fix
   twice in a trip);
3. the survivor takes every partition over and finishes.

When the group's committed offsets reach the end of every partition, LinkDB must hold
every record's row exactly once, and everything ingest derives from them must equal
what one consumer never interrupted derives from the same stream.
"""

from __future__ import annotations

import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

import pytest
from confluent_kafka import Consumer, TopicPartition
from helpers import T0, bootstrap, mixed, produce, query, snapshot, topics

import polycorn_schema.telemetry.v1.telemetry_pb2 as pb
from polycorn_ingest.consumer import IngestConfig, Ingestor
from polycorn_ingest.metrics import Metrics
from polycorn_ingest.sink import LinkDbSink
from polycorn_schema.testing import fresh_database, service_url

PARTITIONS = 6
ALL = set(range(PARTITIONS))
WORKER = Path(__file__).with_name("replica_worker.py")
CLI = Path(sys.executable).with_name("polycorn-ingest")

T = TypeVar("T")


def stream() -> list[pb.Record]:
    return [r for i in range(18) for r in mixed(f"train-{i:02d}", T0 + 997 * i, n=80)]


def expected_keys(recs: list[pb.Record]) -> dict[str, set[tuple[Any, ...]]]:
    """Each table's natural keys of the rows the records make."""
    keys: dict[str, set[tuple[Any, ...]]] = {
        "gps_fixes": set(),
        "signal_samples": set(),
        "path_stats": set(),
        "handovers": set(),
    }
    for r in recs:
        kind = r.WhichOneof("body")
        if kind == "gps":
            keys["gps_fixes"].add((r.train_id, r.time_unix_ms))
        elif kind == "cell":
            keys["signal_samples"].add((r.train_id, r.cell.path, r.time_unix_ms))
        elif kind == "path":
            keys["path_stats"].add((r.train_id, r.path.path, r.time_unix_ms))
        elif kind == "handover":
            h = r.handover
            keys["handovers"].add((r.train_id, h.carrier, h.start_unix_ms))
    return keys


MS = "(extract(epoch from {}) * 1000)::bigint"
STORED = {
    "gps_fixes": f"SELECT train_id, {MS.format('time')} FROM gps_fixes",
    "signal_samples": f"SELECT train_id, path, {MS.format('time')} FROM signal_samples",
    "path_stats": f"SELECT train_id, path, {MS.format('time')} FROM path_stats",
    "handovers": f"SELECT train_id, carrier, {MS.format('start_time')} FROM handovers",
}


def stored_rows(url: str) -> dict[str, list[tuple[Any, ...]]]:
    return {t: [tuple(r) for r in query(url, sql)] for t, sql in STORED.items()}


def rows_in(url: str) -> int:
    return sum(query(url, f"SELECT count(*) FROM {t}")[0][0] for t in STORED)


class Replica:
    """A replica's process; a thread collects its output lines."""

    def __init__(self, name: str, cmd: list[str]) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        self.lines: list[str] = []
        self._cv = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cv:
                self.lines.append(line.rstrip("\n"))
                self._cv.notify_all()
        with self._cv:
            self._cv.notify_all()

    def wait_for(self, what: str, found: Callable[[list[str]], T | None], guard_s: float) -> T:
        """``found(lines)`` once it is something. A hang guard, not a timing assertion:
        it fails after ``guard_s`` or when the process ends first."""
        end = time.monotonic() + guard_s
        with self._cv:
            while True:
                got = found(self.lines)
                if got:
                    return got
                left = end - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    tail = "\n".join(self.lines[-30:])
                    pytest.fail(f"{self.name}: no {what} (exit {self.proc.poll()}):\n{tail}")
                self._cv.wait(min(left, 0.5))

    def go(self) -> None:
        """Let a worker started with ``--wait`` join its group."""
        self.wait_for("start", lambda ls: "ready" in ls, 120)
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        """SIGTERM (finish the batch, leave the group), SIGKILL if that hangs."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._reader.join(10)


def parts(text: str) -> set[int]:
    return {int(p) for p in re.findall(r"\d+", text)}


def held(lines: list[str]) -> set[int]:
    """A replica's partitions after these lines: cooperative rebalancing assigns and
    revokes some at a time. The worker writes ``assigned 0,3``, the CLI's log
    ``assigned [0, 3]``."""
    have: set[int] = set()
    for line in lines:
        m = re.search(r"\b(assigned|revoked) \[?([\d, ]*)\]?$", line)
        if m and m[1] == "assigned":
            have |= parts(m[2])
        elif m:
            have -= parts(m[2])
    return have


def ends(topic: str, partitions: int = PARTITIONS) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap(), "group.id": f"w-{secrets.token_hex(4)}"})
    try:
        return {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
    finally:
        c.close()


def uninterrupted(url: str, topic: str, dlq: str) -> dict[str, Any]:
    """What one consumer, never interrupted, stores from the stream in ``topic``."""
    cfg = IngestConfig(
        bootstrap(),
        group=f"g-{secrets.token_hex(4)}",
        topic=topic,
        dlq_topic=dlq,
        batch_max=500,
        batch_timeout_s=0.2,
        kafka={"topic.metadata.refresh.interval.ms": 1000},
    )
    Ingestor(cfg, LinkDbSink(service_url(url, "ingest")), Metrics()).run(until_caught_up=True)
    return snapshot(url)


@pytest.fixture(scope="module")
def reference() -> Iterator[Future[dict[str, Any]]]:
    """:func:`uninterrupted`, running while the first test waits for its replicas (the
    database is made first: two migrations at once in one process trip Alembic)."""
    with (
        fresh_database() as url,
        topics(partitions=PARTITIONS) as (topic, dlq),
        ThreadPoolExecutor(1) as pool,
    ):
        produce(topic, stream())
        yield pool.submit(uninterrupted, url, topic, dlq)


@dataclass
class Group:
    """The consumer group of one test: its replicas, on one topic and database."""

    url: str  # LinkDB, as the superuser (for the checks)
    topic: str
    dlq: str
    name: str = field(default_factory=lambda: f"g-{secrets.token_hex(4)}")
    replicas: list[Replica] = field(default_factory=list)

    @cached_property
    def ingest_url(self) -> str:
        return service_url(self.url, "ingest")

    def cli(self, name: str) -> Replica:
        """A replica as deployed: ``polycorn-ingest run``."""
        r = Replica(
            name,
            [
                str(CLI),
                "run",
                f"--bootstrap={bootstrap()}",
                f"--database-url={self.ingest_url}",
                f"--topic={self.topic}",
                f"--dlq-topic={self.dlq}",
                f"--group={self.name}",
                "--batch-max=200",
                "--batch-timeout-s=0.2",
                "--metrics-addr=",
            ],
        )
        self.replicas.append(r)
        return r

    def worker(self, name: str, point: str, *extra: str) -> Replica:
        """A replica that holds still at ``point`` of each batch (replica_worker.py)."""
        r = Replica(
            name,
            [
                sys.executable,
                str(WORKER),
                f"--bootstrap={bootstrap()}",
                f"--database-url={self.ingest_url}",
                f"--topic={self.topic}",
                f"--dlq-topic={self.dlq}",
                f"--group={self.name}",
                f"--pause={point}",
                *extra,
            ],
        )
        self.replicas.append(r)
        return r

    def split(self, a: Replica, b: Replica) -> None:
        """Until ``a`` and ``b`` hold every partition between them, each some."""
        a.wait_for("partitions", held, 120)
        b.wait_for("partitions", lambda ls: held(ls) and held(ls) | held(a.lines) == ALL, 120)

    def committed(self) -> dict[int, int]:
        c = Consumer({"bootstrap.servers": bootstrap(), "group.id": self.name})
        try:
            got = c.committed([TopicPartition(self.topic, p) for p in ALL], timeout=10)
            # Nothing committed yet (OFFSET_INVALID) is 0: an empty partition's end.
            return {tp.partition: max(tp.offset, 0) for tp in got}
        finally:
            c.close()

    def kill(self, victim: Replica, other: Replica) -> Kill:
        """SIGKILL ``victim`` as it holds still in its second batch or a later one, of
        partitions it holds and ``other`` does not."""

        def own_batch(ls: list[str]) -> tuple[int, dict[int, int]] | None:
            for line in ls:
                if line.startswith("pause "):
                    _, _, n, offs = line.split(" ", 3)
                    batch = {int(p): int(o) for p, o in (x.split(":") for x in offs.split(","))}
                    mine = set(batch) <= held(ls) and not set(batch) & held(other.lines)
                    if int(n) >= 2 and mine:
                        return int(n), batch
            return None

        n, batch = victim.wait_for("second batch of its own partitions", own_batch, 120)
        victim.proc.kill()  # no shutdown, no leaving the group
        victim.proc.wait(10)
        return Kill(victim.name, n, batch, rows_in(self.url), self.committed())

    def until_done(self, survivor: Replica) -> None:
        """Until the group has committed the end of every partition."""
        end = ends(self.topic)
        guard = time.monotonic() + 120  # a hang guard
        while (now := self.committed()) != end:
            assert survivor.proc.poll() is None, "the survivor died"
            assert time.monotonic() < guard, f"the group did not finish: {now}, end {end}"
            time.sleep(0.5)


@dataclass
class Kill:
    """Where a replica was SIGKILLed, and what the group had done by then."""

    replica: str
    batch: int  # its batch number (from 1)
    offsets: dict[int, int]  # the batch's partitions, each with the offset after it
    rows: int  # rows in LinkDB's four tables at the kill
    committed: dict[int, int]  # the group's committed offsets at the kill


def exactly_once(url: str, want: dict[str, set[tuple[Any, ...]]]) -> list[str]:
    """Each table's rows against the records' keys: what is missing or there twice."""
    got = stored_rows(url)
    problems = []
    for table, keys in want.items():
        rows = got[table]
        missing = keys - set(rows)
        doubled = len(rows) - len(set(rows))
        if missing or doubled or len(set(rows)) != len(keys):
            problems.append(
                f"{table}: {len(rows)} rows for {len(keys)} records, "
                f"{len(missing)} missing (e.g. {sorted(missing)[:3]}), {doubled} twice"
            )
    return problems


def test_two_replicas_keep_exactly_once_through_kills_and_rebalances(
    reference: Future[dict[str, Any]],
) -> None:
    recs = stream()
    want = expected_keys(recs)
    with fresh_database() as url, topics(partitions=PARTITIONS) as (topic, dlq):
        g = Group(url, topic, dlq)
        try:
            victim = g.worker("victim", "before-db-write")
            survivor = g.cli("survivor")
            # Started now, it is ready to join when it is wanted.
            replacement = g.worker("replacement", "after-db-commit", "--wait")
            g.split(victim, survivor)
            produce(topic, recs[::2])
            first = g.kill(victim, survivor)
            mark = len(survivor.lines)
            replacement.go()
            g.split(replacement, survivor)
            took = held(survivor.lines[mark:]) | held(replacement.lines)
            produce(topic, recs[1::2])
            second = g.kill(replacement, survivor)
            g.until_done(survivor)
            last = held(survivor.lines)
        finally:
            for r in g.replicas:
                r.stop()
        kills = f"killed: {first}, {second}"
        # Every record's row once: nothing lost, nothing twice ...
        problems = exactly_once(url, want)
        assert not problems, kills + "\n" + "\n".join(problems)
        # ... and what is derived from them as one uninterrupted consumer derives it.
        assert snapshot(url) == reference.result(), kills
        assert sum(ends(dlq, 1).values()) == 0, "records were dead-lettered"
    # The kills came in the middle of the stream, each in the window it was meant for,
    # and the victims' partitions went to the replicas left.
    total = sum(len(k) for k in want.values())
    for k in (first, second):
        assert 0 < k.rows < total, k
        for p, o in k.offsets.items():
            assert k.committed[p] < o, (
                f"{k.replica}, partition {p}: offset {k.committed[p]} committed at the "
                f"kill, the batch ends at {o}: its next owner would not read it again"
            )
    assert set(first.offsets) <= took, f"{set(first.offsets)} not taken over, {took}"
    assert last == ALL, f"the survivor holds {last}, not every partition"
