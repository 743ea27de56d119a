"""A trainer run (binary COPY in passes, the batch fit in worker processes,
liblinear called directly) stores exactly what the reference path stores:
LinkDB read by one grouping query (data.load_cells), every cell fitted by
fit.fit_cell with scikit-learn's LinearSVC, the validation summed by
run.summarise. Against the real PostGIS (scripts/infra.sh), on a generated
fleet with the awkward cases a LinkDB holds: map-matched routes (and a cell
on two), handovers without a position, trip, RSRP or GPS fix near them, a
stopped train, failures at position 0, a cell with no positioned handover."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
import pytest

from polycorn_ingest.routes import RouteSpec, store
from polycorn_schema.testing import fresh_database
from polycorn_trainer.data import (
    Reader,
    Shard,
    fleet_priors,
    load_cells,
    parse_binary_copy,
    stream_binary_copy,
)
from polycorn_trainer.fit import Params, priors_of
from polycorn_trainer.run import Options, fit_all, run, summarise
from polycorn_trainer.store import publish_table, store_model

T0 = dt.datetime(2026, 10, 5, 6, 0, tzinfo=dt.UTC)
TRAINS = ("fp-a", "fp-b", "fp-c", "fp-d")
CELLS = 30  # per carrier and direction; cell k's boundary at 2000 m * k
SPEED = 80.0
TRIP_S = 25 * (CELLS + 1)


HANDOVER_COLUMNS = (
    "source, train_id, trip_id, cell, carrier, source_cell_id, target_cell_id, start_time, geog, "
    "track_m, route_id, direction, rsrp_dbm, outcome, duration_ms"
)


def cell_id(carrier: int, direction: str, k: int) -> int:
    return (carrier + 1) << 32 | (0 if direction == "increasing" else 1) << 16 | k


def trip_handovers(
    rng: np.random.Generator,
    trip: tuple[str, int, dt.datetime, str, int],
    key: dict[int, int],
    propensity: npt.NDArray[np.float64],
) -> Iterator[tuple[Any, ...]]:
    """One handover per cell of the trip's direction (of both carriers), in
    the order the train meets them, 25 s apart. Cell 7's handovers of the
    first four days fail at position 0; the last cell's have no position."""
    train, trip_id, start, direction, day = trip
    d = 0 if direction == "increasing" else 1
    for order in range(CELLS + 1):
        k = order if d == 0 else CELLS - order
        for ci, carrier in enumerate(("cmcc", "unicom")):
            late = float(rng.exponential(150.0))
            at_zero = k == 7 and day < 4
            track: float | None = 2000.0 * k + late if d == 0 else 2000.0 * k - late
            if at_zero:
                track = 0.0
            logit = propensity[ci, d, k] + late / 150.0
            failed = at_zero or bool(rng.random() < 1 / (1 + np.exp(-logit)))
            route = None
            if carrier == "cmcc":
                route = "r1"
                if (k == 3 and day % 3 == 0) or (k == 5 and day % 2 == 0):
                    route = "r2"
            elif k == 9 and day % 4 == 0:
                route = "r2"  # a few of unicom cell 9's: most have none, so the cell has none
            if k == CELLS or rng.random() < 0.03:
                track = None
            yield (
                "telemetry",
                train,
                None if rng.random() < 0.05 else trip_id,
                key[cell_id(ci, direction, k)],
                carrier,
                cell_id(ci, direction, k),
                1,
                start + dt.timedelta(seconds=25 * order + 0.001 * ci + rng.uniform(0, 20)),
                f"SRID=4326;POINT({116 + (track or 0.0) / 85000} 39)",
                track,
                route,
                direction,
                None if rng.random() < 0.1 else -95.0 - late / 50 + rng.normal(0, 3),
                "failure" if failed else "success",
                3000 if failed else 40,
            )


def trip_fixes(
    rng: np.random.Generator, train: str, start: dt.datetime
) -> Iterator[tuple[Any, ...]]:
    """1 Hz fixes over the trip, but for a 40 s gap, and 10 s stopped."""
    gap = int(rng.integers(0, TRIP_S - 40))
    for s in range(TRIP_S + 1):
        if not gap <= s < gap + 40:
            speed = 0.0 if 100 <= s < 110 else SPEED + float(rng.normal(0, 2))
            yield train, start + dt.timedelta(seconds=s), "SRID=4326;POINT(116 39)", speed


