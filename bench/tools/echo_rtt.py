#!/usr/bin/env python3
"""Request/response latency: N sequential round trips of SIZE bytes on one
TCP connection to an echo server; prints one JSON object (microseconds).

usage: echo_rtt.py HOST PORT [--count 2000] [--size 100] [--warmup 50]

Each round trip is: send SIZE bytes, read until all SIZE bytes are back.
TCP_NODELAY is set, so every request leaves at once. The first WARMUP round
trips (connection set-up, caches) are not counted.
"""

import argparse
import json
import socket
import sys
import time


def percentile(sorted_us: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_us:
        raise ValueError("no samples")
    rank = max(1, min(len(sorted_us), round(p / 100 * len(sorted_us) + 0.5)))
    return sorted_us[rank - 1]


def round_trip(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(payload)
    got = 0
    while got < len(payload):
        chunk = sock.recv(len(payload) - got)
        if not chunk:
            raise ConnectionError("echo server closed the connection")
        got += len(chunk)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds, per socket operation")
    args = ap.parse_args()

    payload = bytes(i % 251 for i in range(args.size))
    samples: list[float] = []
    with socket.create_connection((args.host, args.port), timeout=args.timeout) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(args.warmup):
            round_trip(sock, payload)
        for _ in range(args.count):
            t0 = time.perf_counter_ns()
            round_trip(sock, payload)
            samples.append((time.perf_counter_ns() - t0) / 1000)
    samples.sort()
    out = {
        "count": len(samples),
        "size_bytes": args.size,
        "p50_us": round(percentile(samples, 50), 1),
        "p90_us": round(percentile(samples, 90), 1),
        "p99_us": round(percentile(samples, 99), 1),
        "min_us": round(samples[0], 1),
        "max_us": round(samples[-1], 1),
        "mean_us": round(sum(samples) / len(samples), 1),
    }
    json.dump(out, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
