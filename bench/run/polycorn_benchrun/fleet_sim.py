"""Simulated trains for ``make bench-fleet``: ``python -m polycorn_benchrun.fleet --sim``.

The cloud node under test is :mod:`polycorn_benchrun.fleet`'s: one ``polycorn-proxy``
per train with the chart's flags, Kafka, one ingest consumer, LinkDB. The trains are
one ``polycorn-fleetsim`` process (bench/fleetsim) instead of a ``polycorn-relay``
per train and a passengers process: per train the relay-agent's own session, two TLS
subflows over loopback with the train's certificate, its durable telemetry spool (on
a tmpfs) and the radio replay of the same trip from the train's own place on it, and,
unless ``--conns 0``, the same downloads and chat connections, opened on the session
directly and checked byte for byte against the same origin. So a fleet of hundreds or
thousands of trains costs the machine little more than its cloud side.

Everything else (the measurement window, CPU and RSS from /proc, the proxies'
counters, ingest lag, the topic read back, LinkDB's exactly-once check per train) is
``fleet.py``'s; this module only brings the trains up, reads the simulator's metrics
and summary in place of the relays' and the passengers', and adds the simulator's
own check and cost (``load_generator`` in the result: CPU and RSS of the one process,
per train).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from polycorn_benchrun.fleet import (
    CARRIERS,
    SIM_MAX_TRAINS,
    Fleet,
    Shared,
    quantile,
    scrape,
)

#: polycorn_fleetsim_passengers_state once the passengers' time is up.
PASSENGERS_TIME_UP = 2
PASSENGER_KEYS = (
    "bulk_done",
    "bulk_bytes",
    "bulk_failed",
    "bulk_cut_at_end",
    "chat_ok",
    "chat_failed",
    "corrupt",
)


def spool_root() -> Path:
    """A tmpfs for the simulated trains' spools, where there is one: the simulator's
    fsyncs are the trains' cost, not the cloud node's, and stay off the disk."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() else Path(tempfile.gettempdir())


