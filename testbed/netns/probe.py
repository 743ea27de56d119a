#!/usr/bin/env python3
"""Small network probes the testbed's self-test (testbed/harness/suites/netns) runs
inside a namespace (``ip netns exec NS python3 probe.py ...``):

    probe.py echo HOST PORT            exit 0 when the echo server returns what it got
    probe.py mptcp-sink PORT           accept one MPTCP connection, read it to the end
    probe.py mptcp-source HOST PORT    send 20 MiB over MPTCP (retrying the connect)
    probe.py origdst PORT OUT          accept one connection, write its SO_ORIGINAL_DST
                                       and peer to OUT, answer "intercepted"; OUT.ready
                                       once listening
"""

import socket
import struct
import sys
import time
from pathlib import Path

SO_ORIGINAL_DST = 80


def echo(host: str, port: int) -> int:
    s = socket.create_connection((host, port), timeout=3)
    msg = b"hello from the train\n" * 100
    s.sendall(msg)
    s.shutdown(socket.SHUT_WR)
    got = b""
    while chunk := s.recv(65536):
        got += chunk
    return 0 if got == msg else 1


def mptcp_sink(port: int) -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_MPTCP)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))  # noqa: S104 (inside a testbed namespace)
    s.listen(1)
    c, _ = s.accept()
    while c.recv(1 << 16):
        pass
    return 0


def mptcp_source(host: str, port: int) -> int:
    for _ in range(50):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_MPTCP)
        try:
            s.connect((host, port))
            break
        except ConnectionRefusedError:
            s.close()
            time.sleep(0.1)
    else:
        return 1
    buf = b"x" * 65536
    for _ in range(320):  # 20 MiB
        s.sendall(buf)
    s.close()
    return 0


def origdst(port: int, out: str) -> int:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))  # noqa: S104 (inside a testbed namespace)
    s.listen(1)
    Path(out + ".ready").touch()
    c, peer = s.accept()
    raw = c.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    dport, addr = struct.unpack_from("!2xH4s", raw)
    Path(out).write_text(f"{socket.inet_ntoa(addr)}:{dport} from {peer[0]}\n")
    c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 11\r\n\r\nintercepted")
    c.close()
    return 0


def main(argv: list[str]) -> int:
    cmd, args = argv[0], argv[1:]
    if cmd == "echo":
        return echo(args[0], int(args[1]))
    if cmd == "mptcp-sink":
        return mptcp_sink(int(args[0]))
    if cmd == "mptcp-source":
        return mptcp_source(args[0], int(args[1]))
    if cmd == "origdst":
        return origdst(int(args[0]), args[1])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
