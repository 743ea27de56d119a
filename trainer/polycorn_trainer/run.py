"""One trainer run: read a shard's cells, fit and validate them in parallel,
store the model, publish the table (LinkDB, then Kafka), signed with
``Options.signer`` when the trainer has a signing key.

The cells are read in passes (:class:`polycorn_trainer.data.Reader`) and
each pass is fitted in worker processes (:func:`polycorn_trainer.batch.
fit_columns`) while the next one is read (:func:`fit_stream`), so reading
and fitting overlap and memory holds a few passes, not the fleet. The
workers are forked by a forkserver: a clean single-threaded process (the
trainer itself runs threads: Kafka's client, the metrics server, the
executor's own), started once with the fitting code imported, so a worker
starts in milliseconds and inherits neither the trainer's threads nor its
memory."""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import select
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg

from polycorn_schema.startup import pg_connect
from polycorn_trainer.batch import Columns, Fitted, fit_columns
from polycorn_trainer.data import Reader, Shard, fleet_priors
from polycorn_trainer.fit import CellData, CellResult, Counts, Params, fit_many, priors_of
from polycorn_trainer.kafka import produce_table
from polycorn_trainer.metrics import Metrics
from polycorn_trainer.signing import TableSigner
from polycorn_trainer.store import (
    DEFAULT_VALIDITY_S,
    Published,
    StoredModel,
    StoredTableError,
    publish_table,
    store_model,
)

log = logging.getLogger(__name__)


@dataclass
class Options:
    shard: Shard = field(default_factory=Shard)
    workers: int = 0  # 0: one per CPU
    params: Params = field(default_factory=Params)
    store: bool = True  # false: validate only
    publish: bool = True
    bootstrap: str | None = None
    topic: str = "polycorn.failure-tables.v1"
    # Kafka security settings (polycorn_schema.kafka_security); {}: PLAINTEXT.
    kafka: dict[str, str] = field(default_factory=dict)
    # --table-signing-key: signs every table published; None: unsigned.
    signer: TableSigner | None = None
    # --table-validity-s: each table's expiry after its issue time.
    validity_s: int = DEFAULT_VALIDITY_S
    progress_every_s: float = 5.0
    # How long to wait for a starting PostgreSQL before a run fails.
    db_wait_s: float = 60.0


def _workers(n: int) -> int:
    return n if n > 0 else max(1, len(os.sched_getaffinity(0)))


