"""Passenger traffic of ``make bench-fleet``: the origin and the passengers (asyncio).

    python -m polycorn_benchrun.fleet_traffic origin --listen HOST:PORT [--fault corrupt|short]
    python -m polycorn_benchrun.fleet_traffic passengers --plan FILE --out FILE

The origin is the Internet the proxies connect to. A connection opens with a
17-byte header, ``kind u8 | key u64 | size u32 | rate u32`` (network order):

* ``B`` (bulk): the origin sends ``size`` bytes of :func:`pattern` for
  ``key`` at ``rate`` bytes/s (paced in chunks of a quarter second), then
  closes;
* ``C`` (chat): the origin echoes every 100-byte message until the client
  closes.

The passengers (one process for the whole fleet) reach each train's relay
through its SOCKS5 listener, from their own source addresses (127.x.y.z; the
relay tells passengers apart by address). Per train, ``bulk`` connections
download back to back (each download a fresh connection) and ``chat``
connections stay open and send a message after exponential gaps. Every byte
is checked: a download's bytes against :func:`pattern` of its key (so bytes
of another connection, a gap or a duplicate all fail) and its length; a chat
answer against the message. SIGTERM (or the plan's end) stops them; the
report (JSON) counts transfers, failures with their first errors, bytes per
second of the run, and the chat round trips.

``--fault`` seeds one broken transfer at the origin (a flipped byte, or a
download cut short by 1 KiB) so that the benchmark's check can be seen to fail.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import resource
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HEADER = struct.Struct("!cQII")
MSG = 100
BLOCK = random.Random(0x706F6C79636F726E).randbytes(1 << 20)  # noqa: S311 (test data)
KEY_STRIDE = 40_503


def pattern(key: int, offset: int, n: int) -> bytes:
    """Bytes ``offset .. offset + n`` of download ``key``: a 1 MiB random block, cyclic,
    entered at a place that depends on the key."""
    start = (key * KEY_STRIDE + offset) % len(BLOCK)
    out = BLOCK[start : start + n]
    while len(out) < n:
        out += BLOCK[: n - len(out)]
    return out


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# --------------------------------------------------------------------------- origin


class Origin:
    def __init__(self, fault: str | None) -> None:
        self.fault = fault
        self.faulted = False

    async def serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            kind, key, size, rate = HEADER.unpack(await r.readexactly(HEADER.size))
            if kind == b"B":
                await self.bulk(w, key, size, rate)
            elif kind == b"C":
                while True:
                    w.write(await r.readexactly(MSG))
                    await w.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            w.close()
            with contextlib.suppress(OSError):
                await w.wait_closed()

    async def bulk(self, w: asyncio.StreamWriter, key: int, size: int, rate: int) -> None:
        chunk = max(1024, min(16_384, rate // 4))
        loop = asyncio.get_running_loop()
        due = loop.time()
        fault, self.faulted = (self.fault, True) if not self.faulted else (None, True)
        if fault == "short":
            size -= min(size, 1024)
        sent = 0
        while sent < size:
            n = min(chunk, size - sent)
            data = pattern(key, sent, n)
            if fault == "corrupt" and sent == 0:
                data = bytes([data[0] ^ 0xFF]) + data[1:]
            w.write(data)
            await w.drain()
            sent += n
            due += n / rate
            await asyncio.sleep(max(0.0, due - loop.time()))


async def origin_main(listen: str, fault: str | None) -> None:
    host, port = listen.rsplit(":", 1)
    origin = Origin(fault)
    server = await asyncio.start_server(origin.serve, host, int(port), backlog=4096)
    print(f"listening on {listen}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


# --------------------------------------------------------------------------- passengers


@dataclass
class TrainStats:
    bulk_done: int = 0
    bulk_bytes: int = 0
    bulk_failed: int = 0
    bulk_cut_at_end: int = 0
    chat_ok: int = 0
    chat_failed: int = 0
    corrupt: int = 0
    errors: list[str] = field(default_factory=list)

    def fail(self, what: str) -> None:
        if len(self.errors) < 10:
            self.errors.append(what)


class TransferError(Exception):
    pass


class Passengers:
    def __init__(self, plan: dict[str, Any]) -> None:
        self.plan = plan
        self.origin_host, port = plan["origin"].rsplit(":", 1)
        self.origin_port = int(port)
        self.stats = [TrainStats() for _ in plan["trains"]]
        self.t0 = time.monotonic()
        self.bytes_per_s: list[int] = []
        self.rtts_ms: list[float] = []
        self.stop = asyncio.Event()
        self.keys = 0
        self.loop_lags_ms: list[float] = []

    async def watch_loop(self) -> None:
        """How late the event loop wakes up: a starved load generator cannot offer its load."""
        while not self.stop.is_set():
            t = time.monotonic()
            await asyncio.sleep(0.1)
            self.loop_lags_ms.append((time.monotonic() - t - 0.1) * 1000)

    def count_bytes(self, n: int) -> None:
        s = int(time.monotonic() - self.t0)
        while len(self.bytes_per_s) <= s:
            self.bytes_per_s.append(0)
        self.bytes_per_s[s] += n

    async def connect(
        self, socks: str, source: str
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        host, port = socks.rsplit(":", 1)
        r, w = await asyncio.open_connection(host, int(port), local_addr=(source, 0))
        sock = w.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        w.write(b"\x05\x01\x00")
        if await r.readexactly(2) != b"\x05\x00":
            raise TransferError("SOCKS5: no acceptable method")
        w.write(
            b"\x05\x01\x00\x01"
            + socket.inet_aton(self.origin_host)
            + struct.pack("!H", self.origin_port)
        )
        rep = await r.readexactly(4)
        if rep[1] != 0:
            raise TransferError(f"SOCKS5: CONNECT refused, reply {rep[1]}")
        await r.readexactly({1: 6, 4: 18}.get(rep[3], 6))
        return r, w

    async def bulk_worker(self, ti: int, socks: str, source: str, delay: float) -> None:
        st = self.stats[ti]
        size, rate = int(self.plan["bulk_size"]), int(self.plan["bulk_rate"])
        await asyncio.sleep(delay)
        while not self.stop.is_set():
            self.keys += 1
            key = self.keys
            got = 0
            w: asyncio.StreamWriter | None = None
            try:
                r, w = await self.connect(socks, source)
                w.write(HEADER.pack(b"B", key, size, rate))
                while True:
                    data = await r.read(65_536)
                    if not data:
                        break
                    if got + len(data) > size or data != pattern(key, got, len(data)):
                        st.corrupt += 1
                        raise TransferError(
                            f"bulk {key}: bytes {got}..{got + len(data)} differ from the origin's"
                        )
                    got += len(data)
                    st.bulk_bytes += len(data)
                    self.count_bytes(len(data))
                if got != size:
                    raise TransferError(f"bulk {key}: {got} of {size} bytes, then EOF")
                st.bulk_done += 1
            except asyncio.CancelledError:
                if w is not None:
                    st.bulk_cut_at_end += 1
                raise
            except (OSError, asyncio.IncompleteReadError, TransferError) as e:
                if self.stop.is_set():
                    st.bulk_cut_at_end += 1
                    return
                st.bulk_failed += 1
                st.fail(f"{time.monotonic() - self.t0:.1f}s {type(e).__name__}: {e}")
                await asyncio.sleep(0.5)
            finally:
                if w is not None:
                    w.close()

    async def chat_worker(
        self, ti: int, socks: str, source: str, delay: float, rng: random.Random
    ) -> None:
        st = self.stats[ti]
        gap = float(self.plan["chat_gap_s"])
        await asyncio.sleep(delay)
        w: asyncio.StreamWriter | None = None
        seq = 0
        try:
            r, w = await self.connect(socks, source)
            w.write(HEADER.pack(b"C", 0, 0, 0))
            while not self.stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), rng.expovariate(1 / gap))
                if self.stop.is_set():
                    break
                seq += 1
                msg = struct.pack("!IQ", ti, seq) + pattern(seq, ti, MSG - 12)
                t = time.monotonic()
                w.write(msg)
                back = await r.readexactly(MSG)
                if back != msg:
                    st.corrupt += 1
                    raise TransferError(f"chat {ti}/{seq}: the answer differs")
                self.rtts_ms.append((time.monotonic() - t) * 1000)
                st.chat_ok += 1
        except asyncio.CancelledError:
            raise
        except (OSError, asyncio.IncompleteReadError, TransferError) as e:
            if not self.stop.is_set():
                st.chat_failed += 1
                st.fail(f"{time.monotonic() - self.t0:.1f}s chat {type(e).__name__}: {e}")
        finally:
            if w is not None:
                w.close()

    async def run(self) -> dict[str, Any]:
        p = self.plan
        rng = random.Random(p.get("seed", 1))  # noqa: S311
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)
        tasks: list[asyncio.Task[None]] = [asyncio.create_task(self.watch_loop())]
        ramp = float(p["ramp_s"])
        for ti, t in enumerate(p["trains"]):
            for c in range(int(p["conns"])):
                source = t["sources"][c % len(t["sources"])]
                delay = rng.uniform(0, ramp)
                if c < int(p["bulk"]):
                    tasks.append(
                        asyncio.create_task(self.bulk_worker(ti, t["socks"], source, delay))
                    )
                else:
                    crng = random.Random(rng.getrandbits(64))  # noqa: S311
                    tasks.append(
                        asyncio.create_task(self.chat_worker(ti, t["socks"], source, delay, crng))
                    )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), float(p["seconds"]))
        self.stop.set()
        # Chat workers leave at once; a download in flight is cut (its bytes so far
        # were checked) and counted apart.
        await asyncio.sleep(0.2)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return {
            "seconds": round(time.monotonic() - self.t0, 2),
            "trains": [vars(s) for s in self.stats],
            "bulk_bytes_per_s": self.bytes_per_s,
            "chat_rtt_ms": [round(x, 2) for x in self.rtts_ms],
            "loop_lag_ms": [round(x, 1) for x in self.loop_lags_ms],
        }


def passengers_main(plan_path: Path, out: Path) -> None:
    raise_nofile()
    plan = json.loads(plan_path.read_text())
    report = asyncio.run(Passengers(plan).run())
    out.write_text(json.dumps(report) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("origin")
    o.add_argument("--listen", required=True)
    o.add_argument("--fault", choices=["corrupt", "short"])
    ps = sub.add_parser("passengers")
    ps.add_argument("--plan", type=Path, required=True)
    ps.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    if a.cmd == "origin":
        raise_nofile()
        asyncio.run(origin_main(a.listen, a.fault))
    else:
        passengers_main(a.plan, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
