"""make bench-dataplane: throughput, CPU per GB, request/response latency and memory
of the relay-agent/proxy pair on the namespace testbed, side by side with plain TCP
and kernel MPTCP (``python -m polycorn_benchrun.dataplane``; needs root).
What each number means: bench/README.md.

Builds its own testbed (``PC_PREFIX`` pcbench, 4 carriers; the harness's
:class:`~polycorn_harness.pair.Pair` over testbed/netns/pair.sh), runs every scheme
once per repetition, interleaved and in a rotating order, so that machine noise hits
them alike, then runs the scheduler decision micro-benchmark (cargo bench) and
writes bench/out/dataplane.json and bench/out/dataplane.md (bench/tools/report.py).
Tears everything down whatever happens, Ctrl-C included.

Env (defaults of the options): BENCH_REPS (3), BENCH_SECONDS (5, per iperf3 run),
BENCH_CONNS (1000), BENCH_RTTS (2000), BENCH_MPTCP_SUBFLOWS (2), BENCH_DECISION (1;
0 skips cargo bench), BENCH_OUT (bench/out), PC_PREFIX (pcbench), BIN
(target/release).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from polycorn_harness import ROOT, provenance
from polycorn_harness.pair import ORIGIN_ADDR, Pair
from polycorn_harness.process import cpu_ticks, machine_busy_ticks, stop_process
from polycorn_harness.topology import run
from polycorn_harness.wait import WaitTimeoutError, wait_until

CARRIERS = 4
PROXY_PORT = 4433
#: "direct" and "mptcp_raw" servers: on the cloud's end of carrier 0.
DIRECT_ADDR = "10.77.0.2"
DIRECT_IPERF_PORT = 5301
MPTCP_IPERF_PORT = 5302
DIRECT_ECHO_PORT = 7007
SCHEMES = ("direct", "mptcp_raw", "relay_1", "relay_2", "relay_4", "quic_2", "kernel_mptcp")
HZ = os.sysconf("SC_CLK_TCK")
CRITERION = ROOT / "target" / "criterion"
# The pipeline the relay and proxy run unless told otherwise, read from its
# one definition so that the decision benchmark follows it.
REGISTRY_RS = ROOT / "crates" / "core" / "src" / "sched" / "registry.rs"


def default_pipeline() -> str:
    m = re.search(r'pub const DEFAULT_PIPELINE: &str = "([^"]+)";', REGISTRY_RS.read_text())
    if m is None:
        raise SystemExit(f"no DEFAULT_PIPELINE in {REGISTRY_RS}")
    return m.group(1)


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def utc() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def args() -> argparse.Namespace:
    e = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=int(e("BENCH_REPS", "3")))
    p.add_argument("--seconds", type=int, default=int(e("BENCH_SECONDS", "5")))
    p.add_argument("--conns", type=int, default=int(e("BENCH_CONNS", "1000")))
    p.add_argument("--rtts", type=int, default=int(e("BENCH_RTTS", "2000")))
    p.add_argument("--mptcp-subflows", type=int, default=int(e("BENCH_MPTCP_SUBFLOWS", "2")))
    p.add_argument("--decision", type=int, default=int(e("BENCH_DECISION", "1")))
    p.add_argument("--out", type=Path, default=Path(e("BENCH_OUT", str(ROOT / "bench" / "out"))))
    p.add_argument("--prefix", default=e("PC_PREFIX", "pcbench"))
    p.add_argument("--bin", type=Path, default=Path(e("BIN", str(ROOT / "target" / "release"))))
    a = p.parse_args()
    if not 1 <= a.mptcp_subflows <= CARRIERS:
        p.error(f"--mptcp-subflows (BENCH_MPTCP_SUBFLOWS) must be 1..{CARRIERS}")
    return a


# ------------------------------------------------------------------ /proc readers


class Proc:
    """The /proc counters of a pair process (``relay`` or ``proxy``), by its pid file;
    ``None`` when it is not running."""

    def __init__(self, pair: Pair, name: str) -> None:
        self.pair, self.name = pair, name

    def pid(self) -> int | None:
        f = self.pair.state / "run" / f"{self.name}.pid"
        try:
            return int(f.read_text())
        except (OSError, ValueError):
            return None

    def ticks(self) -> int | None:
        """utime + stime, all threads, in clock ticks."""
        pid = self.pid()
        try:
            return None if pid is None else cpu_ticks(pid)
        except OSError:
            return None

    def ctx_switches(self) -> int | None:
        """Voluntary + involuntary context switches of all its threads."""
        pid = self.pid()
        if pid is None:
            return None
        n = 0
        for st in Path(f"/proc/{pid}/task").glob("*/status"):
            try:
                text = st.read_text()
            except OSError:
                continue
            n += sum(int(m) for m in re.findall(r"ctxt_switches:\s+(\d+)", text))
        return n

    def rss_kb(self) -> int | None:
        try:
            status = Path(f"/proc/{self.pid()}/status").read_text()
        except OSError:
            return None
        m = re.search(r"^VmRSS:\s+(\d+)", status, re.M)
        return int(m.group(1)) if m else None


def delta(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else b - a


# ------------------------------------------------------------------ the bench


class Bench:
    def __init__(self, a: argparse.Namespace, work: Path) -> None:
        self.a, self.work = a, work
        self.raw = work / "raw.jsonl"
        self.bin = work / "bin"
        self.testbed = Pair(a.prefix, self.bin, CARRIERS)
        self.relay = Proc(self.testbed, "relay")
        self.proxy = Proc(self.testbed, "proxy")

    def pair(self, carriers: int) -> Pair:
        return Pair(self.a.prefix, self.bin, carriers)

    def ns(self, which: str, *cmd: str) -> list[str]:
        return ["ip", "netns", "exec", self.testbed.ns(which), *cmd]

    def record(self, rec: dict[str, Any]) -> None:
        with self.raw.open("a") as f:
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")

    # ---- schemes

    def subflows(self, scheme: str) -> int:
        """Subflows the scheme's data connection is using right now."""
        if scheme == "direct":
            return 1
        if scheme.startswith("quic_"):
            # quinn's sockets are not connected: ss has no peer to match; the relay
            # counts its subflows.
            return self.pair(int(scheme.removeprefix("quic_"))).paths_up()
        if scheme.startswith("relay_"):
            est = ["ss", "-Htn", "state", "established", f"( dport = :{PROXY_PORT} )"]
            return len(run(self.ns("train", *est)).stdout.splitlines())
        # ss -M reports the subflows added to the initial one.
        port = MPTCP_IPERF_PORT if scheme == "mptcp_raw" else PROXY_PORT
        out = run(self.ns("train", "ss", "-HMni", f"( dport = :{port} )")).stdout
        return max((int(n) for n in re.findall(r"subflows:(\d+)", out)), default=-1) + 1

    def scheme_up(self, scheme: str, *proxy_args: str) -> bool:
        """Start what ``scheme`` needs; False if it does not come up. Explicit scheduler
        and transport: the results must not follow a change of the defaults silently."""
        try:
            if scheme.startswith(("relay_", "quic_")):
                transport, k = scheme.split("_")
                transport = "tls" if transport == "relay" else transport
                self.testbed.start_proxy(
                    "--scheduler", "minrtt", "--transport", transport, *proxy_args
                )
                self.pair(int(k)).start_main_relay(
                    "--scheduler", "minrtt", "--transport", transport
                )
                self.pair(int(k)).wait_paths_up(int(k))
            elif scheme == "kernel_mptcp":
                args = ("--scheduler", "minrtt", "--transport", "kernel-mptcp")
                self.testbed.start_proxy(*args)
                self.pair(1).start_main_relay(*args)
                self.pair(1).wait_paths_up(1)
                # The kernel joins the extra subflows just after the handshake.
                try:
                    wait_until(
                        "kernel MPTCP's subflows",
                        lambda: self.subflows("kernel_mptcp") >= self.a.mptcp_subflows,
                        3,
                    )
                except WaitTimeoutError:
                    log(
                        f"warning: kernel MPTCP has {self.subflows('kernel_mptcp')} subflows, "
                        f"expected {self.a.mptcp_subflows}"
                    )
        except AssertionError as e:
            why = str(e).splitlines()[0]
            log(f"  {scheme} did not come up ({why}); see {self.testbed.state}/logs")
            return False
        return True

    def scheme_down(self) -> None:
        self.testbed.stop("relay")
        self.testbed.stop("proxy")

    def iperf_client(self, scheme: str, *flags: str) -> list[str]:
        t = ["timeout", str(self.a.seconds + 25)]
        if scheme == "direct":
            return self.ns(
                "train", *t, "iperf3", "-c", DIRECT_ADDR, "-p", str(DIRECT_IPERF_PORT), *flags
            )
        if scheme == "mptcp_raw":
            return self.ns(
                "train", *t, "mptcpize", "run", "iperf3", "-c", DIRECT_ADDR, "-p",
                str(MPTCP_IPERF_PORT), *flags,
            )  # fmt: skip
        return self.ns("pax", *t, "iperf3", "-c", ORIGIN_ADDR, "-p", "5201", *flags)

    def top_snapshot(self, title: str) -> None:
        """A per-thread top frame (the second one, whose %CPU covers the last second)."""
        out = subprocess.run(
            ["top", "-b", "-H", "-n", "2", "-d", "1", "-w", "200"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        frames = re.split(r"(?m)^(?=top -)", out)
        frame = frames[2] if len(frames) > 2 else ""
        with (self.a.out / "dataplane-top.txt").open("a") as f:
            f.write(f"=== {title}\n" + "\n".join(frame.splitlines()[:30]) + "\n\n")

    def throughput(self, rep: int, scheme: str, direction: str) -> None:
        """One iperf3 run (-i 0.1: 100 ms intervals, to see stalls)."""
        flags = ["-t", str(self.a.seconds), "-J", "-i", "0.1"]
        flags += ["-R"] if direction == "down" else []
        sub: list[int | None] = [None]

        def sampler() -> None:  # mid-run: subflows in use, and once where the CPU goes
            time.sleep(self.a.seconds // 2)
            sub[0] = self.subflows(scheme)
            if rep == 1 and scheme == "relay_2":
                self.top_snapshot(f"relay_2 {direction}, {utc()}")

        th = threading.Thread(target=sampler, daemon=True)
        th.start()
        rx0, px0 = self.relay.ctx_switches(), self.proxy.ctx_switches()
        r0, p0, m0, t0 = (
            self.relay.ticks(),
            self.proxy.ticks(),
            machine_busy_ticks(),
            time.time_ns(),
        )
        r = subprocess.run(
            self.iperf_client(scheme, *flags), capture_output=True, text=True, check=False
        )
        t1, r1, p1, m1 = (
            time.time_ns(),
            self.relay.ticks(),
            self.proxy.ticks(),
            machine_busy_ticks(),
        )
        rx1, px1 = self.relay.ctx_switches(), self.proxy.ctx_switches()
        th.join()
        try:
            doc = json.loads(r.stdout)
        except json.JSONDecodeError:
            doc = {}
        received = doc.get("end", {}).get("sum_received", {})
        error = None
        if r.returncode != 0 or not received.get("bytes", 0) > 0:
            error = f"{doc.get('error', '')}\n{r.stderr[:300]}exit {r.returncode}\n".lstrip("\n")
            doc, received = {}, {}
        relay_cpu, proxy_cpu = delta(r0, r1), delta(p0, p1)
        rec = {
            "kind": "throughput",
            "rep": rep,
            "scheme": scheme,
            "dir": direction,
            "bits_per_second": received.get("bits_per_second"),
            "bytes": received.get("bytes"),
            "intervals": [
                [round(i["sum"]["seconds"] * 1000), i["sum"]["bytes"]]
                for i in doc.get("intervals", [])
            ],
            "wall_s": (t1 - t0) / 1e9,
            "relay_cpu_s": None if relay_cpu is None else relay_cpu / HZ,
            "proxy_cpu_s": None if proxy_cpu is None else proxy_cpu / HZ,
            "machine_cpu_s": (m1 - m0) / HZ,
            "relay_ctx_switches": delta(rx0, rx1),
            "proxy_ctx_switches": delta(px0, px1),
            "subflows": sub[0],
            "error": error,
        }
        self.record(rec)
        if error:
            log(f"    {direction}    FAILED: {error}")
        else:
            empty = sum(1 for _, b in rec["intervals"] if b == 0)
            cpu = (
                f"  relay {rec['relay_cpu_s']}s proxy {rec['proxy_cpu_s']}s CPU"
                if rec["relay_cpu_s"]
                else ""
            )
            log(
                f"    {direction}    {received['bits_per_second'] / 1e9:.2f} Gb/s  empty 100ms "
                f"intervals {empty}  subflows {sub[0]}{cpu}"
            )

    def latency(self, rep: int, scheme: str) -> None:
        """Echo round trips."""
        tool = ["python3", "bench/tools/echo_rtt.py"]
        if scheme == "direct":
            cmd = self.ns("train", *tool, DIRECT_ADDR, str(DIRECT_ECHO_PORT))
        elif scheme == "origin_local":
            cmd = self.ns("cloud", *tool, ORIGIN_ADDR, "7")
        else:
            cmd = self.ns("pax", *tool, ORIGIN_ADDR, "7")
        r = subprocess.run(
            ["timeout", "60", *cmd, "--count", str(self.a.rtts)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        if r.returncode == 0:
            res = json.loads(r.stdout)
            self.record({"kind": "latency", "rep": rep, "scheme": scheme, "error": None, **res})
            log(f"    rtt    p50 {res['p50_us']} us  p99 {res['p99_us']} us")
        else:
            err = r.stderr[:300]
            self.record({"kind": "latency", "rep": rep, "scheme": scheme, "error": err})
            log(f"    rtt    FAILED: {err}")

    def rss(self, rep: int) -> None:
        """A fresh relay_2 pair, idle, then holding ``conns`` passenger connections
        open through it. The proxy's hard budget reserves a few hundred KiB per connection
        and refuses (RESET) what does not fit: its default 256 MiB admits about 700, so
        the run gives it 1 MiB per connection (the budget is accounting; RSS is what is
        measured)."""
        budget = max(256, self.a.conns) * 1024 * 1024
        if not self.scheme_up("relay_2", "--mem-budget", str(budget)):
            self.record({"kind": "rss", "rep": rep, "error": "relay_2 did not come up"})
            self.scheme_down()
            return
        time.sleep(0.5)  # settle: the idle RSS is measured after the handshakes
        r_idle, p_idle = self.relay.rss_kb(), self.proxy.rss_kb()
        r_held = p_held = upstreams = None
        ready: dict[str, Any] = {}
        err = None
        hold = subprocess.Popen(
            self.ns(
                "pax",
                "python3",
                "bench/tools/hold_conns.py",
                ORIGIN_ADDR,
                "7",
                "--count",
                str(self.a.conns),
                "--hold",
                "120",
            ),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert hold.stdout is not None and hold.stderr is not None
            line = hold.stdout.readline()  # its one line: every connection is up
            if line:
                time.sleep(1)  # let both ends settle
                r_held, p_held = self.relay.rss_kb(), self.proxy.rss_kb()
                ss = run(
                    self.ns(
                        "cloud", "ss", "-Htn", "state", "established",
                        f"( dst {ORIGIN_ADDR} and dport = :7 )",
                    )
                ).stdout  # fmt: skip
                upstreams = len(ss.splitlines())
                ready = json.loads(line)
            else:
                hold.wait(timeout=10)
                err = hold.stderr.read()
        finally:
            stop_process(hold.pid)
            hold.wait(timeout=10)
        rec = {
            "kind": "rss",
            "rep": rep,
            "conns": self.a.conns,
            "proxy_mem_budget": budget,
            "relay_kb_idle": r_idle,
            "proxy_kb_idle": p_idle,
            "relay_kb": r_held,
            "proxy_kb": p_held,
            "proxy_upstreams": upstreams,
            "echoed": ready.get("echoed"),
            "open_seconds": ready.get("seconds"),
            "error": err,
        }
        self.record(rec)
        log(
            f"    rss    {self.a.conns} conns ({rec['echoed']} echoed, {upstreams} upstream at the "
            f"proxy): relay {r_idle} -> {r_held} kB, proxy {p_idle} -> {p_held} kB"
        )
        self.scheme_down()

    def decision(self) -> dict[str, Any]:
        """The decision micro-benchmark (crates/core/benches/decision.rs) for
        `minrtt` and the default pipeline: `select` (one pipeline call) and
        `schedule` (per packet placed by the endpoint), median ns by path count."""
        if self.a.decision != 1:
            return {"error": "skipped (BENCH_DECISION=0)"}
        pipelines = ["minrtt", default_pipeline()]
        marker = time.time()
        logf = self.work / "decision.log"
        names = "|".join(re.escape(p) for p in pipelines)
        log(f"decision: cargo bench -p polycorn-core --bench decision, {pipelines} (log: {logf})")
        with logf.open("w") as f:
            r = subprocess.run(
                [
                    "cargo",
                    "bench",
                    "--locked",
                    "-p",
                    "polycorn-core",
                    "--bench",
                    "decision",
                    "--",
                    "--warm-up-time",
                    "1",
                    "--measurement-time",
                    "3",
                    f"^(select|schedule)/({names})/",
                ],
                cwd=ROOT,
                stdout=f,
                stderr=subprocess.STDOUT,
                check=False,
            )
        if r.returncode != 0:
            tail = "\n".join(logf.read_text().splitlines()[-15:])
            log(f"decision: cargo bench failed; decision_ns is null. Last lines:\n{tail}")
            return {"error": "cargo bench failed", "log_tail": tail}
        out: dict[str, Any] = {}
        for group in ("select", "schedule"):
            for p in pipelines:
                for n in (2, 4, 8):
                    est = CRITERION / group / p / str(n) / "new" / "estimates.json"
                    if est.exists() and est.stat().st_mtime > marker:
                        ns = json.loads(est.read_text())["median"]["point_estimate"]
                        out.setdefault(group, {}).setdefault(p, {})[str(n)] = ns
                    else:
                        log(f"decision: no fresh {est} (bench ID {group}/{p}/{n} missing?)")
        log(f"decision: {json.dumps(out)} ns")
        return out

    # ---- the testbed

    def up(self) -> None:
        self.testbed.up_bare()
        env = (self.testbed.state / "netns.env").read_text()
        if "MPTCP=1" not in env.splitlines():
            log("warning: kernel MPTCP is off; mptcp_raw and kernel_mptcp will fail")
        # Kernel MPTCP gets mptcp_subflows subflows (the initial one over car0, plus one
        # endpoint per further carrier), so that kernel_mptcp is comparable to
        # relay_<mptcp_subflows>.
        subprocess.run(self.ns("train", "ip", "mptcp", "endpoint", "flush"), check=False)
        for i in range(1, self.a.mptcp_subflows):
            run(
                self.ns(
                    "train",
                    "ip",
                    "mptcp",
                    "endpoint",
                    "add",
                    f"10.77.{i}.1",
                    "dev",
                    f"car{i}",
                    "subflow",
                )
            )
        w = str(self.work)
        server = ["iperf3", "-s", "-D", "-B", DIRECT_ADDR, "-p"]
        run(self.ns("cloud", *server, str(DIRECT_IPERF_PORT), "--logfile", f"{w}/iperf-direct.log"))
        mptcp = ["mptcpize", "run", *server, str(MPTCP_IPERF_PORT)]
        run(self.ns("cloud", *mptcp, "--logfile", f"{w}/iperf-mptcp.log"))
        with (self.work / "echo-direct.log").open("a") as f:
            subprocess.Popen(
                self.ns(
                    "cloud",
                    "python3",
                    "testbed/origin/echo.py",
                    "--bind",
                    DIRECT_ADDR,
                    "--port",
                    str(DIRECT_ECHO_PORT),
                ),
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

        def listening() -> bool:
            ss = run(self.ns("cloud", "ss", "-Hltn", f"src {DIRECT_ADDR}")).stdout
            return len(ss.splitlines()) >= 3

        wait_until("the direct iperf3, MPTCP iperf3 and echo servers listening", listening, 5)

    def down(self) -> None:
        # pair.sh down: the pair, the origin, the namespaces (and whatever runs in them).
        self.testbed.down()


def binary_info(path: Path) -> str:
    version = run([str(path), "--version"]).stdout.strip()
    return f"{version}, sha256 {hashlib.sha256(path.read_bytes()).hexdigest()[:16]}"


def preflight() -> bool:
    """Root and every tool the run uses; what is missing logged."""
    if os.geteuid() != 0:
        log("must run as root (network namespaces)")
        return False
    for tool in ("iperf3", "mptcpize", "python3", "ss", "top"):
        if shutil.which(tool) is None:
            log(f"{tool} not found: run 'make setup'")
            return False
    return True


def private_binaries(a: argparse.Namespace) -> Path:
    """The pair's binaries (built if missing) copied into the run's work directory,
    which is returned."""
    bins = ("polycorn-relay", "polycorn-proxy", "polycorn-pki")
    if not all((a.bin / b).exists() for b in bins):
        subprocess.run(
            # The whole workspace, as `make build`: a subset would unify features
            # differently and compile the shared dependencies again.
            ["cargo", "build", "--release", "--locked", "--workspace"],
            cwd=ROOT,
            check=True,
        )
    work = Path(f"/tmp/polycorn-state-{a.prefix}") / "bench"
    (work / "bin").mkdir(parents=True, exist_ok=True)
    # Private copies: a rebuild of target/release during the run (others work in
    # this tree) must not mix two versions of the pair in one result.
    for b in bins:
        shutil.copy2(a.bin / b, work / "bin" / b)
    return work


def measure_scheme(bench: Bench, rep: int, scheme: str) -> None:
    """One scheme's throughput both ways and, where it has a path for it, latency."""
    if not bench.scheme_up(scheme):
        for d in ("down", "up"):
            bench.record(
                {
                    "kind": "throughput",
                    "rep": rep,
                    "scheme": scheme,
                    "dir": d,
                    "error": "did not come up",
                }
            )
        bench.scheme_down()
        return
    bench.throughput(rep, scheme, "down")
    bench.throughput(rep, scheme, "up")
    if scheme == "direct":
        bench.latency(rep, "direct")
        bench.latency(rep, "origin_local")
    elif scheme.startswith(("relay_", "quic_")) or scheme == "kernel_mptcp":
        bench.latency(rep, scheme)
    bench.scheme_down()


def measure_network(bench: Bench, a: argparse.Namespace) -> None:
    """Every repetition: each scheme, then the relay's memory with idle connections."""
    for rep in range(1, a.reps + 1):
        # Rotate the order each repetition, so no scheme always runs first.
        order = SCHEMES[rep - 1 :] + SCHEMES[: rep - 1]
        for scheme in order:
            log(f"rep {rep}/{a.reps}  {scheme}")
            measure_scheme(bench, rep, scheme)
        log(f"rep {rep}/{a.reps}  rss: {a.conns} idle passenger connections through relay_2")
        bench.rss(rep)


def machine() -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = re.search(r"^model name\s*:\s*(.*)$", cpuinfo, re.M)
    mem = re.search(r"^MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text(), re.M)
    return {
        "cpu": model.group(1) if model else "",
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "mem_mb": int(mem.group(1)) // 1024 if mem else None,
    }


def report(a: argparse.Namespace, bench: Bench, work: Path) -> int:
    """bench/tools/report.py over the raw records, printed; its exit status."""
    r = subprocess.run(
        [
            "python3",
            "bench/tools/report.py",
            "--raw",
            str(bench.raw),
            "--meta",
            str(work / "meta.json"),
            "--decision",
            str(work / "decision.json"),
            "--provenance",
            str(work / "provenance.json"),
            "--json",
            str(a.out / "dataplane.json"),
            "--md",
            str(a.out / "dataplane.md"),
        ],
        cwd=ROOT,
        check=False,
    )
    return r.returncode


def main() -> int:
    a = args()
    prov = provenance.start(a.out / "dataplane.json", a.out / "dataplane.md")
    if not preflight():
        return 1
    work = private_binaries(a)
    a.out.mkdir(parents=True, exist_ok=True)
    bench = Bench(a, work)
    bench.raw.write_text("")
    (a.out / "dataplane-top.txt").write_text("")
    started, load_start = utc(), " ".join(Path("/proc/loadavg").read_text().split()[:3])
    t_start = time.monotonic()
    log(
        f"testbed {a.prefix}: {CARRIERS} carriers; {a.reps} repetitions x {len(SCHEMES)} "
        f"schemes x up/down x {a.seconds}s"
    )
    try:
        bench.up()
        measure_network(bench, a)
        load_end = " ".join(Path("/proc/loadavg").read_text().split()[:3])
        net_seconds = round(time.monotonic() - t_start)
        relay_log = bench.testbed.state / "logs" / "relay.log"
        if relay_log.exists():
            shutil.copy2(relay_log, work / "relay-last.log")
        log(f"network part done in {net_seconds}s; tearing down the testbed")
    finally:
        bench.down()
    decision = bench.decision()
    (work / "decision.json").write_text(json.dumps(decision))
    meta = {
        "started": started,
        "finished": utc(),
        "settings": {
            "reps": a.reps,
            "seconds_per_run": a.seconds,
            "conns": a.conns,
            "round_trips": a.rtts,
            "mptcp_subflows": a.mptcp_subflows,
            "testbed_carriers": CARRIERS,
        },
        "network_part_seconds": net_seconds,
        "loadavg_start": load_start,
        "loadavg_end": load_end,
        "machine": machine(),
        "tools": {
            "iperf3": run(["iperf3", "--version"]).stdout.splitlines()[0],
            "python": run(["python3", "--version"]).stdout.strip(),
            "relay": binary_info(work / "bin" / "polycorn-relay"),
            "proxy": binary_info(work / "bin" / "polycorn-proxy"),
        },
    }
    (work / "meta.json").write_text(json.dumps(meta))
    (work / "provenance.json").write_text(json.dumps(prov.fields()))
    rc = report(a, bench, work)
    log(
        f"wrote {a.out}/dataplane.json and {a.out}/dataplane.md "
        f"({time.monotonic() - t_start:.0f}s in all)"
    )
    print()
    print((a.out / "dataplane.md").read_text() if (a.out / "dataplane.md").exists() else "")
    return rc


if __name__ == "__main__":
    sys.exit(main())
