"""make bench-emu: the ceiling of the link emulator (testbed/emu, polycorn-emu) on
this machine -> bench/out/emu.json and a table (``python -m polycorn_benchrun.emu``;
needs root).

Builds its own namespace testbed (``PC_PREFIX`` pcemu, testbed/netns/up.sh),
replaces the carrier veths with polycorn-emu links at a constant rate (default
100 Mbit/s per carrier and direction, 1 ms one-way delay, 2 MB droptail buffer per
direction), and runs one iperf3 TCP flow per carrier at the same time: iperf3
servers in the cloud namespace bound to cpx<i> (10.77.<i>.2), clients in the train
namespace bound to car<i> (10.77.<i>.1). Cases: 4 carriers and 1 carrier, downlink
(-R, the cloud sends) and uplink. For each case it records the per-carrier receiver
goodput, the total, the retransmissions, and the emulator's CPU time (utime + stime
of /proc/<pid>/stat over the iperf3 window) as % of one core.

Then the same with a much higher link rate (``--stress-rate-mbit``, 1000 Mbit/s per
carrier, downlink only), where the emulator (or the machine) rather than the
emulated link is the bottleneck: that is the ceiling proper.

Everything it creates (namespaces, emulator, iperf3) is torn down on exit, on
errors and on Ctrl-C. Env (defaults of the options): EMU_SECONDS (20, per case),
EMU_RATE_MBIT (100), EMU_STRESS_RATE_MBIT (1000; 0 skips those cases), EMU_DELAY_MS
(1), EMU_BUFFER_BYTES (2000000), EMU_CC (cubic), BENCH_OUT (bench/out), PC_PREFIX
(pcemu).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from polycorn_harness import ROOT, provenance
from polycorn_harness.process import cpu_ticks, machine_busy_ticks, stop_process
from polycorn_harness.topology import run
from polycorn_harness.wait import wait_until

PORT0 = 5401
HZ = os.sysconf("SC_CLK_TCK")
NCPU = os.cpu_count() or 1


def log(msg: str) -> None:
    print(f"bench-emu: {msg}", file=sys.stderr, flush=True)


def car_addr(i: int) -> str:
    return f"10.77.{i}.1"


def cpx_addr(i: int) -> str:
    return f"10.77.{i}.2"


class Testbed:
    """The namespaces (testbed/netns) with ``n`` carriers, veths replaced by the
    emulator at ``rate`` Mbit/s, and an iperf3 server per carrier."""

    def __init__(self, a: argparse.Namespace, emu: Path, work: Path) -> None:
        self.a, self.emu, self.work = a, emu, work
        self.proc: subprocess.Popen[bytes] | None = None
        self.ns_train, self.ns_cloud = f"{a.prefix}-train", f"{a.prefix}-cloud"

    def env(self, n: int) -> dict[str, str]:
        return {**os.environ, "PC_PREFIX": self.a.prefix, "PC_CARRIERS": str(n)}

    def up(self, n: int, rate: int) -> None:
        run(["testbed/netns/up.sh"], env=self.env(n))
        out = self.work / "emu.out"
        with out.open("w") as o, (self.work / f"emu-{n}.err").open("w") as e:
            self.proc = subprocess.Popen(
                [
                    str(self.emu),
                    "--train-ns",
                    self.ns_train,
                    "--cloud-ns",
                    self.ns_cloud,
                    "--carriers",
                    str(n),
                    "--replace",
                    "--rate-mbit",
                    str(rate),
                    "--delay-ms",
                    str(self.a.delay_ms),
                    "--buffer-bytes",
                    str(self.a.buffer_bytes),
                ],
                stdout=o,
                stderr=e,
            )

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                err = (self.work / f"emu-{n}.err").read_text()
                raise AssertionError(f"the emulator exited: {err[-2000:]}")
            return "ready" in out.read_text()

        wait_until("the emulator ready", ready, 10)
        for i in range(n):
            run(["ip", "netns", "exec", self.ns_train, "ping", "-c", "1", "-W", "2", cpx_addr(i)])
            run(
                [
                    "ip",
                    "netns",
                    "exec",
                    self.ns_cloud,
                    "iperf3",
                    "-s",
                    "-D",
                    "-B",
                    cpx_addr(i),
                    "-p",
                    str(PORT0 + i),
                    "--pidfile",
                    str(self.work / f"iperf3-s{i}.pid"),
                ]
            )

        def listening() -> bool:
            ss = run(["ip", "netns", "exec", self.ns_cloud, "ss", "-Htln"]).stdout
            return all(f"{cpx_addr(i)}:{PORT0 + i}" in ss for i in range(n))

        wait_until("the iperf3 servers listening", listening, 10)

    def down(self) -> None:
        if self.proc is not None:
            stop_process(self.proc.pid)
            self.proc.wait(timeout=10)
            self.proc = None
        run(["testbed/netns/down.sh"], env=self.env(1))

    def case(self, n: int, rate: int, direction: str) -> dict[str, Any]:
        """One iperf3 flow per carrier, all at once."""
        a = self.a
        assert self.proc is not None
        log(f"{n} carrier(s), {direction}, {a.seconds}s, {rate} Mbit/s each")
        t0, m0 = cpu_ticks(self.proc.pid), machine_busy_ticks()
        procs = []
        for i in range(n):
            out = (self.work / f"iperf-{n}-{direction}-{i}.json").open("w")
            cmd = ["timeout", str(a.seconds + 30), "ip", "netns", "exec", self.ns_train]
            cmd += ["iperf3", "-c", cpx_addr(i), "-B", car_addr(i), "-p", str(PORT0 + i)]
            cmd += [
                "-t",
                str(a.seconds),
                "-C",
                a.cc,
                "-J",
                *(["-R"] if direction == "down" else []),
            ]
            procs.append((subprocess.Popen(cmd, stdout=out), out))
        for p, out in procs:
            if p.wait() != 0:
                raise AssertionError(f"iperf3 exited {p.returncode}: {out.name}")
            out.close()
        t1, m1 = cpu_ticks(self.proc.pid), machine_busy_ticks()
        per, retr = [], []
        for i in range(n):
            r = json.loads((self.work / f"iperf-{n}-{direction}-{i}.json").read_text())["end"]
            per.append(round(r["sum_received"]["bits_per_second"] / 1e6 * 100) / 100)
            retr.append(r["sum_sent"].get("retransmits") or 0)
        return {
            "carriers": n,
            "direction": direction,
            "rate_mbit": rate,
            "delay_ms": a.delay_ms,
            "buffer_bytes": a.buffer_bytes,
            "cc": a.cc,
            "seconds": a.seconds,
            "per_carrier_mbps": per,
            "total_mbps": round(sum(per) * 100) / 100,
            "retransmits": retr,
            "emu_cpu_pct_of_core": round((t1 - t0) / HZ / a.seconds * 100),
            "machine_cpu_pct_all_cores": round((m1 - m0) / HZ / a.seconds / NCPU * 100),
        }


def args() -> argparse.Namespace:
    e = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=int, default=int(e("EMU_SECONDS", "20")))
    p.add_argument("--rate-mbit", type=int, default=int(e("EMU_RATE_MBIT", "100")))
    p.add_argument("--stress-rate-mbit", type=int, default=int(e("EMU_STRESS_RATE_MBIT", "1000")))
    p.add_argument("--delay-ms", type=int, default=int(e("EMU_DELAY_MS", "1")))
    p.add_argument("--buffer-bytes", type=int, default=int(e("EMU_BUFFER_BYTES", "2000000")))
    p.add_argument("--cc", default=e("EMU_CC", "cubic"))
    p.add_argument("--out", type=Path, default=Path(e("BENCH_OUT", str(ROOT / "bench" / "out"))))
    p.add_argument("--prefix", default=e("PC_PREFIX", "pcemu"))
    return p.parse_args()


def table(cases: list[dict[str, Any]]) -> str:
    cols = ("carriers", "rate", "dir", "per-carrier Mbit/s", "total", "emu CPU", "machine")
    fmt = "{:<9} {:<6} {:<5} {:<34} {:>9} {:>8} {:>10}"
    lines = [fmt.format(*cols)]
    for c in cases:
        lines.append(
            fmt.format(
                c["carriers"],
                c["rate_mbit"],
                c["direction"],
                " ".join(f"{x:g}" for x in c["per_carrier_mbps"]),
                f"{c['total_mbps']:g}",
                f"{c['emu_cpu_pct_of_core']}%",
                f"{c['machine_cpu_pct_all_cores']}%",
            )
        )
    return "\n".join(lines)


def main() -> int:
    a = args()
    if os.geteuid() != 0:
        log("must run as root (network namespaces)")
        return 1
    prov = provenance.start(a.out / "emu.json")
    for tool in ("iperf3", "ip"):
        if shutil.which(tool) is None:
            log(f"{tool} not found: run 'make setup'")
            return 1
    work = Path(f"/tmp/polycorn-state-{a.prefix}") / "bench-emu"
    built = subprocess.run(
        # The workspace, as `make build` (a subset would compile its dependencies again).
        ["cargo", "build", "--release", "--locked", "--workspace"],
        cwd=ROOT,
        check=False,
    )
    if built.returncode != 0:
        if not (ROOT / "target" / "release" / "polycorn-emu").exists():
            return 1
        log("warning: cargo build failed (workspace being edited?); using the existing binary")
    work.mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    # A private copy: another build of target/release during the run must not swap it.
    emu = work / "polycorn-emu"
    shutil.copy2(ROOT / "target" / "release" / "polycorn-emu", emu)
    tb = Testbed(a, emu, work)
    cases: list[dict[str, Any]] = []
    runs: list[tuple[int, int, tuple[str, ...]]] = [
        (n, a.rate_mbit, ("down", "up")) for n in (4, 1)
    ]
    if a.stress_rate_mbit > 0:
        runs += [(n, a.stress_rate_mbit, ("down",)) for n in (4, 1)]
    try:
        for n, rate, dirs in runs:
            tb.up(n, rate)
            cases += [tb.case(n, rate, d) for d in dirs]
            tb.down()
    finally:
        tb.down()
    model = next(
        (
            ln.split(": ", 1)[1]
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        "",
    )
    doc = {
        **prov.fields(),
        "what": "polycorn-emu ceiling: one iperf3 TCP flow per carrier, all carriers at once "
        "(make bench-emu)",
        "machine": {"cpus": NCPU, "model": model, "kernel": platform.release()},
        "cases": cases,
    }
    (a.out / "emu.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(table(cases))
    log(f"wrote {a.out}/emu.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
