#!/usr/bin/env python3
"""Strangers flooding a listener: from each of N loopback source addresses,
a connection that never speaks (or sends the first bytes of a TLS record
and then nothing), opened again as soon as the listener closes it, until
SIGTERM. Prints one JSON line of counts when it stops.

usage: flood.py HOST PORT [--sources 100] [--first 127.3.0.1]

Loopback sources need no setup (127.0.0.0/8 is all local), so this runs in
the namespace of the listener it floods.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import signal
import socket
import sys

#: A TLS handshake record announcing 512 bytes, of which 9 are sent.
HALF_TLS = bytes([0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xFC])


async def stranger(
    host: str, port: int, source: str, half_tls: bool, counts: dict[str, int]
) -> None:
    loop = asyncio.get_running_loop()
    while True:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.bind((source, 0))
            await loop.sock_connect(s, (host, port))
            counts["opened"] += 1
            if half_tls:
                await loop.sock_sendall(s, HALF_TLS)
            # Held until the listener closes it.
            while await loop.sock_recv(s, 64):
                pass
            counts["closed_by_listener"] += 1
        except OSError:
            counts["errors"] += 1
        finally:
            s.close()
        await asyncio.sleep(0.05)


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("--sources", type=int, default=100)
    ap.add_argument("--first", default="127.3.0.1")
    a = ap.parse_args()
    counts = {"opened": 0, "closed_by_listener": 0, "errors": 0}
    first = ipaddress.IPv4Address(a.first)
    tasks = [
        asyncio.create_task(stranger(a.host, a.port, str(first + i), i % 2 == 1, counts))
        for i in range(a.sources)
    ]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    print(json.dumps(counts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
