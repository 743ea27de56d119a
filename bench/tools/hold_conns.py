#!/usr/bin/env python3
"""Open N TCP connections to an echo server, check each end to end with a
one-byte echo, print one JSON line, then hold them all open, idle, until
SIGTERM/SIGINT (or --hold seconds pass).

usage: hold_conns.py HOST PORT [--count 1000] [--hold 120]

The JSON line ({"opened": N, "echoed": M, "seconds": S}) is the signal that
every connection is up: the caller then measures, and stops this process.
"""

import argparse
import json
import resource
import signal
import socket
import sys
import time


def raise_nofile(want: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--hold", type=float, default=120.0, help="seconds to hold at most")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds, per socket operation")
    args = ap.parse_args()

    raise_nofile(max(8192, args.count + 64))
    stop = False

    def on_signal(_sig: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    t0 = time.monotonic()
    socks: list[socket.socket] = []
    for _ in range(args.count):
        s = socket.create_connection((args.host, args.port), timeout=args.timeout)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        socks.append(s)
    # All requests first, then all answers: the round trips overlap.
    for s in socks:
        s.sendall(b"x")
    echoed = 0
    for s in socks:
        if s.recv(1) == b"x":
            echoed += 1
    print(json.dumps({"opened": len(socks), "echoed": echoed, "seconds": round(time.monotonic() - t0, 2)}), flush=True)

    deadline = time.monotonic() + args.hold
    while not stop and time.monotonic() < deadline:
        time.sleep(0.1)
    for s in socks:
        s.close()
    return 0 if echoed == args.count else 1


if __name__ == "__main__":
    sys.exit(main())
