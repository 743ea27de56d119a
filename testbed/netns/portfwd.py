#!/usr/bin/env python3
"""Forward TCP ports from inside a network namespace to the root namespace.

    portfwd.py NAMESPACE PORT [PORT...]

Listens on 127.0.0.1:PORT inside NAMESPACE (/run/netns/NAMESPACE) and
connects each accepted connection to 127.0.0.1:PORT in the namespace the
script was started in. The testbed uses it to let the proxy in the cloud
namespace reach the Kafka broker that scripts/infra.sh runs on the root
namespace's loopback: the broker advertises 127.0.0.1:PORT, and through the
forwarder that address means the same broker in both namespaces.

Sockets keep the namespace they were created in, so the listeners are
created after setns(2) into NAMESPACE and the script then returns to its own
namespace for the outgoing connections. Standard library only; root needed.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import socket
import sys

CLONE_NEWNET = 0x40000000


def setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    try:
        while data := await r.read(65536):
            w.write(data)
            await w.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            w.close()
        except OSError:
            pass


async def serve(listeners: list[socket.socket]) -> None:
    async def handle(port: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            w.close()
            return
        await asyncio.gather(pipe(r, uw), pipe(ur, w))

    servers = []
    for s in listeners:
        port = s.getsockname()[1]
        servers.append(
            await asyncio.start_server(lambda r, w, p=port: handle(p, r, w), sock=s)
        )
    print("portfwd: ready", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    ns, ports = sys.argv[1], [int(p) for p in sys.argv[2:]]
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    setns(target)
    listeners = []
    for p in ports:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", p))
        s.listen(128)
        s.setblocking(False)
        listeners.append(s)
    setns(home)
    asyncio.run(serve(listeners))
    return 0


if __name__ == "__main__":
    sys.exit(main())
