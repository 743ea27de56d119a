"""The follower (polycorn-trainer follow): which failures are new (pure), and
against the real PostGIS and Kafka: a cell whose failures come from a second
train enters the table at the next poll, every other entry is kept, a cell
failing for one train only stays out, and nothing is published when no
entry moved."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition

from polycorn_harness.wait import wait_until
from polycorn_schema.testing import compacted_topic, fresh_database
from polycorn_trainer import follow
from polycorn_trainer.fit import Params
from polycorn_trainer.follow import Follower, FollowOptions, Update, Watermark, export
from polycorn_trainer.metrics import Metrics
from polycorn_trainer.run import Options, run, send_table
from polycorn_trainer.store import current_table

T0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)

# ------------------------------------------------------------------ pure


def test_a_failure_is_new_once_and_a_late_commit_below_the_top_is_still_seen() -> None:
    w = Watermark(floor=100, lookback_s=60)
    assert w.observe(0, [(101, 1), (105, 2)]) == [101, 105]
    assert w.observe(5, [(101, 1), (105, 2)]) == []
    # 103 committed after 105 was read: above the floor, so still read and new.
    assert w.observe(10, [(101, 1), (103, 1), (105, 2)]) == [103]
    assert w.floor == 100


def test_a_failure_without_its_cell_yet_is_read_again() -> None:
    w = Watermark(floor=0, lookback_s=60)
    assert w.observe(0, [(1, None)]) == []
    assert w.observe(1, [(1, 7)]) == [1]


def test_the_floor_trails_the_top_by_the_lookback_and_forgets_what_is_below() -> None:
    w = Watermark(floor=0, lookback_s=60)
    w.observe(0, [(10, 1)])
    w.observe(30, [(20, 1)])
    assert w.floor == 0 and w.seen == {10, 20}
    w.observe(61, [])
    assert w.floor == 10 and w.seen == {20}
    # Below the floor: the refit's, never the follower's.
    assert w.observe(62, [(5, 1)]) == []
    w.observe(200, [])
    assert w.floor == 20 and w.seen == set()


def test_metrics_count_polls_and_time_the_failures_a_new_table_carries() -> None:
    m = Metrics()
    export(m, Update(), 1000.0)
    export(m, Update(failures=2, cells=1, backlog=3), 1000.0)
    reg = m.registry
    assert reg.get_sample_value("polycorn_trainer_follow_polls_total", {"result": "idle"}) == 1
    assert reg.get_sample_value("polycorn_trainer_follow_polls_total", {"result": "unchanged"}) == 1
    assert reg.get_sample_value("polycorn_trainer_follow_failures_total") == 2
    assert reg.get_sample_value("polycorn_trainer_follow_backlog_cells") == 3


# ------------------------------------------------------------------ LinkDB


@pytest.fixture
def db() -> Iterator[str]:
    with fresh_database(prefix="linkdb_test_follow") as url:
        yield url


@pytest.fixture
def topic() -> Iterator[str]:
    with compacted_topic() as name:
        yield name


class Fleet:
    """Cells of one carrier and the handovers two trains report out of them."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.cells: dict[int, int] = {}
        self.n = 0
        with psycopg.connect(url) as c:
            for t in ("t1", "t2"):
                c.execute(
                    "INSERT INTO trains (id, source, first_seen, last_seen) "
                    "VALUES (%s, 'telemetry', %s, %s)",
                    (t, T0, T0),
                )

    def cell(self, k: int) -> int:
        """LinkDB's ID of cell k (made on first use)."""
        if k not in self.cells:
            with psycopg.connect(self.url) as c:
                row = c.execute(
                    "INSERT INTO cells (carrier, cell_id, direction, handovers, failures, "
                    "first_seen, last_seen) VALUES ('cmcc', %s, 'increasing', 0, 0, %s, %s) "
                    "RETURNING id",
                    ((1 << 32) | k, T0, T0),
                ).fetchone()
            assert row is not None
            self.cells[k] = int(row[0])
        return self.cells[k]

    def handovers(self, train: str, k: int, *, failed: int = 0, succeeded: int = 0) -> None:
        """Handovers out of cell k near 1000 m past its start (each its own trip)."""
        key = self.cell(k)
        with psycopg.connect(self.url) as c:
            for i in range(failed + succeeded):
                self.n += 1
                track = 10_000.0 * k + 1000.0 + 10.0 * (i % 5)
                fail = i < failed
                c.execute(
                    "INSERT INTO handovers (source, train_id, cell, carrier, source_cell_id, "
                    "target_cell_id, start_time, geog, track_m, direction, outcome, duration_ms) "
                    "VALUES ('telemetry', %s, %s, 'cmcc', %s, 1, %s, "
                    "'SRID=4326;POINT(116 39)', %s, 'increasing', %s, %s)",
                    (
                        train,
                        key,
                        (1 << 32) | k,
                        T0 + dt.timedelta(minutes=self.n),
                        track,
                        "failure" if fail else "success",
                        3000 if fail else 40,
                    ),
                )


