"""``make bench-ingest``: sustained Kafka → LinkDB throughput and end-to-end lag.

    python -m polycorn_benchrun.ingest [--records 1000000] [--trains 1000] [--consumers 2]
        [--batch-max 50000] [--lag-rate 10000] [--lag-seconds 30] [--out FILE]
    python -m polycorn_benchrun.ingest --replicas 1,2 [--repeats 3] [...] [--out FILE]

Against the real Kafka and PostGIS of ``scripts/infra.sh`` (env
``POLYCORN_KAFKA_BOOTSTRAP``, ``POLYCORN_DATABASE_URL``), on a fresh
database and a fresh 8-partition topic:

1. preload: N records of a fleet of T trains in time order, the mix a train
   sends per second: 1 GPS fix, 4 cell samples (2 carriers, 2 Hz), 2 path
   statistics, and a handover every 10 s per carrier (1 in 12 failed);
2. throughput: C ingest processes (one consumer group) start, and the
   events/s is N over the time from the end of the first batch's database
   commit to the last one (group join and start-up excluded);
3. lag: the same processes stay up while a producer sends records stamped
   with their send time at a fixed rate R for D seconds; the lag of every
   record is its database commit time minus that stamp (p50/p99).

With ``--replicas 1,2`` it compares consumer counts (ingest replicas, one process
each, one consumer group) side by side: each repeat runs every count once, each run
on a database and topic of its own, in alternating order (1, 2, then 2, 1, ...) so
that a drift of the machine's load does not favour one; the result has every run,
the median per count, and each repeat's ratio of events/s, lag p50 and lag p99 to
the first count's (their geometric mean, min and max). The default output is then
``bench/out/ingest-replicas.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import platform
import queue
import secrets
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, ConsumerGroupState, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

import polycorn_schema.telemetry.v1.telemetry_pb2 as pb
from polycorn_harness import provenance
from polycorn_ingest.consumer import IngestConfig, Ingestor
from polycorn_ingest.metrics import Metrics
from polycorn_ingest.records import Rows
from polycorn_ingest.sink import LinkDbSink
from polycorn_schema.startup import kafka_create_topics, pg_connect
from polycorn_schema.testing import fresh_database

CARRIERS = ("carrier-a", "carrier-b")
#: Partitions of the benchmark's topic (the telemetry topic's, services/kafka/topics.txt).
PARTITIONS = 8
# Server settings recorded with the result (durability must stay on).
PG_SETTINGS = (
    "server_version",
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_compression",
    "wal_buffers",
    "shared_buffers",
    "max_wal_size",
    "checkpoint_timeout",
)


def fleet(trains: int, t0_ms: int) -> Iterator[pb.Record]:
    """The fleet's records in time order, forever (second by second)."""
    sec = 0
    while True:
        t = t0_ms + sec * 1000
        for i in range(trains):
            train = f"train-{i:05d}"
            d = 83.0 * sec + 997.0 * i
            lat, lon = 39.865 - d * 8.5e-6, 116.379 + d * 3.6e-6
            yield pb.Record(
                train_id=train,
                time_unix_ms=t + i % 1000,
                gps=pb.GpsFix(
                    lat_deg=lat,
                    lon_deg=lon,
                    speed_mps=83.0,
                    heading_deg=160.0,
                    accuracy_m=8.0,
                    track_m=d,
                ),
            )
            for c, name in enumerate(CARRIERS):
                cell = (c + 1) << 32 | int(d // (900 - 250 * c))
                for half in (0, 500):
                    yield pb.Record(
                        train_id=train,
                        time_unix_ms=t + half + 10 + i % 490,
                        cell=pb.CellSample(
                            path=c,
                            carrier=name,
                            cell_id=cell,
                            rsrp_dbm=-80.0 - (d % 900) / 30,
                            registration=pb.REGISTRATION_STATE_REGISTERED,
                            measured_unix_ms=t + half + i % 490,
                        ),
                    )
                yield pb.Record(
                    train_id=train,
                    time_unix_ms=t + 20 + c + i % 900,
                    path=pb.PathStatistics(
                        path=c,
                        carrier=name,
                        up=True,
                        srtt_us=60_000 + sec,
                        rate_bps=20_000_000,
                        bytes_sent=sec * 10**6,
                        bytes_acked=sec * 10**6,
                        rto_count=sec // 100,
                    ),
                )
                if (sec + 3 * i + 5 * c) % 10 == 0:
                    yield pb.Record(
                        train_id=train,
                        time_unix_ms=t + 900,
                        handover=pb.HandoverEvent(
                            path=c,
                            carrier=name,
                            source_cell_id=cell,
                            target_cell_id=cell + 1,
                            start_unix_ms=t + 30 + c,
                            start_lat_deg=lat,
                            start_lon_deg=lon,
                            start_track_m=d,
                            rsrp_dbm=-112.0,
                            outcome=pb.HANDOVER_OUTCOME_FAILURE
                            if (sec + i) % 12 == 0
                            else pb.HANDOVER_OUTCOME_SUCCESS,
                            duration_ms=80,
                        ),
                    )
        sec += 1


def _produce(bootstrap: str, topic: str, recs: Iterator[pb.Record], n: int) -> dict[str, int]:
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    mix: dict[str, int] = {}
    for _ in range(n):
        r = next(recs)
        kind = r.WhichOneof("body") or "?"
        mix[kind] = mix.get(kind, 0) + 1
        while True:
            try:
                p.produce(topic, key=r.train_id.encode(), value=r.SerializeToString())
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(120):
        raise RuntimeError("preload: Kafka did not take every record")
    return mix


class _Held(Ingestor):
    """An Ingestor that keeps its partitions paused until ``start`` is set, so that
    every consumer starts at once on a settled group (a group still rebalancing moves
    partitions, and batches, between them)."""

    def __init__(self, *args: Any, start: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._start = start
        self._held = True

    def _on_assign(self, consumer: Consumer, parts: list[TopicPartition]) -> None:
        super()._on_assign(consumer, parts)
        if self._held:
            consumer.incremental_assign(parts)
            consumer.pause(parts)

    def _update_lag(self, force: bool = False) -> None:
        # Called by the loop between batches.
        if self._held and self._start.is_set():
            self._held = False
            self.consumer.resume([TopicPartition(t, p) for t, p in sorted(self._assignment)])
        super()._update_lag(force)


def _worker(
    url: str,
    bootstrap: str,
    topic: str,
    group: str,
    *,
    out: Any,
    stop: Any,
    go: Any,
    start: Any,
    batch_max: int,
) -> None:
    cfg = IngestConfig(
        bootstrap,
        group=group,
        topic=topic,
        dlq_topic=topic + ".dlq",
        batch_max=batch_max,
        batch_timeout_s=0.2,
    )

    # The stage times and CPU at the end of the throughput phase (the first
    # commit of the lag phase), besides the totals at the end.
    snap: dict[str, float] = {}

    def hook(rows: Rows, commit_s: float) -> None:
        if stop_lags.is_set() and not snap:
            snap.update(ing.stage_seconds, cpu=time.process_time())
        out.put(
            (
                "commit",
                commit_s,
                len(rows.times),
                [commit_s - t / 1000 for t in rows.times] if stop_lags.is_set() else None,
            )
        )

    stop_lags = stop[1]
    ing = _Held(cfg, LinkDbSink(url), Metrics(), on_commit=hook, start=start)

    def watch() -> None:
        stop[0].wait()
        ing.stop()

    threading.Thread(target=watch, daemon=True).start()
    # Started (seconds of imports), the consumers join the group together, and
    # consume once it has settled (_Held).
    out.put(("ready",))
    go.wait()
    ing.run()
    out.put(("stages", {**ing.stage_seconds, "cpu": time.process_time()}, ing.batches, snap))


def _machine() -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
    except OSError:
        mem = "?"
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "mem_kib": mem,
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--trains", type=int, default=1000)
    ap.add_argument("--consumers", type=int, default=2)
    ap.add_argument("--batch-max", type=int, default=50_000)
    ap.add_argument("--lag-rate", type=int, default=10_000, help="records/s in the lag phase")
    ap.add_argument("--lag-seconds", type=float, default=30.0)
    ap.add_argument(
        "--replicas",
        type=_counts,
        default=None,
        help="compare these consumer counts side by side, e.g. 1,2 (the first is the "
        "baseline of the ratios); --consumers is then not used",
    )
    ap.add_argument("--repeats", type=int, default=3, help="with --replicas: runs per count")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="bench/out/ingest.json (bench/out/ingest-replicas.json with --replicas)",
    )
    a = ap.parse_args(argv)
    if a.out is None:
        a.out = Path("bench/out/ingest-replicas.json" if a.replicas else "bench/out/ingest.json")
    return a


def _counts(text: str) -> list[int]:
    counts = [int(x) for x in text.split(",") if x.strip()]
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(f"distinct consumer counts >= 1, e.g. 1,2: {text!r}")
    return counts


def _preload(a: argparse.Namespace, bootstrap: str, topic: str) -> tuple[dict[str, int], float]:
    """The fleet's records, ending an hour ago, into the topic; their mix and the seconds
    it took."""
    t_pre = time.monotonic()
    now_ms = int(time.time() * 1000)
    secs = a.records // (a.trains * 7) + 2
    mix = _produce(bootstrap, topic, fleet(a.trains, now_ms - secs * 1000 - 3_600_000), a.records)
    preload_s = time.monotonic() - t_pre
    print(f"preloaded {a.records} records in {preload_s:.1f} s: {mix}", flush=True)
    return mix, preload_s


def _offsets(bootstrap: str, topic: str, group: str | None = None) -> dict[int, int]:
    """The topic's end offsets, or with ``group`` the group's committed ones (0 for
    none yet)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group or "bench-offsets"})
    try:
        parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        if group is None:
            return {tp.partition: c.get_watermark_offsets(tp, timeout=10)[1] for tp in parts}
        return {tp.partition: max(tp.offset, 0) for tp in c.committed(parts, timeout=10)}
    finally:
        c.close()


def _stable(bootstrap: str, group: str, consumers: int) -> float:
    """Wait until the group is stable with every consumer in it, each with partitions
    (as many as have one); the time it was seen so."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    guard = time.monotonic() + 300
    while True:
        d = admin.describe_consumer_groups([group])[group].result(30)
        busy = [m for m in d.members if m.assignment and m.assignment.topic_partitions]
        if (
            d.state == ConsumerGroupState.STABLE
            and len(d.members) == consumers
            and len(busy) == min(consumers, PARTITIONS)
        ):
            return time.time()
        if time.monotonic() > guard:
            raise RuntimeError(f"group {group} not stable: {d.state}, {len(d.members)} members")
        time.sleep(0.2)


def _throughput(
    out: Any, records: int, *, bootstrap: str, topic: str, group: str, since: float
) -> tuple[float, float, int]:
    """Until the group has committed every preloaded record: the events/s over the
    commits after ``since`` (the group stable), from the end of the first of them to the
    last one, that window, and the records stored more than once (batches a rebalance
    took from a consumer before it committed their offsets, read again by the next)."""
    end = _offsets(bootstrap, topic)
    commits: list[tuple[float, int]] = []
    guard = time.monotonic() + 1800
    while _offsets(bootstrap, topic, group) != end:
        if time.monotonic() > guard:
            raise RuntimeError("throughput phase: the group did not commit every record")
        with contextlib.suppress(queue.Empty):
            while True:
                _, commit_s, n, _ = out.get(timeout=0.5)
                commits.append((commit_s, n))
    # The hook reports a batch before its offsets are committed: all are queued by now.
    with contextlib.suppress(queue.Empty):
        while True:
            _, commit_s, n, _ = out.get(timeout=0.5)
            commits.append((commit_s, n))
    after = sorted(c for c in commits if c[0] >= since)
    if len(after) < 2:
        raise RuntimeError("the group settled after the records were in: preload more")
    span = after[-1][0] - after[0][0]
    eps = (sum(n for _, n in after) - after[0][1]) / span
    replayed = sum(n for _, n in commits) - records
    print(
        f"throughput: {records} records ({replayed} read again), {eps:,.0f} events/s "
        f"over {span:.1f} s",
        flush=True,
    )
    return span, eps, replayed


def _lag_phase(
    a: argparse.Namespace, out: Any, bootstrap: str, topic: str
) -> tuple[list[float], float]:
    """Records stamped with their send time at the lag rate for the lag seconds, until
    every one is committed: the lag of each (unsorted), and the rate achieved."""
    lags: list[float] = []
    prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    recs = fleet(a.trains, int(time.time() * 1000))
    target = int(a.lag_rate * a.lag_seconds)
    t0 = time.monotonic()
    sent = 0
    while sent < target:
        due = min(target, int((time.monotonic() - t0) * a.lag_rate))
        while sent < due:
            r = next(recs)
            r.time_unix_ms = int(time.time() * 1000)
            prod.produce(topic, key=r.train_id.encode(), value=r.SerializeToString())
            sent += 1
        prod.poll(0)
        while True:
            try:
                _, _, _, lag = out.get_nowait()
            except queue.Empty:
                break
            if lag is not None:
                lags.extend(lag)
        time.sleep(0.002)
    achieved = sent / (time.monotonic() - t0)
    prod.flush(30)
    while len(lags) < target:
        _, _, _, lag = out.get(timeout=120)
        if lag is not None:
            lags.extend(lag)
    return lags, achieved


def _stages(out: Any, workers: int) -> tuple[list[dict[str, float]], list[dict[str, float]], int]:
    """Every stopping worker's stage times at the end and at the end of the throughput
    phase, and the batches of all."""
    stages: list[dict[str, float]] = []
    snaps: list[dict[str, float]] = []
    batches = 0
    while len(stages) < workers:
        msg = out.get(timeout=60)
        if msg[0] == "stages":
            stages.append(msg[1])
            batches += msg[2]
            snaps.append(msg[3])
    return stages, snaps, batches


def _postgres(url: str) -> tuple[dict[str, Any], Any]:
    """The server settings recorded with the result, and the schema's revision row."""
    with pg_connect(url) as c:
        pg = {
            k: c.execute(f"SHOW {k}").fetchone()[0]  # type: ignore[index]
            for k in PG_SETTINGS
        }
        head = c.execute("SELECT version_num FROM alembic_version").fetchone()
    return pg, head


def _run(a: argparse.Namespace, url: str, bootstrap: str, topic: str, tag: str) -> dict[str, Any]:
    """Preload, the throughput phase and the lag phase on the database at ``url``; the
    result."""
    ctx = mp.get_context("spawn")
    mix, preload_s = _preload(a, bootstrap, topic)
    out = ctx.Queue()
    stop = (ctx.Event(), ctx.Event())
    go, start = ctx.Event(), ctx.Event()
    group = f"bench-{tag}"
    procs = [
        ctx.Process(
            target=_worker,
            args=(url, bootstrap, topic, group),
            kwargs={"out": out, "stop": stop, "go": go, "start": start, "batch_max": a.batch_max},
        )
        for _ in range(a.consumers)
    ]
    for proc in procs:
        proc.start()
    for _ in procs:
        assert out.get(timeout=300) == ("ready",)
    t_go = time.time()
    go.set()
    since = _stable(bootstrap, group, a.consumers)
    start.set()
    span, eps, replayed = _throughput(
        out, a.records, bootstrap=bootstrap, topic=topic, group=group, since=since
    )
    # Lag phase.
    stop[1].set()
    time.sleep(1.0)
    lags, achieved = _lag_phase(a, out, bootstrap, topic)
    stop[0].set()
    stages, snaps, batches = _stages(out, len(procs))
    for proc in procs:
        proc.join(30)
    lags.sort()
    q = statistics.quantiles(lags, n=100)
    total = {k: round(sum(s[k] for s in stages), 2) for k in stages[0]}
    thr = {k: round(sum(s.get(k, 0.0) for s in snaps), 2) for k in stages[0]}
    pg, head = _postgres(url)
    return {
        "events_per_s": round(eps),
        "lag_p50_ms": round(q[49] * 1000, 1),
        "lag_p99_ms": round(q[98] * 1000, 1),
        "goal_events_per_s": 50_000,
        "records": a.records,
        "records_read_again": replayed,
        "group_settled_s": round(since - t_go, 2),
        "mix": mix,
        "trains": a.trains,
        "consumers": a.consumers,
        "consumer_note": "one consumer group, each consumer its own process; they join "
        "together once started, and consume once the group is stable with each of them "
        "holding partitions (group_settled_s after joining)",
        "partitions": PARTITIONS,
        "batch_max": a.batch_max,
        "throughput_window_s": round(span, 2),
        "preload_s": round(preload_s, 1),
        "lag_phase": {
            "rate_per_s": a.lag_rate,
            "achieved_rate_per_s": round(achieved),
            "seconds": a.lag_seconds,
            "records": len(lags),
            "max_ms": round(lags[-1] * 1000, 1),
        },
        "stage_seconds_all_consumers": total,
        "stage_seconds_throughput_phase": thr,
        "stage_note": "wall seconds per stage summed over the consumer processes "
        "(cpu = their own process CPU); all = both phases, throughput_phase = up to "
        "the first commit of the lag phase",
        "postgres": pg,
        "schema_revision": head[0] if head else None,
        "batches": batches,
        "machine": _machine(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "method": "see docs/ingest.md#benchmark",
    }


def _trial(a: argparse.Namespace, bootstrap: str) -> dict[str, Any]:
    """One run of ``a.consumers`` consumers on a fresh topic and database."""
    tag = secrets.token_hex(3)
    topic = f"bench.telemetry.{tag}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    kafka_create_topics(bootstrap, [NewTopic(topic, PARTITIONS, 1), NewTopic(topic + ".dlq", 1, 1)])
    try:
        with fresh_database(prefix="linkdb_bench") as url:
            return _run(a, url, bootstrap, topic, tag)
    finally:
        for f in admin.delete_topics([topic, topic + ".dlq"]).values():
            f.result(30)


#: What the comparison keeps of each run (and compares: RATIO_KEYS).
TRIAL_KEYS = (
    "events_per_s",
    "lag_p50_ms",
    "lag_p99_ms",
    "records",
    "records_read_again",
    "group_settled_s",
    "throughput_window_s",
    "batches",
    "load_average_1m",
)
RATIO_KEYS = ("events_per_s", "lag_p50_ms", "lag_p99_ms")


def _ratio_summary(values: list[float]) -> dict[str, Any]:
    return {
        "per_repeat": [round(v, 3) for v in values],
        "geomean": round(statistics.geometric_mean(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def _replicas(a: argparse.Namespace, bootstrap: str) -> dict[str, Any]:
    """Every count of ``a.replicas`` once per repeat, in alternating order; the runs,
    the median per count and the ratios to the first count, repeat by repeat."""
    counts: list[int] = a.replicas
    runs: list[dict[str, Any]] = []
    for rep in range(a.repeats):
        for c in counts if rep % 2 == 0 else counts[::-1]:
            print(f"repeat {rep + 1}/{a.repeats}: {c} consumer(s)", flush=True)
            r = _trial(argparse.Namespace(**{**vars(a), "consumers": c}), bootstrap)
            cpu = r["stage_seconds_throughput_phase"].get("cpu")
            runs.append(
                {"repeat": rep, "consumers": c, **{k: r[k] for k in TRIAL_KEYS}, "cpu_s": cpu}
            )
    base = counts[0]

    def value(rep: int, c: int, key: str) -> float:
        (v,) = [r[key] for r in runs if r["repeat"] == rep and r["consumers"] == c]
        return float(v)

    median = {
        str(c): {
            k: statistics.median(r[k] for r in runs if r["consumers"] == c) for k in RATIO_KEYS
        }
        for c in counts
    }
    ratios = {
        f"{c}/{base}": {
            k: _ratio_summary([value(rep, c, k) / value(rep, base, k) for rep in range(a.repeats)])
            for k in RATIO_KEYS
        }
        for c in counts[1:]
    }
    return {
        "replicas": counts,
        "repeats": a.repeats,
        "median": median,
        "ratios": ratios,
        "runs": runs,
        "records": a.records,
        "trains": a.trains,
        "partitions": PARTITIONS,
        "batch_max": a.batch_max,
        "lag_phase": {"rate_per_s": a.lag_rate, "seconds": a.lag_seconds},
        "replica_note": "each replica its own process, all in one consumer group; every "
        "run on a fresh database and topic; order alternating per repeat; ratios are "
        "each repeat's value over the first count's (events/s: > 1 is faster; lag: "
        "< 1 is shorter)",
        "machine": _machine(),
        "method": "see docs/ingest.md#benchmark",
    }


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    prov = provenance.start(a.out)
    bootstrap = os.environ["POLYCORN_KAFKA_BOOTSTRAP"]
    result = prov.stamp(_replicas(a, bootstrap) if a.replicas else _trial(a, bootstrap))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
