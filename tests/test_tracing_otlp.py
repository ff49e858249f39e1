"""Tracing of a real ``cellactors serve --otlp-endpoint`` process, received by an OTLP/HTTP
receiver on loopback (a small HTTP server decoding ``POST /v1/traces`` with
opentelemetry-proto: no collector needed), and how the endpoint is configured."""

from __future__ import annotations

import gzip
import signal
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from cellactors.errors import ConfigError
from cellactors.persistence.store.embedded import SeaweedServer
from cellactors.persistence.store.s3 import S3Bucket
from cellactors.tracing import export, spans
from tests.helpers.fleet import NodeProc
from tests.helpers.runtime import eventually

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"

APP = """
from cellactors import CellActor


class Tally(CellActor):
    def on_activate(self) -> None:
        self.db.execute("CREATE TABLE IF NOT EXISTS t (n INTEGER)")

    def add(self, n: int) -> int:
        self.db.execute("INSERT INTO t (n) VALUES (?)", [n])
        return int(self.db.execute("SELECT sum(n) FROM t").fetchone()[0])
"""


class Receiver:
    """An OTLP/HTTP trace receiver on loopback: every span it is sent, with the resource
    attributes of its batch."""

    def __init__(self) -> None:
        self.spans: list[tuple[dict[str, Any], Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver.take(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def take(self, request: ExportTraceServiceRequest) -> None:
        with self.lock:
            for resource_spans in request.resource_spans:
                resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
                for scope in resource_spans.scope_spans:
                    self.spans.extend((resource, span) for span in scope.spans)

    def named(self, name: str, trace_id: str) -> list[tuple[dict[str, Any], Any]]:
        with self.lock:
            return [
                (resource, span)
                for resource, span in self.spans
                if span.name == name and span.trace_id.hex() == trace_id
            ]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _value(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None


def attributes(span: Any) -> dict[str, Any]:
    return {a.key: _value(a.value) for a in span.attributes}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    try:
        yield server
    finally:
        server.close()


@pytest.mark.parametrize("when", ["batched", "on_stop"])
def test_a_served_node_exports_its_spans_over_otlp_http(
    tmp_path: Path, sw_bucket: S3Bucket, seaweed: SeaweedServer, receiver: Receiver, when: str
) -> None:
    """Spans leave in batches while the node serves (every 0.1 s here), and whatever is
    still batched leaves when it stops on SIGTERM (here nothing would leave before)."""
    app = tmp_path / "tally_app.py"
    app.write_text(APP)
    node = NodeProc(
        "traced",
        app,
        tmp_path,
        f"s3://{sw_bucket.bucket}",
        seaweed.endpoint,
        extra=["--otlp-endpoint", receiver.url],
        env={"OTEL_BSP_SCHEDULE_DELAY": "100" if when == "batched" else "600000"},
    )
    node.start()
    try:
        node.ready()
        answer = httpx.post(
            f"{node.public_url}/cells/Tally/a/add",
            json={"n": 2},
            headers={"traceparent": TRACEPARENT},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        wanted = ("cellactors.call", "cellactors.run", "cellactors.commit", "cellactors.ack")
        if when == "on_stop":
            assert not receiver.spans
            node.signal(signal.SIGTERM)
            assert node.wait(30) == 0
        found = eventually(lambda: _all(receiver, wanted), timeout=20)
    finally:
        node.kill()
    resource, call = found["cellactors.call"]
    assert resource["service.name"] == "cellactors"
    assert resource["cellactors.node"] == resource["service.instance.id"] == "traced"
    assert call.parent_span_id.hex() == "b7ad6b7169203331"
    assert attributes(call)[spans.CELL] == "Tally:a"
    assert attributes(call)[spans.OUTCOME] == "ok"
    _, run = found["cellactors.run"]
    assert run.parent_span_id == call.span_id
    assert attributes(run)[spans.METHOD] == "add"
    assert attributes(run)[spans.TXID] >= 1
    _, ack = found["cellactors.ack"]
    assert ack.parent_span_id == run.span_id
    assert attributes(ack)[spans.TXID] == attributes(run)[spans.TXID]


def _all(receiver: Receiver, names: tuple[str, ...]) -> dict[str, tuple[dict[str, Any], Any]]:
    found = {}
    for name in names:
        got = receiver.named(name, TRACE_ID)
        assert len(got) == 1, (name, len(got))
        found[name] = got[0]
    return found


def test_the_endpoint_comes_from_the_flag_or_the_standard_variables() -> None:
    base = "http://collector:4318"
    assert export.traces_url(None, {}) is None
    assert export.traces_url(base, {}) == base + "/v1/traces"
    assert export.traces_url(base + "/v1/traces/", {}) == base + "/v1/traces"
    assert export.traces_url(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": base + "/"}) == (
        base + "/v1/traces"
    )
    only_traces = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1/x"}
    assert export.traces_url(None, {**only_traces, "OTEL_EXPORTER_OTLP_ENDPOINT": base}) == (
        "http://t:1/x"
    )
    assert export.traces_url("http://flag:1", only_traces) == "http://flag:1/v1/traces"


def test_without_the_otel_extra_the_flag_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(ConfigError, match=r"pip install 'cellactors\[otel\]'"):
        export.install("http://127.0.0.1:4318/v1/traces", "n1")
    assert not spans.enabled()
