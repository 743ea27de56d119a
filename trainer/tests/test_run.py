"""Trainer runs against the real PostGIS and Kafka (scripts/infra.sh): models
stored, the table published in LinkDB (served byte for byte by linkdb-api)
and on the compacted topic, sharding, and the service's error paths."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import secrets
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient

from polycorn_ingest.routes import RouteSpec, store
from polycorn_linkdb_api.app import create_app
from polycorn_linkdb_api.auth import hash_key
from polycorn_linkdb_api.settings import ApiSettings, DatabaseSettings, Settings
from polycorn_schema.failure_table import (
    HEADER_ETAG,
    HEADER_SIGNATURE,
    HEADER_VERSION,
    HTTP_SIGNATURE_HEADER,
    KAFKA_KEY,
    canonical,
    etag_of,
)
from polycorn_schema.testing import compacted_topic, fresh_database, service_url
from polycorn_trainer import cli
from polycorn_trainer.data import Shard, load_cells
from polycorn_trainer.fit import Params
from polycorn_trainer.metrics import Metrics
from polycorn_trainer.run import Options, run
from polycorn_trainer.signing import TableSigner, verify
from polycorn_trainer.store import DEFAULT_VALIDITY_S, StoredTableError, publish_table

T0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
CELLS = 12  # per carrier, increasing direction; cell k's edge at 2000 * k
# seed's fleet is one train: its failures are enough for the table only with
# min_trains=1 (the several-trains rule has its own tests, test_one_train.py).
ONE_TRAIN = Params(min_trains=1)


def seed(url: str, trips: int = 6, seed_: int = 1) -> dict[str, int]:
    """A small fleet: ``trips`` trips of one train over two carriers' cells.
    Handovers of cell k start around its edge; the later one starts, the
    likelier it fails (cells 0-5 fail often, 6-11 never). Returns counts."""
    rng = np.random.default_rng(seed_)
    n_ho = n_fail = 0
    with psycopg.connect(url) as c:
        c.execute(
            "INSERT INTO trains (id, source, first_seen, last_seen) "
            "VALUES ('t1', 'telemetry', %s, %s)",
            (T0, T0 + dt.timedelta(days=trips)),
        )
        cell_ids: dict[tuple[str, int], int] = {}
        for carrier_i, carrier in enumerate(("cmcc", "unicom")):
            for k in range(CELLS):
                cid = (carrier_i + 1) << 32 | (k + 1)
                row = c.execute(
                    "INSERT INTO cells (carrier, cell_id, direction, handovers, failures, "
                    "first_seen, last_seen) "
                    "VALUES (%s, %s, 'increasing', 0, 0, %s, %s) RETURNING id",
                    (carrier, cid, T0, T0),
                ).fetchone()
                assert row is not None
                cell_ids[(carrier, k)] = row[0]
        for t in range(trips):
            start = T0 + dt.timedelta(days=t)
            row = c.execute(
                "INSERT INTO trips (train_id, started_at, ended_at, fixes, direction) "
                "VALUES ('t1', %s, %s, 0, 'increasing') RETURNING id",
                (start, start + dt.timedelta(hours=1)),
            ).fetchone()
            assert row is not None
            trip_id = row[0]
            with c.cursor().copy(
                "COPY handovers (source, train_id, trip_id, cell, carrier, source_cell_id, "
                "target_cell_id, start_time, geog, track_m, direction, rsrp_dbm, outcome, "
                "duration_ms) FROM STDIN"
            ) as cp:
                for (carrier, k), key in cell_ids.items():
                    carrier_i = 0 if carrier == "cmcc" else 1
                    cid = (carrier_i + 1) << 32 | (k + 1)
                    late = rng.uniform(0, 400)
                    track = 2000.0 * k + late
                    p_fail = 0.9 if (k < 6 and late > 200) else 0.0
                    failed = rng.random() < p_fail
                    n_ho += 1
                    n_fail += failed
                    when = start + dt.timedelta(seconds=track / 80 + carrier_i)
                    cp.write_row(
                        (
                            "telemetry",
                            "t1",
                            trip_id,
                            key,
                            carrier,
                            cid,
                            cid + 1,
                            when,
                            f"SRID=4326;POINT({116 + track / 1e5} 39)",
                            track,
                            "increasing",
                            -90.0 - rng.uniform(0, 10),
                            "failure" if failed else "success",
                            3000 if failed else 40,
                        )
                    )
        # One handover without a position: counted, not used.
        c.execute(
            "INSERT INTO handovers (source, train_id, cell, carrier, source_cell_id, "
            "target_cell_id, start_time, geog, outcome, duration_ms) VALUES ('telemetry', 't1', "
            "%s, 'cmcc', 4294967297, 2, %s, 'SRID=4326;POINT(116 39)', 'failure', 3000)",
            (cell_ids[("cmcc", 0)], T0 + dt.timedelta(days=99)),
        )
    return {"handovers": n_ho, "failures": n_fail}


@pytest.fixture
def db() -> Iterator[str]:
    with fresh_database(prefix="linkdb_test_trainer") as url:
        yield url


@pytest.fixture
def topic() -> Iterator[str]:
    with compacted_topic() as name:
        yield name


def read_topic(topic: str) -> list[tuple[Any, Any, dict[str, Any]]]:
    c = Consumer(
        {
            "bootstrap.servers": os.environ["POLYCORN_KAFKA_BOOTSTRAP"],
            "group.id": f"test-{secrets.token_hex(4)}",
            "enable.auto.commit": False,
        }
    )
    c.assign([TopicPartition(topic, 0, 0)])
    out: list[tuple[Any, Any, dict[str, Any]]] = []
    _, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    while len(out) < high:
        m = c.poll(10)
        assert m is not None, f"only {len(out)} of {high} messages"
        assert m.error() is None
        out.append((m.key(), m.value(), dict(m.headers() or [])))
    c.close()
    return out


def api(url: str) -> TestClient:
    s = Settings(
        DatabaseSettings(url=service_url(url, "api"), pool_size=2),
        ApiSettings(keys=f"t:read:{hash_key('k')}"),
    )
    return TestClient(create_app(s))


def test_run_stores_publishes_and_api_serves_the_same_bytes(db: str, topic: str) -> None:
    truth = seed(db)
    m = Metrics()
    o = Options(
        workers=1, params=ONE_TRAIN, bootstrap=os.environ["POLYCORN_KAFKA_BOOTSTRAP"], topic=topic
    )
    s = run(db, o, m)
    assert s["handovers"] == truth["handovers"]  # the one without a position is left out
    assert s["handovers_without_track"] == 1
    assert s["cells"] == 2 * CELLS
    v = s["validation"]
    assert (
        v["failures"] == truth["failures"]
        and v["successes"] == truth["handovers"] - truth["failures"]
    )
    assert sum(v[k] for k in ("failure_correct", "failure_late", "failure_early")) == pytest.approx(
        1
    )
    # Failures happen late in cells 0-5 only: those get entries, 6-11 none.
    table = s["table"]
    assert table is not None and table["version"] == 1 and table["new"]
    with psycopg.connect(db) as c:
        body, etag, model_id = c.execute(
            "SELECT body, etag, model_id FROM failure_tables WHERE version = 1"
        ).fetchone()  # type: ignore[misc]
        n_models = c.execute(
            "SELECT count(*) FROM cell_models WHERE model_id = %s", (model_id,)
        ).fetchone()
        assert n_models == (2 * CELLS,)
        stored_v = c.execute("SELECT validation FROM models WHERE id = %s", (model_id,)).fetchone()
        assert stored_v is not None and stored_v[0]["failures"] == truth["failures"]
    cells = {e["cell"] & 0xFFFF for e in body["entries"]}
    assert cells <= set(range(1, 7)) and len(cells) >= 4
    # Failures start 200-400 m into their cell; the entry is one of them, moved
    # earlier by at most the margin over the fewest failures a cell enters on.
    margin = ONE_TRAIN.location_margin_m / ONE_TRAIN.min_failures
    for e in body["entries"]:
        k = (e["cell"] & 0xFFFF) - 1
        assert 2000 * k + 200 - margin <= e["position_m"] <= 2000 * k + 400
    # The API serves exactly the stored bytes under the stored ETag...
    with api(db) as client:
        r = client.get("/v1/failure-table", headers={"X-API-Key": "k"})
        assert r.status_code == 200
        assert r.headers["etag"] == f'"{etag}"'
        assert etag_of(r.content) == etag
    # ... and the Kafka message carries the same bytes.
    msgs = read_topic(topic)
    assert len(msgs) == 1
    key, value, headers = msgs[0]
    assert key == KAFKA_KEY and value == r.content
    assert headers[HEADER_VERSION] == b"1" and headers[HEADER_ETAG] == etag.encode()
    assert HEADER_SIGNATURE not in headers, "no signing key: unsigned"
    assert HTTP_SIGNATURE_HEADER not in r.headers
    # The metrics say what happened.
    assert m.registry.get_sample_value("polycorn_trainer_runs_total", {"result": "ok"}) == 1
    assert m.registry.get_sample_value("polycorn_trainer_table_version") == 1
    # A second run on the same data: a new model, the same table (no new
    # version) re-issued with a later issue time, sent to Kafka again.
    s2 = run(db, o, m)
    assert s2["model_id"] != s["model_id"]
    assert s2["table"]["version"] == 1 and not s2["table"]["new"]
    assert s2["table"]["entries"] == table["entries"]
    msgs = read_topic(topic)
    assert len(msgs) == 2
    first, again = json.loads(msgs[0][1]), json.loads(msgs[1][1])
    assert again["entries"] == first["entries"] and again["version"] == 1
    assert again["issued_unix_s"] >= first["issued_unix_s"]


def test_shards_split_the_cells_and_publish_the_union(db: str) -> None:
    seed(db, trips=5, seed_=2)
    whole = run(db, Options(workers=1, params=ONE_TRAIN, publish=True))
    assert whole["table"] is not None
    with psycopg.connect(db) as c:
        entries_whole = c.execute(
            "SELECT body->'entries' FROM failure_tables WHERE version = 1"
        ).fetchone()
    seen = 0
    for i in range(3):
        s = run(db, Options(workers=1, params=ONE_TRAIN, shard=Shard(i, 3)))
        seen += s["cells"]
    assert seen == 2 * CELLS  # every cell in exactly one shard
    with psycopg.connect(db) as c:
        versions = c.execute(
            "SELECT version, body->'entries' FROM failure_tables ORDER BY version"
        ).fetchall()
    # The shards' models replace the whole run's one by one; the union is the same table.
    assert versions[-1][1] == entries_whole[0]  # type: ignore[index]


def test_parallel_workers_give_the_same_model_as_one(db: str) -> None:
    seed(db, trips=8, seed_=3)
    one = run(db, Options(workers=1, store=False, publish=False))
    two = run(db, Options(workers=2, store=False, publish=False))
    assert one["validation"] == two["validation"]
    assert one["kinds"] == two["kinds"]


def test_empty_linkdb_is_not_an_error(db: str) -> None:
    s = run(db, Options(workers=1))
    assert s["cells"] == 0 and s["table"] is None
    assert s["validation"]["failure_correct"] is None


def test_cli_once_writes_a_summary_and_reports_a_dead_database(
    db: str, tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    from pathlib import Path

    out = Path(str(tmp_path)) / "summary.json"
    seed(db, trips=4)
    rc = cli.main(
        [
            "run",
            "--once",
            "--database-url",
            service_url(db, "trainer"),
            "--bootstrap",
            "",
            "--workers",
            "1",
            "--min-trains",
            "1",
            "--summary-json",
            str(out),
        ]
    )
    assert rc == 0
    s = json.loads(out.read_text())
    assert s["table"]["version"] == 1 and s["cells"] == 2 * CELLS
    # The prior rule, with its prior read over the fleet as the trainer's role.
    prior = ["--rule", "prior", "--workers", "1", "--min-trains", "1", "--summary-json", str(out)]
    rc = cli.main(["validate", "--database-url", service_url(db, "trainer"), *prior])
    assert rc == 0
    s = json.loads(out.read_text())
    assert s["prior"]["a"] > 0 and s["prior"]["b"] > 0 and s["model_id"] is None
    # No server on the port: a starting server, waited for (bounded), then
    # one clear line.
    rc = cli.main(
        ["validate", "--database-url", "postgresql://postgres@127.0.0.1:1/none", "--db-wait-s", "1"]
    )
    assert rc == 1
    err = capsys.readouterr().err
    assert "polycorn-trainer: NotReadyError: connecting to PostgreSQL at" in err
    assert "still failing after 1 s" in err
    # A server that answers but has no such database is no starting server:
    # the error comes at once, not NotReadyError after the wait.
    missing = db.rpartition("/")[0] + "/no_such_linkdb"
    rc = cli.main(["validate", "--database-url", missing, "--db-wait-s", "600"])
    assert rc == 1
    assert "polycorn-trainer: OperationalError" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["run", "--once", "--shard", "3/3", "--database-url", db])
    assert e.value.code == 2
    with pytest.raises(SystemExit):
        cli.main(["run", "--once", "--min-failure-rate", "1.5", "--database-url", db])


def test_params_are_stored_with_the_model(db: str) -> None:
    seed(db, trips=3)
    s = run(db, Options(workers=1, params=Params(min_failures=1, min_failure_rate=0.0)))
    with psycopg.connect(db) as c:
        row = c.execute("SELECT params FROM models WHERE id = %s", (s["model_id"],)).fetchone()
    assert row is not None
    assert row[0]["min_failures"] == 1 and row[0]["shard"] == "0/1"
    assert "prior" not in row[0] and "prior" not in s
    s = run(db, Options(workers=1, params=Params(rule="prior", failure_cost_ratio=9.0)))
    with psycopg.connect(db) as c:
        row = c.execute("SELECT params FROM models WHERE id = %s", (s["model_id"],)).fetchone()
    assert row is not None
    assert row[0]["rule"] == "prior" and row[0]["failure_cost_ratio"] == 9.0
    assert row[0]["prior"] == s["prior"] and s["prior"]["a"] > 0


def test_routed_cells_publish_their_route_point_and_line(db: str) -> None:
    # Map-matched handovers: carrier cmcc's are on route "r1",
    # a straight line east along 39° N from 116° E whose measure the seed's
    # track_m is; unicom's carry no route (a testbed-style track). A third
    # of cmcc cell 0's handovers are on another route "r2" at measures that
    # would move its failure location by 50 km: the cell is fitted on its
    # majority route only.
    seed(db)
    with psycopg.connect(db) as c, c.transaction():
        for rid, lat in (("r1", 39.0), ("r2", 40.0)):
            spec = RouteSpec(rid, rid, "geojson", [(116.0, lat), (116.3, lat)])
            store(c, spec)
        c.execute("UPDATE handovers SET route_id = 'r1' WHERE carrier = 'cmcc'")
        c.execute(
            "INSERT INTO handovers (source, train_id, cell, carrier, source_cell_id, "
            "target_cell_id, start_time, geog, track_m, route_id, direction, outcome, "
            "duration_ms) SELECT 'telemetry', 't1', cell, carrier, source_cell_id, 2, "
            "start_time + interval '1 hour', geog, track_m + 50000, 'r2', direction, "
            "'failure', 3000 FROM handovers WHERE carrier = 'cmcc' AND source_cell_id = %s "
            "AND route_id = 'r1' AND trip_id IS NOT NULL ORDER BY start_time LIMIT 2",
            (1 << 32 | 1,),
        )
    loaded = load_cells(psycopg.connect(db), Shard())
    cell0 = next(x for x in loaded.cells if x.cell_id == 1 << 32 | 1)
    assert float(cell0.track_m.max()) < 1000  # the r2 handovers are left out
    s = run(db, Options(workers=1, params=ONE_TRAIN), Metrics())
    assert s["table"] is not None
    with psycopg.connect(db) as c:
        row = c.execute("SELECT body FROM failure_tables ORDER BY version DESC LIMIT 1").fetchone()
    assert row is not None
    body = row[0]
    routed = [e for e in body["entries"] if e.get("route")]
    plain = [e for e in body["entries"] if not e.get("route")]
    assert routed and plain
    assert {e["route"] for e in routed} == {"r1"}
    assert all((e["cell"] >> 32) == 1 for e in routed)  # cmcc
    m_per_deg = 111_320 * math.cos(math.radians(39.0))
    for e in routed:
        assert abs(e["lat"] - 39.0) < 1e-4  # a geodesic bulges north by < 1 m
        assert abs((e["lon"] - 116.0) * m_per_deg - e["position_m"]) < 0.01 * e["position_m"] + 5
    (line,) = body["routes"]
    assert line["id"] == "r1" and len(line["coords"]) == len(line["measures"])
    assert line["measures"][0] == 0.0 and abs(line["measures"][-1] - 0.3 * m_per_deg) < 100


def write_signing_key(path: Path, *, seed_only: bool = False) -> Ed25519PrivateKey:
    """A new Ed25519 key in ``path``: PEM PKCS#8 (polycorn-pki table-key's
    form) or the raw 32-byte seed."""
    key = Ed25519PrivateKey.generate()
    if seed_only:
        data = key.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
    else:
        data = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    path.write_bytes(data)
    return key


def test_published_tables_are_signed_and_the_api_serves_the_signature(
    db: str, topic: str, tmp_path: Path
) -> None:
    """With --table-signing-key: the Kafka message's ``polycorn-signature``
    header verifies with the public key over exactly the message's value,
    LinkDB keeps the bytes and the signature, and the API serves the same
    bytes with the same signature. The signed bytes carry the issue time and
    the expiry. A new key (a rotation) re-issues the current table signed by
    it, without a new version."""
    seed(db)
    key = write_signing_key(tmp_path / "table-signing.key")
    signer = TableSigner.load(tmp_path / "table-signing.key")
    o = Options(
        workers=1, params=ONE_TRAIN, bootstrap=os.environ["POLYCORN_KAFKA_BOOTSTRAP"], topic=topic
    )
    s = run(db, replace(o, signer=signer))
    assert s["table"] is not None and s["table"]["version"] == 1

    [(k, value, headers)] = read_topic(topic)
    assert k == KAFKA_KEY
    sig = headers[HEADER_SIGNATURE]
    verify(key.public_key(), value, sig)  # raises InvalidSignature otherwise
    with pytest.raises(InvalidSignature):
        verify(Ed25519PrivateKey.generate().public_key(), value, sig)
    with pytest.raises(InvalidSignature):
        verify(key.public_key(), value.replace(b'"version":1', b'"version":2'), sig)
    with psycopg.connect(db) as c:
        stored = c.execute(
            "SELECT body_bytes, signature FROM failure_tables WHERE version = 1"
        ).fetchone()
    assert stored is not None and bytes(stored[0]) == value and stored[1] == sig.decode()
    doc = json.loads(value)
    assert doc["expires_unix_s"] - doc["issued_unix_s"] == DEFAULT_VALIDITY_S
    with api(db) as client:
        r = client.get("/v1/failure-table", headers={"X-API-Key": "k"})
        assert r.status_code == 200 and r.content == value
        assert r.headers[HTTP_SIGNATURE_HEADER] == sig.decode()
        r1 = client.get("/v1/failure-tables/1", headers={"X-API-Key": "k"})
        assert r1.content == value and r1.headers[HTTP_SIGNATURE_HEADER] == sig.decode()
        etag = r.headers["etag"]
        r304 = client.get("/v1/failure-table", headers={"X-API-Key": "k", "If-None-Match": etag})
        assert r304.status_code == 304

    # A new key (the seed form this time): the same table re-issued, signed by it.
    new_key = write_signing_key(tmp_path / "new.key", seed_only=True)
    s2 = run(db, replace(o, signer=TableSigner.load(tmp_path / "new.key")))
    assert s2["table"] is not None and s2["table"]["version"] == 1 and not s2["table"]["new"]
    _, value2, headers2 = read_topic(topic)[-1]
    doc2 = json.loads(value2)
    assert doc2["entries"] == doc["entries"] and doc2["issued_unix_s"] >= doc["issued_unix_s"]
    verify(new_key.public_key(), value2, headers2[HEADER_SIGNATURE])
    with pytest.raises(InvalidSignature):
        verify(key.public_key(), value2, headers2[HEADER_SIGNATURE])
    with api(db) as client:
        r = client.get("/v1/failure-table", headers={"X-API-Key": "k"})
        assert r.content == value2 and r.headers["etag"] == f'"{etag_of(value2)}"'
        assert r.headers[HTTP_SIGNATURE_HEADER] == headers2[HEADER_SIGNATURE].decode()

    # Without a key the table is sent as LinkDB holds it, signature and all
    # (the trainer signs nothing).
    run(db, o)
    _, value3, headers3 = read_topic(topic)[-1]
    assert value3 == value2 and headers3[HEADER_SIGNATURE] == headers2[HEADER_SIGNATURE]


def test_an_unchanged_table_is_reissued_before_it_expires(db: str, tmp_path: Path) -> None:
    """Every run re-issues the current table, unchanged, under the same
    version with a fresh issue time and expiry, signed over the new bytes:
    a fleet whose trainer keeps running never holds an expired table."""
    seed(db)
    run(db, Options(workers=1, params=ONE_TRAIN, publish=False))  # cell models, no table yet
    key = write_signing_key(tmp_path / "k.key")
    signer = TableSigner.load(tmp_path / "k.key")
    with psycopg.connect(db) as c:
        first = publish_table(c, None, signer, validity_s=600, now_unix_s=1_800_000_000)
        again = publish_table(c, None, signer, validity_s=600, now_unix_s=1_800_000_500)
        row = c.execute(
            "SELECT body_bytes, signature, count(*) OVER () FROM failure_tables"
        ).fetchone()
    assert first is not None and again is not None and first.new and not again.new
    assert again.version == first.version
    a, b = json.loads(first.body), json.loads(again.body)
    assert (a["issued_unix_s"], a["expires_unix_s"]) == (1_800_000_000, 1_800_000_600)
    assert (b["issued_unix_s"], b["expires_unix_s"]) == (1_800_000_500, 1_800_001_100)
    assert a["entries"] == b["entries"]
    assert row is not None and bytes(row[0]) == again.body and row[2] == 1
    assert again.signature is not None and row[1] == again.signature
    verify(key.public_key(), again.body, again.signature)


def test_a_planted_table_is_neither_signed_nor_published(
    db: str, topic: str, tmp_path: Path
) -> None:
    """Someone who can write ``failure_tables`` plants a row with a far-future
    version whose body equals what the trainer would assemble but whose
    ``body_bytes`` are a table of their own. The next run signs nothing and
    sends nothing: it fails (exit status 1, counted), the planted row stays
    unsigned, the topic gets no message."""
    seed(db)
    write_signing_key(tmp_path / "k.key")
    signer = TableSigner.load(tmp_path / "k.key")
    o = Options(
        workers=1, params=ONE_TRAIN, bootstrap=os.environ["POLYCORN_KAFKA_BOOTSTRAP"], topic=topic
    )
    s = run(db, replace(o, signer=signer))
    assert s["table"] is not None
    with psycopg.connect(db) as c:
        body = c.execute("SELECT body FROM failure_tables WHERE version = 1").fetchone()
        assert body is not None
        planted_version = 10**12
        genuine = {**body[0], "version": planted_version}
        forged = {**genuine, "entries": [{"cell": 7, "direction": "increasing", "position_m": 1.0}]}
        c.execute(
            "INSERT INTO failure_tables (version, etag, entries, body, note, body_bytes) "
            "VALUES (%s, %s, 1, %s, 'planted', %s)",
            (planted_version, "x", json.dumps(genuine), canonical(forged)),
        )
    sent = len(read_topic(topic))
    m = Metrics()
    with pytest.raises(StoredTableError, match="not the canonical form"):
        run(db, replace(o, signer=signer), m)
    assert m.registry.get_sample_value("polycorn_trainer_table_refused_total") == 1
    assert m.registry.get_sample_value("polycorn_trainer_runs_total", {"result": "error"}) == 1
    rc = cli.main(
        [
            "publish",
            "--database-url",
            db,
            "--bootstrap",
            os.environ["POLYCORN_KAFKA_BOOTSTRAP"],
            "--topic",
            topic,
            "--table-signing-key",
            str(tmp_path / "k.key"),
        ]
    )
    assert rc == 1
    with psycopg.connect(db) as c:
        planted = c.execute(
            "SELECT signature, body_bytes FROM failure_tables WHERE version = %s",
            (planted_version,),
        ).fetchone()
        highest = c.execute("SELECT max(version) FROM failure_tables").fetchone()
    assert planted is not None and planted[0] is None, "the planted row was signed"
    assert bytes(planted[1]) == canonical(forged)
    assert highest == (planted_version,), "nothing was published on top of it"
    assert len(read_topic(topic)) == sent, "something was sent to Kafka"


def test_a_bad_signing_key_fails_the_run_with_one_line(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "p256.key"
    from cryptography.hazmat.primitives.asymmetric import ec

    bad.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    for path, why in ((bad, "not an Ed25519 key"), (tmp_path / "missing", "missing")):
        rc = cli.main(["run", "--once", "--database-url", db, "--table-signing-key", str(path)])
        assert rc == 1
        err = capsys.readouterr().err
        assert why in err and err.count("\n") == 1, err
