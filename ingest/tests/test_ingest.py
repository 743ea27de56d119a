"""Kafka → LinkDB against the real Kafka and PostGIS (scripts/infra.sh)."""

from __future__ import annotations

import secrets
import threading
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from helpers import (
    T0,
    bootstrap,
    cell,
    counts,
    gps,
    handover,
    line,
    mixed,
    produce,
    query,
    snapshot,
    topics,
)

import polycorn_schema.telemetry.v1.telemetry_pb2 as pb
from polycorn_ingest.consumer import IngestConfig, Ingestor
from polycorn_ingest.metrics import Metrics
from polycorn_ingest.sink import LinkDbSink
from polycorn_schema.testing import fresh_database, service_url

FAST: dict[str, Any] = {"topic.metadata.refresh.interval.ms": 1000}


def ingest(  # noqa: PLR0917
    url: str,
    topic: str,
    dlq: str,
    group: str | None = None,
    sink: LinkDbSink | None = None,
    metrics: Metrics | None = None,
) -> Ingestor:
    cfg = IngestConfig(
        bootstrap(),
        group=group or f"g-{secrets.token_hex(4)}",
        topic=topic,
        dlq_topic=dlq,
        batch_max=500,
        batch_timeout_s=0.2,
        retry_initial_s=0.05,
        retry_max_s=0.2,
        kafka=FAST,
    )
    return Ingestor(cfg, sink or LinkDbSink(service_url(url, "ingest")), metrics or Metrics())


def committed(group: str, topic: str, partitions: int) -> list[int]:
    c = Consumer({"bootstrap.servers": bootstrap(), "group.id": group})
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return [tp.offset for tp in got]
    finally:
        c.close()


def test_duplicates_and_replays_change_nothing() -> None:
    with fresh_database() as url, topics() as (topic, dlq):
        recs = mixed("train-1", T0) + mixed("train-2", T0 + 5000)
        produce(topic, recs + recs)  # every record twice
        group = f"g-{secrets.token_hex(4)}"
        m = Metrics()
        ingest(url, topic, dlq, group, metrics=m).run(until_caught_up=True)
        first = snapshot(url)
        assert first["counts"]["gps_fixes"] == 120
        assert first["counts"]["signal_samples"] == 60
        assert first["counts"]["path_stats"] == 60
        assert first["counts"]["handovers"] == 4
        assert first["counts"]["trips"] == 2
        assert m.rows_written.labels("gps_fixes")._value.get() == 120
        # Replay: the same topic from the start under a fresh group (offsets
        # reset), and the records a third time.
        produce(topic, recs)
        ingest(url, topic, dlq).run(until_caught_up=True)
        assert snapshot(url) == first


def test_derived_rows_do_not_depend_on_arrival_order() -> None:
    recs = mixed("train-1", T0) + line("train-1", T0 + 3_600_000, n=5, track0=10_000)
    rev = list(reversed(recs))
    shots = []
    for order in (recs, rev):
        with fresh_database() as url, topics(partitions=1) as (topic, dlq):
            produce(topic, order)
            ing = ingest(url, topic, dlq)
            ing.cfg.batch_max = 7  # many small batches, out of order
            ing.run(until_caught_up=True)
            shots.append(snapshot(url))
    assert shots[0] == shots[1]
    assert len(shots[0]["trips"]) == 2, "an hour without fixes splits the trips"


def test_garbage_goes_to_the_dead_letter_topic_with_the_reason() -> None:
    with fresh_database() as url, topics(partitions=1) as (topic, dlq):
        good = gps("train-1", T0, 39.8, 116.3, 1.0)
        bad: list[tuple[bytes | None, bytes]] = [
            (b"train-1", b"\x08\x96\x01garbage\xff"),
            (b"train-1", pb.Record(train_id="train-1", time_unix_ms=T0).SerializeToString()),
            (b"someone-else", good.SerializeToString()),
            (b"train-1", gps("train-1", T0 + 1000, 95.0, 116.3).SerializeToString()),
            (b"train-1", cell("train-1", T0, "nul\x00", 5).SerializeToString()),
        ]
        produce(topic, [good, *bad])
        m = Metrics()
        ingest(url, topic, dlq, metrics=m).run(until_caught_up=True)
        assert counts(url)["gps_fixes"] == 1
        c = Consumer(
            {
                "bootstrap.servers": bootstrap(),
                "group.id": f"r-{secrets.token_hex(4)}",
                "auto.offset.reset": "earliest",
            }
        )
        c.subscribe([dlq])
        got: list[Any] = []
        while len(got) < len(bad):
            got.extend(x for x in c.consume(10, 5) if x.error() is None)
        c.close()
        reasons = []
        for msg, (key, value) in zip(got, bad, strict=True):
            h = dict(msg.headers())
            assert (msg.key(), msg.value()) == (key, value)
            assert h["polycorn-source-topic"] == topic.encode()
            assert h["polycorn-source-partition"] == b"0"
            reasons.append(h["polycorn-error"].decode().split(":")[0])
            assert int(h["polycorn-source-offset"]) >= 1
        assert reasons == ["decode_error", "no_body", "key_mismatch", "bad_position", "bad_value"]
        assert m.dead_letters.labels("key_mismatch")._value.get() == 1


