"""HTTP load: sequential calls on one keep-alive connection (httpx), and concurrent calls
from one asyncio loop (a minimal HTTP/1.1 client, one connection per worker)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from bench.common import Load

HEADERS = {"content-type": "application/json"}


def call_path(cell: str, method: str) -> str:
    """``/cells/Counter/<cell>/<method>``."""
    return f"/cells/Counter/{cell}/{method}"


def sequential(base_url: str, path: str, kwargs: dict[str, Any], n: int) -> Load:
    """``n`` calls one after another on one httpx keep-alive connection (after a warm-up):
    what a Python caller sees, client included."""
    body = json.dumps(kwargs).encode()
    lat = []
    with httpx.Client(base_url=base_url, timeout=30) as client:
        client.post(path, content=body, headers=HEADERS).raise_for_status()
        start = time.perf_counter()
        for _ in range(n):
            t = time.perf_counter()
            resp = client.post(path, content=body, headers=HEADERS)
            lat.append(time.perf_counter() - t)
            resp.raise_for_status()
        elapsed = time.perf_counter() - start
    return Load(n, elapsed, lat)


def concurrent(
    base_url: str,
    paths: Sequence[str],
    kwargs: dict[str, Any],
    duration: float,
    before_start: Callable[[], object] | None = None,
) -> Load:
    """Worker i calls ``paths[i]`` in a loop for ``duration`` seconds, every worker on its
    own keep-alive connection (opened, with a warm-up call, before the clock starts).

    A minimal HTTP/1.1 client on asyncio streams: httpx.AsyncClient costs more CPU per call
    than the servers measured here, and on a small machine the client would be what is
    measured. Answers must carry Content-Length (uvicorn's do). ``before_start`` runs after
    the warm-up, right before the clock starts."""
    body = json.dumps(kwargs).encode()
    return asyncio.run(_concurrent(base_url, paths, body, duration, before_start))


class _Conn:
    """One keep-alive connection that POSTs JSON and reads Content-Length answers."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, host: str, port: int) -> _Conn:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    async def post(self, request: bytes) -> int:
        """Send a prepared request; the answer's status code (its body is read and dropped)."""
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        match = _LENGTH.search(head)
        if match is None:
            raise RuntimeError(f"answer without Content-Length: {head[:200]!r}")
        await self.reader.readexactly(int(match.group(1)))
        return status

    def close(self) -> None:
        self.writer.close()


_LENGTH = re.compile(rb"(?i)\r\ncontent-length:\s*(\d+)")


def _request(host: str, port: int, path: str, body: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def _concurrent(
    base_url: str,
    paths: Sequence[str],
    body: bytes,
    duration: float,
    before_start: Callable[[], object] | None,
) -> Load:
    url = httpx.URL(base_url)
    host, port = url.host, url.port or 80
    requests = [_request(host, port, p, body) for p in paths]
    conns = await asyncio.gather(*(_Conn.open(host, port) for _ in paths))
    try:
        # Warm-up: one call per connection, all at once.
        await asyncio.gather(*(c.post(r) for c, r in zip(conns, requests, strict=True)))
        if before_start is not None:
            before_start()
        lat: list[float] = []
        errors = 0
        deadline = 0.0

        async def worker(conn: _Conn, request: bytes) -> None:
            nonlocal errors
            while time.perf_counter() < deadline:
                t = time.perf_counter()
                if await conn.post(request) == 200:
                    lat.append(time.perf_counter() - t)
                else:
                    errors += 1

        start = time.perf_counter()
        deadline = start + duration
        await asyncio.gather(*(worker(c, r) for c, r in zip(conns, requests, strict=True)))
        elapsed = time.perf_counter() - start
    finally:
        for conn in conns:
            conn.close()
    return Load(len(lat), elapsed, lat, errors)
