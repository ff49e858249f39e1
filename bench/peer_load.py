"""Load for the peer rows, the same against every system: concurrent clients that each cycle
over their own keys and count every acknowledged call per path (so that the adds can be
checked against the counters read back at the end), and first calls to fresh keys.

Built on the minimal HTTP/1.1 client of :mod:`bench.http` (one keep-alive connection per
client, answers with Content-Length, which both uvicorn and Restate's ingress send)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from bench.common import Load
from bench.http import HEADERS, _Conn, _request


def cycling(
    base_url: str,
    plans: Sequence[Sequence[str]],
    kwargs: dict[str, Any],
    duration: float,
    before_start: Callable[[], object] | None = None,
) -> tuple[Load, Counter[str]]:
    """Client i calls the paths of ``plans[i]`` in turn for ``duration`` seconds, each client
    on its own connection, after a warm-up in which every client calls each of its paths
    once (so every key is active before the clock starts; ``before_start`` runs right
    before it does). The load (warm-up excluded) and the 200 answers per path (warm-up
    included: every acknowledged call)."""
    body = json.dumps(kwargs).encode()
    return asyncio.run(_cycling(base_url, plans, body, duration, before_start))


async def _cycling(
    base_url: str,
    plans: Sequence[Sequence[str]],
    body: bytes,
    duration: float,
    before_start: Callable[[], object] | None,
) -> tuple[Load, Counter[str]]:
    url = httpx.URL(base_url)
    host, port = url.host, url.port or 80
    requests = [[(p, _request(host, port, p, body)) for p in plan] for plan in plans]
    acks: Counter[str] = Counter()
    conns = await asyncio.gather(*(_Conn.open(host, port) for _ in plans))
    try:

        async def warm(conn: _Conn, mine: list[tuple[str, bytes]]) -> None:
            for path, request in mine:
                if await conn.post(request) == 200:
                    acks[path] += 1

        await asyncio.gather(*(warm(c, r) for c, r in zip(conns, requests, strict=True)))
        if before_start is not None:
            before_start()
        lat: list[float] = []
        errors = 0
        deadline = 0.0

        async def worker(conn: _Conn, mine: list[tuple[str, bytes]]) -> None:
            nonlocal errors
            i = 0
            while time.perf_counter() < deadline:
                path, request = mine[i % len(mine)]
                i += 1
                t = time.perf_counter()
                if await conn.post(request) == 200:
                    lat.append(time.perf_counter() - t)
                    acks[path] += 1
                else:
                    errors += 1

        start = time.perf_counter()
        deadline = start + duration
        await asyncio.gather(*(worker(c, r) for c, r in zip(conns, requests, strict=True)))
        elapsed = time.perf_counter() - start
    finally:
        for conn in conns:
            conn.close()
    return Load(len(lat), elapsed, lat, errors), acks


def first_calls(
    base_url: str,
    paths: Sequence[str],
    kwargs: dict[str, Any],
    warm: str,
    before_start: Callable[[], object] | None = None,
) -> tuple[Load, Counter[str]]:
    """One call to each path, one after another on one keep-alive connection, first opened
    with a call to ``warm`` (an already active key: no connection setup is measured;
    ``before_start`` runs right after it): the latency of each key's first call, and the
    200 answers per path (``warm``'s included)."""
    body = json.dumps(kwargs).encode()
    lat: list[float] = []
    acks: Counter[str] = Counter()
    errors = 0
    with httpx.Client(base_url=base_url, timeout=30) as client:
        client.post(warm, content=body, headers=HEADERS).raise_for_status()
        acks[warm] += 1
        if before_start is not None:
            before_start()
        start = time.perf_counter()
        for path in paths:
            t = time.perf_counter()
            resp = client.post(path, content=body, headers=HEADERS)
            if resp.status_code == 200:
                lat.append(time.perf_counter() - t)
                acks[path] += 1
            else:
                errors += 1
        elapsed = time.perf_counter() - start
    return Load(len(lat), elapsed, lat, errors), acks


def read_back(
    base_url: str, paths: Sequence[str], kwargs: dict[str, Any], value: Callable[[Any], int]
) -> dict[str, int]:
    """Call each read path once; ``value`` takes the JSON answer to the count."""
    body = json.dumps(kwargs).encode()
    out: dict[str, int] = {}
    with httpx.Client(base_url=base_url, timeout=30) as client:
        for path in paths:
            resp = client.post(path, content=body, headers=HEADERS)
            resp.raise_for_status()
            out[path] = value(resp.json())
    return out
