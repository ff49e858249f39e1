"""The public and internal HTTP apps and the runner, served for real by uvicorn on loopback,
around a fake node that keeps the runtime contract."""

from __future__ import annotations

import io
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import msgpack
import pytest

from cellactors.errors import (
    RemoteOwner,
)
from cellactors.persistence.store.embedded import free_port
from cellactors.server import signing
from cellactors.server.app import ServerSettings, build_internal_app, build_public_app
from cellactors.server.runner import FenceLatch, Runner
from tests.helpers.fake_node import (
    KEY,
    WAIT,
    FakeNode,
    Served,
    owner_route,
    post,
    serving,
    signed_post,
    wait_until,
)


@pytest.fixture
def node() -> FakeNode:
    return FakeNode("node-a")


@pytest.fixture
def served(node: FakeNode) -> Iterator[Served]:
    with serving(node) as s:
        yield s


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=WAIT) as client:
        yield client


# --- public calls -------------------------------------------------------------------------


def test_call_returns_the_result_as_json(served: Served, http: httpx.Client) -> None:
    r = post(http, served.public, "/cells/Counter/a/increment", {"by": 2})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert r.headers["x-cellactors-node"] == "node-a"
    assert r.json() == {"result": 2}
    assert served.node.calls == [("Counter", "a", "increment", {"by": 2}, False)]
    assert post(http, served.public, "/cells/Counter/a/increment", {}).json() == {"result": 3}


def test_empty_body_means_no_arguments(served: Served, http: httpx.Client) -> None:
    r = http.post(
        served.public + "/cells/Counter/a/echo", headers={"content-type": "application/json"}
    )
    assert r.status_code == 200
    assert r.json() == {"result": {}}


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; b=x"],
)
def test_a_call_a_browser_could_send_across_origins_is_415_not_run(
    served: Served, http: httpx.Client, content_type: str | None
) -> None:
    """A page on another origin can make a browser POST these without a CORS preflight
    (a form, a no-cors fetch, an empty body): refused before the body is read."""
    headers = {} if content_type is None else {"content-type": content_type}
    r = http.post(served.public + "/cells/Counter/a/increment", content=b"{}", headers=headers)
    assert r.status_code == 415
    assert (r.json()["error"], r.json()["outcome"]) == ("unsupported_media_type", "not_run")
    assert served.node.calls == []
    preflight = http.request("OPTIONS", served.public + "/cells/Counter/a/increment")
    assert "access-control-allow-origin" not in preflight.headers  # no CORS, ever granted


def test_msgpack_in_msgpack_out(served: Served, http: httpx.Client) -> None:
    body = msgpack.packb({"blob": b"\x00\x01", "n": 5})
    r = http.post(
        served.public + "/cells/Counter/b/echo",
        content=body,
        headers={"Content-Type": "application/msgpack"},
    )
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/msgpack"
    assert msgpack.unpackb(r.content) == {"result": {"blob": b"\x00\x01", "n": 5}}


def test_msgpack_errors_are_msgpack(served: Served, http: httpx.Client) -> None:
    r = http.post(
        served.public + "/cells/Counter/b/fail",
        content=msgpack.packb({}),
        headers={"Content-Type": "application/msgpack"},
    )
    assert r.status_code == 422
    assert r.headers["content-type"] == "application/msgpack"
    assert msgpack.unpackb(r.content)["error"] == "method_failed"


def test_unknown_class_is_404_without_calling_the_node(served: Served, http: httpx.Client) -> None:
    r = post(http, served.public, "/cells/Nope/a/increment", {})
    assert r.status_code == 404
    assert r.json()["error"] == "unknown_cell"
    assert r.json()["retryable"] is False
    assert served.node.calls == []


