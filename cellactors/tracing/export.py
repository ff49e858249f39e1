"""Sending spans to an OpenTelemetry collector over OTLP/HTTP (``cellactors serve
--otlp-endpoint``, or the standard ``OTEL_EXPORTER_OTLP_ENDPOINT``).

The SDK and the exporter are the ``otel`` extra (``pip install 'cellactors[otel]'``); the
package itself needs only ``opentelemetry-api``. They are imported here, when tracing is
turned on, so a node that does not trace never loads them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from cellactors.errors import ConfigError
from cellactors.tracing import spans

#: The standard variables, most specific first (the traces one is a full URL).
TRACES_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
TRACES_PATH = "/v1/traces"
SERVICE_NAME = "cellactors"
#: How long stopping waits for the spans still batched to leave (a collector that does
#: not answer never holds a stopping node up longer).
FLUSH_TIMEOUT_S = 5.0


def traces_url(flag: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """Where spans go: the flag's URL (a collector's base URL, or its full ``/v1/traces``
    URL), else ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` as it is, else
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` plus ``/v1/traces``; None (tracing off) without any."""
    env = os.environ if env is None else env
    if flag:
        base = flag.rstrip("/")
        return base if base.endswith(TRACES_PATH) else base + TRACES_PATH
    if env.get(TRACES_ENDPOINT_ENV):
        return env[TRACES_ENDPOINT_ENV]
    if env.get(ENDPOINT_ENV):
        return env[ENDPOINT_ENV].rstrip("/") + TRACES_PATH
    return None


def install(url: str, node_id: str) -> Callable[[], None]:
    """Trace this process: an SDK tracer provider (``service.name`` ``cellactors``, the node
    id as ``service.instance.id`` and ``cellactors.node``) whose batch processor exports to
    ``url``, made the global provider too (so spans a cell's own code makes join the call's
    trace). Returns the function that stops it, flushing the spans still batched for at
    most :data:`FLUSH_TIMEOUT_S`. :class:`ConfigError` when the ``otel`` extra is not
    installed."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as err:
        raise ConfigError(
            "--otlp-endpoint (or OTEL_EXPORTER_OTLP_ENDPOINT) needs the OpenTelemetry SDK "
            f"and its OTLP/HTTP exporter: pip install 'cellactors[otel]' ({err})"
        ) from None
    from opentelemetry import trace

    resource: Any = Resource.create(
        {
            "service.name": SERVICE_NAME,
            "service.instance.id": node_id,
            "cellactors.node": node_id,
        }
    )
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
    trace.set_tracer_provider(provider)
    spans.enable(provider)

    def shutdown() -> None:
        spans.disable()
        # Exports what the batch processor still holds, in a thread of its own: the SDK's
        # own wait for an unanswering collector is far longer than a node's stop.
        flush = threading.Thread(target=provider.shutdown, name="otel-flush", daemon=True)
        flush.start()
        flush.join(FLUSH_TIMEOUT_S)

    return shutdown
