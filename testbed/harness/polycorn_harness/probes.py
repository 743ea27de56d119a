"""The passenger probe suite: from the passenger namespace of a running pair,
everything a passenger must not reach is probed, directly (the relay's
transparent capture, or the train's own addresses) and through the relay's
SOCKS5 (literal addresses and names), and each probe is named with its
outcome: the train's own services (on its LAN and carrier addresses), the
proxy host's own addresses, every loopback, unspecified, mapped, compatible,
6to4 and NAT64 spelling of them, cloud metadata addresses, and the private
ranges a cluster uses.

Every target is made to answer if it is reached: :func:`targets` starts
listeners on the train (its LAN and carrier addresses) and on the proxy's
host (on all of its addresses, to which it adds the metadata and private
ones), and checks from inside each namespace that they answer; names that
resolve to the targets are served by the origin's resolver
(``testbed/origin/start.sh``). Passenger IPv6 has no route in the testbed,
so IPv6 targets are probed through SOCKS5 only, and loopback forms too (a
passenger's own loopback is its own)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

from polycorn_harness import ROOT
from polycorn_harness.pair import LAN_ADDR, RELAY_SOCKS, Pair

PROBE = ROOT / "testbed" / "netns" / "passenger_probe.py"
#: The port of every stand-in service on the proxy's host.
CLOUD_PORT = 8089
#: The proxy's metrics (testbed/netns/lib-pair.sh), on its loopback.
PROXY_METRICS_PORT = 9464
#: Stand-ins for the train's own services on its LAN address: ssh, gpsd, the
#: relay's metrics port; and a UDP one (SNMP).
TRAIN_TCP = {"ssh": 22, "gpsd": 2947, "relay metrics": 9465}
TRAIN_UDP = {"snmp": 161}
#: The modem manager's web UI on each carrier's address.
MODEM_UI_PORT = 8089
#: Cloud metadata and cluster-private addresses added to the proxy's host.
METADATA = ("169.254.169.254", "fd00:ec2::254")
PRIVATE = ("10.0.0.1", "172.16.0.1", "192.168.0.1", "100.64.0.1", "fd00::1")
#: Names the origin's resolver gives these addresses (testbed/origin/start.sh).
NAMES = {
    "loopback.test": "127.0.0.1 and ::1",
    "metadata.test": "169.254.169.254",
    "private.test": "10.0.0.1",
    "proxy-host.test": "10.99.0.1",
}

__all__ = ["Probe", "Result", "catalogue", "run", "targets"]


@dataclass(frozen=True)
class Probe:
    """One thing a passenger tries: ``via`` is ``tcp`` or ``udp`` (straight
    from the passenger) or ``socks5`` (through the relay's SOCKS5)."""

    name: str
    via: str
    host: str
    port: int

    @property
    def target(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.via}://{host}:{self.port}"

    def as_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "via": self.via,
            "host": self.host,
            "port": self.port,
            "socks": RELAY_SOCKS,
        }


@dataclass(frozen=True)
class Result:
    probe: Probe
    result: str
    answered: bool

    def line(self) -> str:
        verdict = "ANSWERED" if self.answered else "refused"
        return f"{verdict:8}  {self.probe.name:58}  {self.probe.target:38}  {self.result}"


def _v4(host: str) -> bool:
    return ":" not in host


def catalogue(carriers: int, proxy_host: list[str]) -> list[Probe]:
    """Every probe, for a pair with ``carriers`` carriers whose proxy's host
    has the addresses ``proxy_host`` (the origin's excluded)."""
    out: list[Probe] = []
    for svc, port in TRAIN_TCP.items():
        out.append(Probe(f"train {svc} on its LAN address", "tcp", LAN_ADDR, port))
    for svc, port in TRAIN_UDP.items():
        out.append(Probe(f"train {svc} (UDP) on its LAN address", "udp", LAN_ADDR, port))
    for i in range(carriers):
        out.append(
            Probe(f"modem web UI on carrier {i}'s address", "tcp", f"10.77.{i}.1", MODEM_UI_PORT)
        )
    for addr in proxy_host:
        if _v4(addr):
            out.append(Probe(f"proxy host's own {addr}, captured", "tcp", addr, CLOUD_PORT))
        out.append(Probe(f"proxy host's own {addr}, SOCKS5", "socks5", addr, CLOUD_PORT))
    for addr in (a for a in proxy_host if _v4(a)):
        a, b, c, d = (int(x) for x in addr.split("."))
        out.append(Probe(f"proxy host's {addr}, mapped", "socks5", f"::ffff:{addr}", CLOUD_PORT))
        nat64 = f"64:ff9b::{a << 8 | b:x}:{c << 8 | d:x}"
        out.append(Probe(f"proxy host's {addr}, NAT64", "socks5", nat64, CLOUD_PORT))
    loopback = {
        "loopback": "127.0.0.1",
        "loopback, another 127/8 address": "127.0.0.2",
        "IPv6 loopback": "::1",
        "loopback, IPv4-mapped": "::ffff:127.0.0.1",
        "loopback, IPv4-compatible": "::127.0.0.1",
        "loopback, NAT64": "64:ff9b::7f00:1",
        "loopback, 6to4": "2002:7f00:1::1",
        "unspecified": "0.0.0.0",  # noqa: S104 (a destination probed, not bound)
        "IPv6 unspecified": "::",
        "unspecified, IPv4-mapped": "::ffff:0.0.0.0",
    }
    for what, addr in loopback.items():
        out.append(Probe(f"proxy host's {what}", "socks5", addr, CLOUD_PORT))
    out.append(Probe("proxy's metrics on its loopback", "socks5", "127.0.0.1", PROXY_METRICS_PORT))
    for addr in METADATA + PRIVATE:
        kind = "metadata" if addr in METADATA else "cluster-private"
        if _v4(addr):
            out.append(Probe(f"{kind} {addr}, captured", "tcp", addr, CLOUD_PORT))
        out.append(Probe(f"{kind} {addr}, SOCKS5", "socks5", addr, CLOUD_PORT))
    for name, what in NAMES.items():
        out.append(Probe(f"name {name} ({what}), SOCKS5", "socks5", name, CLOUD_PORT))
    return out