def test_no_offsets_are_committed_while_the_database_is_down() -> None:
    with fresh_database() as url, topics(partitions=2) as (topic, dlq):
        recs = mixed("train-1", T0) + mixed("train-2", T0)
        produce(topic, recs)
        group = f"g-{secrets.token_hex(4)}"
        # A port nothing listens on: the database is "down".
        head, _, tail = url.rpartition("@")
        host_db = tail.split("/", 1)
        sink = LinkDbSink(f"{head}@127.0.0.1:1/{host_db[1]}")
        m = Metrics()
        ing = ingest(url, topic, dlq, group, sink=sink, metrics=m)
        th = threading.Thread(target=ing.run, kwargs={"until_caught_up": True})
        th.start()
        try:
            # A hang guard, not a timing assertion: 2,400 polls of 50 ms.
            for _ in range(2400):
                if m.db_errors._value.get() >= 3:
                    break
                th.join(0.05)
                assert th.is_alive()
            else:
                pytest.fail(f"ingest counted {m.db_errors._value.get()} database errors, not 3")
            assert all(o < 0 for o in committed(group, topic, 2)), "nothing committed"
            assert counts(url)["gps_fixes"] == 0
            sink.url = url  # the database is back
            th.join(120)
            assert not th.is_alive()
        finally:
            ing.stop()
            th.join(30)
        assert counts(url)["gps_fixes"] == 120
        assert sum(max(o, 0) for o in committed(group, topic, 2)) == len(recs)


def test_trips_cells_and_directions_are_derived() -> None:
    with fresh_database() as url, topics(partitions=1) as (topic, dlq):
        a = (1 << 32) | 7
        b = (1 << 32) | 8
        # Southbound along increasing track_m, then (next trip) back north.
        up = line("train-1", T0, n=30)
        down = [
            gps(
                "train-1",
                T0 + 7_200_000 + i * 1000,
                39.8,
                116.3 + (30 - i) * 0.001,
                10_000.0 - 80 * i,
            )
            for i in range(30)
        ]
        hos = [
            handover("train-1", T0 + 10_500, "carrier-a", a, b, 39.79, 116.31, 840.0),
            handover(
                "train-1", T0 + 20_500, "carrier-a", a, b, 39.78, 116.32, 1640.0, failure=True
            ),
            handover(
                "train-1",
                T0 + 7_200_000 + 5_500,
                "carrier-a",
                a,
                b,
                39.8,
                116.32,
                9560.0,
                failure=True,
            ),
        ]
        # Handovers first: their direction is decided when the fixes arrive.
        produce(topic, hos + up + down)
        ingest(url, topic, dlq).run(until_caught_up=True)
        trips = query(url, "SELECT fixes, direction FROM trips ORDER BY started_at")
        assert trips == [(30, "increasing"), (30, "decreasing")]
        cells = query(
            url,
            "SELECT direction, handovers, failures, earliest_ho_track_m "
            "FROM cells ORDER BY direction",
        )
        assert cells == [("increasing", 2, 1, 840.0), ("decreasing", 1, 1, 9560.0)]
        linked = query(
            url,
            "SELECT count(*) FROM handovers h JOIN cells c ON c.id = h.cell "
            "AND c.direction = h.direction JOIN trips t ON t.id = h.trip_id "
            "AND h.start_time BETWEEN t.started_at AND t.ended_at",
        )
        assert linked == [(3,)]
        trains = query(url, "SELECT id, source FROM trains")
        assert trains == [("train-1", "telemetry")]


def test_without_track_the_direction_comes_from_the_gps_track() -> None:
    with fresh_database() as url, topics(partitions=1) as (topic, dlq):
        east = [gps("t", T0 + i * 1000, 39.8, 116.3 + i * 0.001) for i in range(10)]
        west = [gps("t", T0 + 3_600_000 + i * 1000, 39.8, 116.4 - i * 0.001) for i in range(10)]
        hos = [
            handover("t", T0 + 4500, "c", 5, 6, 39.8, 116.3045),
            handover("t", T0 + 3_604_500, "c", 5, 6, 39.8, 116.3955),
        ]
        produce(topic, east + west + hos)
        ingest(url, topic, dlq).run(until_caught_up=True)
        got = query(
            url, "SELECT direction, handovers, earliest_ho_track_m FROM cells ORDER BY direction"
        )
        assert got == [("increasing", 1, None), ("decreasing", 1, None)]
