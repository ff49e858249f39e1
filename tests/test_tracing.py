"""OpenTelemetry tracing (cellactors.tracing, docs/observability.md "Traces"), recorded with
the SDK's in-memory exporter: one call's spans and attributes, a forward that keeps one
trace across two nodes, a trace header a non-peer cannot inject, calls between cells, the
outbox and alarms in their trace, and nothing at all while tracing is off."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    TraceFlags,
    set_span_in_context,
)

from cellactors import CellActor, Client
from cellactors.core import principal
from cellactors.core.principal import Principal
from cellactors.errors import RemoteOwner
from cellactors.persistence.celldb import calls
from cellactors.persistence.celldb.runtime_tables import OUTBOX_TABLE, RuntimeTables
from cellactors.persistence.store.s3 import S3Bucket
from cellactors.server import forward, signing
from cellactors.tracing import spans
from tests.helpers.cells import Counter
from tests.helpers.runtime import eventually, make_node
from tests.helpers.served import KEY, served_node

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


class Relay(CellActor):
    """Calls a counter synchronously, or through the outbox."""

    def relay(self, name: str) -> int:
        return int(self.cell(Counter, name).increment(name="x"))

    def post(self, name: str) -> str:
        return self.send(Counter, name, "increment", name="x")


class Waker(CellActor):
    """Sets an alarm whose ``on_alarm`` writes a row."""

    def on_activate(self) -> None:
        self.db.execute("CREATE TABLE IF NOT EXISTS fired (n INTEGER)")

    def arm(self) -> None:
        self.set_alarm(self.now())

    def on_alarm(self) -> None:
        self.db.execute("INSERT INTO fired (n) VALUES (1)")

    def fired(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM fired").fetchone()[0])

    def trace_rows(self) -> int:
        """Rows of the runtime's alarm-trace table (none before any traced set_alarm)."""
        if "_cellactors_alarm_trace" not in self.db.table_names():
            return 0
        return int(self.db.execute("SELECT count(*) FROM _cellactors_alarm_trace").fetchone()[0])


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """Tracing on, every span recorded in memory as it ends; off again afterwards."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    spans.enable(provider)
    try:
        yield memory
    finally:
        spans.disable()
        provider.shutdown()


def trace_id(span: ReadableSpan) -> str:
    assert span.context is not None
    return format(span.context.trace_id, "032x")


def named(memory: InMemorySpanExporter, name: str, **attrs: object) -> list[ReadableSpan]:
    """The finished spans called ``name`` whose ``cellactors.<key>`` attributes match."""
    return [
        s
        for s in memory.get_finished_spans()
        if s.name == name and all((s.attributes or {}).get(_key(k)) == v for k, v in attrs.items())
    ]


def _key(name: str) -> str:
    return {"cell_class": spans.CLASS, "cell_name": spans.NAME}.get(name, "cellactors." + name)


def one(memory: InMemorySpanExporter, name: str, **attrs: object) -> ReadableSpan:
    """The one finished span ``name`` (waited for: some end just after the answer)."""

    def found() -> ReadableSpan:
        got = named(memory, name, **attrs)
        assert len(got) == 1, (name, attrs, [s.name for s in memory.get_finished_spans()])
        return got[0]

    return eventually(found, timeout=15)


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.span_id)


def test_a_call_is_traced_from_the_callers_traceparent_to_its_acknowledgement(
    sw_bucket: S3Bucket, exporter: InMemorySpanExporter
) -> None:
    with served_node(sw_bucket, "n1") as served:
        resp = httpx.post(
            f"{served.public}/cells/Counter/a/increment",
            json={"name": "x"},
            headers={"traceparent": TRACEPARENT},
            timeout=30,
        )
        assert resp.status_code == 200, resp.text
        call = one(exporter, "cellactors.call")
        run = one(exporter, "cellactors.run", method="increment")
        commit = one(exporter, "cellactors.commit")
        ack = one(exporter, "cellactors.ack")
        activate = one(exporter, "cellactors.activate")
        acquire = one(exporter, "cellactors.acquire")
        restore = one(exporter, "cellactors.restore")
        put = one(exporter, "cellactors.put")
        reread = one(exporter, "cellactors.reread")
    everything = [call, run, commit, ack, activate, acquire, restore, put, reread]
    assert {trace_id(s) for s in everything} == {TRACE_ID}  # one trace, the caller's
    assert call.kind is SpanKind.SERVER and parent_of(call) == int(PARENT_ID, 16)
    assert call.attributes is not None
    assert call.attributes[spans.CELL] == "Counter:a"
    assert call.attributes[spans.CLASS] == "Counter"
    assert call.attributes[spans.NAME] == "a"
    assert call.attributes[spans.METHOD] == "increment"
    assert call.attributes[spans.OUTCOME] == "ok"
    # The activation (acquire, then restore at the claimed epoch) runs for the call.
    assert parent_of(activate) == span_id(call)
    assert parent_of(acquire) == parent_of(restore) == span_id(activate)
    assert activate.attributes is not None and restore.attributes is not None
    epoch = activate.attributes[spans.EPOCH]
    assert restore.attributes[spans.EPOCH] == epoch
    # The method's transaction on the cell's thread, its commit, and the acknowledgement.
    assert parent_of(run) == span_id(call)
    assert run.attributes is not None and commit.attributes is not None
    assert run.attributes[spans.EPOCH] == epoch
    assert run.attributes[spans.OUTCOME] == "ok"
    txid = run.attributes[spans.TXID]
    assert isinstance(txid, int) and txid >= 1
    assert parent_of(commit) == span_id(run) and commit.attributes[spans.TXID] == txid
    assert (call.attributes[spans.EPOCH], call.attributes[spans.TXID]) == (epoch, txid)
    assert parent_of(ack) == span_id(run)
    assert ack.attributes is not None
    assert (ack.attributes[spans.TXID], ack.attributes[spans.EPOCH]) == (txid, epoch)
    assert ack.attributes[spans.OUTCOME] == "ok"
    assert parent_of(put) == parent_of(reread) == span_id(ack)
    assert put.end_time is not None and reread.start_time is not None
    assert put.end_time <= reread.start_time  # the re-read follows the PUT's answer


def test_the_python_client_sends_its_programs_trace_context(
    sw_bucket: S3Bucket, exporter: InMemorySpanExporter
) -> None:
    """A traced program calling a node with :class:`Client` (OpenTelemetry's global
    propagator) has the node's spans in its trace."""
    caller = SpanContext(
        int(TRACE_ID, 16), int(PARENT_ID, 16), False, TraceFlags(TraceFlags.SAMPLED)
    )
    with served_node(sw_bucket, "n1") as served, Client(served.public) as client:
        token = otel_context.attach(set_span_in_context(NonRecordingSpan(caller)))
        try:
            assert client.call("Counter", "t", "increment", name="x") == 1
        finally:
            otel_context.detach(token)
        assert client.call("Counter", "t", "increment", name="x") == 2  # outside: a new trace
        calls = eventually(lambda: _two(named(exporter, "cellactors.call")))
    first, second = sorted(calls, key=lambda s: s.start_time or 0)
    assert trace_id(first) == TRACE_ID and parent_of(first) == int(PARENT_ID, 16)
    assert trace_id(second) != TRACE_ID and second.parent is None


