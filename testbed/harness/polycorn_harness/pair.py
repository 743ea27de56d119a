"""A relay/proxy pair on the bare namespace testbed (veth carriers, no link
emulator): ``testbed/netns/pair.sh`` does the plumbing, this module drives
it and reads what it needs (metrics, logs, the origin's files)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from polycorn_harness import ROOT, metrics
from polycorn_harness.topology import ORIGIN as ORIGIN_ADDR
from polycorn_harness.topology import PROXY_METRICS, RELAY_METRICS, run, scrape
from polycorn_harness.wait import wait_until

PAIR = ROOT / "testbed" / "netns" / "pair.sh"
LINK = ROOT / "testbed" / "netns" / "link.sh"
#: As testbed/netns/lib-pair.sh and testbed/netns/lib.sh give them.
RELAY_SOCKS = "10.66.0.1:1080"
LAN_ADDR = "10.66.0.1"
ORIGIN = f"http://{ORIGIN_ADDR}"

__all__ = ["LAN_ADDR", "ORIGIN", "ORIGIN_ADDR", "RELAY_SOCKS", "Pair", "sha256"]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Pair:
    """The pair under ``prefix`` with ``carriers`` carriers."""

    prefix: str
    bin_dir: Path
    carriers: int = 2

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PC_PREFIX": self.prefix,
            "PC_CARRIERS": str(self.carriers),
            "BIN": str(self.bin_dir),
        }

    def _pair(self, *args: str, timeout: float = 120) -> None:
        run([str(PAIR), *args], env=self.env(), timeout=timeout)

    @property
    def state(self) -> Path:
        return Path(f"/tmp/polycorn-state-{self.prefix}")

    def ns(self, which: str) -> str:
        """The namespace ``pax``, ``train`` or ``cloud``."""
        return f"{self.prefix}-{which}"

    def up(self) -> Pair:
        """Namespaces, origin, PKI, the proxy and the main relay started."""
        self._pair("up", timeout=300)
        return self

    def up_bare(self) -> Pair:
        """Namespaces, origin and PKI; no proxy or relay yet."""
        self._pair("up-bare", timeout=300)
        return self

    def down(self) -> None:
        self._pair("down")

    def start_proxy(self, *args: str) -> None:
        self._pair("start-proxy", *args)

    def start_main_relay(self, *args: str) -> None:
        self._pair("start-main-relay", *args)

    def start_relay(self, name: str, train: str, *args: str) -> None:
        self._pair("start-relay", name, train, *args)

    def stop(self, name: str) -> None:
        self._pair("stop", name)

    def pid(self, name: str) -> int:
        return int((self.state / "run" / f"{name}.pid").read_text())

    def link(self, op: str, carrier: int) -> None:
        """``link.sh OP CARRIER`` (down, up, drop, undrop)."""
        run([str(LINK), op, str(carrier)], env=self.env())

    def exec(
        self, which: str, cmd: Sequence[str], *, timeout: float = 120, check: bool = True
    ) -> subprocess.CompletedProcess[bytes]:
        """``cmd`` inside namespace ``which``; its output as bytes."""
        return subprocess.run(
            ["ip", "netns", "exec", self.ns(which), *cmd],
            cwd=ROOT,
            capture_output=True,
            timeout=timeout,
            check=check,
        )

    def metrics_text(self, which: str, addr: str) -> str | None:
        """``/metrics`` at ``addr`` in namespace ``which``; ``None`` when it does not answer."""
        return scrape(self.ns(which), addr, timeout_s=2)

    def relay_metrics(self) -> str | None:
        return self.metrics_text("train", RELAY_METRICS)

    def proxy_metrics(self) -> str | None:
        return self.metrics_text("cloud", PROXY_METRICS)

    def paths_up(self) -> int:
        """Subflows the relay reports up (0 while it does not answer)."""
        text = self.relay_metrics()
        if text is None:
            return 0
        return sum(
            1 for s in metrics.samples(text) if s.name == "polycorn_path_up" and s.value == 1
        )

    def wait_paths_up(self, n: int | None = None, timeout_s: float = 10) -> int:
        """Until the relay reports ``n`` (every carrier's) subflows up."""
        want = self.carriers if n is None else n
        return wait_until(
            f"{want} subflow(s) up", lambda: self.paths_up() >= want and want, timeout_s
        )

    def log_lines(self, name: str) -> list[str]:
        p = self.state / "logs" / f"{name}.log"
        return p.read_text(errors="replace").splitlines() if p.exists() else []

    def origin_file(self, name: str) -> bytes:
        return (self.state / "origin" / "www" / "files" / name).read_bytes()

    def start_download(
        self, path: str, *, rate: str, out: Path | str = "/dev/null", timeout_s: int = 120
    ) -> subprocess.Popen[bytes]:
        """A passenger's ``curl`` of the origin's ``path`` at ``rate`` (curl's
        ``--limit-rate``), in the background, into ``out``."""
        return subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                self.ns("pax"),
                "curl",
                "-fsS",
                "--max-time",
                str(timeout_s),
                "--limit-rate",
                rate,
                "-o",
                str(out),
                f"{ORIGIN}{path}",
            ]
        )

    def download(self, path: str, *curl_args: str, timeout: float = 120) -> bytes:
        """A passenger's ``curl`` of the origin's ``path``; fails on an HTTP or transfer error."""
        return self.exec(
            "pax",
            ["curl", "-fsS", "--max-time", str(int(timeout)), *curl_args, f"{ORIGIN}{path}"],
            timeout=timeout + 30,
        ).stdout
