"""Limits on the wire (cellactors.server.wire_limits), on raw sockets against a real node
served by the real runner: heads too large or with too many headers are answered 431, slow
heads and bodies are cut off with 408, idle connections are closed, a connection over the
cap is answered 503, and every refusal is counted; the listener keeps serving the others.
One test runs ``cellactors serve`` itself, to see that its flags reach the listeners."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cellactors.actors.metrics import WIRE_LIMITS, WIRE_LISTENERS
from cellactors.persistence.store.embedded import SeaweedServer
from cellactors.persistence.store.s3 import S3Bucket
from cellactors.server.app import ServerSettings
from tests.helpers.fleet import COUNTER_APP, NodeProc
from tests.helpers.metrics import parse, value
from tests.helpers.runtime import eventually
from tests.helpers.served import ServedNode, served_node
from tests.helpers.stores import make_s3_bucket

TIMEOUT = 1.0  # the short timeouts under test
WAIT = 10.0  # upper bound for every wait on the node
LIMITS = ServerSettings(
    max_header_bytes=4096,
    max_header_count=20,
    header_timeout=TIMEOUT,
    body_timeout=TIMEOUT,
    keep_alive_timeout=TIMEOUT,
    max_connections=64,
)
REFUSALS = "cellactors_wire_refusals_total"


@pytest.fixture(scope="module")
def node(seaweed: SeaweedServer) -> Iterator[ServedNode]:
    """One node for the module's tests (each measures the counters it moves)."""
    with served_node(make_s3_bucket(seaweed.endpoint), "wire-limits", LIMITS) as served:
        yield served


def port_of(node: ServedNode, listener: str) -> int:
    return node.public_port if listener == "public" else node.internal_port


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
    sock.settimeout(WAIT)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the node sends until it closes the connection (within :data:`WAIT`)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def read_answer(sock: socket.socket) -> bytes:
    """One whole answer with a Content-Length, leaving the connection open."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    length = int(answer(data)[1]["content-length"])
    while len(data.partition(b"\r\n\r\n")[2]) < length:
        data += sock.recv(65536)
    return data


def answer(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Status, headers (lower-cased names) and body of one HTTP answer."""
    head, _, body = raw.partition(b"\r\n\r\n")
    line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for header in lines:
        name, _, val = header.partition(":")
        headers[name.strip().lower()] = val.strip()
    return int(line.split()[1]), headers, body


def error_of(raw: bytes) -> tuple[int, str, str, str]:
    """Status, error code, outcome and Connection header of an error answer."""
    status, headers, body = answer(raw)
    payload = json.loads(body)
    return status, payload["error"], payload["outcome"], headers.get("connection", "")


def refusals(node: ServedNode) -> dict[tuple[str, str], float]:
    samples = parse(httpx.get(node.internal + "/metrics", timeout=WAIT).text)
    return {
        (listener, limit): value(samples, REFUSALS, listener=listener, limit=limit)
        for listener in WIRE_LISTENERS
        for limit in WIRE_LIMITS
    }


def healthz(port: int) -> int:
    return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=WAIT).status_code


@pytest.mark.parametrize("listener", ["public", "internal"])
def test_a_head_over_the_size_limit_is_431_and_closed(node: ServedNode, listener: str) -> None:
    before = refusals(node)
    with connect(port_of(node, listener)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 5000)
        sock.sendall(b"\r\n\r\n")
        got = read_until_closed(sock)
    assert error_of(got) == (431, "headers_too_large", "not_run", "close")
    after = refusals(node)
    assert after[(listener, "header_bytes")] == before[(listener, "header_bytes")] + 1


def test_an_unfinished_header_is_refused_once_over_the_limit(node: ServedNode) -> None:
    """The parser holds a header until it ends: one that never ends must not grow for ever
    (the probe held 8 MB each)."""
    with connect(node.public_port) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
        for _ in range(16):  # 16 KiB of one header value, never ended
            sock.sendall(b"a" * 1024)
        got = read_until_closed(sock)
    assert error_of(got)[:3] == (431, "headers_too_large", "not_run")


@pytest.mark.parametrize("listener", ["public", "internal"])
def test_too_many_headers_is_431_and_closed(node: ServedNode, listener: str) -> None:
    before = refusals(node)
    headers = b"".join(b"X-H%d: v\r\n" % i for i in range(21))
    with connect(port_of(node, listener)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers + b"\r\n")
        got = read_until_closed(sock)
    assert error_of(got) == (431, "headers_too_large", "not_run", "close")
    after = refusals(node)
    assert after[(listener, "header_count")] == before[(listener, "header_count")] + 1


def test_a_head_under_the_limits_is_served(node: ServedNode) -> None:
    headers = b"".join(b"X-H%d: v\r\n" % i for i in range(18))
    with connect(node.public_port) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers + b"\r\n")
        status, _, _ = answer(read_answer(sock))
    assert status == 200


@pytest.mark.parametrize("listener", ["public", "internal"])
def test_a_slow_head_is_cut_off_while_others_are_served(node: ServedNode, listener: str) -> None:
    before = refusals(node)
    port = port_of(node, listener)
    with connect(port) as slow:
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        started = time.monotonic()
        assert healthz(port) == 200  # another connection meanwhile
        slow.sendall(b"a")  # still trickling: the head's deadline runs from its first byte
        got = read_until_closed(slow)
        elapsed = time.monotonic() - started
    assert error_of(got) == (408, "request_timeout", "not_run", "close")
    assert TIMEOUT * 0.9 <= elapsed < WAIT
    after = refusals(node)
    assert after[(listener, "header_timeout")] == before[(listener, "header_timeout")] + 1


