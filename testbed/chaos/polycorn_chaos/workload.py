"""The passengers of an episode: downloads with known sha256, and chat.

Downloads are curl in the passengers' namespace to the origin's files
(testbed/origin/make-files.sh), caught by the relay's transparent capture;
each passenger has its own source address (topology.sh adds 10.66.0.100-163),
so the relay sees distinct passengers. The body is hashed as it arrives.
Chat is polycorn-loadgen im against the origin's IM server: one record per
message, answered or failed with a reason.
"""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from polycorn_chaos.checks import HANG_S, Transfer
from polycorn_chaos.plan import Workload
from polycorn_chaos.testbed import Testbed
from polycorn_harness import ROOT

ORIGIN = "10.99.0.10"
IM_PORT = 7100
CURL_MAX_TIME_S = 25


def download(tb: Testbed, source: str, name: str, max_time_s: float = CURL_MAX_TIME_S) -> Transfer:
    cmd = [
        "ip",
        "netns",
        "exec",
        tb.s.ns_pax,
        "curl",
        "-sS",
        "--fail",
        "--interface",
        source,
        "--connect-timeout",
        "8",
        "--max-time",
        str(max_time_s),
        "-o",
        "-",
        f"http://{ORIGIN}/files/{name}",
    ]
    h = hashlib.sha256()
    size = 0
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    while chunk := p.stdout.read(1 << 16):
        h.update(chunk)
        size += len(chunk)
    err = p.stderr.read().decode(errors="replace").strip()
    rc = p.wait()
    return Transfer(source, name, rc, h.hexdigest(), size, err[-200:])


class Downloader(threading.Thread):
    """One passenger fetching files one after another until its window ends."""

    def __init__(
        self, tb: Testbed, source: str, files: tuple[str, ...], window_s: float, seed: int
    ):
        super().__init__(daemon=True)
        self.tb, self.source, self.files = tb, source, files
        self.until = time.monotonic() + window_s
        self.rng = random.Random(seed)
        self.transfers: list[Transfer] = []

    def run(self) -> None:
        while time.monotonic() < self.until:
            t = download(self.tb, self.source, self.rng.choice(self.files))
            self.transfers.append(t)
            if t.exit_code != 0:
                time.sleep(0.5)  # a passenger retries, but not in a tight loop


class Passengers:
    """The workload of one episode, started at once and collected by ``finish``."""

    def __init__(self, tb: Testbed, w: Workload, seed: int, out: Path):
        self.tb, self.w = tb, w
        self.downloaders = [
            Downloader(tb, f"10.66.0.{100 + i}", w.files, w.window_s, seed * 31 + i)
            for i in range(w.downloaders)
        ]
        trip_s = (time.time() * 1000 - tb.epoch_ms) / 1000
        start_s = int(trip_s) + 1
        # Room for the messages, for the faults to delay them, and for a
        # message left without reply or error to show as hanging (checks.py).
        deadline_s = start_s + int(w.window_s) + HANG_S + 5
        self.deadline_ms = deadline_s * 1000.0
        self.chat_out = out
        out.unlink(missing_ok=True)
        self.chat = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                tb.s.ns_pax,
                str(tb.s.bin / "polycorn-loadgen"),
                "im",
                "--server",
                f"{ORIGIN}:{IM_PORT}",
                "--epoch-unix-ms",
                str(tb.epoch_ms),
                "--seed",
                str(seed),
                "--users",
                str(w.chat_users),
                "--messages",
                str(w.chat_messages),
                "--mean-gap-ms",
                str(w.chat_gap_ms),
                "--start-s",
                str(start_s),
                "--deadline-s",
                str(deadline_s),
                "--out",
                str(out),
                "--source-base",
                "10.66.0.120",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=ROOT,
        )
        self.chat_bound_s = deadline_s - trip_s + 30
        for d in self.downloaders:
            d.start()

    def finish(self) -> tuple[list[Transfer], list[dict[str, Any]], str]:
        """Transfers, chat records and what went wrong with the tools themselves."""
        problems = []
        for d in self.downloaders:
            d.join(timeout=self.w.window_s + CURL_MAX_TIME_S + 30)
            if d.is_alive():
                problems.append(f"downloader {d.source} still running")
        try:
            _, err = self.chat.communicate(timeout=max(self.chat_bound_s, 5))
            if self.chat.returncode != 0:
                problems.append(f"loadgen im exited {self.chat.returncode}: {err.decode()[-300:]}")
        except subprocess.TimeoutExpired:
            self.chat.kill()
            self.chat.wait()
            problems.append("loadgen im overran its deadline")
        records = []
        if self.chat_out.is_file():
            for line in self.chat_out.read_text().splitlines():
                if line.strip():
                    records.append(json.loads(line))
        transfers = [t for d in self.downloaders for t in d.transfers]
        return transfers, records, "; ".join(problems)
