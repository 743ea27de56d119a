"""End-to-end check of the namespace testbed itself, not of Polycorn (``make
smoke-netns``): builds the topology and the origin (testbed/netns/up.sh,
testbed/origin/start.sh), checks every property the integration tests rely on, tears
it all down and checks that nothing is left behind. Its own prefix (``PC_PREFIX``,
default pcsmoke), so that it never tears down a topology a demo or test run is using.
The probes that must run inside a namespace are testbed/netns/probe.py. Tests run in
file order. Needs root.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from polycorn_harness import ROOT
from polycorn_harness.wait import wait_until

NETNS = ROOT / "testbed" / "netns"
PROBE = str(NETNS / "probe.py")
ORIGIN = "10.99.0.10"
PAX_ADDR = "10.66.0.2"


@dataclass
class NetnsBed:
    prefix: str
    carriers: int
    tmp: Path

    @property
    def state(self) -> Path:
        return Path(f"/tmp/polycorn-state-{self.prefix}")

    def env(self) -> dict[str, str]:
        return {**os.environ, "PC_PREFIX": self.prefix, "PC_CARRIERS": str(self.carriers)}

    def ns(self, which: str) -> str:
        return f"{self.prefix}-{which}"

    def sh(self, script: str, *args: str) -> None:
        subprocess.run([str(ROOT / script), *args], env=self.env(), capture_output=True, check=True)

    def ok(self, which: str, *cmd: str, timeout: float = 30) -> bool:
        """Whether ``cmd`` succeeds inside namespace ``which``."""
        r = subprocess.run(
            ["ip", "netns", "exec", self.ns(which), *cmd],
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        return r.returncode == 0

    def out(self, which: str, *cmd: str) -> str:
        return subprocess.run(
            ["ip", "netns", "exec", self.ns(which), *cmd],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stdout

    def ping(self, i: int, wait_s: int = 2) -> bool:
        return self.ok("train", "ping", "-c1", f"-W{wait_s}", "-I", f"car{i}", f"10.77.{i}.2")

    def curl(self, which: str, *args: str) -> bool:
        return self.ok(which, "curl", "-fsS", "--max-time", "20", *args)

    def pids(self) -> list[int]:
        out = []
        for w in ("pax", "train", "cloud", "inet"):
            cmd = ["ip", "netns", "pids", self.ns(w)]
            r = subprocess.run(cmd, capture_output=True, text=True, check=False)
            out += [int(p) for p in r.stdout.split()]
        return out


@pytest.fixture(scope="module")
def tb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsBed]:
    t = NetnsBed(
        os.environ.get("PC_PREFIX", "pcsmoke"),
        int(os.environ.get("PC_CARRIERS", "2")),
        tmp_path_factory.mktemp("smoke"),
    )
    try:
        t.sh("testbed/netns/up.sh")
        t.sh("testbed/origin/start.sh")
        yield t
    finally:
        subprocess.run([str(NETNS / "down.sh")], env=t.env(), capture_output=True, check=False)


def test_netns_env_is_written(tb: NetnsBed) -> None:
    assert f"NS_TRAIN={tb.ns('train')}" in (tb.state / "netns.env").read_text()


# ---- the origin, seen from the cloud namespace


def test_the_origin_answers_and_serves_its_files(tb: NetnsBed) -> None:
    assert tb.curl("cloud", "-o", "/dev/null", f"http://{ORIGIN}/")
    got = tb.tmp / "1MiB.bin"
    assert tb.curl("cloud", "-o", str(got), f"http://{ORIGIN}/files/1MiB.bin")
    sums = (tb.state / "origin" / "www" / "files" / "SHA256SUMS").read_text().splitlines()
    want = next(line.split()[0] for line in sums if line.split()[1] == "1MiB.bin")
    assert hashlib.sha256(got.read_bytes()).hexdigest() == want


def test_uploads_round_trip_and_delete(tb: NetnsBed) -> None:
    up, down = tb.tmp / "up.bin", tb.tmp / "down.bin"
    up.write_bytes(os.urandom(10 * 1024 * 1024))
    url = f"http://{ORIGIN}/upload/smoke.bin"
    assert tb.curl("cloud", "-T", str(up), url)
    assert tb.curl("cloud", "-o", str(down), url)
    assert up.read_bytes() == down.read_bytes()
    assert tb.curl("cloud", "-X", "DELETE", url)


def test_iperf3_and_the_echo_server(tb: NetnsBed) -> None:
    assert tb.ok("cloud", "timeout", "20", "iperf3", "-c", ORIGIN, "-p", "5201", "-n", "10M")
    assert tb.ok("cloud", "timeout", "5", "python3", PROBE, "echo", ORIGIN, "7")


# ---- isolation


def test_the_train_and_the_passengers_cannot_reach_the_origin(tb: NetnsBed) -> None:
    for which in ("train", "pax"):
        args = ("curl", "-fsS", "--connect-timeout", "2", "-o", "/dev/null", f"http://{ORIGIN}/")
        assert not tb.ok(which, *args), f"{which} reached the origin"
    assert tb.out("train", "sysctl", "-n", "net.ipv4.ip_forward").strip() != "1"


# ---- carriers


def test_every_carrier_reaches_its_cloud_end(tb: NetnsBed) -> None:
    for i in range(tb.carriers):
        assert tb.ping(i), f"car{i}"


def test_link_sh_cuts_and_restores_a_carrier(tb: NetnsBed) -> None:
    last = str(tb.carriers - 1)
    tb.sh("testbed/netns/link.sh", "down", last)
    assert not tb.ping(int(last), 1), "down did not cut it"
    if tb.carriers > 1:
        assert tb.ping(0), "down cut carrier 0 too"
    tb.sh("testbed/netns/link.sh", "up", last)
    assert tb.ping(int(last), 3), "up did not restore it"
    tb.sh("testbed/netns/link.sh", "drop", last)
    assert not tb.ping(int(last), 1), "drop did not blackhole it"
    tb.sh("testbed/netns/link.sh", "undrop", last)
    assert tb.ping(int(last)), "undrop did not restore it"


def test_kernel_mptcp_joins_the_other_carriers(tb: NetnsBed) -> None:
    """The subflow endpoints make the kernel join over the other carriers, on its
    own, for a connection opened over car0."""
    if tb.carriers < 2 or "MPTCP=1" not in (tb.state / "netns.env").read_text():
        pytest.skip("one carrier, or no kernel MPTCP")

    def joins() -> int:
        out = tb.out("train", "nstat", "-az", "MPTcpExtMPJoinSynAckRx").split()
        return int(out[out.index("MPTcpExtMPJoinSynAckRx") + 1])

    before = joins()
    sink = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            tb.ns("cloud"),
            "timeout",
            "20",
            "python3",
            PROBE,
            "mptcp-sink",
            "15099",
        ]
    )
    tb.ok("train", "timeout", "20", "python3", PROBE, "mptcp-source", "10.77.0.2", "15099")
    sink.wait(timeout=30)
    after = joins()
    print(f"MP_JOIN SYN/ACKs {before} -> {after}")
    assert after - before >= tb.carriers - 1


# ---- passenger interception


def test_passengers_are_intercepted_to_the_train(tb: NetnsBed) -> None:
    tb.sh("testbed/netns/intercept.sh", "add", "15001")
    tb.sh("testbed/netns/intercept.sh", "add", "15001")  # must stay a single rule
    rules = tb.out("train", "iptables", "-t", "nat", "-S", "PREROUTING")
    assert rules.count("REDIRECT --to-ports 15001") == 1, "intercept.sh add is not idempotent"
    out = tb.tmp / "origdst"
    listener = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            tb.ns("train"),
            "timeout",
            "10",
            "python3",
            PROBE,
            "origdst",
            "15001",
            str(out),
        ]
    )
    ready = Path(f"{out}.ready")
    wait_until("the listener", ready.exists, 5)
    body = tb.out("pax", "curl", "-fsS", "--max-time", "5", f"http://{ORIGIN}:80/")
    listener.wait(timeout=15)
    assert body == "intercepted"
    assert out.read_text().strip() == f"{ORIGIN}:80 from {PAX_ADDR}"
    udp = ("timeout", "5", "python3", str(NETNS / "udp_refused.py"), ORIGIN, "443")
    assert tb.ok("pax", *udp), "passenger UDP 443 (QUIC) is not refused at once"
    tb.sh("testbed/netns/intercept.sh", "del", "15001")
    assert "REDIRECT" not in tb.out("train", "iptables", "-t", "nat", "-S", "PREROUTING")
    assert not tb.ok("train", "nft", "list", "table", "inet", "pc_intercept")


# ---- teardown (last)


def test_down_leaves_nothing_and_is_idempotent(tb: NetnsBed) -> None:
    pids = tb.pids()
    assert len(pids) >= 4, f"the origin's processes were not running ({pids})"
    tb.sh("testbed/netns/down.sh")
    tb.sh("testbed/netns/down.sh")  # twice: must be a no-op
    left = [w for w in ("pax", "train", "cloud", "inet") if Path(f"/run/netns/{tb.ns(w)}").exists()]
    assert not left, f"namespaces left: {left}"
    alive = [p for p in pids if Path(f"/proc/{p}").exists()]
    assert not alive, f"processes left: {alive}"
    assert not list((tb.state / "run").glob("*.pid")), "pid files left"
