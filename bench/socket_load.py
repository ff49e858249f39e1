"""The socket load generator of row 15: a separate process that opens many idle WebSockets
and holds them until told to let go.

``python -m bench.socket_load --url ws://127.0.0.1:P --cls C --cells N --per-cell K`` opens
K sockets to each of the paths ``/cells/C/c<i>/ws`` (i < N), a cell's K one after another,
with the subprotocol ``cellactors.v1``, each counted open once its hello frame arrived (on a
node: once the cell's ``on_connect`` is durable), at most ``--concurrency`` handshakes at a
time. It prints one JSON line ``{"opened": n, "failed": m, "seconds": s}``, then holds the
sockets (answering pings) until a line arrives on stdin or stdin closes, and exits without
closing them (the server sees them drop, or is gone already).

It imports no cellactors: the process holds the sockets and nothing else.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

SUBPROTOCOL = "cellactors.v1"


def raise_nofile(need: int) -> None:
    """Raise the soft open-files limit to the hard one (at least what ``need`` asks, if
    the hard limit allows)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, need)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < need:
        print(f"open-files limit {target} is below the {need} sockets asked", file=sys.stderr)


async def open_socket(url: str, timeout: float = 60.0) -> ClientConnection:
    """One socket with the numbered subprotocol, returned once its hello frame came."""
    ws = await connect(
        url,
        subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
        compression=None,
        ping_interval=None,  # the server pings (20 s); the client only answers
        open_timeout=timeout,
        max_queue=64,
    )
    await asyncio.wait_for(ws.recv(), timeout)
    return ws


async def open_many(urls: list[str], concurrency: int) -> tuple[list[ClientConnection], int]:
    """Open a socket to each of ``urls``, ``concurrency`` handshakes at a time, trying each
    up to 3 times; (the open sockets, how many failed)."""
    gate = asyncio.Semaphore(concurrency)
    opened: list[ClientConnection] = []
    failed = 0

    async def one(url: str) -> None:
        nonlocal failed
        async with gate:
            for attempt in range(3):
                try:
                    opened.append(await open_socket(url))
                    return
                except Exception as err:
                    last: Any = err
                    await asyncio.sleep(0.2 * (attempt + 1))
            failed += 1
            print(f"socket to {url} failed: {last!r}", file=sys.stderr)

    await asyncio.gather(*(one(u) for u in urls))
    return opened, failed


async def _main(args: argparse.Namespace) -> None:
    # A cell's sockets one after another: they open together (their on_connects share
    # batches) and wake a hibernated cell once.
    urls = [
        f"{args.url}/cells/{args.cls}/c{i}/ws"
        for i in range(args.cells)
        for _ in range(args.per_cell)
    ]
    raise_nofile(len(urls) + 100)
    start = time.perf_counter()
    opened, failed = await open_many(urls, args.concurrency)
    seconds = time.perf_counter() - start
    print(json.dumps({"opened": len(opened), "failed": failed, "seconds": seconds}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True, help="ws://host:port")
    parser.add_argument("--cls", required=True)
    parser.add_argument("--cells", type=int, required=True)
    parser.add_argument("--per-cell", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=100)
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
