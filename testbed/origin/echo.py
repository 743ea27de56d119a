#!/usr/bin/env python3
"""TCP echo server for the instant-messaging tests: every byte a client sends
comes straight back, each connection independent, until the client closes.

usage: echo.py [--bind 10.99.0.10] [--port 7] [--pidfile FILE]

Runs in the foreground; testbed/origin/start.sh puts it in the background
inside the cloud namespace. Exits on SIGTERM/SIGINT.
"""

import argparse
import asyncio
import os
import signal


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        # Half-close back, so a client that shut down its write side still
        # reads EOF from us, as from a real echo service.
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bind", default="10.99.0.10")
    ap.add_argument("--port", type=int, default=7)
    ap.add_argument("--pidfile")
    args = ap.parse_args()

    server = await asyncio.start_server(echo, args.bind, args.port, reuse_address=True)
    if args.pidfile:
        with open(args.pidfile, "w") as f:
            f.write(f"{os.getpid()}\n")

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()
    if args.pidfile:
        try:
            os.unlink(args.pidfile)
        except FileNotFoundError:
            pass


if __name__ == "__main__":
    asyncio.run(main())