def test_deep_or_out_of_range_arguments_are_400_not_run_without_calling_the_node(
    served: Served, http: httpx.Client
) -> None:
    deep = b'{"name": ' + b"[" * 500 + b"]" * 500 + b"}"
    for body in (deep, b'{"name": 1e400}'):
        r = http.post(
            served.public + "/cells/Counter/a/increment",
            content=body,
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 400, r.text
        assert (r.json()["error"], r.json()["outcome"]) == ("bad_request", "not_run")
    assert served.node.calls == []


def test_unknown_or_private_method_is_404(served: Served, http: httpx.Client) -> None:
    r = post(http, served.public, "/cells/Counter/a/nope", {})
    assert r.status_code == 404
    assert r.json()["error"] == "unknown_method"
    r = post(http, served.public, "/cells/Counter/a/__init__", {})
    assert r.status_code == 404
    assert len(served.node.calls) == 1  # the private name never reached the node


@pytest.mark.parametrize("name", ["a%20b", "x*y", "a%21b", "n" * 300])
def test_invalid_cell_id_is_400(served: Served, http: httpx.Client, name: str) -> None:
    r = post(http, served.public, f"/cells/Counter/{name}/increment", {})
    assert r.status_code == 400
    assert r.json()["error"] == "bad_request"
    assert "cell id" in r.json()["message"]


def test_encoded_slash_in_a_name_matches_no_route(served: Served, http: httpx.Client) -> None:
    r = post(http, served.public, "/cells/Counter/a%2F..%2Fb/increment", {})
    assert r.status_code == 404
    assert r.json()["error"] == "not_found"
    assert served.node.calls == []


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b'{"by": ', "malformed json"),
        (b"[1, 2]", "object of keyword arguments"),
        (b"7", "object of keyword arguments"),
        (b'{"not an identifier": 1}', "identifier"),
    ],
)
def test_bad_bodies_are_400(
    served: Served, http: httpx.Client, content: bytes, fragment: str
) -> None:
    r = http.post(
        served.public + "/cells/Counter/a/increment",
        content=content,
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 400
    assert r.json()["error"] == "bad_request"
    assert fragment in r.json()["message"]
    assert served.node.calls == []


def test_malformed_msgpack_is_400(served: Served, http: httpx.Client) -> None:
    r = http.post(
        served.public + "/cells/Counter/a/increment",
        content=b"\xc1",
        headers={"Content-Type": "application/msgpack"},
    )
    assert r.status_code == 400
    assert msgpack.unpackb(r.content)["error"] == "bad_request"


def test_two_mebibyte_body_is_413(served: Served, http: httpx.Client) -> None:
    big = b'{"x": "' + b"a" * (2 << 20) + b'"}'
    r = http.post(
        served.public + "/cells/Counter/a/echo",
        content=big,
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 413
    assert r.json()["error"] == "payload_too_large"
    assert served.node.calls == []
    # The node keeps serving afterwards.
    assert post(http, served.public, "/cells/Counter/a/increment", {}).status_code == 200


def test_chunked_oversize_body_is_413(served: Served, http: httpx.Client) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(32):
            yield b"a" * (64 << 10)  # 2 MiB in all, no Content-Length

    r = http.post(
        served.public + "/cells/Counter/a/echo",
        content=chunks(),
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413
    assert served.node.calls == []


def test_body_limit_is_configurable(node: FakeNode, http: httpx.Client) -> None:
    with serving(node, settings=ServerSettings(max_body_bytes=100)) as s:
        ok = post(http, s.public, "/cells/Counter/a/echo", {"x": "a" * 50})
        assert ok.status_code == 200
        big = post(http, s.public, "/cells/Counter/a/echo", {"x": "a" * 200})
        assert big.status_code == 413


def test_method_failure_is_422_with_type(served: Served, http: httpx.Client) -> None:
    r = post(http, served.public, "/cells/Counter/a/fail", {})
    assert r.status_code == 422
    assert r.json() == {
        "error": "method_failed",
        "message": "ValueError: bad input",
        "outcome": "failed",
        "retryable": False,
        "type": "ValueError",
        "detail": "bad input",
    }
    assert "retry-after" not in r.headers


def test_not_durable_is_503_with_retry_after(served: Served, http: httpx.Client) -> None:
    r = post(http, served.public, "/cells/Counter/a/not_durable", {})
    assert r.status_code == 503
    assert r.headers["retry-after"] == "1"
    assert r.json()["error"] == "not_durable"
    assert r.json()["outcome"] == "unknown"
    assert r.json()["retryable"] is False


def test_draining_node_answers_503_and_unhealthy(served: Served, http: httpx.Client) -> None:
    assert http.get(served.public + "/healthz").status_code == 200
    served.node.status = "draining"
    r = post(http, served.public, "/cells/Counter/a/increment", {})
    assert r.status_code == 503
    assert r.json()["error"] == "node_unavailable"
    assert "retry-after" in r.headers
    for base in (served.public, served.internal):
        h = http.get(base + "/healthz")
        assert h.status_code == 503
        assert h.json()["status"] == "draining"
        assert "retry-after" in h.headers
    served.node.status = "serving"


def test_unexpected_node_exception_is_500(
    served: Served, http: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    r = post(http, served.public, "/cells/Counter/a/crash", {})
    assert r.status_code == 500
    assert (r.json()["error"], r.json()["outcome"]) == ("internal", "unknown")
    assert "RuntimeError" not in r.json()["message"]  # no node internals to a caller
    reference = r.json()["message"].split("reference ")[1].split()[0]
    assert f"unexpected failure {reference}: RuntimeError" in caplog.text


def test_unencodable_result_is_rolled_back_as_bad_result(
    served: Served, http: httpx.Client
) -> None:
    r = post(http, served.public, "/cells/Counter/a/unencodable", {})
    assert r.status_code == 422
    assert r.json()["error"] == "bad_result"
    assert r.json()["outcome"] == "failed"
    [(_result, refusal)] = served.node.checks
    assert isinstance(refusal, ValueError)  # the check ran on the result, before "commit"


def test_healthz(served: Served, http: httpx.Client) -> None:
    r = http.get(served.public + "/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "serving", "node": "node-a", "generation": "gen-node-a"}


def test_public_app_exposes_no_internal_route(served: Served, http: httpx.Client) -> None:
    for path in ("/state", "/metrics", "/internal/cells/Counter/a/increment"):
        assert http.get(served.public + path).status_code == 404
        r = http.post(served.public + path, json={})
        assert r.status_code == 404
        assert r.json()["error"] == "not_found"
    # Even a correctly signed forward is not accepted on the public port.
    path = "/internal/cells/Counter/a/increment"
    headers = signing.sign_request(
        KEY, "POST", path, b"{}", source="x", target="node-a", target_generation="gen-node-a"
    )
    r = http.post(served.public + path, content=b"{}", headers=headers)
    assert r.status_code == 404
    assert served.node.calls == []


def test_wrong_http_method_is_405(served: Served, http: httpx.Client) -> None:
    r = http.get(served.public + "/cells/Counter/a/increment")
    assert r.status_code == 405
    assert r.json()["error"] == "method_not_allowed"


# --- internal app ----------------------------------------------------------------------------


def test_internal_runs_signed_forwarded_calls(served: Served, http: httpx.Client) -> None:
    r = signed_post(http, served, "increment", b'{"by": 5}')
    assert r.status_code == 200
    assert r.json() == {"result": 5}
    assert served.node.calls == [("Counter", "a", "increment", {"by": 5}, True)]


def test_internal_refuses_unsigned(served: Served, http: httpx.Client) -> None:
    r = http.post(served.internal + "/internal/cells/Counter/a/whoami", json={})
    assert r.status_code == 401
    assert r.json()["error"] == "unauthorized"
    assert "unsigned" in r.json()["message"]
    assert served.node.calls == []


def test_internal_refuses_wrong_signature(served: Served, http: httpx.Client) -> None:
    r = signed_post(http, served, key=bytes(32))
    assert r.status_code == 401
    assert "bad signature" in r.json()["message"]
    # A body swapped under a valid signature fails too.
    path = "/internal/cells/Counter/a/increment"
    headers = signing.sign_request(
        KEY, "POST", path, b"{}", source="z", target="node-a", target_generation="gen-node-a"
    )
    r = http.post(served.internal + path, content=b'{"by": 100}', headers=headers)
    assert r.status_code == 401
    assert served.node.calls == []


def test_internal_refuses_wrong_target(served: Served, http: httpx.Client) -> None:
    r = signed_post(http, served, target="node-q")
    assert r.status_code == 401
    assert "node-q" in r.json()["message"]


def test_internal_refuses_stale(served: Served, http: httpx.Client) -> None:
    r = signed_post(http, served, now=time.time() - 60)
    assert r.status_code == 401
    assert "stale" in r.json()["message"]
    r = signed_post(http, served, now=time.time() + 60)
    assert r.status_code == 401
    assert served.node.calls == []


def test_internal_refuses_replayed_nonce(served: Served, http: httpx.Client) -> None:
    path = "/internal/cells/Counter/a/increment"
    headers = signing.sign_request(
        KEY, "POST", path, b"{}", source="z", target="node-a", target_generation="gen-node-a"
    )
    first = signed_post(http, served, "increment", headers=headers)
    assert first.status_code == 200
    replay = signed_post(http, served, "increment", headers=headers)
    assert replay.status_code == 401
    assert "replayed" in replay.json()["message"]
    assert len(served.node.calls) == 1


def test_internal_maps_remote_owner_to_stale_route(served: Served, http: httpx.Client) -> None:
    served.node.stale_routes = 1
    r = signed_post(http, served)
    assert r.status_code == 409
    assert r.json() == {
        "error": "stale_route",
        "outcome": "not_run",
        "message": "node-a does not own Counter:a",
        "retryable": True,
    }


def test_state_metrics_and_healthz(served: Served, http: httpx.Client) -> None:
    state = http.get(served.internal + "/state")
    assert state.status_code == 200
    assert state.json()["cells"] == [{"cell": "Counter:a", "epoch": 4, "acked_txid": 17}]
    metrics = http.get(served.internal + "/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    assert "cellactors_calls_total 3" in metrics.text
    assert http.get(served.internal + "/healthz").status_code == 200


# --- forwarding between two nodes -----------------------------------------------------------


@pytest.fixture
def pair() -> Iterator[tuple[Served, Served]]:
    with serving(FakeNode("node-a")) as a, serving(FakeNode("node-b")) as b:
        yield a, b


def test_remote_owner_forwards_signed_and_passes_through(
    pair: tuple[Served, Served], http: httpx.Client
) -> None:
    a, b = pair
    a.node.routes = [owner_route(b)]
    r = post(http, a.public, "/cells/Counter/c/increment", {"by": 7})
    assert r.status_code == 200
    assert r.json() == {"result": 7}
    assert r.headers["x-cellactors-node"] == "node-b"
    assert b.node.calls == [("Counter", "c", "increment", {"by": 7}, True)]
    assert b.node.counters == {"c": 7}
    assert a.node.counters == {}
    assert a.node.forgotten == []


def test_forwarded_errors_and_msgpack_pass_through(
    pair: tuple[Served, Served], http: httpx.Client
) -> None:
    a, b = pair
    a.node.routes = [
        RemoteOwner("node-b", b.internal_hostport, b.node.generation)
    ]  # addr without scheme
    r = http.post(
        a.public + "/cells/Counter/c/not_durable",
        content=msgpack.packb({}),
        headers={"Content-Type": "application/msgpack"},
    )
    assert r.status_code == 503
    assert r.headers["content-type"] == "application/msgpack"
    assert r.headers["retry-after"] == "1"
    assert msgpack.unpackb(r.content)["error"] == "not_durable"
    assert [c[4] for c in b.node.calls] == [True]


def test_stale_route_refreshes_and_routes_once_more(
    pair: tuple[Served, Served], http: httpx.Client
) -> None:
    a, b = pair
    a.node.routes = [owner_route(b)]  # only the first routing says remote
    b.node.stale_routes = 1
    r = post(http, a.public, "/cells/Counter/d/whoami", {})
    assert r.status_code == 200
    assert r.json() == {"result": "node-a"}  # second routing ran it locally
    assert a.node.forgotten == [("Counter", "d")]
    assert len(b.node.calls) == 1
    assert [c[4] for c in a.node.calls] == [False, False]


def test_stale_route_then_forward_again(pair: tuple[Served, Served], http: httpx.Client) -> None:
    a, b = pair
    a.node.routes = [owner_route(b)] * 2
    b.node.stale_routes = 1
    r = post(http, a.public, "/cells/Counter/d/whoami", {})
    assert r.status_code == 200
    assert r.json() == {"result": "node-b"}
    assert len(b.node.calls) == 2


def test_stale_route_twice_gives_up(pair: tuple[Served, Served], http: httpx.Client) -> None:
    a, b = pair
    a.node.routes = [owner_route(b)] * 5
    b.node.stale_routes = 5
    r = post(http, a.public, "/cells/Counter/d/whoami", {})
    assert r.status_code == 409
    assert r.json()["error"] == "stale_route"
    assert r.json()["retryable"] is True
    assert len(b.node.calls) == 2  # forwarded once, refreshed, forwarded once more: no more
    assert a.node.forgotten == [("Counter", "d")]
    assert len(a.node.routes) == 3


def test_unreachable_owner_is_forgotten_and_the_call_routed_again(
    served: Served, http: httpx.Client
) -> None:
    served.node.routes = [RemoteOwner("node-gone", f"http://127.0.0.1:{free_port()}", "gen-gone")]
    r = post(http, served.public, "/cells/Counter/e/whoami", {})
    assert r.status_code == 200  # the second routing decision ran it here
    assert served.node.forgotten == [("Counter", "e")]


def test_unreachable_owner_is_503_retryable(served: Served, http: httpx.Client) -> None:
    gone = RemoteOwner("node-gone", f"http://127.0.0.1:{free_port()}", "gen-gone")
    served.node.routes = [gone, gone]
    r = post(http, served.public, "/cells/Counter/e/whoami", {})
    assert served.node.forgotten == [("Counter", "e")]  # refreshed once, then gave up
    assert r.status_code == 503
    assert r.json()["error"] == "node_unavailable"
    assert r.json()["retryable"] is True
    assert "node-gone" in r.json()["message"]
    assert r.headers["retry-after"] == "1"


def test_peer_with_another_key_is_refused_as_502(http: httpx.Client) -> None:
    with serving(FakeNode("node-a")) as a, serving(FakeNode("node-b"), key=bytes(32)) as b:
        a.node.routes = [owner_route(b)]
        r = post(http, a.public, "/cells/Counter/c/whoami", {})
        assert r.status_code == 502
        assert r.json()["error"] == "peer_refused"
        assert b.node.calls == []


def test_forward_timeout_is_an_unknown_outcome(http: httpx.Client) -> None:
    settings = ServerSettings(forward_timeout=0.3)
    with serving(FakeNode("node-a"), settings=settings) as a, serving(FakeNode("node-b")) as b:
        a.node.routes = [owner_route(b)]
        r = post(http, a.public, "/cells/Counter/c/wait", {})
        assert r.status_code == 503
        assert r.json()["error"] == "not_durable"  # may have run on node-b
        b.node.gate.set()


# --- concurrency and keep-alive (real sockets) -----------------------------------------------


def test_twenty_blocked_calls_do_not_block_health_checks(served: Served) -> None:
    node = served.node
    with httpx.Client(timeout=WAIT) as client, ThreadPoolExecutor(20) as pool:
        futures = [
            pool.submit(client.post, served.public + f"/cells/Counter/c{i}/wait", json={})
            for i in range(20)
        ]
        wait_until(lambda: node.in_flight == 20)
        with httpx.Client(timeout=2.0) as probe:
            assert probe.get(served.public + "/healthz").status_code == 200
            assert probe.get(served.internal + "/healthz").status_code == 200
            assert probe.get(served.internal + "/state").status_code == 200
        assert not any(f.done() for f in futures)
        node.gate.set()
        answers = [f.result(WAIT) for f in futures]
    assert [a.status_code for a in answers] == [200] * 20
    assert {a.json()["result"] for a in answers} == {"released"}


def test_connections_are_kept_alive(served: Served) -> None:
    with httpx.Client(timeout=WAIT) as client:
        ports = set()
        for _ in range(3):
            r = client.post(served.public + "/cells/Counter/a/increment", json={})
            assert r.status_code == 200
            ports.add(r.extensions["network_stream"].get_extra_info("client_addr"))
    assert len(ports) == 1


# --- runner: graceful stop and self-fence ----------------------------------------------------


def test_sigterm_drains_first_then_stops_with_0() -> None:
    """Runs the runner in the main thread so that its real SIGTERM handler is installed."""
    node = FakeNode("node-s")
    node.drain_release.clear()
    runner = Runner(node, KEY, public=("127.0.0.1", 0), internal=("127.0.0.1", 0))
    seen: dict[str, Any] = {}
    failures: list[BaseException] = []

    def drive() -> None:
        try:
            assert runner.ready.wait(WAIT)
            assert runner.public_address is not None
            base = "http://{}:{}".format(*runner.public_address)
            with httpx.Client(timeout=WAIT) as client, ThreadPoolExecutor(1) as pool:
                in_flight = pool.submit(client.post, base + "/cells/Counter/a/wait", json={})
                wait_until(lambda: node.in_flight == 1)
                os.kill(os.getpid(), signal.SIGTERM)
                assert node.drain_started.wait(WAIT)
                seen["healthz"] = client.get(base + "/healthz").status_code
                seen["new_call"] = client.post(base + "/cells/Counter/b/whoami", json={})
                node.drain_release.set()
                node.gate.set()
                seen["in_flight"] = in_flight.result(WAIT)
        except BaseException as e:
            failures.append(e)
            node.gate.set()
            node.drain_release.set()
            runner.request_stop()

    driver = threading.Thread(target=drive)
    driver.start()
    code = runner.run(install_signals=True)
    driver.join(WAIT)
    assert not failures, failures
    assert code == 0
    assert node.drains == 1
    assert node.status == "stopped"
    assert seen["healthz"] == 503
    assert seen["new_call"].status_code == 503
    assert seen["new_call"].json()["error"] == "node_unavailable"
    assert seen["in_flight"].status_code == 200
    assert seen["in_flight"].json() == {"result": "released"}
    # The handlers were removed again: SIGTERM is back to its previous disposition.
    assert signal.getsignal(signal.SIGTERM) is not None


def test_on_fence_from_another_thread_exits_3_with_self_fence_line() -> None:
    node = FakeNode("node-f")
    out = io.StringIO()
    runner = Runner(node, KEY, public=("127.0.0.1", 0), internal=("127.0.0.1", 0), fence_stream=out)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(runner.run(install_signals=False)))
    thread.start()
    assert runner.ready.wait(WAIT)
    node.status = "fenced"
    threading.Thread(target=runner.on_fence, args=("lease renewal rejected",)).start()
    runner.on_fence("second reason is ignored")
    thread.join(WAIT)
    assert not thread.is_alive()
    assert codes == [3]
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("SELF-FENCE:")
    assert node.drains == 0  # a fenced node is not drained


def test_fenced_status_alone_is_noticed() -> None:
    node = FakeNode("node-g")
    out = io.StringIO()
    latch = FenceLatch()
    settings = ServerSettings(fence_poll_interval=0.05)
    runner = Runner(
        node,
        KEY,
        public=("127.0.0.1", 0),
        internal=("127.0.0.1", 0),
        settings=settings,
        fence=latch,
        fence_stream=out,
    )
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(runner.run(install_signals=False)))
    thread.start()
    assert runner.ready.wait(WAIT)
    node.status = "fenced"
    thread.join(WAIT)
    assert codes == [3]
    assert latch.tripped
    assert out.getvalue().startswith("SELF-FENCE: node node-g: node status is fenced")


def test_fence_before_start_exits_3_without_listening() -> None:
    latch = FenceLatch()
    latch.trip("renewal rejected")
    out = io.StringIO()
    runner = Runner(FakeNode(), KEY, public=("127.0.0.1", 0), fence=latch, fence_stream=out)
    assert runner.run(install_signals=False) == 3
    assert not runner.ready.is_set()
    assert "renewal rejected" in out.getvalue()


def test_port_in_use_exits_1() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        runner = Runner(FakeNode(), KEY, public=("127.0.0.1", port), internal=("127.0.0.1", 0))
        assert runner.run(install_signals=False) == 1


def test_reserved_sockets_are_served_as_they_are() -> None:
    # serve binds its addresses before touching the store; the servers must listen on those
    # very sockets, or another process may take a port between the check and the serving.
    reserved = {"public": socket.socket(), "internal": socket.socket()}
    for sock in reserved.values():
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
    public, internal = (reserved[w].getsockname() for w in ("public", "internal"))
    runner = Runner(FakeNode(), KEY, public=public, internal=internal, sockets=reserved)
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(runner.run(install_signals=False)))
    thread.start()
    try:
        assert runner.ready.wait(WAIT)
        assert (runner.public_address, runner.internal_address) == (public, internal)
        for sock in reserved.values():
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
        with httpx.Client(timeout=WAIT) as client:
            assert client.get("http://{}:{}/healthz".format(*public)).status_code == 200
    finally:
        runner.request_stop()
        thread.join(WAIT)
        for sock in reserved.values():
            sock.close()
    assert result == [0]


def test_app_builders_refuse_a_short_key() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        build_public_app(FakeNode(), b"short")
    with pytest.raises(ValueError, match="32 bytes"):
        build_internal_app(FakeNode(), b"short")


def test_fake_node_keeps_the_node_like_contract() -> None:
    """Type-checked: the fake is usable wherever the HTTP layer expects a node."""
    from cellactors.server.app import NodeLike

    node: NodeLike = FakeNode("node-t")
    assert node.status == "serving"
    assert node.call("Counter", "a", "increment", {"by": 4}) == 4


def test_a_large_body_is_decoded_off_the_serving_loop(
    served: Served, http: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decoding a large body takes time and memory: it runs in a worker thread, so that
    /healthz and other calls never wait behind it; a small one stays on the loop."""
    from cellactors.server import handling
    from cellactors.wire import codec

    threads: list[str] = []
    decode = codec.decode_kwargs

    def recording(body: bytes, encoding: codec.Encoding) -> dict[str, Any]:
        threads.append(threading.current_thread().name)
        return decode(body, encoding)

    monkeypatch.setattr(codec, "decode_kwargs", recording)
    big = {"x": "a" * (handling.DECODE_ON_LOOP_BYTES + 1)}
    assert post(http, served.public, "/cells/Counter/a/echo", {"x": 1}).status_code == 200
    assert post(http, served.public, "/cells/Counter/a/echo", big).status_code == 200
    loop_thread = served.thread.name
    assert threads[0] == loop_thread and threads[1] != loop_thread
