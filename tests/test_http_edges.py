"""Edges of the HTTP layer: names that are path segments, JSON constants, requests that die
half way, and failures that must still be answered as JSON with an outcome."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import msgpack
import pytest

from cellactors.client import Client
from cellactors.core import keys
from cellactors.errors import BadRequest, InvalidCellId
from cellactors.server.app import ServerSettings
from tests.helpers.fake_node import WAIT, FakeNode, Served, serving, signed_post, wait_until


@pytest.mark.parametrize("name", [".", ".."])
def test_make_cell_id_refuses_dot_names(name: str) -> None:
    with pytest.raises(InvalidCellId, match="cell id"):
        keys.make_cell_id("Counter", name)
    with pytest.raises(InvalidCellId):
        keys.make_cell_id(name, "a")


@pytest.mark.parametrize("name", ["a.", ".a", "...", "a..b", "a:b"])
def test_make_cell_id_keeps_other_dotted_names(name: str) -> None:
    assert keys.make_cell_id("Counter", name) == f"Counter:{name}"


# --- over HTTP ---------------------------------------------------------------------------------


@pytest.fixture
def served() -> Iterator[Served]:
    with serving(FakeNode("node-a")) as s:
        yield s


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=WAIT) as client:
        yield client


def raw_request(base: str, request: bytes) -> bytes:
    """Send ``request`` as is (no URL normalization) and read the answer until close."""
    url = httpx.URL(base)
    with socket.create_connection((url.host, url.port or 80), timeout=WAIT) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_or_infinity_in_a_json_body_is_400(
    served: Served, http: httpx.Client, constant: str
) -> None:
    r = http.post(
        served.public + "/cells/Counter/a/echo",
        content=f'{{"x": {constant}}}'.encode(),
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 400
    assert r.json()["error"] == "bad_request"
    assert r.json()["outcome"] == "not_run"
    assert served.node.calls == []


@pytest.mark.parametrize("name", ["%2E", "%2E%2E", "%2e"])
def test_dot_names_are_400(served: Served, http: httpx.Client, name: str) -> None:
    r = http.post(served.public + f"/cells/Counter/{name}/increment", json={})
    assert r.status_code == 400
    assert r.json()["error"] == "bad_request"
    assert served.node.calls == []


@pytest.mark.parametrize("name", [".", ".."])
def test_literal_dot_segments_are_400_not_another_route(served: Served, name: str) -> None:
    answer = raw_request(
        served.public,
        f"POST /cells/Counter/{name}/increment HTTP/1.1\r\nHost: x\r\n"
        "Content-Type: application/json\r\n"
        "Content-Length: 2\r\nConnection: close\r\n\r\n{}".encode(),
    )
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 400 Bad Request"
    body = rest.partition(b"\r\n\r\n")[2]
    assert json.loads(body)["error"] == "bad_request"
    assert served.node.calls == []


def test_the_client_sends_dot_names_encoded_and_gets_bad_request(served: Served) -> None:
    with Client(served.public) as client:
        for name in (".", ".."):
            with pytest.raises(BadRequest, match="cell id"):
                client.cell("Counter", name).increment()
    assert served.node.calls == []


def test_router_errors_carry_an_outcome(served: Served, http: httpx.Client) -> None:
    assert http.post(served.public + "/nope", json={}).json()["outcome"] == "not_run"
    assert http.get(served.public + "/cells/Counter/a/x").json()["outcome"] == "not_run"


@pytest.mark.parametrize("listener", ["public", "internal"])
def test_client_leaving_mid_body_is_one_log_line(
    served: Served, caplog: pytest.LogCaptureFixture, listener: str
) -> None:
    caplog.set_level(logging.DEBUG)
    url = httpx.URL(served.public if listener == "public" else served.internal)
    prefix = "" if listener == "public" else "/internal"
    assert url.port is not None
    with socket.create_connection((url.host, url.port), timeout=WAIT) as sock:
        sock.sendall(
            f"POST {prefix}/cells/Counter/a/increment HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
            + b'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"by": '
        )
    deadline = time.monotonic() + WAIT

    def lines() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "disconnected" in r.getMessage()]

    while not lines():
        assert time.monotonic() < deadline, "no log line for the disconnect"
        time.sleep(0.01)
    [line] = lines()
    assert line.name == "cellactors.server"
    assert line.exc_info is None
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    assert served.node.calls == []
    # The node is fine afterwards.
    assert httpx.post(served.public + "/cells/Counter/a/increment", json={}).status_code == 200
    with httpx.Client(timeout=WAIT) as http:
        assert signed_post(http, served, "increment").status_code == 200


def test_a_bug_below_the_handlers_is_a_json_500_with_unknown_outcome(
    served: Served, http: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    core = served.runner.public_app.state.core

    def broken(*args: Any) -> None:
        raise RuntimeError("bug in the HTTP layer")

    core.check_target = broken
    r = http.post(served.public + "/cells/Counter/a/increment", json={})
    assert r.status_code == 500
    assert r.headers["content-type"] == "application/json"
    assert r.json()["error"] == "internal"
    assert r.json()["outcome"] == "unknown"
    # The failure's own words stay in the log, found by the reference the answer gives.
    assert "bug in the HTTP layer" not in r.json()["message"]
    reference = r.json()["message"].split("reference ")[1].split()[0]
    assert f"unexpected failure {reference}: RuntimeError: bug in the HTTP layer" in caplog.text


def test_a_held_success_is_not_durable_when_the_node_may_no_longer_answer(
    served: Served, http: httpx.Client
) -> None:
    served.node.answering = False
    r = http.post(served.public + "/cells/Counter/a/increment", json={})
    assert r.status_code == 503
    assert r.json()["error"] == "not_durable"
    assert r.json()["outcome"] == "unknown"
    assert served.node.counters == {"a": 1}
    internal = signed_post(http, served, "increment")
    assert internal.status_code == 503
    assert internal.json()["error"] == "not_durable"


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_fenced_node_answers_calls_cut_short_as_errors_with_outcome(encoding: str) -> None:
    """A call still running when the fence grace ends is cancelled by uvicorn; it is answered
    503 not_durable in the request's encoding, not uvicorn's plain-text 500."""
    node = FakeNode("node-f")
    settings = ServerSettings(fence_grace_seconds=1, fence_poll_interval=0.05)
    content_type = "application/msgpack" if encoding == "msgpack" else "application/json"
    body = msgpack.packb({}) if encoding == "msgpack" else b"{}"
    with (
        serving(node, settings=settings) as s,
        httpx.Client(timeout=WAIT) as client,
        ThreadPoolExecutor(1) as pool,
    ):
        held = pool.submit(
            client.post,
            s.public + "/cells/Counter/a/wait",
            content=body,
            headers={"Content-Type": content_type},
        )
        wait_until(lambda: node.in_flight == 1)
        new = client.post(s.public + "/cells/Counter/b/whoami", json={})
        assert new.status_code == 200
        node.status = "fenced"
        refused = client.post(s.public + "/cells/Counter/b/whoami", json={})
        s.runner.on_fence("lease renewal rejected")
        r = held.result(WAIT)
        s.thread.join(WAIT)
        assert s.exit_code == 3
    assert refused.status_code == 503
    assert refused.json()["outcome"] == "not_run"
    assert r.status_code == 503
    assert r.headers["content-type"] == content_type
    payload = msgpack.unpackb(r.content) if encoding == "msgpack" else r.json()
    assert payload["error"] == "not_durable"
    assert payload["outcome"] == "unknown"
    assert payload["retryable"] is False
