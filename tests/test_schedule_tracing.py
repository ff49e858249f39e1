"""A schedule's run is traced like an alarm's fire: its own trace, the ``on_schedule``
transaction under it, named for the schedule and linked to the call that set it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cellactors.persistence.store.s3 import S3Bucket
from cellactors.tracing import spans
from tests.helpers.runtime import eventually, make_node
from tests.helpers.schedule_cells import Planner


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    spans.enable(provider)
    try:
        yield memory
    finally:
        spans.disable()
        provider.shutdown()


def finished(memory: InMemorySpanExporter, name: str, **attrs: object) -> list[ReadableSpan]:
    return [
        s
        for s in memory.get_finished_spans()
        if s.name == name and all((s.attributes or {}).get(k) == v for k, v in attrs.items())
    ]


def test_a_schedule_run_is_a_span_linked_to_the_call_that_set_it(
    sw_bucket: S3Bucket, exporter: InMemorySpanExporter
) -> None:
    node = make_node(sw_bucket, "n1")
    node.register(Planner)
    try:
        with spans.span("setter", kind=spans.SpanKind.CLIENT):
            node.call("Planner", "t", "plan", {"name": "soon", "after": 0.1})
        eventually(lambda: len(node.call("Planner", "t", "runs", {})) == 1)
        attrs = {"cellactors.method": "on_schedule", "cellactors.schedule": "soon"}
        run = eventually(lambda: finished(exporter, "cellactors.run", **attrs) or False)
    finally:
        node.stop()
    assert isinstance(run, list) and len(run) == 1
    (setter,) = finished(exporter, "setter")
    assert setter.context is not None and run[0].context is not None
    assert [link.context.trace_id for link in run[0].links] == [setter.context.trace_id]
    assert run[0].context.trace_id != setter.context.trace_id  # a trace of its own