def _run_probes(pair: Pair, which: str, probes: list[Probe]) -> list[Result]:
    payload = json.dumps([p.as_json() for p in probes]).encode()
    cmd = ["ip", "netns", "exec", pair.ns(which), sys.executable, str(PROBE), "probe"]
    out = subprocess.run(cmd, input=payload, capture_output=True, timeout=60, check=True)
    rows = [json.loads(line) for line in out.stdout.decode().splitlines() if line.strip()]
    assert len(rows) == len(probes), out.stderr.decode()
    return [
        Result(p, str(r["result"]), bool(r["answered"])) for p, r in zip(probes, rows, strict=True)
    ]


def run(pair: Pair, probes: list[Probe]) -> list[Result]:
    """Each probe from the passenger namespace, all at once."""
    return _run_probes(pair, "pax", probes)


def proxy_host_addresses(pair: Pair) -> list[str]:
    """The proxy host's own global addresses (loopback and link-local aside,
    probed on their own), without those :func:`targets` adds."""
    out = pair.exec("cloud", ["ip", "-j", "addr", "show"]).stdout
    added = {*METADATA, *PRIVATE}
    addrs: list[str] = []
    for link in json.loads(out):
        for a in link.get("addr_info", []):
            local = a["local"]
            if a.get("scope") == "global" and local not in added:
                addrs.append(local)
    return sorted(set(addrs))


def _listen(pair: Pair, which: str, specs: list[str]) -> subprocess.Popen[bytes]:
    cmd = ["ip", "netns", "exec", pair.ns(which), sys.executable, str(PROBE), "listen", *specs]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != b"ready":
        proc.kill()
        _, err = proc.communicate(timeout=10)
        raise AssertionError(f"listeners in {which} did not start: {err.decode()}")
    return proc


@contextlib.contextmanager
def targets(pair: Pair) -> Iterator[list[str]]:
    """Stand-in services on the train and the proxy's host, and the metadata
    and private addresses on the latter, for the duration; yields the proxy
    host's addresses. Each service is first seen to answer inside its own
    namespace, so a refusal seen by the passenger is the refusal's doing."""
    extra = [*METADATA, *PRIVATE]
    for addr in extra:
        plen = 128 if ":" in addr else 32
        pair.exec("cloud", ["ip", "addr", "add", f"{addr}/{plen}", "dev", "lo"])
    procs: list[subprocess.Popen[bytes]] = []
    try:
        train = [f"tcp:{LAN_ADDR}:{p}" for p in TRAIN_TCP.values()]
        train += [f"udp:{LAN_ADDR}:{p}" for p in TRAIN_UDP.values()]
        train += [f"tcp:10.77.{i}.1:{MODEM_UI_PORT}" for i in range(pair.carriers)]
        procs.append(_listen(pair, "train", train))
        procs.append(
            _listen(pair, "cloud", [f"tcp:0.0.0.0:{CLOUD_PORT}", f"tcp:[::]:{CLOUD_PORT}"])
        )
        host = proxy_host_addresses(pair)
        # Controls: every stand-in answers where it runs.
        controls = {
            "train": [Probe(s.replace(":", " ", 1), s[:3], *_host_port(s[4:])) for s in train],
            "cloud": [
                Probe(f"cloud {a}", "tcp", a, CLOUD_PORT)
                for a in [*host, *extra, "127.0.0.1", "::1"]
            ],
        }
        for which, probes in controls.items():
            silent = [r.line() for r in _run_probes(pair, which, probes) if not r.answered]
            assert not silent, f"stand-in services do not answer in {which}:\n" + "\n".join(silent)
        yield host
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)
        for addr in extra:
            plen = 128 if ":" in addr else 32
            pair.exec("cloud", ["ip", "addr", "del", f"{addr}/{plen}", "dev", "lo"], check=False)


def _host_port(hp: str) -> tuple[str, int]:
    host, port = hp.rsplit(":", 1)
    return host.strip("[]"), int(port)
