"""What the proxy writes of a call: the tool_call record of a decided call, and the one
way every event reaches the sinks (the run's folded state, the exporter, the trace).

The engine calls these with itself as the `RecordHost`."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

import structlog
from pydantic_core import PydanticSerializationError

from offscope.ledgers.matcher import CompiledLedger, TagResult
from offscope.proxy.exchange import (
    EXCERPT,
    Exchange,
    PendingCall,
    flow_stamp,
    scrub,
    tool_call_fields,
)
from offscope.proxy.exporter import Exporter
from offscope.proxy.runs import RunContext, RunTable
from offscope.proxy.sinks import TraceSink
from offscope.trace.events import Event, ToolCallEvent
from offscope.trace.redact import redact_text

log = structlog.get_logger("offscope")


class RecordHost(Protocol):
    """What recording uses of the engine."""

    runs: RunTable
    exporter: Exporter
    trace: TraceSink
    clock: Callable[[], float]

    def cover(self, ledger: CompiledLedger, tag: TagResult) -> None: ...


def emit(host: RecordHost, ctx: RunContext, event: Event) -> None:
    """Fold an event into its run's state and write it to every sink: the exporter's
    metrics and the trace. A sink failure is counted and logged, never raised."""
    if ctx.state.ended is not None and event.type != "run_end":
        # A call answered after its run ended: fold it where `offscope report`
        # folds it, into the latest run of that id (a new one, if it started).
        ctx = host.runs.get(event.run) or ctx
    signals = ctx.state.observe(event)
    try:
        host.exporter.record(event, signals)
        try:
            host.trace.write(event, signals)
        except (PydanticSerializationError, UnicodeError):
            # Bytes that are not UTF-8 (a header an extract rule reads) or a lone
            # surrogate from a JSON body: record the call with them escaped.
            host.trace.write(printable(event), signals)
    except OSError as exc:  # a full disk: count it (an alert), keep serving
        host.exporter.trace_write_failed()
        host.exporter.dropped()
        log.error(
            "trace_write_failed", error=exc.strerror or str(exc), run=event.run, type=event.type
        )
        return
    except Exception as exc:  # a sink failure must not take the flow down
        host.exporter.dropped()
        log.error("event_dropped", error=str(exc), run=event.run, type=event.type)
        return
    if event.type == "tool_call" and event.call.scope == "out":
        log.info(
            "out_of_scope_call",
            run=event.run,
            ledger=event.ledger,
            step=event.step,
            stage=event.call.stage,
            decision=event.decision,
            targets=[f"{t.kind}:{t.value}" for t in event.call.targets if not t.in_scope],
        )


def record_call(
    host: RecordHost,
    ex: Exchange,
    pending: PendingCall,
    status: int | None,
    *,
    injected: bool,
    excerpt: bytes = b"",
    error: str | None = None,
) -> None:
    """Record one decided call: its tool_call event, redacted as the trace keeps calls."""
    assert ex.ctx is not None
    host.cover(ex.ledger, pending.tag)
    v = pending.verdict
    notes = pending.notes + ([f"upstream error: {error}"] if error else [])
    url = ex.req.url if pending.call.source != "llm" else None
    # One validation of the whole event (nested dicts are built in pydantic-core).
    emit(
        host,
        ex.ctx,
        ToolCallEvent.model_validate(
            {
                **flow_stamp(ex, host.clock()),
                "step": pending.step,
                "call": {
                    **tool_call_fields(
                        pending.call,
                        pending.tag,
                        notes,
                        url,
                        len(ex.req.body),
                        ledger=ex.ledger,
                        port=ex.req.port if url else None,
                    ),
                    "stage_from": pending.tag.stage_from,
                },
                "decision": v.decision,
                "status": status,
                "injected": injected,
                "friction": v.friction,
                "reason": v.reason,
                "request_id": pending.request_id,
                "approval": pending.approval or _grant_approval(ex.ledger, pending.tag),
                "call_id": None if pending.mcp_id is None else str(pending.mcp_id),
                "session": _session_digest(getattr(ex.state, "session", None)),
                "continues": pending.continues,
                "response_excerpt": redact_text(
                    scrub(ex, excerpt[:EXCERPT].decode("utf-8", "replace")), EXCERPT
                )
                or None,
            }
        ),
    )


def _grant_approval(ledger: CompiledLedger, tag: TagResult) -> dict[str, Any] | None:
    """Who approved the grants a call was let through by, and when."""
    if not tag.targets or not (ids := tag.grants):
        return None
    grant = ledger.grant(ids[0])
    if grant is None:
        return None
    at = datetime.fromisoformat(grant.created).timestamp() if grant.created else None
    return {
        "request_id": grant.request_id,
        "outcome": "granted",
        "approver": grant.approver,
        "at": at,
        "grants": list(ids),
        "scope": grant.scope,
    }


def _session_digest(session: str | None) -> str | None:
    """An MCP session id as the record keeps it: a digest that correlates calls
    of one session without handing out the id, which lets its holder use the session."""
    if not session:
        return None
    return "sha256:" + hashlib.sha256(session.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def printable(event: Event) -> Event:
    """The event with every string made encodable as UTF-8: bytes that came in
    as surrogate escapes read `\\xff`, other lone surrogates `\\ud800`."""
    return type(event).model_validate(_printable(event.model_dump(by_alias=True)))


def _printable(value: Any) -> Any:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            try:
                return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            except UnicodeEncodeError:
                return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_printable(k): _printable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_printable(v) for v in value]
    return value
