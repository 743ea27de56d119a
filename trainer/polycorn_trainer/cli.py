"""``polycorn-trainer``: learn where handovers fail and publish the table.

    polycorn-trainer run [--once | --interval-s N] [--shard I/N] [--workers K]
                         [--no-publish] [--topic T] [--summary-json FILE]
                         [--metrics-addr HOST:PORT] [model options]
    polycorn-trainer validate [--shard I/N] [--summary-json FILE] [model options]
    polycorn-trainer publish

``run`` fits, validates, stores the model and publishes the table (LinkDB and
the Kafka topic); without ``--once`` it stays up and runs every
``--interval-s`` seconds (a failed run is logged and counted, and the next one
tries again) until SIGTERM/SIGINT. ``validate`` stores nothing. ``publish``
re-assembles the table from the latest model of every cell (after sharded
runs) and sends the current table to Kafka again. ``--database-url``
defaults to ``POLYCORN_DATABASE_URL``, ``--bootstrap`` to
``POLYCORN_KAFKA_BOOTSTRAP`` (without one, tables stay in LinkDB, where the
API serves them); ``run`` and ``publish`` take the Kafka security options
(``--kafka-security-protocol SASL_SSL --kafka-sasl-username ...
--kafka-sasl-password-file ... --kafka-ssl-ca ...``; ``polycorn_schema.
kafka_security``) and ``--table-signing-key FILE`` (env
``POLYCORN_TRAINER_TABLE_SIGNING_KEY``): the Ed25519 key every table is
signed with (``polycorn-pki table-key``; without it tables are published
unsigned, and relays and proxies with ``--failure-table-verify-key`` refuse
them), and ``--table-validity-s`` (default three days): each table's expiry
after its issue time; every run re-issues the current table, so it must
exceed twice ``--interval-s``. Exit status: 0 done, 1 the run failed (also
when the current ``failure_tables`` row is not one a publisher wrote: the
trainer signs nothing then), 2 bad usage.
``docs/trainer.md`` has the method.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from polycorn_schema import kafka_security
from polycorn_schema.failure_table import TOPIC
from polycorn_trainer.data import Shard
from polycorn_trainer.fit import RULES, Params
from polycorn_trainer.follow import FollowOptions
from polycorn_trainer.follow import serve as follow_serve
from polycorn_trainer.metrics import Metrics
from polycorn_trainer.run import Options, publish_only, run
from polycorn_trainer.signing import TableSigner
from polycorn_trainer.store import DEFAULT_VALIDITY_S

log = logging.getLogger("polycorn_trainer")


def _non_negative_int(text: str) -> int:
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def _positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _positive_float(text: str) -> float:
    v = float(text)
    if not (v > 0 and v < 1e9):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return v


def _metres(text: str) -> float:
    """A distance along the track, 0 to 10 km (NaN and infinities refused)."""
    v = float(text)
    if not 0.0 <= v <= 10_000.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 10000 m, got {text}")
    return v


def _quantile(text: str) -> float | None:
    """A fraction, or ``mean`` (None: the failures' mean position)."""
    return None if text.strip().lower() == "mean" else _fraction(text)


def _fraction(text: str) -> float:
    v = float(text)
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return v


def _seconds(text: str) -> float:
    v = float(text)
    if not (v > 0 and v < 1e7):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return v


def _validity(text: str) -> int:
    v = int(text)
    if not 60 <= v <= 365 * 24 * 3600:
        raise argparse.ArgumentTypeError(f"must be 60 s to a year, got {text}")
    return v


def _shard(text: str) -> Shard:
    try:
        return Shard.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="polycorn-trainer",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--log-level", default="INFO")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = Params()

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--database-url",
            default=os.environ.get("POLYCORN_DATABASE_URL"),
            help="postgresql://user@host:port/db (env POLYCORN_DATABASE_URL)",
        )
        sp.add_argument(
            "--db-wait-s",
            type=_seconds,
            default=60.0,
            help="wait this long for a starting PostgreSQL before failing (default 60)",
        )

    def kafka(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--bootstrap",
            default=os.environ.get("POLYCORN_KAFKA_BOOTSTRAP"),
            help="Kafka bootstrap servers (env POLYCORN_KAFKA_BOOTSTRAP); none: LinkDB only",
        )
        sp.add_argument("--topic", default=TOPIC, help=f"compacted table topic (default {TOPIC})")
        key = os.environ.get("POLYCORN_TRAINER_TABLE_SIGNING_KEY")
        sp.add_argument(
            "--table-signing-key",
            type=Path,
            default=Path(key) if key else None,
            help="Ed25519 private key (PEM or 32-byte seed; polycorn-pki table-key) that signs "
            "every table published (env POLYCORN_TRAINER_TABLE_SIGNING_KEY); none: unsigned",
        )
        sp.add_argument(
            "--table-validity-s",
            type=_validity,
            default=DEFAULT_VALIDITY_S,
            help="each table expires this long after it is issued (default "
            f"{DEFAULT_VALIDITY_S}); every run re-issues it, so keep it well above --interval-s",
        )
        kafka_security.add_arguments(sp)

    def model(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--shard", type=_shard, default=Shard(), help="I/N: this worker's cells")
        sp.add_argument(
            "--workers", type=_non_negative_int, default=0, help="processes (0: one per CPU)"
        )
        sp.add_argument(
            "--rule",
            choices=RULES,
            default=d.rule,
            help="what puts a cell into the table: 'threshold' (--min-failures and "
            "--min-failure-rate) or 'prior' (the cell's posterior failure probability under "
            "a prior fitted across the fleet's cells against --failure-cost-ratio; follow "
            f"uses the latest refit's) (default {d.rule})",
        )
        sp.add_argument(
            "--failure-cost-ratio",
            type=_positive_float,
            default=d.failure_cost_ratio,
            help="the prior rule's cost of a failure not rested before over that of a rest "
            "before a handover that succeeds: a cell enters when its failure probability "
            f"exceeds 1 / (1 + R) (default {d.failure_cost_ratio:g})",
        )
        sp.add_argument("--min-failures", type=_non_negative_int, default=d.min_failures)
        sp.add_argument("--min-failure-rate", type=_fraction, default=d.min_failure_rate)
        sp.add_argument("--min-handovers", type=_non_negative_int, default=d.min_handovers)
        sp.add_argument(
            "--min-trains",
            type=_positive_int,
            default=d.min_trains,
            help="a cell enters the table only on failures from this many distinct trains, and "
            "only if it still qualifies with any one train left out (default "
            f"{d.min_trains}); 1: one train's reports are enough (a line with a single train)",
        )
        sp.add_argument(
            "--location-quantile",
            type=_quantile,
            default=d.location_quantile,
            help="place a cell's failure at the ⌈q·n⌉-th earliest of its n failures along the "
            f"direction of travel (default q = {d.location_quantile}), or 'mean': their mean "
            "(the paper's)",
        )
        sp.add_argument(
            "--location-margin-m",
            type=_metres,
            default=d.location_margin_m,
            help="with a quantile, move the entry this many metres earlier divided by the "
            f"cell's failures (default {d.location_margin_m:g}: 1 s at 300 km/h); 0: none",
        )
        sp.add_argument(
            "--lead-s",
            type=_seconds,
            default=d.lead_s,
            help="HPR's lead for the validation's with_lead reading (RTT + E_GPS / V)",
        )
        sp.add_argument("--summary-json", type=Path, help="write the run's summary here")

    r = sub.add_parser("run", help="fit, validate, store and publish")
    common(r)
    kafka(r)
    model(r)
    g = r.add_mutually_exclusive_group()
    g.add_argument("--once", action="store_true", help="one run, then exit")
    g.add_argument("--interval-s", type=_seconds, default=3600.0, help="seconds between runs")
    r.add_argument("--no-publish", action="store_true", help="store the model, publish no table")
    r.add_argument("--metrics-addr", help="serve Prometheus metrics on HOST:PORT")

    f = sub.add_parser(
        "follow",
        help="refit the cells of new failures every few seconds and publish the table again "
        "(between refits; docs/trainer.md)",
    )
    common(f)
    kafka(f)
    model(f)
    f.add_argument(
        "--poll-s", type=_seconds, default=FollowOptions.poll_s, help="seconds between polls"
    )
    f.add_argument(
        "--lookback-s",
        type=_seconds,
        default=FollowOptions.lookback_s,
        help="how long a failure may commit after a higher handover ID and still be seen",
    )
    f.add_argument(
        "--max-cells",
        type=_positive_int,
        default=FollowOptions.max_cells,
        help="cells refitted per poll at most (the rest wait for the next)",
    )
    f.add_argument("--metrics-addr", help="serve Prometheus metrics on HOST:PORT")

    v = sub.add_parser("validate", help="leave-one-trip-out validation only; stores nothing")
    common(v)
    model(v)

    pb = sub.add_parser("publish", help="assemble and publish the table from the latest models")
    common(pb)
    kafka(pb)
    return p


def _options(
    a: argparse.Namespace,
    store: bool,
    publish: bool,
    kafka: dict[str, str] | None = None,
    signer: TableSigner | None = None,
) -> Options:
    params = Params(
        rule=a.rule,
        failure_cost_ratio=a.failure_cost_ratio,
        min_failures=a.min_failures,
        min_failure_rate=a.min_failure_rate,
        min_handovers=max(2, a.min_handovers),
        min_trains=a.min_trains,
        lead_s=a.lead_s,
        location_quantile=a.location_quantile,
        location_margin_m=a.location_margin_m,
    )
    return Options(
        shard=a.shard,
        workers=a.workers,
        params=params,
        store=store,
        publish=publish,
        bootstrap=getattr(a, "bootstrap", None),
        topic=getattr(a, "topic", TOPIC),
        kafka=kafka or {},
        signer=signer,
        validity_s=getattr(a, "table_validity_s", DEFAULT_VALIDITY_S),
        db_wait_s=a.db_wait_s,
    )


def _signer(a: argparse.Namespace) -> TableSigner | None:
    """The signing key of ``run`` and ``publish``; a warning without one."""
    path: Path | None = getattr(a, "table_signing_key", None)
    if path is not None:
        signer = TableSigner.load(path)
        log.info("failure-location tables are signed with %s", path)
        return signer
    if a.cmd == "publish" or (a.cmd == "run" and not a.no_publish):
        log.warning(
            "no --table-signing-key: tables are published unsigned; relays and proxies with "
            "--failure-table-verify-key refuse them"
        )
    return None


def _write_summary(path: Path | None, summary: dict[str, Any]) -> None:
    if path is None:
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    a = p.parse_args(argv)
    logging.basicConfig(
        level=a.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not a.database_url:
        p.error("no database: give --database-url or set POLYCORN_DATABASE_URL")
    # Security options only where there is a Kafka (validate has none).
    kafka = kafka_security.parse(p, a) if hasattr(a, "kafka_security_protocol") else {}
    try:
        signer = _signer(a)
        if a.cmd == "publish":
            t = publish_only(
                a.database_url,
                a.bootstrap,
                a.topic,
                db_wait_s=a.db_wait_s,
                kafka=kafka,
                signer=signer,
                validity_s=a.table_validity_s,
            )
            print(
                json.dumps(
                    None
                    if t is None
                    else {"version": t.version, "entries": t.entries, "etag": t.etag, "new": t.new}
                )
            )
            return 0
        if a.cmd == "follow":
            if a.shard != Shard():
                p.error("follow refits the cells of new failures wherever they are: no --shard")
            return _follow(a, _options(a, store=True, publish=True, kafka=kafka, signer=signer))
        if a.cmd == "validate":
            s = run(a.database_url, _options(a, store=False, publish=False))
            _write_summary(a.summary_json, s)
            print(json.dumps(s["validation"], indent=2))
            return 0
        o = _options(a, store=True, publish=not a.no_publish, kafka=kafka, signer=signer)
        if not a.once and a.table_validity_s <= 2 * a.interval_s:
            p.error(
                f"--table-validity-s {a.table_validity_s} must exceed twice --interval-s "
                f"{a.interval_s:.0f}: tables would expire between runs"
            )
        metrics = Metrics()
        if a.metrics_addr:
            metrics.serve(a.metrics_addr)
        if a.once:
            _write_summary(a.summary_json, run(a.database_url, o, metrics))
            return 0
        return _serve(a, o, metrics)
    except Exception as e:  # one clear line, not a traceback, for operators
        log.debug("run failed", exc_info=True)
        print(f"polycorn-trainer: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


def _follow(a: argparse.Namespace, o: Options) -> int:
    """``follow`` until SIGTERM/SIGINT (a poll in progress finishes first:
    each is a few cells)."""
    metrics = Metrics()
    if a.metrics_addr:
        metrics.serve(a.metrics_addr)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    fo = FollowOptions(poll_s=a.poll_s, lookback_s=a.lookback_s, max_cells=a.max_cells)
    follow_serve(a.database_url, o, fo, metrics, stop)
    return 0


class Stopped(KeyboardInterrupt):
    """Raised in the main thread by SIGTERM/SIGINT while a service run is
    in progress: the run is abandoned (its open transaction rolls back, the
    fitting workers are stopped). A ``KeyboardInterrupt`` because psycopg
    cancels a query in progress on the server for that one only."""


def _serve(a: argparse.Namespace, o: Options, metrics: Metrics) -> int:
    """Runs every ``--interval-s`` until SIGTERM/SIGINT. A signal during a
    run abandons it at once: a run waits up to ``--db-wait-s`` for
    PostgreSQL and fits for minutes on a large fleet, longer than a
    platform's grace period (Kubernetes: 30 s by default), and a SIGKILL
    after it would leave nothing better. Nothing of an abandoned run is
    half-stored: the model and the table are each one transaction, and a
    table already in LinkDB but not yet produced to Kafka is produced again
    by the next run (it republishes the current table)."""
    stop = threading.Event()
    running = False

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()
        if running:
            log.info("signal %d: abandoning the current run and stopping", signum)
            raise Stopped
        log.info("signal %d: stopping", signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("trainer service: a run every %.0f s (shard %s)", a.interval_s, o.shard)
    try:
        while not stop.is_set():
            summary = None
            running = True
            try:
                summary = run(a.database_url, o, metrics)
            except Exception as e:
                log.error(
                    "run failed: %s: %s (next run in %.0f s)", type(e).__name__, e, a.interval_s
                )
            finally:
                running = False
            if summary is not None:
                _write_summary(a.summary_json, summary)
            stop.wait(a.interval_s)
    except Stopped:
        log.info("run abandoned")
    return 0


if __name__ == "__main__":
    sys.exit(main())