def test_a_failed_call_has_its_outcome(sw_bucket: S3Bucket, exporter: InMemorySpanExporter) -> None:
    with served_node(sw_bucket, "n1") as served:
        resp = httpx.post(
            f"{served.public}/cells/Counter/a/fail_after_write", json={"name": "x"}, timeout=30
        )
        assert resp.status_code == 422, resp.text
        call = one(exporter, "cellactors.call", method="fail_after_write")
        run = one(exporter, "cellactors.run", method="fail_after_write")
    assert call.attributes is not None and run.attributes is not None
    assert call.attributes[spans.OUTCOME] == run.attributes[spans.OUTCOME] == "failed"
    assert spans.TXID not in run.attributes  # rolled back: nothing committed
    assert not named(exporter, "cellactors.commit")


def test_a_forwarded_call_keeps_one_trace_across_nodes(
    sw_bucket: S3Bucket, exporter: InMemorySpanExporter
) -> None:
    with served_node(sw_bucket, "n2") as b, served_node(sw_bucket, "n1") as a:
        warm = httpx.post(f"{b.public}/cells/Counter/f/increment", json={"name": "x"}, timeout=30)
        assert warm.status_code == 200, warm.text  # the cell lives on n2
        exporter.clear()
        resp = httpx.post(
            f"{a.public}/cells/Counter/f/increment",
            json={"name": "x"},
            headers={"traceparent": TRACEPARENT},
            timeout=30,
        )
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-cellactors-node"] == "n2"
        calls = eventually(lambda: _two(named(exporter, "cellactors.call")))
        sent = one(exporter, "cellactors.forward")
        run = one(exporter, "cellactors.run", method="increment")
    first, owner = sorted(calls, key=lambda s: s.start_time or 0)
    assert {trace_id(s) for s in (first, sent, owner, run)} == {TRACE_ID}
    assert parent_of(first) == int(PARENT_ID, 16)
    assert sent.kind is SpanKind.CLIENT and parent_of(sent) == span_id(first)
    assert sent.attributes is not None and sent.attributes["cellactors.peer"] == "n2"
    assert owner.kind is SpanKind.SERVER and parent_of(owner) == span_id(sent)
    assert parent_of(run) == span_id(owner)
    assert first.attributes is not None and owner.attributes is not None
    assert first.attributes[spans.OUTCOME] == owner.attributes[spans.OUTCOME] == "ok"


