"""OpenTelemetry export: one span per trace record, built from the record itself.

A record sink (offscope/proxy/sinks.py) fed with the very records the JSONL
trace gets, so what a span says is what the trace says, redacted the same way,
for every producer that writes records through the engine (the HTTP proxy, the
stdio MCP wrapper). Turned on by the standard OTLP environment variables
(`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`); the
SDK is imported only then, and only when the `offscope[otel]` extra is installed.

Export never blocks a flow: a span is handed to a `BatchSpanProcessor` whose
queue is bounded (`OTEL_BSP_MAX_QUEUE_SIZE`, 2048 by default) and exported from
its own thread. A span that does not reach the collector (queue full, export
failed) is counted in `offscope_otel_spans_dropped_total`.

Attribute names follow the OpenTelemetry GenAI semantic conventions (tool
execution, inference and MCP spans) where one applies; offscope's own
attributes are under `offscope.*`. docs/otel.md lists them.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import structlog

from offscope.errors import InputError
from offscope.proxy.extract.llm import DIALECTS
from offscope.trace.events import Event, LlmEvent, OperatorEvent, ToolCallEvent
from offscope.trace.metrics import Signal

if TYPE_CHECKING:
    from offscope.proxy.exporter import Exporter

log = structlog.get_logger("offscope")

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
PROTOCOL_VARS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
SUPPORTED_PROTOCOL = "http/protobuf"
SHUTDOWN_SECONDS = 5.0  # the most a stopping proxy waits for the last spans to go out

Dropped = Callable[[str, int], None]  # (cause, spans)


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment asks for OTLP trace export."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return any(environ.get(name, "").strip() for name in ENDPOINT_VARS)


def describe_environment(environ: Mapping[str, str] = os.environ) -> str | None:
    """Where spans go, for the start-up banner (None: export is off). A protocol
    offscope does not speak is an error (exit 2), not a silent lack of spans."""
    if not wanted(environ):
        return None
    protocol = next(
        (environ[n].strip() for n in PROTOCOL_VARS if environ.get(n, "").strip()),
        SUPPORTED_PROTOCOL,
    )
    if protocol != SUPPORTED_PROTOCOL:
        raise InputError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r} is not supported",
            hint=f"offscope exports OTLP over HTTP: set it to {SUPPORTED_PROTOCOL} "
            "(or unset it) and point OTEL_EXPORTER_OTLP_ENDPOINT at the "
            "collector's OTLP/HTTP port (4318)",
        )
    return next(environ[n].strip() for n in ENDPOINT_VARS if environ.get(n, "").strip())


def from_environment(dropped: Dropped, environ: Mapping[str, str] = os.environ) -> OtelSink | None:
    """The OTLP sink the environment asks for, or None (nothing imported) when
    it asks for none or the `offscope[otel]` extra is not installed."""
    if describe_environment(environ) is None:
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        log.warning(
            "otel_export_unavailable",
            reason="the offscope[otel] extra is not installed",
            hint="pip install 'offscope[otel]'",
        )
        return None
    return OtelSink(OTLPSpanExporter(), dropped)


def record_sinks(exporter: Exporter) -> list[OtelSink]:
    """The record sinks the environment asks for, wired to the exporter's
    dropped-span counter: what a producer passes as `TraceSink(..., extra=...)`."""
    sink = from_environment(exporter.otel_dropped)
    if sink is None:
        return []
    exporter.otel_enabled()
    return [sink]


class OtelSink:
    """Turns records into spans off the flow's thread and hands them to a
    batching processor.

    `emit` only appends the record to a bounded queue: building a span (the
    SDK validates every attribute) costs far more than writing the JSONL line,
    so a worker thread does it, and a full queue drops (and counts) the record."""

    def __init__(self, span_exporter: Any, dropped: Dropped, max_queue: int | None = None) -> None:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider

        from offscope import __version__

        resource = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
        if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
            resource = resource.merge(Resource({SERVICE_NAME: "offscope"}))
        self._dropped = dropped
        self._processor = _counting_processor(_CountingExporter(span_exporter, dropped), dropped)
        self._provider = TracerProvider(resource=resource)  # not the global one: offscope's own
        self._provider.add_span_processor(self._processor)
        self._tracer = self._provider.get_tracer("offscope", __version__)
        self._max_queue = max_queue or _queue_size()
        self._pending: deque[
            tuple[ToolCallEvent | OperatorEvent | LlmEvent, tuple[Signal, ...]]
        ] = deque()
        self._wake = threading.Event()
        self._closed = False
        self._worker = threading.Thread(target=self._work, name="offscope-otel-spans", daemon=True)
        self._worker.start()

    def emit(self, event: Event, signals: Sequence[Signal] = ()) -> None:
        """Queue a tool call, operator exchange or LLM call for its span; never
        blocks, never raises."""
        if self._closed or not isinstance(event, ToolCallEvent | OperatorEvent | LlmEvent):
            return
        if len(self._pending) >= self._max_queue:
            self._dropped("queue_full", 1)
            return
        self._pending.append((event, tuple(signals)))
        self._wake.set()

    def _work(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()  # before draining: a record queued meanwhile sets it again
            while self._pending:
                event, signals = self._pending.popleft()
                try:
                    self._span(event, signals)
                except Exception as exc:  # telemetry must not stop on one bad record
                    self._dropped("error", 1)
                    log.error("otel_span_failed", error=str(exc), run=event.run, type=event.type)
            if self._closed:
                return

    def _span(
        self, event: ToolCallEvent | OperatorEvent | LlmEvent, signals: Sequence[Signal]
    ) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        name, attributes = describe(event)
        end = _ns(event.ts)
        start = min(_ns(event.started), end) if event.started is not None else end
        span = self._tracer.start_span(
            name,
            context=_parent(event.traceparent),
            start_time=start,
            attributes=attributes,
            kind=SpanKind.INTERNAL if isinstance(event, OperatorEvent) else SpanKind.CLIENT,
        )
        for event_name, event_attributes in span_events(event, signals):
            span.add_event(event_name, event_attributes, timestamp=end)
        error = _error(event)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=end)

    def close(self) -> None:
        """Build the queued spans and send them, waiting at most SHUTDOWN_SECONDS
        in all (a dead collector must not hold a stopping proxy)."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        deadline = time.monotonic() + SHUTDOWN_SECONDS
        self._worker.join(SHUTDOWN_SECONDS)
        done = threading.Thread(
            target=self._provider.shutdown, name="offscope-otel-shutdown", daemon=True
        )
        done.start()
        done.join(max(0.0, deadline - time.monotonic()))
        if self._worker.is_alive() or done.is_alive():
            log.warning("otel_shutdown_incomplete", waited_seconds=SHUTDOWN_SECONDS)