def _chunks(cells: list[CellData], workers: int) -> list[list[CellData]]:
    # Several chunks per worker so that progress is smooth and a worker that
    # got the big cells does not hold up the end; not so many that pickling
    # dominates.
    size = max(16, len(cells) // (workers * 8) + 1)
    return [cells[i : i + size] for i in range(0, len(cells), size)]


def _exit_with(parent: int) -> None:
    """A worker's initializer: the worker exits as soon as the trainer
    process ``parent`` is gone. A SIGKILLed trainer (OOM killer, a second
    Ctrl-C, a test harness) otherwise leaves its workers fitting for
    minutes, and the forkserver with them; a container runtime would kill
    them with the cgroup, a plain host does not. A pidfd, not the parent
    PID: the workers' parent is the forkserver, and PIDs are reused."""
    try:
        fd = os.pidfd_open(parent)
    except ProcessLookupError:
        os._exit(1)

    def watch() -> None:
        select.select([fd], [], [])  # readable when the process has exited
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-trainer", daemon=True).start()


def _terminate(pool: ProcessPoolExecutor) -> None:
    """Stops ``pool``'s workers now, fits in progress abandoned (a run
    interrupted by SIGTERM must not wait for them). The executor keeps its
    processes in ``_processes`` (3.11; 3.14 adds ``terminate_workers()``)."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    for p in procs:
        p.terminate()
    pool.shutdown(wait=True, cancel_futures=True)
    for p in procs:
        p.join(5)


T = TypeVar("T")
R = TypeVar("R")
Fit = Callable[[list[CellData], Params], list[CellResult]]

# Batches sent to a worker: small enough that the work spreads evenly and
# progress is smooth, large enough that sending them costs little.
BATCH_HANDOVERS = 50_000
BATCH_CELLS = 1_000


class _Progress:
    """Logs how many cells are fitted, at most every ``every_s`` (called
    from the executor's thread as batches complete)."""

    def __init__(self, total: int, every_s: float) -> None:
        self.total, self.every_s = total, every_s
        self.done = 0
        self.t0 = self.last = time.monotonic()
        self.lock = threading.Lock()

    def done_with(self, cells: int, _batch: object) -> None:
        self.add(cells)

    def add(self, cells: int) -> None:
        with self.lock:
            self.done += cells
            now = time.monotonic()
            if now - self.last >= self.every_s:
                self.last = now
                log.info(
                    "fitted %d/%d cells (%.0f %%) in %.1f s",
                    self.done,
                    self.total,
                    100 * self.done / max(self.total, 1),
                    now - self.t0,
                )


def _pool(workers: int) -> ProcessPoolExecutor:
    """``workers`` processes forked by the forkserver (module docstring),
    each exiting with the trainer (:func:`_exit_with`)."""
    ctx = multiprocessing.get_context("forkserver")
    # Imported once in the forkserver (when it starts), not in every worker.
    ctx.set_forkserver_preload(["polycorn_trainer.run"])
    return ProcessPoolExecutor(
        max_workers=workers, mp_context=ctx, initializer=_exit_with, initargs=(os.getpid(),)
    )


def _ready() -> None:
    """A worker's first task: it is running."""


def _start(pool: ProcessPoolExecutor, workers: int) -> None:
    """Starts ``pool``'s processes (a task each); a failure shows on the real tasks."""
    try:
        for f in [pool.submit(_ready) for _ in range(workers)]:
            f.result()
    except Exception:  # noqa: S110 (the pool is broken or shut down: fit_stream sees it)
        pass


def fit_stream(
    batches: Iterable[T],
    o: Options,
    fit: Callable[[T, Params], R],
    *,
    total: int,
    size: Callable[[T], int],
    ahead: int = 0,
) -> list[R]:
    """``fit(batch, o.params)`` for every batch, the results in the batches'
    order: in worker processes when there is more than one worker and
    ``total`` (the cells to fit, for the progress log) reaches 64. The
    batches are taken as the workers need them, at most ``ahead`` (by
    default two per worker) waiting, so a lazy ``batches`` (a reader) runs
    while earlier batches are fitted, and memory holds only the batches in
    flight. Interrupted (an exception in this thread, e.g. the service's
    SIGTERM, or a batch's failure), it stops the workers before it lets the
    exception go."""
    workers = _workers(o.workers)
    progress = _Progress(total, o.progress_every_s)
    if workers == 1 or total < 64:
        out: list[R] = []
        for b in batches:
            out.append(fit(b, o.params))
            progress.add(size(b))
        return out
    pool = _pool(workers)
    # The forkserver imports the fitting code (seconds: scikit-learn) and
    # forks the workers while this thread reads the first batch.
    threading.Thread(target=_start, args=(pool, workers), name="start-workers", daemon=True).start()
    try:
        futures: list[Future[R]] = []
        for b in batches:
            f = pool.submit(fit, b, o.params)
            f.add_done_callback(functools.partial(progress.done_with, size(b)))
            futures.append(f)
            waiting = [f for f in futures if not f.done()]
            if len(waiting) > (ahead or 2 * workers):
                wait(waiting, return_when=FIRST_COMPLETED)
        results = [f.result() for f in futures]
    except BaseException:
        _terminate(pool)
        raise
    pool.shutdown(wait=True)
    return results


def fit_all(cells: list[CellData], o: Options, fit: Fit | None = None) -> list[CellResult]:
    """Fits every cell with ``fit`` (the reference by default, under the
    ``prior`` rule with the priors of all of ``cells``, not of each
    worker's share), in worker processes when there is more than one worker
    and enough cells (:func:`fit_stream`)."""
    if fit is None:
        priors = priors_of(cells) if o.params.rule == "prior" else None
        fit = functools.partial(fit_many, priors=priors)
    chunks = _chunks(cells, _workers(o.workers))
    return [r for part in fit_stream(chunks, o, fit, total=len(cells), size=len) for r in part]


def _batches(reader: Iterable[Columns]) -> Iterator[Columns]:
    """The reader's passes cut into worker-sized batches."""
    for batch in reader:
        yield from batch.split(BATCH_HANDOVERS, BATCH_CELLS)


def summary_of(by_carrier: dict[str, tuple[Counts, Counts]]) -> dict[str, Any]:
    """The validation summary (fractions 0–1), overall and by carrier, from
    each carrier's counts (paper, deployed)."""
    paper, deployed = Counts(), Counts()
    for p, d in by_carrier.values():
        paper.add(p)
        deployed.add(d)
    out = paper.summary()
    dep = deployed.summary()
    out["deployed"] = {k: v for k, v in dep.items() if not k.startswith("separability")}
    out["by_carrier"] = {}
    for k in sorted(by_carrier):
        s = by_carrier[k][0].summary()
        ds = by_carrier[k][1].summary()
        s["deployed"] = {k2: v for k2, v in ds.items() if not k2.startswith("separability")}
        out["by_carrier"][k] = s
    return out


def summarise(cells: Iterable[CellData], results: list[CellResult]) -> dict[str, Any]:
    """The validation summary of the reference's results (:func:`summary_of`)."""
    carrier = {c.key: c.carrier for c in cells}
    by_carrier: dict[str, tuple[Counts, Counts]] = {}
    for r in results:
        paper, deployed = by_carrier.setdefault(carrier[r.key], (Counts(), Counts()))
        paper.add(r.counts)
        deployed.add(r.deployed)
    return summary_of(by_carrier)


def run(url: str, o: Options, metrics: Metrics | None = None) -> dict[str, Any]:
    """One run; returns the summary (docs/trainer.md, "Summary")."""
    m = metrics or Metrics()
    t0 = time.monotonic()
    try:
        summary = _run(url, o, m, t0)
    except StoredTableError:
        m.table_refused.inc()
        m.runs.labels("error").inc()
        raise
    except Exception:
        m.runs.labels("error").inc()
        raise
    m.runs.labels("ok").inc()
    m.run_seconds.observe(summary["refit_s"])
    m.last_success.set(time.time())
    return summary


def _run(url: str, o: Options, m: Metrics, t0: float) -> dict[str, Any]:
    with pg_connect(url, timeout_s=o.db_wait_s) as conn:
        t_read = time.monotonic()
        reader = Reader(conn, o.shard)
        in_shard = len(reader.shard_cells.key)
        priors = None
        if o.params.rule == "prior":
            t_prior = time.monotonic()
            priors = fleet_priors(conn)
            log.info(
                "the fleet's prior: Beta(%.3g, %.3g), %d trips held out, in %.1f s",
                priors.all.a,
                priors.all.b,
                len(priors.without_trip),
                time.monotonic() - t_prior,
            )
        log.info("shard %s: %d cells; reading and fitting them", o.shard, in_shard)
        fitted = Fitted()
        # The reader goes on with the next pass while up to two passes' worth
        # of batches wait for the workers: it does not wait while they keep up.
        ahead = 2 * -(-reader.pass_handovers // BATCH_HANDOVERS)
        fit = functools.partial(fit_columns, priors=priors)
        for part in fit_stream(_batches(reader), o, fit, total=in_shard, size=len, ahead=ahead):
            fitted.add(part)
        conn.commit()  # the read-only snapshot
        # Reading and fitting overlap: the fitting's share is what it added.
        fit_s = time.monotonic() - t_read - reader.seconds
        t_load = t_read - t0 + reader.seconds
        handovers, untracked = reader.handovers, reader.untracked
        log.info(
            "shard %s: %d cells, %d handovers (%d more without a track position) read in %.1f s, "
            "fitted %.1f s later (%.1f s of CPU)",
            o.shard,
            reader.cells,
            handovers,
            untracked,
            t_load,
            fit_s,
            fitted.cpu_s,
        )
        validation = summary_of(fitted.counts)
        kinds = fitted.kinds
        t_store = time.monotonic()
        # The prior rule's tables depend on the fleet's prior too: it is
        # stored with the model's parameters.
        prior = {"prior": {"a": priors.all.a, "b": priors.all.b}} if priors else {}
        model_id, published = _store_and_publish(
            conn, o, fitted.models, validation, handovers, routed=reader.routed, extra=prior
        )
    if published is not None:
        send_table(o, published)
    refit_s = time.monotonic() - t0
    summary: dict[str, Any] = {
        "model_id": model_id,
        "shard": str(o.shard),
        "cells": reader.cells,
        "cells_fitted": kinds.get("linear_svc", 0),
        "kinds": dict(sorted(kinds.items())),
        "handovers": handovers,
        "handovers_without_track": untracked,
        "handovers_in_cells": handovers + untracked,
        "load_s": round(t_load, 3),
        "fit_s": round(fit_s, 3),
        "fit_cpu_s": round(fitted.cpu_s, 3),
        "store_s": round(time.monotonic() - t_store, 3),
        "refit_s": round(refit_s, 3),
        "table": (
            {
                "version": published.version,
                "entries": published.entries,
                "etag": published.etag,
                "new": published.new,
            }
            if published
            else None
        ),
        **prior,
        "validation": validation,
    }
    _export(m, summary, kinds, published)
    log.info(
        "run done in %.1f s: model %s, %d cells (%d SVMs), table %s; validation: failures "
        "correct/late/early %s/%s/%s, successes correct %s",
        refit_s,
        model_id,
        reader.cells,
        summary["cells_fitted"],
        f"v{published.version} ({published.entries} entries)" if published else "none",
        validation["failure_correct"],
        validation["failure_late"],
        validation["failure_early"],
        validation["success_correct"],
    )
    return summary


def _store_and_publish(
    conn: psycopg.Connection,
    o: Options,
    results: Sequence[StoredModel],
    validation: dict[str, Any],
    handovers: int,
    *,
    routed: Sequence[int] | None = None,
    extra: dict[str, Any] | None = None,
) -> tuple[int | None, Published | None]:
    """Store the model (its id) and assemble the table from it, as the
    options ask; ``extra``: stored with the parameters."""
    model_id: int | None = None
    published: Published | None = None
    if o.store:
        with conn.transaction():
            model_id = store_model(
                conn,
                results,
                {**o.params.as_dict(), "shard": str(o.shard), **(extra or {})},
                validation,
                handovers,
                routed=routed,
            )
        if o.publish:
            published = publish_table(conn, model_id, o.signer, validity_s=o.validity_s)
    elif o.publish:
        raise ValueError("publishing needs a stored model")
    if o.publish and published is None:
        log.info("no cell has a failure location yet: no table published")
    return model_id, published


def send_table(o: Options, published: Published) -> None:
    """Send a published table to Kafka, if there is one to send it to."""
    if o.bootstrap:
        produce_table(
            o.bootstrap,
            o.topic,
            published.body,
            version=published.version,
            etag=published.etag,
            signature=published.signature,
            kafka=o.kafka,
        )
        log.info("table v%d produced to %s", published.version, o.topic)
    else:
        log.warning(
            "no Kafka bootstrap: table v%d is in LinkDB only (the API serves it)", published.version
        )


def _export(
    m: Metrics, summary: dict[str, Any], kinds: dict[str, int], published: Published | None
) -> None:
    """A run's summary as the trainer's metrics."""
    validation = summary["validation"]
    m.cells_fitted.set(summary["cells_fitted"])
    for k in ("linear_svc", "too_few", "no_failures", "failures_only"):
        m.cells.labels(k).set(kinds.get(k, 0))
    m.handovers.set(summary["handovers"])
    for k in ("failure_correct", "failure_late", "failure_early", "success_correct"):
        if validation[k] is not None:
            m.validation.labels(k).set(validation[k])
    for k, v in validation["with_lead"].items():
        if v is not None:
            m.validation.labels(f"lead_{k}").set(v)
    for k, v in validation["separability"].items():
        if v is not None:
            m.validation.labels(f"separability_{k}").set(v)
    if summary["model_id"] is not None:
        m.model_id.set(summary["model_id"])
    if published:
        m.table_version.set(published.version)
        m.table_entries.set(published.entries)


def publish_only(
    url: str,
    bootstrap: str | None,
    topic: str,
    *,
    db_wait_s: float = 60.0,
    kafka: dict[str, str] | None = None,
    signer: TableSigner | None = None,
    validity_s: int = DEFAULT_VALIDITY_S,
) -> Published | None:
    """Re-assembles the table from the latest cell models and publishes it
    (after sharded runs, or to re-issue the current table and send it to
    Kafka)."""
    with pg_connect(url, timeout_s=db_wait_s) as conn:
        published = publish_table(conn, None, signer, validity_s=validity_s)
    if published is not None and bootstrap:
        produce_table(
            bootstrap,
            topic,
            published.body,
            version=published.version,
            etag=published.etag,
            signature=published.signature,
            kafka=kafka,
        )
    return published