def _two(found: list[ReadableSpan]) -> list[ReadableSpan]:
    assert len(found) == 2, [s.name for s in found]
    return found


def test_a_trace_header_is_trusted_only_under_a_peers_signature(
    sw_bucket: S3Bucket, exporter: InMemorySpanExporter
) -> None:
    """The internal listener takes a trace context only from a signed peer request: one a
    non-peer sends (unsigned, or added to a signed request) is refused with its request
    and makes no span."""
    forged = "00-" + "f" * 32 + "-" + "1" * 16 + "-01"
    path = "/internal/cells/Counter/s/increment"
    with served_node(sw_bucket, "n1") as served:
        node = served.node
        unsigned = httpx.post(
            served.internal + path,
            json={"name": "x"},
            headers={signing.TRACE_HEADER: forged, "traceparent": forged},
            timeout=30,
        )
        assert unsigned.status_code == 401, unsigned.text

        def peer_request(trace: str) -> forward.Forward:
            owner = RemoteOwner(node.node_id, served.internal, node.generation)
            return forward.signed(
                KEY,
                "peer",
                owner,
                "Counter",
                "s",
                "increment",
                b'{"name": "x"}',
                "json",
                idempotency_key=None,
                now=node.store_time(),
                trace=trace,
            )

        grafted = peer_request("")  # signed without a trace; one added on the way
        headers = {**grafted.headers, signing.TRACE_HEADER: forged}
        refused = httpx.post(grafted.url, content=grafted.body, headers=headers, timeout=30)
        assert refused.status_code == 401, refused.text
        altered = peer_request(TRACEPARENT)  # signed with one trace, sent with another
        headers = {**altered.headers, signing.TRACE_HEADER: forged}
        refused = httpx.post(altered.url, content=altered.body, headers=headers, timeout=30)
        assert refused.status_code == 401, refused.text
        assert not named(exporter, "cellactors.call")
        # A plain traceparent on a signed request is no trace context of the peer's.
        plain = peer_request("")
        headers = {**plain.headers, "traceparent": forged}
        ok = httpx.post(plain.url, content=plain.body, headers=headers, timeout=30)
        assert ok.status_code == 200, ok.text
        call = one(exporter, "cellactors.call")
        assert trace_id(call) != "f" * 32 and call.parent is None
        exporter.clear()
        signed = peer_request(TRACEPARENT)
        ok = httpx.post(signed.url, content=signed.body, headers=signed.headers, timeout=30)
        assert ok.status_code == 200, ok.text
        call = one(exporter, "cellactors.call")
    assert trace_id(call) == TRACE_ID and parent_of(call) == int(PARENT_ID, 16)
    assert all(trace_id(s) != "f" * 32 for s in exporter.get_finished_spans())


