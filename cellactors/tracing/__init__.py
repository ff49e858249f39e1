"""OpenTelemetry tracing of calls, activations, commits and acknowledgements
(docs/observability.md, "Traces"): :mod:`.spans` makes the spans and carries their context
across threads, nodes and the outbox; :mod:`.export` installs the SDK and its OTLP/HTTP
exporter for ``cellactors serve``. Off unless configured, and then it costs one flag check
per span site."""