class SimFleet(Fleet):
    """One fleet of ``n`` simulated trains against ``n`` real proxies."""

    RSS_GROUP = "fleetsim"

    def __init__(self, sh: Shared, n: int) -> None:
        super().__init__(sh, n)
        b = self.cfg.port_base
        self.stride = SIM_MAX_TRAINS
        self.sim_metrics = f"127.0.0.1:{b + 2 * SIM_MAX_TRAINS}"
        self.spool = Path(tempfile.mkdtemp(prefix="polycorn-fleetsim.", dir=spool_root()))
        self.summary_file = self.work / "fleetsim.json"
        #: The simulator's summary, once it ended.
        self.summary: dict[str, Any] | None = None

    def plan(self) -> dict[str, Any]:
        """The simulator's plan: the trains as start_proxies placed them, the trip, the
        passengers as fleet_traffic's plan has them."""
        cfg, sh = self.cfg, self.sh
        passengers = None
        if cfg.conns > 0:
            passengers = {
                "origin": self.origin,
                "conns": cfg.conns,
                "bulk": round(cfg.conns * cfg.bulk_share),
                "bulk_rate": cfg.bulk_rate,
                "bulk_size": cfg.bulk_size,
                "chat_gap_s": cfg.chat_gap_s,
                "ramp_s": cfg.ramp_s,
                "seconds": cfg.ramp_s + cfg.warmup_s + cfg.seconds + 5,
                "passengers_per_train": cfg.passengers_per_train,
                "start_on_sigusr1": True,
                "seed": self.n,
            }
        return {
            "ca": str(sh.pki / "ca.crt"),
            "proxy_name": "proxy.polycorn",
            "paths": CARRIERS,
            "events": str(sh.trip / "events.jsonl"),
            "spool_dir": str(self.spool),
            # 10 ms apart, at most 10 s: the handshakes do not all land at once.
            "start_spread_s": min(10.0, 0.01 * self.n),
            "trains": [
                {
                    "id": t["id"],
                    "proxy": t["proxy"],
                    "cert": str(sh.pki / f"{t['id']}.crt"),
                    "key": str(sh.pki / f"{t['id']}.key"),
                    "epoch_unix_ms": t["epoch_ms"],
                }
                for t in self.trains
            ],
            "passengers": passengers,
        }

    # ---- the trains' side: one process

    def start_relays(self) -> None:
        plan = self.work / "fleetsim-plan.json"
        plan.write_text(json.dumps(self.plan(), indent=1))
        argv = [
            str(self.cfg.bin_dir / "polycorn-fleetsim"),
            f"--plan={plan}",
            f"--summary={self.summary_file}",
            f"--metrics-listen={self.sim_metrics}",
            "--log-json",
        ]
        if self.cfg.sim_threads:
            argv.append(f"--threads={self.cfg.sim_threads}")
        self.procs.start("fleetsim", argv)
        # Until the summary says when each train's replay began.
        now_ms = int(time.time() * 1000)
        for tr in self.trains:
            tr["started_ms"] = now_ms

    def wait_connected(self) -> None:
        """Until every simulated train has had both subflows up."""
        self.wait_sim_trains(self.sim_metrics, 0.2, "connected")
        print(f"n={self.n}: {self.n} simulated trains connected to {self.n} proxies", flush=True)

    def start_passengers(self) -> subprocess.Popen[bytes]:
        """SIGUSR1: the simulator starts its passengers now, with the measurement's clock."""
        sim = self.procs.p["fleetsim"]
        if self.cfg.conns > 0:
            sim.send_signal(signal.SIGUSR1)
            end = time.monotonic() + 10
            while scrape(self.sim_metrics).get("polycorn_fleetsim_passengers_state", 0) < 1:
                if time.monotonic() > end or sim.poll() is not None:
                    raise RuntimeError(
                        f"the simulator's passengers did not start; logs in {self.work}"
                    )
                time.sleep(0.1)
        return sim

    def train_groups(self, pax: subprocess.Popen[bytes]) -> dict[str, list[int]]:
        return {"fleetsim": [pax.pid]}

    def wait_passengers(self, pax: subprocess.Popen[bytes]) -> None:
        """Until the simulator's passengers' time is up and every worker ended."""
        if self.cfg.conns == 0:
            return
        cfg = self.cfg
        end = time.monotonic() + cfg.seconds + cfg.ramp_s + cfg.warmup_s + 120
        while time.monotonic() < end and pax.poll() is None:
            m = scrape(self.sim_metrics)
            if (
                m.get("polycorn_fleetsim_passengers_state") == PASSENGERS_TIME_UP
                and m.get("polycorn_fleetsim_passenger_workers", 1) == 0
            ):
                return
            time.sleep(0.5)

    def relay_metrics(self) -> list[str]:
        return [self.sim_metrics]

    def stop_relays(self) -> None:
        """SIGTERM: the simulator writes its summary; each train's replay start from it."""
        self.procs.stop(["fleetsim"], timeout=30)
        if self.summary_file.exists():
            self.summary = json.loads(self.summary_file.read_text())
            started = {t["id"]: t["started_unix_ms"] for t in self.summary["trains"]}
            for tr in self.trains:
                tr["started_ms"] = started.get(tr["id"], tr["started_ms"])

    def passenger_report(self) -> dict[str, Any]:
        pax = (self.summary or {}).get("passengers")
        if pax is not None:
            report: dict[str, Any] = pax
            return report
        # No passengers (--conns 0), or no summary (then the checks fail on it).
        return {
            "seconds": 0.0,
            "trains": [{**dict.fromkeys(PASSENGER_KEYS, 0), "errors": []} for _ in self.trains],
            "bulk_bytes_per_s": [],
            "chat_rtt_ms": [],
            "loop_lag_ms": [],
        }

    def sim_result(self, measured: dict[str, Any]) -> dict[str, Any]:
        """The simulator's check (every train started and connected, no subflow lost
        after it came up, no spool error, every record confirmed) and its cost."""
        n, s = self.n, self.summary or {}
        tot: dict[str, Any] = s.get("totals", {})
        rss_mb = [x / 1024 for x in measured["rss"][self.RSS_GROUP][0] if x]
        cpu = measured["cpu"][self.RSS_GROUP]
        rss_p99 = quantile(rss_mb, 0.99) if rss_mb else 0.0
        check = (
            bool(s)
            and s["trains_started"] == n
            and s["trains_connected"] == n
            and tot["reconnects"] == 0
            and tot["spool_errors"] == 0
            and tot["records_dropped"] == 0
        )
        return {
            "mode": "sim",
            "checks": {
                "every simulated train started and connected, no subflow lost, "
                "no spool error": check,
            },
            "load_generator": {
                "cpu_pct": round(cpu, 1),
                "cpu_pct_per_train": round(cpu / n, 3),
                "rss_mb_p99": round(rss_p99, 1),
                "rss_mb_per_train": round(rss_p99 / n, 3),
                "threads": s.get("threads"),
                "loop_lag_ms_p99": round(float(s.get("loop_lag_ms_p99", 0.0)), 1),
                "totals": tot,
                # The first ten (failed dials count: a proxy not listening yet).
                "trains_with_errors": {
                    t["id"]: t["error_messages"]
                    for t in [t for t in s.get("trains", []) if t["errors"]][:10]
                },
            },
        }

    def tear_down(self) -> None:
        try:
            super().tear_down()
        finally:
            shutil.rmtree(self.spool, ignore_errors=True)