def seed(url: str, rng_seed: int = 11) -> None:
    """Four trains, eight trips each (alternating direction), two carriers:
    one handover per cell and trip. cmcc's handovers are map-matched onto
    route r1 (a few of cell 3's onto r2; cell 5's split evenly between r1
    and r2), unicom's carry no route (but a few of cell 9's, on r2)."""
    rng = np.random.default_rng(rng_seed)
    with psycopg.connect(url) as c:
        for rid, lat in (("r1", 39.0), ("r2", 40.0)):
            store(c, RouteSpec(rid, rid, "geojson", [(116.0, lat), (117.0, lat)]))
        for t in TRAINS:
            c.execute(
                "INSERT INTO trains (id, source, first_seen, last_seen) "
                "VALUES (%s, 'telemetry', %s, %s)",
                (t, T0, T0 + dt.timedelta(days=30)),
            )
        key: dict[int, int] = {}
        for ci, carrier in enumerate(("cmcc", "unicom")):
            for direction in ("increasing", "decreasing"):
                for k in range(CELLS + 1):
                    row = c.execute(
                        "INSERT INTO cells (carrier, cell_id, direction, handovers, failures, "
                        "first_seen, last_seen) VALUES (%s, %s, %s, 0, 0, %s, %s) RETURNING id",
                        (carrier, cell_id(ci, direction, k), direction, T0, T0),
                    ).fetchone()
                    assert row is not None
                    key[cell_id(ci, direction, k)] = row[0]
        propensity = rng.normal(-2.0, 1.5, (2, 2, CELLS + 1))
        trips = []
        for ti, train in enumerate(TRAINS):
            for day in range(8):
                direction = "increasing" if (day + ti) % 2 == 0 else "decreasing"
                start = T0 + dt.timedelta(days=day, hours=ti)
                row = c.execute(
                    "INSERT INTO trips (train_id, started_at, ended_at, fixes, direction) "
                    "VALUES (%s, %s, %s, 0, %s) RETURNING id",
                    (train, start, start + dt.timedelta(seconds=TRIP_S), direction),
                ).fetchone()
                assert row is not None
                trips.append((train, row[0], start, direction, day))
        with c.cursor().copy(f"COPY handovers ({HANDOVER_COLUMNS}) FROM STDIN") as cp:
            for trip in trips:
                for h in trip_handovers(rng, trip, key, propensity):
                    cp.write_row(h)
        with c.cursor().copy("COPY gps_fixes (train_id, time, geog, speed_mps) FROM STDIN") as cp:
            for train, _, start, _, _ in trips:
                for fix in trip_fixes(rng, train, start):
                    cp.write_row(fix)


def reference_run(url: str, o: Options) -> int:
    """The reference path, stored as a run stores it: its model id."""
    with psycopg.connect(url) as conn:
        loaded = load_cells(conn, o.shard)
        conn.commit()
        results = fit_all(loaded.cells, o)  # fit.fit_many: LinearSVC
        validation = summarise(loaded.cells, results)
        handovers = sum(len(c.track_m) for c in loaded.cells)
        params = {**o.params.as_dict(), "shard": str(o.shard)}
        if o.params.rule == "prior":
            prior = priors_of(loaded.cells).all
            params["prior"] = {"a": prior.a, "b": prior.b}
        with conn.transaction():
            return store_model(conn, results, params, validation, handovers)


def stored(url: str, model_id: int) -> tuple[Any, list[tuple[Any, ...]]]:
    with psycopg.connect(url) as c:
        model = c.execute(
            "SELECT params, cells_fitted, handovers_used, validation FROM models WHERE id = %s",
            (model_id,),
        ).fetchone()
        cells = c.execute(
            "SELECT cell, kind, params, predicted_failure_track_m, failure_rate, route_id, "
            "ST_AsText(predicted_failure_geog) FROM cell_models WHERE model_id = %s ORDER BY cell",
            (model_id,),
        ).fetchall()
    return model, cells


@pytest.fixture(scope="module")
def db() -> Iterator[str]:
    with fresh_database(prefix="linkdb_test_trainer_fast") as url:
        seed(url)
        yield url


def test_the_fleet_has_the_awkward_cases(db: str) -> None:
    with psycopg.connect(db) as c:
        loaded = load_cells(c, Shard())
    assert loaded.untracked > 0
    assert len(loaded.cells) == 2 * 2 * CELLS  # the cells without a position are left out
    x7 = [c for c in loaded.cells if c.cell_id & 0xFFFF == 7]
    assert all((c.track_m == 0).any() for c in x7)
    assert any(np.isnan(c.speed_mps).any() for c in loaded.cells)
    assert any((c.speed_mps == 0).any() for c in loaded.cells)
    assert any(np.isnan(c.rsrp_dbm).any() for c in loaded.cells)
    assert any((c.trip < 0).any() for c in loaded.cells)  # no trip: a group of its own


@pytest.mark.parametrize(
    "params",
    [
        Params(),
        Params(location_quantile=None, min_trains=1),
        Params(min_failures=1),
        Params(rule="prior", failure_cost_ratio=8.0),
    ],
    ids=["default", "mean-one-train", "one-failure", "prior"],
)
@pytest.mark.parametrize("workers", [1, 2])
def test_a_run_stores_what_the_reference_stores(db: str, params: Params, workers: int) -> None:
    o = Options(workers=workers, params=params, publish=False)
    want_model, want_cells = stored(db, reference_run(db, o))
    s = run(db, o)
    got_model, got_cells = stored(db, s["model_id"])
    assert got_model == want_model
    assert got_cells == want_cells
    assert s["validation"] == want_model[3]
    assert any(r[5] == "r1" and r[6] is not None for r in got_cells), "a routed table entry"
    assert s["handovers_without_track"] > 0 and s["cells"] == len(want_cells)