def tables_in(topic: str) -> int:
    c = Consumer({"bootstrap.servers": os.environ["POLYCORN_KAFKA_BOOTSTRAP"], "group.id": "t"})
    try:
        return int(c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])
    finally:
        c.close()


def current_cells(url: str) -> tuple[int, set[int]] | None:
    """The current table's version and the cells (their index k) it has entries for."""
    with psycopg.connect(url) as c:
        cur = current_table(c)
    if cur is None:
        return None
    return cur.version, {int(e["cell"]) & 0xFFFF_FFFF for e in cur.body["entries"]}


def table_cells(url: str) -> tuple[int, set[int]]:
    got = current_cells(url)
    assert got is not None, "no table"
    return got


def test_a_second_trains_failures_enter_the_table_at_the_next_poll(db: str, topic: str) -> None:
    fleet = Fleet(db)
    # Cell 1 fails for both trains; cell 2 so far for t1 only; cell 3 never.
    fleet.handovers("t1", 1, failed=2, succeeded=4)
    fleet.handovers("t2", 1, failed=2, succeeded=4)
    fleet.handovers("t1", 2, failed=2, succeeded=8)
    fleet.handovers("t1", 3, succeeded=10)
    o = Options(bootstrap=os.environ["POLYCORN_KAFKA_BOOTSTRAP"], topic=topic, workers=1)
    run(db, o)
    assert table_cells(db) == (1, {1})

    with psycopg.connect(db) as conn:
        f = Follower(conn, o, FollowOptions(lookback_s=60))
        idle = f.poll(0)
        assert (idle.failures, idle.cells, idle.published) == (0, 0, None)

        # t2 now fails in cell 2 as well: its entry appears, cell 1's stays.
        fleet.handovers("t2", 2, failed=2, succeeded=1)
        u = f.poll(1)
        assert (u.failures, u.cells, u.backlog) == (2, 1, 0)
        assert u.published is not None and u.published.new
        assert table_cells(db) == (2, {1, 2})
        assert len(u.carried_failure_times) == 2
        assert tables_in(topic) == 2, "the update went to Kafka as well"
        with psycopg.connect(db) as c:
            params = c.execute("SELECT params FROM models WHERE id = %s", (u.model_id,)).fetchone()
            stored = c.execute(
                "SELECT count(*) FROM cell_models WHERE model_id = %s", (u.model_id,)
            ).fetchone()
        assert params is not None and params[0]["update"] == "follow"
        assert stored == (1,), "an update stores the cells it refitted, no others"

        # One train's failures alone, however many: refitted, no entry, no new table.
        fleet.handovers("t1", 3, failed=9)
        lone = f.poll(2)
        assert (lone.failures, lone.cells, lone.published) == (9, 1, None)
        assert table_cells(db) == (2, {1, 2})

        # Nothing new: nothing refitted.
        assert f.poll(3).cells == 0

    # The refit stays the authority, and agrees with what the updates built.
    run(db, o)
    assert table_cells(db)[1] == {1, 2}