def test_a_slow_body_is_cut_off_with_408(node: ServedNode) -> None:
    before = refusals(node)
    with connect(node.public_port) as slow:
        slow.sendall(
            b"POST /cells/Counter/wire/increment HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
            b'{"name": '
        )
        started = time.monotonic()
        got = read_until_closed(slow)
        elapsed = time.monotonic() - started
    assert error_of(got) == (408, "request_timeout", "not_run", "close")
    assert TIMEOUT * 0.9 <= elapsed < WAIT
    after = refusals(node)
    assert after[("public", "body_timeout")] == before[("public", "body_timeout")] + 1


@pytest.mark.parametrize("listener", ["public", "internal"])
def test_idle_connections_are_closed(node: ServedNode, listener: str) -> None:
    before = refusals(node)
    port = port_of(node, listener)
    with connect(port) as fresh, connect(port) as kept:
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        status, headers, _ = answer(read_answer(kept))
        assert status == 200 and headers.get("connection") != "close"
        started = time.monotonic()
        assert fresh.recv(1) == b""  # a connection that never sent a byte
        assert read_until_closed(kept) == b""  # kept alive, then idle
        assert TIMEOUT * 0.9 <= time.monotonic() - started < WAIT
    after = refusals(node)
    assert after[(listener, "idle_timeout")] == before[(listener, "idle_timeout")] + 2


@pytest.mark.parametrize("listener", ["public", "internal"])
def test_a_connection_over_the_cap_is_refused_and_the_listener_stays_healthy(
    sw_bucket: S3Bucket, listener: str
) -> None:
    settings = ServerSettings(max_connections=3, keep_alive_timeout=60.0)
    with served_node(sw_bucket, f"wire-cap-{listener}", settings) as capped:
        port = port_of(capped, listener)
        held = [connect(port) for _ in range(3)]
        try:
            with connect(port) as extra:
                started = time.monotonic()
                got = read_until_closed(extra)
            assert time.monotonic() - started < TIMEOUT
            status, code, outcome, connection = error_of(got)
            assert (status, code, outcome, connection) == (
                503,
                "node_unavailable",
                "not_run",
                "close",
            )
            assert answer(got)[1]["retry-after"] == "1"
        finally:
            for sock in held:
                sock.close()
        eventually(lambda: healthz(port) == 200, timeout=WAIT)
        assert refusals(capped)[(listener, "connections")] == 1


@pytest.mark.fleet
def test_the_serve_flags_set_the_limits(
    tmp_path: Path, sw_bucket: S3Bucket, seaweed: SeaweedServer
) -> None:
    proc = NodeProc(
        "wireflags", COUNTER_APP, tmp_path, f"s3://{sw_bucket.bucket}", seaweed.endpoint
    )
    proc.extra = [
        "--max-header-bytes",
        "2048",
        "--max-headers",
        "10",
        "--header-timeout",
        "1",
        "--max-connections",
        "2",
    ]
    proc.start()
    try:
        proc.ready()
        port = proc.public_port
        with connect(port) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 2100 + b"\r\n\r\n")
            assert error_of(read_until_closed(sock))[0] == 431
        with connect(port) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\n" + b"X-H: v\r\n" * 11 + b"\r\n")
            assert error_of(read_until_closed(sock))[0] == 431
        with connect(port) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            assert error_of(read_until_closed(sock))[0] == 408
        with connect(port), connect(port), connect(port) as extra:
            assert error_of(read_until_closed(extra))[0] == 503
        eventually(lambda: healthz(port) == 200, timeout=WAIT)
    finally:
        proc.kill()


def test_serve_defaults_the_limits_as_the_server_settings_do() -> None:
    """The flags spell their defaults (for --help) without importing the server; they must
    be the settings' own, or a default changed in one place would not reach the other."""
    from dataclasses import fields

    from cellactors.cli.serve import serve
    from cellactors.cli.serve_options import WIRE_FIELDS

    defaults = {f.name: f.default for f in fields(ServerSettings)}
    declared = {p.name: p.default for p in serve.params if p.name in WIRE_FIELDS}
    assert declared == {name: defaults[name] for name in WIRE_FIELDS}


def test_a_body_still_arriving_after_the_answer_is_cut_without_a_second_answer(
    seaweed: SeaweedServer,
) -> None:
    """A call refused before its body was read (an unknown class) is answered at once; the
    rest of its body never comes: the connection is cut at the body timeout, and nothing
    more is written on it (a keep-alive client would take a second answer for its next).
    The idle timeout is longer here, so that it is the body timeout that ends it."""
    settings = ServerSettings(body_timeout=TIMEOUT, keep_alive_timeout=5.0)
    bucket = make_s3_bucket(seaweed.endpoint)
    with served_node(bucket, "early", settings) as early, connect(early.public_port) as sock:
        sock.sendall(
            b"POST /cells/Nope/x/m HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{}"
        )
        first = read_answer(sock)
        rest = read_until_closed(sock)
    assert answer(first)[0] == 404
    assert rest == b""