def test_calls_between_cells_and_outbox_deliveries_stay_in_the_callers_trace(
    sw_bucket: S3Bucket, exporter: InMemorySpanExporter
) -> None:
    node = make_node(sw_bucket, "n1")
    node.register(Relay)
    try:
        with spans.span("client"):
            assert node.call("Relay", "r", "relay", {"name": "c"}) == 1
            message = node.call("Relay", "r", "post", {"name": "d"})
        root = trace_id(_finished(exporter, "client"))
        relay = one(exporter, "cellactors.run", cell="Relay:r", method="relay")
        out = one(exporter, "cellactors.call_cell", cell="Counter:c")
        inner = one(exporter, "cellactors.run", cell="Counter:c", method="increment")
        assert parent_of(out) == span_id(relay) and parent_of(inner) == span_id(out)
        assert out.kind is SpanKind.CLIENT
        assert out.attributes is not None and out.attributes[spans.OUTCOME] == "ok"
        post = one(exporter, "cellactors.run", cell="Relay:r", method="post")
        delivery = one(exporter, "cellactors.deliver", message=message)
        delivered = one(exporter, "cellactors.run", cell="Counter:d", method="increment")
        assert parent_of(delivery) == span_id(post)
        assert delivery.attributes is not None
        assert delivery.attributes["cellactors.delivery"] == "delivered"
        assert delivery.attributes[spans.OUTCOME] == "ok"
        assert delivery.attributes["cellactors.sender"] == "Relay:r"
        assert parent_of(delivered) == span_id(delivery)
        for span in (relay, out, inner, post, delivery, delivered):
            assert trace_id(span) == root, span.name
        # Only a trace's own start has no parent: the runtime's own work starts none.
        roots = [s.name for s in exporter.get_finished_spans() if s.parent is None]
        assert roots == ["client"], roots
    finally:
        node.stop()


def test_a_call_between_cells_on_two_nodes_keeps_one_trace(
    sw_bucket: S3Bucket, exporter: InMemorySpanExporter
) -> None:
    """A cell calling a cell another node owns: the signed peer request carries the
    calling span's context, and the owner's spans are its children."""
    classes = (Counter, Relay)
    with (
        served_node(sw_bucket, "n2", classes=classes) as b,
        served_node(sw_bucket, "n1", classes=classes) as a,
    ):
        warm = httpx.post(f"{b.public}/cells/Counter/g/increment", json={"name": "x"}, timeout=30)
        assert warm.status_code == 200 and warm.headers["x-cellactors-node"] == "n2"
        exporter.clear()
        resp = httpx.post(
            f"{a.public}/cells/Relay/r/relay",
            json={"name": "g"},
            headers={"traceparent": TRACEPARENT},
            timeout=30,
        )
        assert resp.status_code == 200, resp.text
        assert resp.json()["result"] == 2 and resp.headers["x-cellactors-node"] == "n1"
        relay = one(exporter, "cellactors.run", cell="Relay:r")
        out = one(exporter, "cellactors.call_cell", cell="Counter:g")
        owner = one(exporter, "cellactors.call", cell="Counter:g")
        inner = one(exporter, "cellactors.run", cell="Counter:g")
    assert {trace_id(s) for s in (relay, out, owner, inner)} == {TRACE_ID}
    assert parent_of(out) == span_id(relay)
    assert owner.kind is SpanKind.SERVER and parent_of(owner) == span_id(out)
    assert parent_of(inner) == span_id(owner)


def _finished(memory: InMemorySpanExporter, name: str) -> ReadableSpan:
    found = [s for s in memory.get_finished_spans() if s.name == name]
    assert len(found) == 1
    return found[0]