def test_a_table_kafka_missed_is_sent_at_the_next_poll_and_nothing_is_lost(
    db: str, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = Fleet(db)
    fleet.handovers("t1", 1, failed=2, succeeded=4)
    o = Options(bootstrap=os.environ["POLYCORN_KAFKA_BOOTSTRAP"], topic=topic, workers=1)
    with psycopg.connect(db) as conn:
        f = Follower(conn, o, FollowOptions(lookback_s=60))
        fleet.handovers("t2", 1, failed=2, succeeded=4)

        def down(_o: Options, _p: object) -> None:
            raise RuntimeError("Kafka down")

        monkeypatch.setattr(follow, "send_table", down)
        with pytest.raises(RuntimeError, match="Kafka down"):
            f.poll(0)
        assert tables_in(topic) == 0 and list(f.pending) == [fleet.cells[1]]
        monkeypatch.setattr(follow, "send_table", send_table)
        u = f.poll(1)
        assert u.cells == 1 and u.published is not None
        assert tables_in(topic) == 1, "the table stored before Kafka failed is sent now"
        assert table_cells(db)[1] == {1}


def test_a_flood_of_cells_is_refitted_a_bounded_number_per_poll(db: str) -> None:
    fleet = Fleet(db)
    with psycopg.connect(db) as conn:
        f = Follower(conn, Options(workers=1), FollowOptions(max_cells=2))
        for k in range(5):
            fleet.handovers("t1", k, failed=1)
        first = f.poll(0)
        assert (first.failures, first.cells, first.backlog) == (5, 2, 3)
        second = f.poll(1)
        assert (second.failures, second.cells, second.backlog) == (0, 2, 1)
        assert f.poll(2).backlog == 0


def test_under_the_prior_rule_the_follower_judges_with_the_refits_prior(db: str) -> None:
    fleet = Fleet(db)
    for k in range(12):
        fleet.handovers("t1", k, succeeded=3)
    o = Options(workers=1, params=Params(rule="prior", min_trains=1), publish=False)

    def rest(prior: dict[str, float]) -> None:
        with psycopg.connect(db) as c:
            c.execute(
                "UPDATE models SET params = jsonb_set(params, '{prior}', %s::jsonb) "
                "WHERE id = (SELECT max(id) FROM models WHERE NOT params ? 'update')",
                (json.dumps(prior),),
            )

    def stored_prior(model_id: int | None) -> object:
        with psycopg.connect(db) as c:
            row = c.execute("SELECT params FROM models WHERE id = %s", (model_id,)).fetchone()
        assert row is not None
        return row[0].get("prior")

    with psycopg.connect(db) as conn:
        f = Follower(conn, o, FollowOptions(lookback_s=60))
        # No refit has stored the fleet's prior: the cell waits for the refit.
        fleet.handovers("t2", 1, failed=6)
        early = f.poll(0)
        assert (early.failures, early.cells, early.model_id) == (6, 0, None)

        s = run(db, o)
        assert stored_prior(s["model_id"]) == s["prior"]
        # The follower judges with the refit's stored prior, whatever it is:
        # under one that makes failures all but impossible, no entry.
        rest({"a": 1.0, "b": 1e6})
        fleet.handovers("t2", 2, failed=6)
        never = f.poll(1)
        assert never.cells == 1 and stored_prior(never.model_id) == {"a": 1.0, "b": 1e6}
        assert positions(db, [fleet.cells[2]]) == [None]
        rest({"a": 1e6, "b": 1.0})
        fleet.handovers("t2", 3, failed=1)
        sure = f.poll(2)
        assert sure.cells == 1 and stored_prior(sure.model_id) == {"a": 1e6, "b": 1.0}
        assert positions(db, [fleet.cells[3]]) != [None]


def positions(url: str, cells: list[int]) -> list[float | None]:
    """Each cell's table position as its latest model has it."""
    with psycopg.connect(url) as c:
        rows: dict[int, float | None] = dict(
            c.execute(follow.POSITIONS_SQL, {"ids": cells}).fetchall()
        )
    return [rows.get(k) for k in cells]


def test_the_cli_refuses_a_shard() -> None:
    from polycorn_trainer import cli

    with pytest.raises(SystemExit) as e:
        cli.main(
            ["follow", "--database-url", "postgresql://nobody@127.0.0.1:1/x", "--shard", "1/2"]
        )
    assert e.value.code == 2


def test_the_service_publishes_a_new_failures_table_and_stops_on_sigterm(db: str) -> None:
    fleet = Fleet(db)
    fleet.handovers("t1", 1, succeeded=5)
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    cmd = [sys.executable, "-m", "polycorn_trainer.cli", "follow", "--database-url", db]
    cmd += ["--poll-s", "0.5", "--min-trains", "1", "--metrics-addr", f"127.0.0.1:{port}"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        # After its first poll the follower has its floor: what comes next is new.
        wait_until(
            "a first poll",
            lambda: 'polycorn_trainer_follow_polls_total{result="idle"}' in scrape(port),
            30,
            every_s=0.2,
        )
        fleet.handovers("t1", 1, failed=3)
        wait_until(
            "a table with cell 1",
            lambda: (got := current_cells(db)) is not None and 1 in got[1],
            30,
            every_s=0.2,
        )
        wait_until(
            "the delay of the 3 failures",
            lambda: "polycorn_trainer_follow_failure_to_table_seconds_count 3.0" in scrape(port),
            30,
            every_s=0.2,
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate()
    assert "following failures above handover" in err


def scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return str(r.read().decode())
    except OSError:
        return ""
