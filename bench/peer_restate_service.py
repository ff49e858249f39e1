"""The Restate side of ``python -m bench --peer restate``: the example ``Counter`` as a Restate
keyed virtual object, served over HTTP/2 (cleartext) by hypercorn in one process.

It runs in the venv :mod:`bench.peer_restate_install` makes for it (the SDK is not one of the
project's dependencies), so it imports nothing from the project:
``<venv>/bin/python bench/peer_restate_service.py --port N``.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import restate
from hypercorn.asyncio import serve
from hypercorn.config import Config
from restate import ObjectContext, ObjectSharedContext, VirtualObject

counter = VirtualObject("Counter")


@counter.handler()  # type: ignore[untyped-decorator]
async def increment(ctx: ObjectContext, req: dict[str, Any]) -> int:
    """Add ``req["by"]`` (1 by default) to counter ``req["name"]`` of this key; the new count
    (like ``Counter.increment`` in examples/counter.py, one state entry per name)."""
    name = str(req["name"])
    count = (await ctx.get(name, type_hint=int) or 0) + int(req.get("by", 1))
    ctx.set(name, count)
    return count


@counter.handler(kind="shared")  # type: ignore[untyped-decorator]
async def get(ctx: ObjectSharedContext, req: dict[str, Any]) -> int:
    """The value of counter ``req["name"]`` of this key (0 when never incremented)."""
    return await ctx.get(str(req["name"]), type_hint=int) or 0


app = restate.app([counter])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    config = Config()
    config.bind = [f"127.0.0.1:{args.port}"]
    # What Restate's serving guide sets for production, so that the server's long-lived
    # HTTP/2 connection is never cut or throttled by hypercorn's defaults.
    config.h2_max_concurrent_streams = 2**31 - 1
    config.keep_alive_max_requests = 2**31 - 1
    config.keep_alive_timeout = 2**31 - 1
    config.accesslog = None
    asyncio.run(serve(app, config))


if __name__ == "__main__":
    main()