def test_shards_read_the_same_cells_as_the_reference(db: str) -> None:
    for i in range(3):
        o = Options(workers=2, shard=Shard(i, 3), store=False, publish=False)
        with psycopg.connect(db) as c:
            ref = load_cells(c, o.shard)
            c.commit()
            reader = Reader(c, o.shard, pass_handovers=200, pass_cells=7)
            got = [cell for batch in reader for cell in batch.cells()]
        assert [x.key for x in got] == [x.key for x in ref.cells]
        assert reader.untracked == ref.untracked
        for a, b in zip(ref.cells, got, strict=True):
            assert (a.carrier, a.cell_id, a.direction) == (b.carrier, b.cell_id, b.direction)
            for f in ("track_m", "rsrp_dbm", "failed", "trip", "train", "speed_mps"):
                assert getattr(a, f).tobytes() == getattr(b, f).tobytes(), (a.key, f)
        s = run(db, o)
        assert s["validation"] == summarise(ref.cells, fit_all(ref.cells, o))


def test_every_shard_gets_the_fleets_prior(db: str) -> None:
    with psycopg.connect(db) as c:
        everything = load_cells(c, Shard()).cells
        got = fleet_priors(c)
    want = priors_of(everything)
    assert got == want
    assert len(want.without_trip) > 20, "a prior fitted without each trip"
    assert any(t < 0 for c in everything for t in c.trip), "trip-less handovers"
    assert all(t > 0 for t in want.without_trip), "no fold prior for a lone handover"
    p = Params(rule="prior", failure_cost_ratio=8.0)
    summaries = [
        run(db, Options(workers=1, shard=Shard(i, 3), params=p, store=False, publish=False))
        for i in range(3)
    ]
    assert [s["prior"] for s in summaries] == [{"a": want.all.a, "b": want.all.b}] * 3
    assert sum(s["validation"]["deployed"]["failures"] for s in summaries) > 0


def test_the_published_table_is_the_references(db: str) -> None:
    o = Options(workers=2, params=Params(min_trains=1))
    reference = reference_run(db, o)
    with psycopg.connect(db) as c:
        before = publish_table(c, reference)
    assert before is not None and before.entries > 0
    s = run(db, o)
    assert s["table"]["version"] == before.version and not s["table"]["new"]
    assert s["table"]["entries"] == before.entries


def test_the_reader_refuses_rows_that_are_not_its_own(db: str) -> None:
    def stream(rsrp: str) -> bytes:
        q = (
            "COPY (SELECT 1::int8, true, 7::int8, now(), 2::int8, 1.5::float8, "
            + rsrp
            + ", false, "
            "3::int8, 4::int8, 5.0::float8 FROM generate_series(1, 3)) TO STDOUT (FORMAT BINARY)"
        )
        with psycopg.connect(db) as c, c.cursor().copy(q) as cp:
            return b"".join(bytes(d) for d in cp)

    rows = parse_binary_copy(stream("-90.0::float8"))
    assert len(rows) == 3 and rows["track_m"][0] == 1.5 and rows["rsrp_dbm"][2] == -90.0
    for bad in ("NULL::float8", "1::int4"):  # (a type of the same width passes)
        with pytest.raises(ValueError, match="binary COPY"):
            parse_binary_copy(stream(bad))
    with pytest.raises(ValueError, match="not a binary COPY"):
        parse_binary_copy(b"1\t2\n")


def test_a_copy_stream_parses_the_same_in_blocks(db: str) -> None:
    fields = (("a", ">i8"), ("b", ">i8"))
    q = "COPY (SELECT g::int8, -g::int8 FROM generate_series(1, 50) g) TO STDOUT (FORMAT BINARY)"
    with psycopg.connect(db) as c, c.cursor().copy(q) as cp:
        data = b"".join(bytes(d) for d in cp)
    whole = parse_binary_copy(data, fields)
    assert whole["a"].tolist() == list(range(1, 51)) and whole["b"][49] == -50
    rng = np.random.default_rng(3)
    for _ in range(20):
        cuts = np.sort(rng.integers(0, len(data), int(rng.integers(0, 12))))
        blocks = [data[i:j] for i, j in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        got = list(stream_binary_copy(blocks, fields))
        for name in ("a", "b"):
            assert [v for g in got for v in g[name].tolist()] == whole[name].tolist()
    for short in (data[:-1], data[:-3], data[:10], b""):
        with pytest.raises(ValueError, match="binary COPY"):
            list(stream_binary_copy([short], fields))
