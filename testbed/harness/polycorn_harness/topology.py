"""One copy of the emulated HSR topology (``testbed/topology.sh``): three
network namespaces (``PREFIX-pax``, ``PREFIX-train``, ``PREFIX-cloud``), the
link emulator replaying a trip, the origin servers and a relay/proxy pair.
Bash keeps the namespace plumbing; this module starts, inspects and tears
it down, and checks that nothing of it is left."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polycorn_harness import ROOT, metrics

TOPOLOGY = ROOT / "testbed" / "topology.sh"
#: The origin's address, as topology.sh gives it (testbed/netns/lib.sh).
ORIGIN = "10.99.0.10"
#: The release binaries the testbed runs.
BINARIES = (
    "polycorn-emu",
    "polycorn-relay",
    "polycorn-proxy",
    "polycorn-pki",
    "polycorn-loadgen",
    "polycorn-tracegen",
)
#: The proxy's metrics inside the cloud namespace, the relay's inside the train's.
PROXY_METRICS = "127.0.0.1:9464"
RELAY_METRICS = "127.0.0.1:9465"


class CommandFailedError(AssertionError):
    """A command of the testbed exited non-zero; the message has its stderr's tail."""


def run(
    cmd: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` to completion (from the repository root); raise
    :class:`CommandFailedError` with its stderr's tail when it fails."""
    r = subprocess.run(
        list(cmd), cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if r.returncode != 0:
        tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-15:])
        raise CommandFailedError(f"{' '.join(cmd[:6])} exited {r.returncode}:\n{tail}")
    return r


@dataclass
class Topology:
    """A topology under ``prefix``, replaying the trip in ``trip``; ``extra_env`` goes
    to topology.sh (e.g. ``TRAIN_ID``, the relay's train)."""

    prefix: str
    trip: Path
    bin_dir: Path
    extra_env: dict[str, str] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            **self.extra_env,
            "PC_PREFIX": self.prefix,
            "BIN": str(self.bin_dir),
        }

    @property
    def state(self) -> Path:
        return Path(f"/tmp/polycorn-state-{self.prefix}")

    def ns(self, which: str) -> str:
        """The namespace ``pax``, ``train`` or ``cloud``."""
        return f"{self.prefix}-{which}"

    def up(
        self,
        scheme: str = "minrtt",
        *,
        epoch_unix_ms: int | None = None,
        failure_table: Path | None = None,
        relay_args: Sequence[str] = (),
        proxy_args: Sequence[str] = (),
        forward_ports: Sequence[int] = (),
        gpsd: bool = False,
        seed: int | None = None,
        cc: str | None = None,
    ) -> Topology:
        """``topology.sh up``: everything started and the relay's first path up.
        ``forward_ports``: 127.0.0.1:PORT in the cloud namespace reaches the root
        namespace's (the Kafka of ``scripts/infra.sh``, for the proxy). ``seed``: the
        emulator's (topology.sh's ``--seed``, 1 when not given). ``cc``: the passengers'
        and the origin's congestion control of a ``direct-c<i>`` scheme (topology.sh's
        ``--cc``; bbr when not given)."""
        cmd = [str(TOPOLOGY), "up", "--trip", str(self.trip), "--scheme", scheme]
        if epoch_unix_ms is not None:
            cmd += ["--epoch-unix-ms", str(epoch_unix_ms)]
        if failure_table is not None:
            cmd += ["--failure-table", str(failure_table)]
        for a in relay_args:
            cmd += ["--relay-arg", a]
        for a in proxy_args:
            cmd += ["--proxy-arg", a]
        for port in forward_ports:
            cmd += ["--forward-port", str(port)]
        if gpsd:
            cmd.append("--gpsd")
        if seed is not None:
            cmd += ["--seed", str(seed)]
        if cc is not None:
            cmd += ["--cc", cc]
        run(cmd, env=self.env(), timeout=300)
        return self

    def down(self) -> None:
        """``topology.sh down``; works whatever state ``up`` left."""
        run([str(TOPOLOGY), "down"], env=self.env(), timeout=120)

    def exec(
        self, which: str, cmd: Sequence[str], *, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """``cmd`` inside namespace ``which``."""
        return run(["ip", "netns", "exec", self.ns(which), *cmd], timeout=timeout)

    def popen(self, which: str, cmd: Sequence[str]) -> subprocess.Popen[bytes]:
        """``cmd`` inside namespace ``which``, in the background."""
        return subprocess.Popen(
            ["ip", "netns", "exec", self.ns(which), *cmd],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def metrics(self, which: str = "cloud", addr: str = PROXY_METRICS) -> str:
        """The exposition of ``/metrics`` at ``addr`` in namespace ``which``;
        :class:`CommandFailedError` when nothing answers."""
        text = scrape(self.ns(which), addr)
        if text is None:
            raise CommandFailedError(f"no /metrics at {addr} in namespace {self.ns(which)}")
        return text

    def metric(self, name: str, which: str = "cloud", **labels: str) -> float | None:
        return metrics.value(self.metrics(which), name, **labels)

    def collect(self, out: Path, *, endpoints: bool = True) -> None:
        """What a benchmark keeps of a run: the relay's and the proxy's ``/metrics``
        (``logs/relay.metrics``, ``logs/proxy.metrics``; empty when one does not
        answer; not written with ``endpoints`` False, a topology without relay and
        proxy) and every log of the topology, under ``out/logs``."""
        logs = out / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for name, which, addr in (
            ("relay", "train", RELAY_METRICS),
            ("proxy", "cloud", PROXY_METRICS),
        ):
            if not endpoints:
                break
            text = scrape(self.ns(which), addr, timeout_s=2)
            (logs / f"{name}.metrics").write_text(text or "")
        for f in (self.state / "logs").glob("*.log"):
            shutil.copy2(f, logs / f.name)


def carrier_counters(ns: str) -> dict[str, list[int]] | None:
    """The train's carrier interfaces' counters in namespace ``ns``: ``rx_bytes``,
    ``rx_packets`` (what each carrier's emulated downlink delivered), ``tx_bytes``,
    ``tx_packets`` (what the train offered its uplink), lists indexed by carrier; None when
    the namespace or its interfaces are gone."""
    r = subprocess.run(
        ["ip", "-n", ns, "-j", "-s", "link", "show"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if r.returncode != 0:
        return None
    try:
        links = json.loads(r.stdout)
    except ValueError:
        return None
    found: dict[int, dict[str, Any]] = {}
    for link in links if isinstance(links, list) else []:
        name = link.get("ifname", "") if isinstance(link, dict) else ""
        if name.startswith("car") and name[3:].isdigit() and "stats64" in link:
            found[int(name[3:])] = link["stats64"]
    if not found or sorted(found) != list(range(len(found))):
        return None
    out: dict[str, list[int]] = {}
    for way in ("rx", "tx"):
        for what in ("bytes", "packets"):
            out[f"{way}_{what}"] = [int(found[i][way][what]) for i in range(len(found))]
    return out


def get(ns: str, url: str, *, timeout_s: float = 2.0) -> tuple[int, str]:
    """``(status, body)`` of a GET of ``url`` from inside namespace ``ns``; status 0 when
    nothing answered."""
    return get_via(["ip", "netns", "exec", ns], url, timeout_s=timeout_s)


def get_via(enter: Sequence[str], url: str, *, timeout_s: float = 2.0) -> tuple[int, str]:
    """:func:`get` from wherever the command prefix ``enter`` runs curl (``ip netns exec
    NS``, or ``nsenter -t PID -n`` for a container's namespace)."""
    r = subprocess.run(
        [
            *enter,
            "curl",
            "-sS",
            "--max-time",
            f"{timeout_s:g}",
            "-w",
            "\n%{http_code}",
            url,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s + 30,
        check=False,
    )
    body, _, code = r.stdout.rpartition("\n")
    return (int(code), body) if code.isdigit() else (0, "")


def scrape(ns: str, addr: str, *, timeout_s: float = 5) -> str | None:
    """The exposition of ``/metrics`` at ``addr`` inside namespace ``ns``; ``None``
    when nothing answers (a process not listening yet, or gone)."""
    code, body = get(ns, f"http://{addr}/metrics", timeout_s=timeout_s)
    return body if code == 200 else None


def leftovers(prefix: str) -> list[str]:
    """Whatever of topology ``prefix`` survives: its namespaces, processes
    naming it, the emulator's TUN devices in the root namespace."""
    left = [f"namespace {p.name}" for p in Path("/run/netns").glob(f"{prefix}-*")]
    ps = subprocess.run(
        ["pgrep", "-af", "--", f"{prefix}-(train|cloud|inet|pax)|polycorn-state-{prefix}"],
        capture_output=True,
        text=True,
        check=False,
    )
    left += [f"process {line}" for line in ps.stdout.splitlines() if "pgrep" not in line]
    links = subprocess.run(
        ["ip", "-o", "link", "show", "type", "tun"], capture_output=True, text=True, check=False
    )
    for line in links.stdout.splitlines():
        dev = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if dev.startswith(("car", "cpx")) or (dev.startswith("pe") and dev[2:3].isdigit()):
            left.append(f"tun {dev}")
    return left
