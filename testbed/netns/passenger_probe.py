#!/usr/bin/env python3
"""Probes of what a passenger can reach, and the services they probe; run
inside a testbed namespace (``ip netns exec NS python3 passenger_probe.py ...``)
by the passenger probe suite (polycorn_harness.probes). Standard library only.

    passenger_probe.py listen SPEC...   serve until killed: SPEC is tcp:HOST:PORT
                                        (answers "open" to every connection) or
                                        udp:HOST:PORT (echoes every datagram); an
                                        IPv6 HOST in brackets. Prints "ready" once
                                        all listen.
    passenger_probe.py probe            probes read as JSON from stdin (a list of
                                        {"name", "via", "host", "port"[, "socks"]},
                                        via "tcp", "udp" or "socks5"), all at once;
                                        prints one JSON result per probe, in order:
                                        {"name", "result", "answered"}

A probe answered when the target sent application bytes back; every other
outcome (reset, refusal, ICMP unreachable, a SOCKS5 error reply, a close
without data, silence) is a refusal, named in "result".
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import struct
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

TIMEOUT_S = 4.0


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _parse_spec(spec: str) -> tuple[str, str, int]:
    proto, rest = spec.split(":", 1)
    host, port = rest.rsplit(":", 1)
    return proto, host.strip("[]"), int(port)


def listen(specs: list[str]) -> int:
    socks: list[tuple[str, socket.socket]] = []
    for spec in specs:
        proto, host, port = _parse_spec(spec)
        kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
        s = socket.socket(_family(host), kind)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if ":" in host:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.bind((host, port))
        if proto == "tcp":
            s.listen(64)
        socks.append((proto, s))

    def serve_tcp(s: socket.socket) -> None:
        while True:
            c, _ = s.accept()
            with contextlib.suppress(OSError):
                c.sendall(b"open\n")
            c.close()

    def serve_udp(s: socket.socket) -> None:
        while True:
            data, peer = s.recvfrom(2048)
            s.sendto(data, peer)

    for proto, s in socks:
        target = serve_tcp if proto == "tcp" else serve_udp
        threading.Thread(target=target, args=(s,), daemon=True).start()
    print("ready", flush=True)
    threading.Event().wait()
    return 0


def _recv_some(s: socket.socket) -> str:
    try:
        data = s.recv(64)
    except TimeoutError:
        return "silent"
    except ConnectionResetError:
        return "reset"
    except OSError as e:
        return f"error {e.strerror}"
    return "answered" if data else "closed without data"


def _connect(host: str, port: int) -> socket.socket:
    s = socket.socket(_family(host), socket.SOCK_STREAM)
    s.settimeout(TIMEOUT_S)
    try:
        s.connect((host, port))
    except BaseException:
        s.close()
        raise
    return s


def probe_tcp(host: str, port: int) -> str:
    try:
        s = _connect(host, port)
    except ConnectionRefusedError:
        return "refused (reset)"
    except TimeoutError:
        return "silent (connect timed out)"
    except OSError as e:
        return f"unreachable ({e.strerror})"
    with s:
        return _recv_some(s)


def probe_udp(host: str, port: int) -> str:
    with socket.socket(_family(host), socket.SOCK_DGRAM) as s:
        s.settimeout(TIMEOUT_S)
        try:
            s.connect((host, port))
            s.send(b"probe")
            return "answered" if s.recv(2048) else "closed without data"
        except ConnectionRefusedError:
            return "refused (ICMP port unreachable)"
        except TimeoutError:
            return "silent"
        except OSError as e:
            return f"unreachable ({e.strerror})"


def _socks_request(host: str, port: int) -> bytes:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        name = host.encode()
        return bytes([5, 1, 0, 3, len(name)]) + name + struct.pack("!H", port)
    atyp = 1 if ip.version == 4 else 4
    return bytes([5, 1, 0, atyp]) + ip.packed + struct.pack("!H", port)


def _read_exact(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionResetError("closed")
        out += chunk
    return out


def probe_socks5(socks: str, host: str, port: int) -> str:
    shost, sport = socks.rsplit(":", 1)
    try:
        s = _connect(shost, int(sport))
    except OSError as e:
        return f"SOCKS5 server unreachable ({e})"
    with s:
        try:
            s.sendall(b"\x05\x01\x00")
            if _read_exact(s, 2) != b"\x05\x00":
                return "SOCKS5 greeting refused"
            s.sendall(_socks_request(host, port))
            reply = _read_exact(s, 10)
        except TimeoutError:
            return "silent (SOCKS5 handshake)"
        except OSError as e:
            return f"refused (SOCKS5 closed: {e})"
        if reply[1] != 0:
            return f"refused (SOCKS5 reply {reply[1]:#04x})"
        return _recv_some(s)


def run_probe(p: dict[str, Any]) -> dict[str, Any]:
    via, host, port = p["via"], str(p["host"]), int(p["port"])
    if via == "tcp":
        result = probe_tcp(host, port)
    elif via == "udp":
        result = probe_udp(host, port)
    elif via == "socks5":
        result = probe_socks5(str(p["socks"]), host, port)
    else:
        result = f"unknown probe kind {via!r}"
    return {"name": p["name"], "result": result, "answered": result == "answered"}


def probe() -> int:
    probes: list[dict[str, Any]] = json.load(sys.stdin)
    with ThreadPoolExecutor(max_workers=32) as pool:
        for r in pool.map(run_probe, probes):
            print(json.dumps(r), flush=True)
    return 0


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[1] == "listen":
        return listen(argv[2:])
    if len(argv) == 2 and argv[1] == "probe":
        return probe()
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
