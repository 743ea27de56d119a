"""The follower: a failure one train reports reaches the table of the trains
behind it within seconds, not at the next refit.

``polycorn-trainer follow`` polls LinkDB every ``poll_s`` for handover
failures it has not seen, refits the cells they are out of (each from its
whole history, exactly as a refit fits it: :func:`~polycorn_trainer.fit.
fit_many`), stores those cells as a model of their own and publishes the
table again (LinkDB, then Kafka), signed like every table. A table is
assembled from the latest model of every cell (``store.assemble``), so an
update replaces the cells it refitted and keeps every other entry; the
periodic refit (``polycorn-trainer run``) stays the authority: its model is
newer than every update before it and overrules them, and an update after
it changes only the cells it refits. Nothing here loosens the table's rule:
a cell enters on failures from ``min_trains`` trains (``fit.qualifies``),
so one faulty train can no more put a cell into the fleet's table through
the follower than through a refit. Under the ``prior`` rule the cells are
judged with the prior of the latest refit that used the rule (stored with
its model): a few cells are not the fleet, and the prior is the fleet's.
Until such a refit exists the follower leaves the cells to it.

Which failures are new (:class:`Watermark`, pure): handover IDs come from
one sequence, but ingest's transactions commit out of ID order (two
replicas, or one batch overtaking another), so a poll reads every failure
above a *floor* that trails the highest ID it saw by ``lookback_s`` and
skips those it has seen. A failure committed more than ``lookback_s`` after
a higher ID was read is left to the next refit. At start the floor is the
highest handover ID there is: the history is the refit's.

A poll that fails (LinkDB or Kafka down) loses nothing it had read: its
cells wait for the next poll, on a new connection. Bounds: at most
``max_rows`` failures read and ``max_cells`` cells refitted per poll; the
rest wait for the next poll (``polycorn_trainer_follow_
backlog_cells``). A table is published only when a refitted cell's entry
appeared, disappeared or moved (``position_m``): the counts an entry carries
change with every handover and would otherwise make a new table version on
every poll.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import psycopg

from polycorn_schema.startup import pg_connect
from polycorn_trainer.data import load_cell_ids
from polycorn_trainer.fit import BetaPrior, Priors, fit_many
from polycorn_trainer.metrics import Metrics
from polycorn_trainer.run import Options, send_table, summarise
from polycorn_trainer.store import Published, publish_table, store_model

log = logging.getLogger(__name__)

# The failures above a floor, in ID order (the primary key), with the cell
# they are out of (NULL until ingest has resolved it) and when they began.
FAILURES_SQL = """
SELECT h.id, h.cell, extract(epoch FROM h.start_time)::float8
FROM handovers h
WHERE h.id > %(floor)s AND h.outcome = 'failure'
ORDER BY h.id
LIMIT %(limit)s
"""
# Each cell's table position as its latest model has it.
POSITIONS_SQL = """
SELECT DISTINCT ON (m.cell) m.cell, m.predicted_failure_track_m FROM cell_models m
WHERE m.cell = ANY(%(ids)s::bigint[])
ORDER BY m.cell, m.model_id DESC
"""

# The fleet's prior as the latest refit under the prior rule stored it (a
# follower's update stores the one it used, marked as an update).
REFIT_PRIOR_SQL = """
SELECT (params->'prior'->>'a')::float8, (params->'prior'->>'b')::float8 FROM models
WHERE params->>'rule' = 'prior' AND params ? 'prior' AND NOT params ? 'update'
ORDER BY id DESC LIMIT 1
"""


@dataclass
class FollowOptions:
    poll_s: float = 5.0
    lookback_s: float = 300.0
    max_rows: int = 10_000
    max_cells: int = 2_000


@dataclass
class Watermark:
    """Which failures a poll has not seen yet (module docstring), pure: the
    caller reads the failures above :attr:`floor` and passes them to
    :meth:`observe` with the time of the poll."""

    floor: int
    lookback_s: float
    # (poll time, highest ID read by then), oldest first.
    marks: deque[tuple[float, int]] = field(default_factory=deque)
    seen: set[int] = field(default_factory=set)

    def observe(self, now: float, rows: Iterable[tuple[int, int | None]]) -> list[int]:
        """The IDs of ``rows`` (failure ID, cell or None) not seen before
        whose cell is known; a row without its cell yet is read again by the
        next polls until the floor passes it. Then the floor moves up to the
        highest ID read at least ``lookback_s`` before ``now``."""
        new: list[int] = []
        top = self.marks[-1][1] if self.marks else self.floor
        for fid, cell in rows:
            if fid <= self.floor or fid in self.seen or cell is None:
                continue
            self.seen.add(fid)
            new.append(fid)
        top = max([top, *new])
        self.marks.append((now, top))
        while self.marks and self.marks[0][0] <= now - self.lookback_s:
            self.floor = max(self.floor, self.marks.popleft()[1])
        self.seen = {i for i in self.seen if i > self.floor}
        return new


@dataclass
class Update:
    """What one poll did."""

    failures: int = 0
    cells: int = 0
    backlog: int = 0
    model_id: int | None = None
    published: Published | None = None
    # Start times (Unix s) of the new failures that the published table carries.
    carried_failure_times: list[float] = field(default_factory=list)


class Follower:
    """The follower's state across polls (one LinkDB connection)."""

    def __init__(self, conn: psycopg.Connection, o: Options, fo: FollowOptions) -> None:
        self.conn, self.o, self.fo = conn, o, fo
        row = conn.execute("SELECT coalesce(max(id), 0) FROM handovers").fetchone()
        conn.commit()
        self.mark = Watermark(int(row[0]) if row else 0, fo.lookback_s)
        # Cells with new failures not refitted yet (over max_cells), with the
        # start times of those failures.
        self.pending: dict[int, list[float]] = {}
        # An update stored but not published and sent (it failed in between),
        # and the start times of the failures whose entries it moved.
        self.unpublished = False
        self.carry: list[float] = []

    def poll(self, now: float | None = None) -> Update:
        now = time.monotonic() if now is None else now
        rows = self.conn.execute(
            FAILURES_SQL, {"floor": self.mark.floor, "limit": self.fo.max_rows}
        ).fetchall()
        self.conn.commit()
        cell_of = {int(r[0]): (None if r[1] is None else int(r[1]), float(r[2])) for r in rows}
        new = self.mark.observe(now, ((i, c) for i, (c, _) in cell_of.items()))
        for fid in new:
            cell, t = cell_of[fid]
            if cell is not None:  # always: observe returns only rows with their cell
                self.pending.setdefault(cell, []).append(t)
        u = Update(failures=len(new))
        if not self.pending:
            return u
        ids = sorted(self.pending)[: self.fo.max_cells]
        times = {i: self.pending.pop(i) for i in ids}
        u.cells, u.backlog = len(ids), len(self.pending)
        try:
            self._update(ids, times, u)
        except BaseException:
            # Refitted at the next poll (on a new connection): a failed
            # update loses no failure it had read.
            for i, ts in times.items():
                self.pending.setdefault(i, []).extend(ts)
            raise
        return u

    def reconnect(self, conn: psycopg.Connection) -> None:
        """Go on with a new connection (the old one failed), keeping which
        failures were read and which cells wait."""
        with contextlib.suppress(Exception):
            self.conn.close()
        self.conn = conn

    def _update(self, ids: list[int], times: dict[int, list[float]], u: Update) -> None:
        priors = self._refit_priors()
        if self.o.params.rule == "prior" and priors is None:
            log.warning(
                "follow: no refit with the prior rule has stored the fleet's prior yet; "
                "%d cells are left to the next refit",
                len(ids),
            )
            u.cells = 0
            return
        before = self._positions(ids)
        loaded = load_cell_ids(self.conn, ids)
        self.conn.commit()
        results = fit_many(loaded.cells, self.o.params, priors)
        handovers = sum(len(c.track_m) for c in loaded.cells)
        params = {**self.o.params.as_dict(), "update": "follow", "cells": len(ids)}
        if priors is not None:
            params["prior"] = {"a": priors.all.a, "b": priors.all.b}
        with self.conn.transaction():
            u.model_id = store_model(
                self.conn, results, params, summarise(loaded.cells, results), handovers
            )
        after = self._positions(ids)
        moved = [i for i in ids if after[i] != before[i]]
        # Stored, not yet published and sent: the next poll publishes even if
        # nothing moves then (its "before" is this model).
        self.carry += [t for i in moved for t in times[i]]
        self.unpublished = self.unpublished or bool(moved)
        if self.unpublished:
            u.published = publish_table(
                self.conn, u.model_id, self.o.signer, validity_s=self.o.validity_s
            )
            if u.published is not None:
                send_table(self.o, u.published)
                if u.published.new:
                    u.carried_failure_times = self.carry
            self.unpublished, self.carry = False, []

    def _refit_priors(self) -> Priors | None:
        """Under the ``prior`` rule the latest refit's prior (module
        docstring); ``None`` under the threshold rule or before that refit."""
        if self.o.params.rule != "prior":
            return None
        row = self.conn.execute(REFIT_PRIOR_SQL).fetchone()
        self.conn.commit()
        if row is None or row[0] is None or row[1] is None:
            return None
        return Priors(BetaPrior(float(row[0]), float(row[1])))

    def _positions(self, ids: list[int]) -> dict[int, float | None]:
        """Each cell's table position (``None``: no entry) as its latest model has it."""
        rows = self.conn.execute(POSITIONS_SQL, {"ids": ids}).fetchall()
        self.conn.commit()
        out: dict[int, float | None] = dict.fromkeys(ids)
        for cell, pos in rows:
            out[int(cell)] = None if pos is None else round(float(pos), 1)
        return out