def _queue_size(environ: Mapping[str, str] = os.environ) -> int:
    """Records waiting for their span: the batching processor's queue size
    (OTEL_BSP_MAX_QUEUE_SIZE, 2048 by default), so one setting bounds both."""
    try:
        return max(1, int(environ.get("OTEL_BSP_MAX_QUEUE_SIZE", "2048")))
    except ValueError:
        return 2048


# -- records -> spans (pure functions: the tests and docs/otel.md follow them) ------

AttributeValue = str | bool | int | float | list[str]


def describe(
    event: ToolCallEvent | OperatorEvent | LlmEvent,
) -> tuple[str, dict[str, AttributeValue]]:
    """The span name and attributes of a record."""
    attrs: dict[str, AttributeValue] = {
        "offscope.ledger": event.ledger,
        "offscope.run": event.run,
        "offscope.record": event.type,
    }
    if isinstance(event, ToolCallEvent):
        return _tool_call(event, attrs)
    if isinstance(event, OperatorEvent):
        attrs.update(
            {
                "offscope.step": event.step,
                "offscope.source": event.source,
                "offscope.operator.channel": event.channel,
                "offscope.provenance": event.provenance,
                "offscope.reply_policy": event.policy,
            }
        )
        if event.claimed_provenance is not None:
            attrs["offscope.claimed_provenance"] = event.claimed_provenance
        return f"offscope.operator {event.source}", attrs
    attrs.update(
        {
            "gen_ai.operation.name": "chat",
            "offscope.source": "llm",
            "offscope.llm.api": event.api,
            "offscope.llm.stream": event.stream,
            "offscope.llm.tool_calls": len(event.tool_calls),
        }
    )
    # gen_ai.provider.name (and the older gen_ai.system): the dialect's telemetry name
    known = DIALECTS.get(event.api)
    provider = known.telemetry_name if known is not None else None
    if provider:
        attrs["gen_ai.provider.name"] = attrs["gen_ai.system"] = provider
    if event.model:
        attrs["gen_ai.request.model"] = event.model
    return ("chat " + event.model) if event.model else "chat", attrs


