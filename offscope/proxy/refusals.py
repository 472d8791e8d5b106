"""The refusals every kind of request can get, before any handler claims it: an
ambiguous target (a Host header that disagrees, a body servers could read differently),
a body offscope cannot or may not inspect. A refused request is answered by offscope and
recorded as a blocked call.

The engine calls these with itself as the `RefusalHost`."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import structlog

from offscope.ledgers.matcher import CompiledLedger, TagResult
from offscope.policies.decide import PolicyVerdict
from offscope.proxy.exchange import Exchange, PendingCall, Recorder, Synthetic, json_response
from offscope.proxy.extract.http import HttpRequest, JsonBody, extract_http
from offscope.proxy.extract.mcp import McpRequest, ToolRegistry, call_from_message, mcp_messages
from offscope.proxy.handlers.http import HTTP
from offscope.vocab import STAGE_RANK

log = structlog.get_logger("offscope")


class RefusalHost(Recorder, Protocol):
    """What refusing uses of the engine."""

    tools: ToolRegistry


def refusal(
    host: RefusalHost, ex: Exchange, oversize: int | None, length_required: bool
) -> float | None:
    """A refusal every kind of request can get (None: none applies; notes
    about what was let through are added to the exchange)."""
    req, policy = ex.req, ex.policy.policy
    if req.host_header is not None:
        ex.notes.append(
            f"Host header {req.host_header!r} disagrees with the destination "
            f"{req.host}:{req.port}; tagged by the destination"
        )
        if policy.mode == "enforce":
            return refuse_request(
                host,
                ex,
                421,
                "offscope_misdirected",
                "The Host header names a different host than the one this request "
                "is sent to. offscope refuses requests whose target is ambiguous.",
                "host header disagrees with the destination",
            )
    if length_required:
        return refuse_request(
            host,
            ex,
            411,
            "offscope_length_required",
            "Send the request body with a Content-Length: offscope inspects a body "
            "before it is forwarded and does not forward chunked bodies in this mode.",
            "chunked body (no Content-Length)",
        )
    if oversize is not None:
        ex.notes.append(f"body of {oversize} bytes is over the inspection limit; not inspected")
        if not ex.streamed and policy.fail_closed:
            return refuse_request(
                host,
                ex,
                413,
                "offscope_body_too_large",
                "The request body is larger than offscope inspects; it was not sent.",
                "body over the inspection limit",
            )
    if ex.streamed:
        ex.notes.append("request body went upstream before offscope could inspect it")
        return None
    if (error := req.json_body().error) is not None:
        if policy.fail_closed:
            return refuse_request(
                host,
                ex,
                400,
                "offscope_uninspectable",
                f"offscope could not inspect this request body ({error}); it was not sent.",
                "extraction error (on_error: closed)",
            )
        ex.notes.append(
            f"extraction error: {error}; forwarded without inspecting the body (on_error: open)"
        )
    elif (ambiguity := req.json_body().ambiguity) is not None:
        # Decided, and recorded, by the body's most out-of-scope reading.
        req._json = _worst_reading(ex.ledger, host.tools, req)
        if policy.refuses_ambiguous:
            return refuse_request(
                host,
                ex,
                400,
                "offscope_ambiguous",
                f"Servers could read this request body differently ({ambiguity}). "
                "Send it in its plain form.",
                "ambiguous request: " + ambiguity,
            )
        ex.notes.append("ambiguous (tagged by its most out-of-scope reading): " + ambiguity)
    return None


def refuse_request(
    host: RefusalHost,
    ex: Exchange,
    status: int,
    code: str,
    message: str,
    reason: str,
    tag: TagResult | None = None,
    answer: Synthetic | None = None,
) -> float:
    """Answer a request offscope will not forward (with `answer`, else a JSON body
    naming `code`), and record it as a blocked call."""
    assert ex.ctx is not None
    ex.handler = HTTP
    call, notes = extract_http(ex.req)
    mcp = mcp_messages(ex.req)  # a refused MCP call is recorded as the tool call it was
    if mcp is not None and (msg := next((m for m in mcp[0] if m.method == "tools/call"), None)):
        call = call_from_message(ex.req, msg, None)
    tag = ex.policy.settle(tag or ex.ledger.tag(call))
    body = {"error": code, "message": message, "reason": reason}
    pending = PendingCall(
        call,
        tag,
        ex.ctx.allocate_step(),
        PolicyVerdict("block", status, body, reason=reason),
        notes + ex.notes,
    )
    ex.calls.append(pending)
    ex.synthetic = answer or json_response(status, body)
    host.record_call(ex, pending, status, injected=True, excerpt=ex.synthetic.body)
    log.warning("request_refused", run=ex.run, reason=reason, host=ex.req.host, status=status)
    return 0.0


def _worst_reading(ledger: CompiledLedger, tools: ToolRegistry, req: HttpRequest) -> JsonBody:
    """Of the readings of an ambiguous JSON body (strict_json.py), the one whose
    calls are the most out of scope (targets out, then stage, a listed tool's
    annotations counted), as HTTP's `tag_readings` picks among readings of a URL."""
    body = req.json_body()
    server = ToolRegistry.key(req)

    def annotations(msg: McpRequest) -> dict[str, Any] | None:
        name = msg.params.get("name")
        return tools.annotations(server, name) if isinstance(name, str) else None

    def severity(value: Any) -> tuple[int, int, int]:
        reading = dataclasses.replace(req, _json=JsonBody(value))
        mcp = mcp_messages(reading)
        calls = (
            [
                call_from_message(reading, m, annotations(m))
                for m in mcp[0]
                if m.method == "tools/call"
            ]
            if mcp is not None
            else [extract_http(reading)[0]]
        )
        worst = (0, 0, 0)
        for call in calls:
            tag = ledger.tag(call)
            out = [t for t in tag.targets if not t.in_scope]
            worst = max(worst, (1 if out else 0, STAGE_RANK[tag.stage], len(out)))
        return worst

    value = max((body.value, *body.other_readings), key=severity)
    return dataclasses.replace(body, value=value)
