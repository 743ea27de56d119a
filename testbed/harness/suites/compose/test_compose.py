"""The docker-compose fleet-in-a-box (docker-compose.yml), run for real (entry
point: scripts/test-compose.sh; :mod:`polycorn_harness.compose` builds, starts and
removes it):

1. the local bases, the stand-ins for the official third-party images and the six
   Polycorn images are built, and ``docker-compose up -d`` runs (the module fixture);
2. every service becomes healthy (each replica of ingest and linkdb-api, behind api-lb)
   and every one-shot completes;
3. passenger traffic crosses the train: a download and an upload through the relay's
   SOCKS5 listener, across the emulated carriers, the proxy and the compose network
   to the origin, checked by SHA-256, the carriers carrying the data;
4. after the emulated trip, LinkDB holds every handover and GPS fix of the trip's
   radio log exactly once (relay -> proxy -> Kafka -> ingest -> PostGIS), and the
   API serves the train; signed tables from the trainer's container reach the proxy,
   unsigned ones and ones of another key are refused; nothing is dead-lettered;
5. Prometheus scrapes every target, and every metric the alert rules and dashboards
   name is one the services export.

Everything is torn down after, also on failure (then the logs of the services that
were not healthy are printed first). ``TEST_COMPOSE_KEEP_UP=1`` leaves the fleet
running when every test passed; ``TEST_COMPOSE_PURGE_CACHE=1`` also removes the local
bases and build caches (the next run is cold).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from polycorn_harness import ROOT, metrics
from polycorn_harness.compose import Fleet, log
from polycorn_harness.trip import Expected, exactly_once
from polycorn_harness.wait import wait_until

TRAIN_ID = "train-compose"
RELAY_METRICS_PORT = 9465
PROXY_METRICS_PORT = 9464
SIG = {"reason": "signature"}


@pytest.fixture(scope="module")
def fleet(request: pytest.FixtureRequest) -> Iterator[Fleet]:
    """The compose fleet, built and up; torn down after the module whatever happened
    (a failed teardown, or anything of the run left behind, is an error)."""
    f = Fleet.from_env()
    if f.earlier_run():
        log("cleaning up after an earlier run")
        f.down()
    f.host.snapshot()
    f.fresh_work()
    failed_before = request.session.testsfailed
    ok = False
    try:
        f.build()
        f.up()
        yield f
        ok = request.session.testsfailed == failed_before
    finally:
        if ok and os.environ.get("TEST_COMPOSE_KEEP_UP") == "1":
            log(
                f"keep-up: the fleet stays up (DOCKER_HOST={f.env()['DOCKER_HOST']}); "
                "clean up with scripts/test-compose.sh --down"
            )
        else:
            if not ok and f.sock.exists():
                print(f.failed_logs())
            t = f.timings
            log(f"timings: images {t.get('images', 0):.0f} s, up {t.get('up', 0):.0f} s")
            left = f.down(purge=os.environ.get("TEST_COMPOSE_PURGE_CACHE") == "1")
            assert not left, f"the teardown left behind: {left}"


def relay_metric(fleet: Fleet, name: str, /, **labels: str) -> float:
    """A relay metric (in the train's namespace, the emulator's), 0 when absent."""
    text = fleet.metrics("emu", RELAY_METRICS_PORT)
    return (metrics.value(text, name, **labels) or 0.0) if text else 0.0


def proxy_metric(fleet: Fleet, name: str, /, **labels: str) -> float:
    text = fleet.metrics("proxy", PROXY_METRICS_PORT)
    return (metrics.value(text, name, **labels) or 0.0) if text else 0.0


def http(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=headers or {})  # noqa: S310 (our own servers)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:  # noqa: S310
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_every_service_healthy_and_every_one_shot_completed(fleet: Fleet) -> None:
    """pki, migrate and kafka-init exit with status 0; every other service is healthy."""
    try:
        wait_until("every service healthy", lambda: not fleet.not_ready(), 240, every_s=2)
    finally:
        for s, st in fleet.states().items():
            print(f"  {s:12} {st}")


def test_the_relay_brings_both_carriers_up_through_the_emulator(fleet: Fleet) -> None:
    wait_until(
        "the relay's two paths up",
        lambda: relay_metric(fleet, "polycorn_path_up") >= 2,
        60,
        every_s=1,
    )


def test_passenger_traffic_through_the_train(fleet: Fleet) -> None:
    """SOCKS5 -> emulated carriers -> proxy -> origin: 8 MiB down, 4 MiB up, SHA-256
    equal, and the relay received at least the download over its carriers."""

    def received() -> float:
        return sum(
            relay_metric(fleet, "polycorn_path_received_bytes_total", name=f"carrier-{i}")
            for i in (0, 1)
        )

    before = received()
    # Retried: a name lookup on the compose network can fail while containers join
    # it (aardvark-dns reloads).
    socks = [
        *fleet.enter("emu"),
        "curl",
        "-fsS",
        "--max-time",
        "120",
        "--retry",
        "3",
        "--retry-delay",
        "1",
        "--retry-all-errors",
        "--socks5-hostname",
        "127.0.0.1:1080",
    ]
    blob = fleet.work / "blob"
    subprocess.run([*socks, "-o", str(blob), "http://origin/blob"], check=True, timeout=600)
    want = fleet.exec("origin", "sha256sum", "/srv/origin/blob").split()[0]
    got = hashlib.sha256(blob.read_bytes()).hexdigest()
    print(f"  download: {blob.stat().st_size} bytes, sha256 {got[:16]}... (origin {want[:16]}...)")
    assert got == want

    up = fleet.work / "up"
    up.write_bytes(os.urandom(4 * 1024 * 1024))
    subprocess.run(
        [*socks, "-T", str(up), "http://origin/upload/from-train"], check=True, timeout=600
    )
    at_origin = fleet.exec("origin", "sha256sum", "/srv/origin/upload/from-train").split()[0]
    print(f"  upload: 4194304 bytes, sha256 at the origin {at_origin[:16]}...")
    assert at_origin == hashlib.sha256(up.read_bytes()).hexdigest()

    delta = received() - before
    print(f"  relay received over its carriers during the transfer: {delta:.0f} B")
    assert delta >= 8 * 1024 * 1024


def psql(fleet: Fleet, sql: str) -> list[list[str]]:
    out = fleet.exec("postgis", "psql", "-U", "polycorn", "-d", "linkdb", "-Atc", sql)
    return [line.split("|") for line in out.splitlines() if line]


def test_the_trips_telemetry_lands_in_linkdb_exactly_once(fleet: Fleet) -> None:
    """relay -> proxy -> Kafka -> ingest -> PostGIS, every handover and GPS fix once."""
    epoch_ms = int(fleet.exec("emu", "cat", "/run/polycorn-trip/epoch").strip())
    events = fleet.work / "events.jsonl"
    events.write_text(fleet.exec("relay-agent", "cat", "/usr/share/polycorn/trip/events.jsonl"))
    trip = json.loads(fleet.exec("relay-agent", "cat", "/usr/share/polycorn/trip/trip.json"))
    end_ms = epoch_ms + int(trip.get("duration_s", 120) * 1000)
    log(f"waiting {max(0, end_ms - time.time() * 1000) / 1000:.0f} s for the trip to end")
    wait_until("the trip's end", lambda: time.time() * 1000 > end_ms, 600, every_s=1)

    counts = "select (select count(*) from handovers), (select count(*) from gps_fixes)"
    last: list[list[str]] = []

    def steady() -> bool:
        now = psql(fleet, counts)
        done = now == last and now != [["0", "0"]]
        last[:] = now
        return done

    wait_until("ingest's row counts stop changing", steady, 180, every_s=2)
    ho = psql(
        fleet,
        "select carrier, (extract(epoch from start_time) * 1000)::bigint from handovers "
        f"where train_id = '{TRAIN_ID}'",
    )
    fixes = psql(
        fleet,
        "select (extract(epoch from time) * 1000)::bigint from gps_fixes "
        f"where train_id = '{TRAIN_ID}'",
    )
    ok, report = exactly_once(
        Expected.load(events, epoch_ms), [(c, int(t)) for c, t in ho], [int(t) for (t,) in fixes]
    )
    print(report)
    assert ok, report


def test_linkdb_api_serves_the_train_and_refuses_a_request_without_a_key(fleet: Fleet) -> None:
    url = f"http://127.0.0.1:{fleet.api_port}/v1/trains"
    status, body = http(url, {"X-API-Key": fleet.env()["POLYCORN_API_READ_KEY"]})
    print(f"  GET /v1/trains: {status} {body[:200]!r}")
    assert status == 200 and f'"{TRAIN_ID}"'.encode() in body
    assert http(url)[0] == 401


def publish_table(fleet: Fleet, kind: str, version: int) -> None:
    script = (Path(__file__).parent / "publish_table.py").read_text()
    r = fleet.dc("exec", "-T", "trainer", "python3", "-", kind, str(version), stdin=script)
    assert r.returncode == 0, f"the trainer's container could not produce a table: {r.stderr}"


def test_the_proxy_takes_a_table_signed_with_the_trainers_key_and_refuses_others(
    fleet: Fleet,
) -> None:
    """The trainer's container signs with the key the pki job gave it; the proxy has
    the verify key from the same job. The compose trip has no failed handover, so the
    trainer's own runs publish no table."""
    refused = proxy_metric(fleet, "polycorn_failure_table_source_rejected_total", **SIG)
    publish_table(fleet, "signed", 5000)
    wait_until(
        "the proxy takes the table signed with the trainer's key (v5000)",
        lambda: proxy_metric(fleet, "polycorn_failure_table_version") == 5000,
        30,
        every_s=0.5,
    )
    for version, kind in ((5001, "unsigned"), (5002, "other")):
        publish_table(fleet, kind, version)
        refused += 1

        def refused_now(want: float = refused) -> bool:
            got = proxy_metric(fleet, "polycorn_failure_table_source_rejected_total", **SIG)
            return got == want

        wait_until(
            f"the {kind} table v{version} refused for its signature", refused_now, 30, every_s=0.5
        )
        assert proxy_metric(fleet, "polycorn_failure_table_version") == 5000
        print(f"  the {kind} table v{version} refused (reason=signature); v5000 stays")


