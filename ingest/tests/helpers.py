"""Test helpers: records, topics on the real Kafka, queries on the real LinkDB."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

import polycorn_schema.telemetry.v1.telemetry_pb2 as pb
from polycorn_schema.startup import kafka_create_topics

T0 = 1_795_000_000_000  # 2026-11-18, Unix ms


def bootstrap() -> str:
    b = os.environ.get("POLYCORN_KAFKA_BOOTSTRAP")
    if not b:
        raise RuntimeError(
            "POLYCORN_KAFKA_BOOTSTRAP is not set: run `scripts/infra.sh up kafka` and "
            '`eval "$(scripts/infra.sh env)"` (make test-py does both)'
        )
    return b


@contextmanager
def topics(partitions: int = 3) -> Iterator[tuple[str, str]]:
    """A fresh telemetry topic and DLQ topic, deleted afterwards."""
    tag = secrets.token_hex(4)
    names = (f"test.telemetry.{tag}", f"test.dlq.{tag}")
    admin = AdminClient({"bootstrap.servers": bootstrap()})
    kafka_create_topics(bootstrap(), [NewTopic(names[0], partitions, 1), NewTopic(names[1], 1, 1)])
    try:
        yield names
    finally:
        for f in admin.delete_topics(list(names)).values():
            f.result(30)


def gps(  # noqa: PLR0917
    train: str,
    t_ms: int,
    lat: float,
    lon: float,
    track_m: float | None = None,
    speed: float = 80.0,
    heading: float = 160.0,
) -> pb.Record:
    g = pb.GpsFix(lat_deg=lat, lon_deg=lon, speed_mps=speed, heading_deg=heading, accuracy_m=5)
    if track_m is not None:
        g.track_m = track_m
    return pb.Record(train_id=train, time_unix_ms=t_ms, gps=g)


def cell(  # noqa: PLR0917
    train: str, t_ms: int, carrier: str, cell_id: int, rsrp: float = -95.0, path: int = 0
) -> pb.Record:
    return pb.Record(
        train_id=train,
        time_unix_ms=t_ms,
        cell=pb.CellSample(
            path=path,
            carrier=carrier,
            cell_id=cell_id,
            rsrp_dbm=rsrp,
            registration=pb.REGISTRATION_STATE_REGISTERED,
            measured_unix_ms=t_ms - 100,
        ),
    )


def handover(  # noqa: PLR0917
    train: str,
    t_ms: int,
    carrier: str,
    src: int,
    dst: int,
    lat: float,
    lon: float,
    track_m: float | None = None,
    failure: bool = False,
    path: int = 0,
) -> pb.Record:
    h = pb.HandoverEvent(
        path=path,
        carrier=carrier,
        source_cell_id=src,
        target_cell_id=dst,
        start_unix_ms=t_ms,
        start_lat_deg=lat,
        start_lon_deg=lon,
        rsrp_dbm=-110.0,
        outcome=pb.HANDOVER_OUTCOME_FAILURE if failure else pb.HANDOVER_OUTCOME_SUCCESS,
        duration_ms=3000 if failure else 50,
    )
    if track_m is not None:
        h.start_track_m = track_m
    return pb.Record(train_id=train, time_unix_ms=t_ms + 100, handover=h)


def pathstat(train: str, t_ms: int, path: int = 0) -> pb.Record:
    return pb.Record(
        train_id=train,
        time_unix_ms=t_ms,
        path=pb.PathStatistics(
            path=path,
            carrier="carrier-a",
            up=True,
            srtt_us=40_000,
            rate_bps=10_000_000,
            bytes_sent=1000,
            bytes_acked=900,
            rto_count=1,
        ),
    )


def produce(topic: str, records: Iterable[pb.Record | tuple[bytes | None, bytes]]) -> int:
    p = Producer({"bootstrap.servers": bootstrap(), "linger.ms": 5})
    n = 0
    for r in records:
        if isinstance(r, tuple):
            key, value = r
        else:
            key, value = r.train_id.encode(), r.SerializeToString()
        p.produce(topic, key=key, value=value)
        n += 1
        if n % 10000 == 0:
            p.poll(0)
    assert p.flush(30) == 0
    return n


def query(url: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as c:
        return c.execute(sql, args or None).fetchall()


def counts(url: str) -> dict[str, int]:
    out = {}
    for t in ("trains", "trips", "gps_fixes", "signal_samples", "path_stats", "handovers", "cells"):
        out[t] = query(url, f"SELECT count(*) FROM {t}")[0][0]
    return out


def line(  # noqa: PLR0917
    train: str,
    t_ms: int,
    step_s: float = 1.0,
    n: int = 10,
    track0: float = 0.0,
    v_mps: float = 80.0,
    with_track: bool = True,
) -> list[pb.Record]:
    """A train moving south-east-ish at v: fixes every step_s seconds."""
    out = []
    for i in range(n):
        d = track0 + v_mps * step_s * i
        out.append(
            gps(
                train,
                t_ms + int(i * step_s * 1000),
                39.8 - d / 111_000 * 0.94,
                116.3 + d / 85_000 * 0.34,
                d if with_track else None,
            )
        )
    return out


def mixed(train: str, t0: int, n: int = 60) -> list[pb.Record]:
    """n fixes along a line, a cell sample and a path statistic every 2 s, a
    handover every 20 s (every other one failed)."""
    recs = line(train, t0, n=n)
    for i in range(0, n, 2):
        recs.append(cell(train, t0 + i * 1000 + 300, "carrier-a", (1 << 32) | (i // 20)))
        recs.append(pathstat(train, t0 + i * 1000 + 400))
    for k in range(1, n // 20):
        i = 20 * k
        recs.append(
            handover(
                train,
                t0 + i * 1000 + 500,
                "carrier-a",
                (1 << 32) | (k - 1),
                (1 << 32) | k,
                39.79,
                116.31,
                80.0 * i + 40,
                failure=k % 2 == 0,
            )
        )
    return recs


def snapshot(url: str) -> dict[str, Any]:
    """What ingest stored and derived, without the surrogate ids."""
    return {
        "counts": counts(url),
        "trips": query(
            url, "SELECT train_id, started_at, ended_at, fixes, direction FROM trips ORDER BY 1, 2"
        ),
        "handovers": query(
            url,
            "SELECT h.train_id, h.start_time, h.direction, t.started_at, "
            "c.cell_id FROM handovers h LEFT JOIN trips t ON t.id = h.trip_id "
            "LEFT JOIN cells c ON c.id = h.cell ORDER BY 1, 2",
        ),
        "cells": query(
            url,
            "SELECT carrier, cell_id, direction, handovers, failures, "
            "earliest_ho_track_m, ST_AsText(earliest_ho_geog), first_seen, "
            "last_seen FROM cells ORDER BY 1, 2, 3",
        ),
        "trains": query(url, "SELECT id, source, first_seen, last_seen FROM trains ORDER BY 1"),
    }
