#!/usr/bin/env python3
"""Exit 0 when a UDP datagram to HOST:PORT is refused at once (ICMP port
unreachable), 1 otherwise. The testbed's checks that passenger QUIC is
rejected, so apps fall back to TCP instead of waiting for a timeout."""
import socket
import sys


def main() -> int:
    host, port = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 443
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(2)
    s.connect((host, port))
    s.send(b"quic?")
    try:
        s.recv(16)
    except ConnectionRefusedError:
        return 0
    except OSError:
        return 1
    return 1


if __name__ == "__main__":
    sys.exit(main())