def test_no_telemetry_record_in_the_dead_letter_topic(fleet: Fleet) -> None:
    out = fleet.exec(
        "kafka",
        "bash",
        "-c",
        "java -cp '/opt/kafka/libs/*' org.apache.kafka.tools.GetOffsetShell "
        "--bootstrap-server localhost:9092 --topic polycorn.telemetry.dlq 2>/dev/null",
    )
    n = sum(int(line.split(":")[2]) for line in out.splitlines() if line.count(":") == 2)
    print(f"  dead letters: {n} ({out.strip()!r})")
    assert out.strip(), "GetOffsetShell listed no partition of the DLQ topic"
    assert n == 0


JOBS = (
    "polycorn-relay",
    "polycorn-proxy",
    "polycorn-ingest",
    "polycorn-trainer",
    "polycorn-trainer-follow",
)


def test_prometheus_scrapes_every_target(fleet: Fleet) -> None:
    """relay, proxy, ingest, trainer, its follower and linkdb-api up (job names of
    services/prometheus/prometheus.compose.yml), and min(up) is 1."""
    base = f"http://127.0.0.1:{fleet.prom_port}/api/v1"
    jobs = (*JOBS, "polycorn-linkdb-api")
    report: list[str] = [""]

    def all_up() -> bool:
        status, body = http(f"{base}/targets?state=active")
        if status != 200:
            return False
        ok, report[0] = metrics.targets_up(json.loads(body), jobs)
        return ok

    try:
        wait_until("every Prometheus target up", all_up, 80, every_s=2)
    finally:
        print(report[0])
    status, body = http(f"{base}/query?query=min(up)")
    assert status == 200
    assert json.loads(body)["data"]["result"][0]["value"][1] == "1"


def test_the_alert_rules_and_dashboards_name_only_metrics_the_services_export(
    fleet: Fleet,
) -> None:
    """Prometheus's metadata API lists each scraped family, with or without samples
    (scripts/check_observability.py; the telemetry suite does the same on the namespace
    testbed from the /metrics dumps)."""
    r = subprocess.run(
        [
            "uv",
            "run",
            "--all-packages",
            "--locked",
            "--quiet",
            "python",
            "scripts/check_observability.py",
            "metrics",
            "--rules",
            *map(str, sorted((ROOT / "services" / "prometheus" / "rules").glob("*.yml"))),
            "--dashboards",
            *map(str, sorted((ROOT / "dashboards").glob("*.json"))),
            "--prometheus",
            f"http://127.0.0.1:{fleet.prom_port}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