def _tool_call(
    event: ToolCallEvent, attrs: dict[str, AttributeValue]
) -> tuple[str, dict[str, AttributeValue]]:
    call = event.call
    attrs.update(
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.tool,
            "offscope.source": call.source,
            "offscope.scope": call.scope,
            "offscope.stage": call.stage,
            "offscope.decision": event.decision,
            "offscope.injected": event.injected,
            "offscope.targets": [f"{t.kind}:{t.value}" for t in call.targets],
            "offscope.targets.out_of_scope": [
                f"{t.kind}:{t.value}" for t in call.targets if not t.in_scope
            ],
        }
    )
    optional: dict[str, Any] = {
        "offscope.step": event.step,
        "offscope.stage_from": call.stage_from,
        "offscope.friction": event.friction,
        "offscope.reason": event.reason,
        "offscope.request_id": event.request_id,
        "gen_ai.tool.call.id": event.call_id,
        "http.response.status_code": event.status,
    }
    if call.source == "mcp":
        optional.update(
            {
                "mcp.method.name": "tools/call",
                "jsonrpc.request.id": event.call_id,
                "mcp.session.id": event.session,
            }
        )
    if call.source in ("http", "mcp"):
        optional.update({"http.request.method": call.method, "url.full": call.url})
    attrs.update({k: v for k, v in optional.items() if v is not None})
    name = f"tools/call {call.tool}" if call.source == "mcp" else f"execute_tool {call.tool}"
    return name, attrs


def span_events(
    event: Event, signals: Sequence[Signal]
) -> list[tuple[str, dict[str, AttributeValue]]]:
    """Span events: a block, an injected friction, each target let in by a grant,
    and the run-level signals a self-granted permission or a harness approval raise."""
    out: list[tuple[str, dict[str, AttributeValue]]] = []
    if isinstance(event, ToolCallEvent):
        if event.decision in ("block", "friction"):
            detail: dict[str, Any] = {
                "offscope.reason": event.reason,
                "offscope.request_id": event.request_id,
                "offscope.friction": event.friction,
                "http.response.status_code": event.status,
            }
            out.append(
                (f"offscope.{event.decision}", {k: v for k, v in detail.items() if v is not None})
            )
        for target in event.call.targets:
            if target.grant is not None:
                out.append(
                    (
                        "offscope.grant",
                        {
                            "offscope.grant": target.grant,
                            "offscope.target": f"{target.kind}:{target.value}",
                        },
                    )
                )
    for signal in signals:
        if signal.kind in ("self_granted", "harness_approval"):
            out.append(
                (
                    f"offscope.{signal.kind}",
                    {"offscope.step": signal.step} if signal.step is not None else {},
                )
            )
    return out


def _error(event: Event) -> str | None:
    """The span status description when the call failed or was blocked."""
    if isinstance(event, ToolCallEvent):
        if event.decision == "block":
            return f"blocked by offscope: {event.reason or 'out of scope'}"
        if event.status is not None and event.status >= 500:
            return f"HTTP {event.status}"
    return None


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


def _parent(traceparent: str | None) -> Any:
    if not traceparent:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({"traceparent": traceparent})


# -- the dropped-span count -----------------------------------------------------------


class _CountingExporter:
    """The OTLP exporter, counting the spans of every batch it could not send."""

    def __init__(self, inner: Any, dropped: Dropped) -> None:
        self._inner, self._dropped = inner, dropped

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        try:
            result = self._inner.export(spans)
        except Exception as exc:
            log.error("otel_export_failed", error=str(exc), spans=len(spans))
            result = SpanExportResult.FAILURE
        if result != SpanExportResult.SUCCESS:
            self._dropped("export_failed", len(spans))
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


def _counting_processor(span_exporter: Any, dropped: Dropped) -> Any:
    """A BatchSpanProcessor that counts the spans its full queue pushes out."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    class CountingBatchSpanProcessor(BatchSpanProcessor):
        def on_end(self, span: Any) -> None:
            # The SDK's queue is a bounded deque that silently drops its oldest
            # span when full; it offers no count, so look before adding.
            queue = getattr(getattr(self, "_batch_processor", None), "_queue", None)
            if (
                queue is not None
                and queue.maxlen is not None
                and len(queue) >= queue.maxlen
                and span.context is not None
                and span.context.trace_flags.sampled
            ):
                dropped("queue_full", 1)
            super().on_end(span)

    return CountingBatchSpanProcessor(span_exporter)