def test_an_alarm_fire_is_a_span_with_its_transaction_under_it(
    sw_bucket: S3Bucket, exporter: InMemorySpanExporter
) -> None:
    node = make_node(sw_bucket, "n1")
    node.register(Waker)
    try:
        with spans.span("setter", kind=spans.SpanKind.CLIENT) as setter:
            node.call("Waker", "w", "arm", {})
        eventually(lambda: node.call("Waker", "w", "fired", {}) == 1)
        alarm = one(exporter, "cellactors.alarm", cell="Waker:w")
        run = one(exporter, "cellactors.run", cell="Waker:w", method="on_alarm")
        assert node.call("Waker", "w", "trace_rows", {}) == 0  # gone with the alarm
    finally:
        node.stop()
    assert alarm.parent is None  # the fire starts a trace of its own; its run links to the setter
    set_by = one(exporter, "setter")
    assert [format(link.context.trace_id, "032x") for link in run.links] == [trace_id(set_by)]
    assert setter is not spans.OFF
    assert parent_of(run) == span_id(alarm) and trace_id(run) == trace_id(alarm)
    assert alarm.attributes is not None and run.attributes is not None
    assert alarm.attributes["cellactors.alarm.result"] == "fired"
    assert alarm.attributes[spans.OUTCOME] == run.attributes[spans.OUTCOME] == "ok"
    assert isinstance(run.attributes[spans.TXID], int)
    assert isinstance(run.attributes[spans.EPOCH], int)


def test_with_tracing_off_nothing_is_traced_and_calls_still_work(sw_bucket: S3Bucket) -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))  # never enabled
    assert not spans.enabled()
    assert spans.span("x") is spans.OFF
    assert spans.current() is None and spans.traceparent() == ""
    assert spans.parent_from(TRACEPARENT) is None
    with served_node(sw_bucket, "n1") as served:
        resp = httpx.post(
            f"{served.public}/cells/Counter/a/increment",
            json={"name": "x"},
            headers={"traceparent": TRACEPARENT},
            timeout=30,
        )
        assert resp.status_code == 200 and resp.json()["result"] == 1
    assert memory.get_finished_spans() == ()
    provider.shutdown()


def test_a_span_site_costs_next_to_nothing_while_tracing_is_off() -> None:
    """The off path is one flag check: no span, context or attribute is built."""

    def site() -> None:
        with spans.span("cellactors.run", None, cell="C:a", method="m") as span:
            span.set(spans.TXID, 1)
            span.outcome(None)

    assert _per_call(site) < 20e-6  # generous: a warm call takes hundreds of microseconds


def _per_call(fn: Callable[[], None], n: int = 20_000) -> float:
    started = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - started) / n


def test_a_malformed_traceparent_is_ignored_not_refused(exporter: InMemorySpanExporter) -> None:
    assert spans.parent_from("not-a-trace") is None
    assert spans.parent_from("00-" + "0" * 32 + "-" + "0" * 16 + "-01") is None
    assert spans.parent_from(TRACEPARENT) is not None
    with spans.span("outer") as outer:
        assert spans.traceparent().startswith("00-")
        assert outer.context() is not None


def test_outbox_rows_carry_a_trace_and_rows_without_one_still_read() -> None:
    conn = sqlite3.connect(":memory:")
    tables = RuntimeTables(conn)
    alice = Principal("alice", frozenset({"ops"}))
    tables.add_message(1, "Counter:a", "increment", {"name": "x"}, 10, None, TRACEPARENT)
    tables.add_message(1, "Counter:a", "increment", {"name": "y"}, 11, alice, TRACEPARENT)
    tables.add_message(1, "Counter:a", "increment", {"name": "z"}, 12, alice)
    tables.add_message(1, "Counter:a", "increment", {"name": "w"}, 13)
    # A row as a node before traces wrote it: [kwargs, caller], or the kwargs alone.
    old = calls.encode([{"name": "v"}, principal.encode(alice)])
    conn.execute(
        f"INSERT INTO main.{OUTBOX_TABLE} (id, txid, target, method, kwargs, at_ms) "
        "VALUES ('outbox.old', 1, 'Counter:a', 'increment', ?, 14)",
        (old,),
    )
    got = [(m.kwargs["name"], m.caller, m.trace, m.at_ms) for m in tables.messages()]
    assert got == [
        ("x", None, TRACEPARENT, 10),
        ("y", alice, TRACEPARENT, 11),
        ("z", alice, "", 12),
        ("w", None, "", 13),
        ("v", alice, "", 14),
    ]
