"""``polycorn-ingest``: Kafka → LinkDB, the drive-test importer, the testbed producer.

    polycorn-ingest run [--bootstrap B] [--database-url URL] [--group G] [--topic T]
                        [--dlq-topic D] [--migrate] [--metrics-addr HOST:PORT] ...
    polycorn-ingest import-drivetest FILE.csv --train-id NAME [--format generic|gnettrack]
                        [--carrier NAME] [--time-col C --lat-col C --lon-col C --cell-col C,...
                        --signal-col C --rsrq-col C --sinr-col C --speed-col C --carrier-col C
                        --mode-col C] [--time-format iso|unix-s|unix-ms|PATTERN]
                        [--timezone ZONE] [--na -] [--speed-unit km/h] [--delimiter ,]
    polycorn-ingest produce-testbed EVENTS.jsonl --train-id NAME [--topic T]
    polycorn-ingest import-routes FILE.geojson|FILE.osm [--route-id ID] [--name N]
                        [--railway rail,...] [--min-length-m M]
    polycorn-ingest rematch [--train T] [--since ISO] [--until ISO]
    polycorn-ingest learn-route --route-id ID [--train T ...] [--since ISO] [--until ISO]

``--bootstrap`` defaults to ``POLYCORN_KAFKA_BOOTSTRAP``, ``--database-url``
to ``POLYCORN_DATABASE_URL``. ``run`` and ``produce-testbed`` take the Kafka
security options (``--kafka-security-protocol SASL_SSL --kafka-sasl-username
... --kafka-sasl-password-file ... --kafka-ssl-ca ...``; ``polycorn_schema.
kafka_security``). ``docs/ingest.md`` has the guarantees.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

import psycopg
from confluent_kafka import KafkaError, Producer

from polycorn_ingest import learn, routes
from polycorn_ingest.consumer import IngestConfig, Ingestor
from polycorn_ingest.drivetest import (
    COLUMN_FIELDS,
    FORMATS,
    SPEED_UNITS,
    customise,
    import_csv,
)
from polycorn_ingest.metrics import Metrics
from polycorn_ingest.records import MAX_TIME_MS, MIN_TIME_MS
from polycorn_ingest.sink import LinkDbSink, TransientDbError
from polycorn_ingest.testbed import records
from polycorn_schema import kafka_security, startup
from polycorn_schema.linkdb.cli import upgrade

log = logging.getLogger("polycorn_ingest")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="polycorn-ingest", description=__doc__.split("\n")[0])
    p.add_argument("--log-level", default="INFO")
    sub = p.add_subparsers(dest="cmd", required=True)
    _run_args(sub.add_parser("run", help="consume telemetry into LinkDB"))
    _import_drivetest_args(
        sub.add_parser(
            "import-drivetest",
            help="import a third-party drive-test CSV log",
            description="Import a drive-test CSV log. --format picks a preset (generic: "
            "time,lat,lon,cell_id,rsrp; gnettrack: G-NetTrack Pro exports such as the UCC "
            "4G/5G datasets); every --*-col option overrides one of its columns ('' drops an "
            "optional one). See docs/ingest.md for the mapping of public formats.",
        )
    )
    _import_routes_args(
        sub.add_parser(
            "import-routes", help="store track geometry (GeoJSON or an OSM XML extract) in LinkDB"
        )
    )
    _learn_route_args(
        sub.add_parser(
            "learn-route", help="learn a route's centre line from stored fixes (no geometry needed)"
        )
    )
    _rematch_args(
        sub.add_parser("rematch", help="map-match fixes stored before their route was imported")
    )
    _produce_testbed_args(
        sub.add_parser("produce-testbed", help="publish a testbed trip's events.jsonl")
    )
    return p


def _db_args(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--database-url",
        default=os.environ.get("POLYCORN_DATABASE_URL"),
        help="postgresql://user@host:port/db (env POLYCORN_DATABASE_URL)",
    )
    sp.add_argument(
        "--migrate", action="store_true", help="bring LinkDB to the latest schema first"
    )
    sp.add_argument(
        "--trip-gap-s",
        type=float,
        default=600.0,
        help="a gap between fixes longer than this starts a new trip",
    )


def _window_args(sp: argparse.ArgumentParser) -> None:  # read by _window
    sp.add_argument("--since", default=None, help="ISO 8601 time (default: the beginning)")
    sp.add_argument("--until", default=None, help="ISO 8601 time (default: now and later)")


def _kafka_args(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--bootstrap",
        default=os.environ.get("POLYCORN_KAFKA_BOOTSTRAP"),
        help="Kafka bootstrap servers (env POLYCORN_KAFKA_BOOTSTRAP)",
    )
    sp.add_argument("--topic", default="polycorn.telemetry.v1")
    kafka_security.add_arguments(sp)


def _run_args(run: argparse.ArgumentParser) -> None:
    _kafka_args(run)
    _db_args(run)
    run.add_argument("--group", default="polycorn-ingest")
    run.add_argument("--dlq-topic", default="polycorn.telemetry.dlq")
    run.add_argument("--batch-max", type=int, default=50_000, help="messages per batch at most")
    run.add_argument(
        "--batch-timeout-s", type=float, default=0.5, help="wait at most this long to fill a batch"
    )
    run.add_argument(
        "--session-timeout-s",
        type=float,
        default=10.0,
        help="a replica that died keeps its partitions this long before the group moves them "
        "(the broker's group.min.session.timeout.ms, 6 s by default, is the least)",
    )
    run.add_argument(
        "--metrics-addr",
        default="127.0.0.1:9464",
        help="serve Prometheus /metrics here ('' to disable)",
    )
    run.add_argument(
        "--migrate-timeout-s",
        type=float,
        default=300.0,
        help="with --migrate: wait this long for a starting database, then exit with the "
        "last error (a broken migration exits at once)",
    )


def _import_drivetest_args(imp: argparse.ArgumentParser) -> None:
    imp.add_argument("file", type=Path)
    _db_args(imp)
    imp.add_argument("--train-id", required=True, help="LinkDB train id for this log")
    imp.add_argument("--format", choices=sorted(FORMATS), default="generic")
    imp.add_argument(
        "--carrier",
        default="",
        help="carrier name of every row (default: the format's operator column)",
    )
    for col, what in (
        ("time", "time"),
        ("lat", "latitude"),
        ("lon", "longitude"),
        ("cell", "serving cell; several comma-separated columns make one identity"),
        ("signal", "RSRP (dBm)"),
        ("rsrq", "RSRQ (dB)"),
        ("sinr", "SINR/SNR (dB)"),
        ("speed", "speed (see --speed-unit)"),
        ("carrier", "operator of each row"),
        ("mode", "network mode (LTE, 5G, ...)"),
    ):
        imp.add_argument(f"--{col}-col", default=None, help=f"column: {what}")
    imp.add_argument(
        "--time-format",
        default=None,
        help="iso, unix-s, unix-ms, or a strptime pattern such as %%Y.%%m.%%d_%%H.%%M.%%S",
    )
    imp.add_argument(
        "--timezone",
        default="UTC",
        help="IANA zone of times written without an offset (loggers write local time)",
    )
    imp.add_argument("--na", default=None, help="comma-separated markers of 'no value'")
    imp.add_argument("--speed-unit", choices=sorted(SPEED_UNITS), default=None)
    imp.add_argument("--delimiter", default=None)
    imp.add_argument(
        "--failure-gap-ms",
        type=int,
        default=None,
        help="a cell change with a longer interruption is a failed handover "
        "(generic 1500, gnettrack 2500)",
    )


def _import_routes_args(rt: argparse.ArgumentParser) -> None:
    rt.add_argument("file", type=Path)
    _db_args(rt)
    rt.add_argument("--format", choices=("geojson", "osm"), default=None, help="default: by suffix")
    rt.add_argument("--route-id", default=None, help="the route's id (required for OSM)")
    rt.add_argument("--name", default="", help="the route's name (OSM)")
    rt.add_argument(
        "--railway",
        default="rail",
        help="OSM railway=* values that are tracks (comma-separated; default rail)",
    )
    rt.add_argument(
        "--min-length-m",
        type=float,
        default=1000.0,
        help="OSM: shorter chains of ways (sidings, yards) are left out",
    )


def _learn_route_args(lr: argparse.ArgumentParser) -> None:
    _db_args(lr)
    lr.add_argument("--route-id", required=True)
    lr.add_argument("--name", default="")
    lr.add_argument("--train", action="append", default=None, help="a train (repeatable)")
    _window_args(lr)
    lr.add_argument("--step-m", type=float, default=100.0, help="vertex spacing while learning")


def _rematch_args(rm: argparse.ArgumentParser) -> None:
    _db_args(rm)
    rm.add_argument("--train", default=None, help="one train (default: every train)")
    _window_args(rm)


def _produce_testbed_args(tb: argparse.ArgumentParser) -> None:
    tb.add_argument("events", type=Path)
    _kafka_args(tb)
    tb.add_argument("--train-id", required=True)
    tb.add_argument("--epoch-unix-ms", type=int, default=None, help="trip start (default: now)")
    tb.add_argument(
        "--gps-only",
        action="store_true",
        help="send fixes and handovers without the log's track position, as a plain GPS "
        "receiver would (ingest map-matches them onto LinkDB's routes)",
    )
    tb.add_argument(
        "--carriers",
        default="carrier-0,carrier-1,carrier-2,carrier-3",
        help="names of carriers 0, 1, ... (comma-separated; the default is the testbed "
        "relay's path names, so LinkDB keys the same cells either way)",
    )


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    a = p.parse_args(argv)
    logging.basicConfig(
        level=a.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if a.cmd == "produce-testbed":
        return _produce_testbed(p, a)
    if not a.database_url:
        p.error("no database: give --database-url or set POLYCORN_DATABASE_URL")
    if a.cmd == "import-drivetest":
        return _import(a)
    if a.cmd == "import-routes":
        return _import_routes(a)
    if a.cmd == "rematch":
        return _rematch(p, a)
    if a.cmd == "learn-route":
        return _learn_route(p, a)
    if not a.bootstrap:
        p.error("no Kafka: give --bootstrap or set POLYCORN_KAFKA_BOOTSTRAP")
    return _run(a, kafka_security.parse(p, a))


def _migrate(sink: LinkDbSink, timeout_s: float) -> None:
    """Bring LinkDB to the latest schema, waiting up to ``timeout_s`` for a
    database that is still starting. Any other error (a broken migration, a
    wrong password) ends the service at once with that error: retrying it
    would only loop."""
    startup.retry(
        sink.migrate,
        what="migrating LinkDB",
        retriable=startup.pg_retriable,
        timeout_s=timeout_s,
        initial_delay_s=0.5,
        max_delay_s=10.0,
    )


def ingest_config(a: argparse.Namespace, kafka: dict[str, str]) -> IngestConfig:
    """The consumer's settings from ``run``'s flags."""
    return IngestConfig(
        bootstrap=a.bootstrap,
        group=a.group,
        topic=a.topic,
        dlq_topic=a.dlq_topic,
        batch_max=a.batch_max,
        batch_timeout_s=a.batch_timeout_s,
        session_timeout_ms=round(a.session_timeout_s * 1000),
        kafka=dict(kafka),
    )


def _run(a: argparse.Namespace, kafka: dict[str, str]) -> int:
    metrics = Metrics()
    if a.metrics_addr:
        metrics.serve(a.metrics_addr)
    sink = LinkDbSink(a.database_url, trip_gap_s=a.trip_gap_s)
    if a.migrate:
        try:
            _migrate(sink, a.migrate_timeout_s)
        except Exception as e:
            log.error("LinkDB migration failed, not starting: %s", e)
            return 1
    cfg = ingest_config(a, kafka)
    log.info("Kafka %s as %s", a.bootstrap, kafka.get("sasl.username", "no user"))
    ing = Ingestor(cfg, sink, metrics)

    def stop(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: finishing the current batch", signum)
        ing.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("consuming %s as group %s into LinkDB", a.topic, a.group)
    ing.run()
    return 0


def _import(a: argparse.Namespace) -> int:
    sink = LinkDbSink(a.database_url, trip_gap_s=a.trip_gap_s, source="drivetest")
    if a.migrate:
        sink.migrate()
    try:
        fmt = customise(
            FORMATS[a.format],
            {c: getattr(a, f"{c}_col") for c in COLUMN_FIELDS},
            time_format=a.time_format,
            na=None if a.na is None else frozenset(v for v in a.na.split(",") if v),
            speed_unit=a.speed_unit,
            delimiter=a.delimiter,
            failure_gap_ms=a.failure_gap_ms,
        )
        rep = import_csv(
            a.file, sink, train=a.train_id, carrier=a.carrier, fmt=fmt, timezone=a.timezone
        )
    except (OSError, ValueError) as e:
        print(f"polycorn-ingest import-drivetest: {e}", file=sys.stderr)
        return 2
    except TransientDbError as e:
        print(
            f"polycorn-ingest import-drivetest: database unavailable, nothing imported: {e}",
            file=sys.stderr,
        )
        return 3
    finally:
        sink.close()
    for line, reason in rep.bad:
        print(f"{a.file}:{line}: skipped: {reason}", file=sys.stderr)
    for line, reason in rep.ignored:
        print(f"{a.file}:{line}: {reason}", file=sys.stderr)
    w = rep.written.inserted if rep.written else {}
    c = rep.columns
    used = (
        {k: v for k, v in vars(c).items() if v is not None and k != "cell"}
        | {"cell": "+".join(c.cell)}
        if c
        else {}
    )
    print(
        f"{a.file}: {rep.rows} rows, {rep.imported} imported, {len(rep.bad)} bad, "
        f"{rep.duplicates} repeated times, {len(rep.ignored)} values stored as empty; "
        f"carriers {rep.carriers}; {rep.handovers} handovers ({rep.failures} failed); "
        f"columns {used}; new rows: {dict(w)}"
    )
    return 0 if rep.imported else 1


def _import_routes(a: argparse.Namespace) -> int:
    try:
        specs = routes.load(
            a.file,
            fmt=a.format,
            route_id=a.route_id,
            name=a.name,
            railway=tuple(r for r in a.railway.split(",") if r),
            min_length_m=a.min_length_m,
        )
    except routes.RouteError as e:
        print(f"polycorn-ingest import-routes: {e}", file=sys.stderr)
        return 2
    try:
        if a.migrate:
            upgrade(a.database_url)
        with psycopg.connect(a.database_url, connect_timeout=5) as conn, conn.transaction():
            stored = [routes.store(conn, s) for s in specs]
    except psycopg.Error as e:
        print(f"polycorn-ingest import-routes: nothing stored: {e}", file=sys.stderr)
        return 3
    for r in stored:
        print(json.dumps(r))
    return 0


def _window(p: argparse.ArgumentParser, a: argparse.Namespace) -> tuple[int, int]:
    def unix_ms(text: str | None, default: int) -> int:
        if text is None:
            return default
        try:
            t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            p.error(f"not an ISO 8601 time: {text!r}")
        if t.tzinfo is None:
            t = t.replace(tzinfo=dt.UTC)
        return int(t.timestamp() * 1000)

    return unix_ms(a.since, MIN_TIME_MS), unix_ms(a.until, MAX_TIME_MS + 1)


def _learn_route(p: argparse.ArgumentParser, a: argparse.Namespace) -> int:
    lo, hi = _window(p, a)
    try:
        if a.migrate:
            upgrade(a.database_url)
        with psycopg.connect(a.database_url, connect_timeout=5) as conn, conn.transaction():
            with conn.cursor() as cur:
                got = learn.learn(
                    cur,
                    route_id=a.route_id,
                    name=a.name,
                    trains=a.train,
                    since_ms=lo,
                    until_ms=hi,
                    step_m=a.step_m,
                )
            stored = routes.store(conn, got.spec)
    except routes.RouteError as e:
        print(f"polycorn-ingest learn-route: {e}", file=sys.stderr)
        return 2
    except psycopg.Error as e:
        print(f"polycorn-ingest learn-route: nothing stored: {e}", file=sys.stderr)
        return 3
    print(json.dumps({**stored, "fixes": got.fixes, "trips": got.trips, "fixes_near": got.used}))
    return 0


def _rematch(p: argparse.ArgumentParser, a: argparse.Namespace) -> int:
    lo, hi = _window(p, a)
    sink = LinkDbSink(a.database_url, trip_gap_s=a.trip_gap_s)
    try:
        if a.migrate:
            sink.migrate()
        r = sink.rematch(train=a.train, since_ms=lo, until_ms=hi)
    except (psycopg.Error, TransientDbError) as e:
        print(f"polycorn-ingest rematch: {e}", file=sys.stderr)
        return 3
    finally:
        sink.close()
    print(
        json.dumps(
            {
                "trains": r.trains,
                "fixes": r.fixes,
                "off_route": r.off_route,
                "handovers_placed": r.handovers,
                "handovers_rederived": r.rederived,
            }
        )
    )
    return 0


def _produce_testbed(p: argparse.ArgumentParser, a: argparse.Namespace) -> int:
    if not a.bootstrap:
        p.error("no Kafka: give --bootstrap or set POLYCORN_KAFKA_BOOTSTRAP")
    epoch = a.epoch_unix_ms if a.epoch_unix_ms is not None else int(time.time() * 1000)
    # librdkafka retries what a starting broker or a new topic answers
    # (LEADER_NOT_AVAILABLE, UNKNOWN_TOPIC_OR_PART, ...) until
    # message.timeout.ms; a record still not delivered then is reported.
    prod = Producer(
        {
            "bootstrap.servers": a.bootstrap,
            **kafka_security.parse(p, a),
            "linger.ms": 20,
            "enable.idempotence": True,
            "message.timeout.ms": 120_000,
        }
    )
    failed: list[str] = []

    def report(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            failed.append(str(err))

    n = 0
    for rec in records(a.events, a.train_id, epoch, a.carriers.split(","), gps_only=a.gps_only):
        while True:
            try:
                prod.produce(
                    a.topic,
                    key=a.train_id.encode(),
                    value=rec.SerializeToString(),
                    on_delivery=report,
                )
                break
            except BufferError:
                prod.poll(0.1)
        n += 1
    left = prod.flush(180)
    print(f"{n - left - len(failed)} records to {a.topic}")
    if failed:
        print(f"polycorn-ingest: {len(failed)} records not delivered: {failed[0]}", file=sys.stderr)
    return 0 if left == 0 and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