def serve(
    url: str,
    o: Options,
    fo: FollowOptions,
    metrics: Metrics,
    stop: threading.Event,
) -> None:
    """Polls until ``stop`` is set. A poll that fails is logged and counted,
    and the next one goes on with a new connection and the same state (the
    failures read, the cells waiting)."""
    follower: Follower | None = None
    broken = False
    while not stop.is_set():
        try:
            if follower is None:
                follower = Follower(pg_connect(url, timeout_s=o.db_wait_s), o, fo)
                log.info(
                    "following failures above handover %d every %.0f s",
                    follower.mark.floor,
                    fo.poll_s,
                )
            elif broken:
                follower.reconnect(pg_connect(url, timeout_s=o.db_wait_s))
            broken = False
            export(metrics, follower.poll(), time.time())
        except Exception as e:
            metrics.follow_polls.labels("error").inc()
            log.error("follow: poll failed: %s: %s", type(e).__name__, e)
            broken = True
        stop.wait(fo.poll_s)
    if follower is not None:
        with contextlib.suppress(Exception):
            follower.conn.close()


def export(m: Metrics, u: Update, now_unix_s: float) -> None:
    """One poll as the follower's metrics."""
    m.follow_failures.inc(u.failures)
    m.follow_cells.inc(u.cells)
    m.follow_backlog.set(u.backlog)
    if u.published is None:
        m.follow_polls.labels("unchanged" if u.cells else "idle").inc()
        return
    m.follow_polls.labels("published" if u.published.new else "unchanged").inc()
    m.table_version.set(u.published.version)
    m.table_entries.set(u.published.entries)
    for t in u.carried_failure_times:
        m.follow_delay.observe(max(0.0, now_unix_s - t))
