"""Held calls (policy `on_out_of_scope: hold`): a call the policy blocks is filed as a
scope-expansion request, parked until a human decides (offscope/proxy/holds.py is the
registry it waits in), then released as approved or answered as refused.

The engine calls these with itself as the `HoldHost`: the few things the flow needs (the
hold registry, the request log, the exporter, the clock and the call record)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from collections.abc import Callable
from typing import Any, Protocol

import structlog

from offscope.ledgers.matcher import (
    CallInput,
    TagResult,
    TargetTag,
    call_digest,
    normalize,
    query_digest,
    url_path,
)
from offscope.policies.decide import PolicyVerdict
from offscope.policies.requests import DECISION_SCHEMA
from offscope.proxy.exchange import Exchange, PendingCall, Recorder, Synthetic, json_response
from offscope.proxy.exporter import Exporter
from offscope.proxy.handlers.mcp import legacy_session, mcp_result
from offscope.proxy.holds import HoldRegistry, Resolution
from offscope.proxy.sinks import RequestLog
from offscope.trace.redact import (
    minimise_args,
    redact_target,
    redact_text,
    redact_url,
    secret_values,
)

log = structlog.get_logger("offscope")


class HoldHost(Recorder, Protocol):
    """What the hold flow uses of the engine."""

    holds: HoldRegistry | None
    requests: RequestLog
    exporter: Exporter
    clock: Callable[[], float]


def file_request(host: HoldHost, ex: Exchange, pending: PendingCall) -> dict[str, Any]:
    """File a call the policy blocks as a scope-expansion request (in the request log, or
    the fleet's store); with `held_until` when the call waits for the decision."""
    request_id = "req-" + uuid.uuid4().hex[:12]
    request: dict[str, Any] = {
        "schema": "offscope.request/1",
        "id": request_id,
        "ts": host.clock(),
        "run": ex.run,
        "ledger": ex.ledger.id,
        "status": "pending",
        "tool": pending.call.tool,
        "source": pending.call.source,
        "method": pending.call.method,
        "stage": pending.tag.stage,
        "url": redact_url(ex.req.url),
        "host": normalize("host", pending.call.host) if pending.call.host else None,
        "path": redact_text(url_path(pending.call.path), 500) or None,
        "query_digest": query_digest(pending.call.query),
        "step": pending.step,
        "targets": target_strings(pending.call, pending.tag, only_out=True),
        "args_digest": call_digest(pending.call),
        # What a reviewer needs to decide: the argument values the trace keeps (the
        # others as names and digests, redacted alike), and the run's labels.
        "args": minimise_args(pending.call.args, ex.ledger.kept_args)
        if pending.call.args is not None
        else None,
        "labels": dict(ex.ctx.state.labels) if ex.ctx is not None else {},
        "reason": pending.verdict.reason,
    }
    if holdable(host, ex, pending):  # the agent waits for the decision until then
        request["held_until"] = request["ts"] + ex.policy.policy.hold_timeout
    if not host.requests.write(request):
        # The review store did not take it: nobody could decide it, so it is not held.
        request.pop("held_until", None)
        request["unfiled"] = True
    host.exporter.scope_request(ex.ledger.id)
    return request


def hold(host: HoldHost, ex: Exchange, pending: PendingCall, request: dict[str, Any]) -> bool:
    """Park a call the policy blocks until a human decides, when the policy
    asks for it and the caller can wait (`settle`); False: block it now."""
    policy = ex.policy.policy
    if host.holds is None or not holdable(host, ex, pending) or request.get("unfiled"):
        return False
    body = {**(pending.verdict.body or {}), "request_id": request["id"]}
    pending.held = PolicyVerdict(
        "block", 403, body, pending.verdict.friction, pending.verdict.reason
    )
    pending.verdict = PolicyVerdict(
        "block", None, reason=pending.verdict.reason
    )  # not refused (yet)
    ex.held.append(pending)
    host.holds.park(request)
    host.holds.notify(policy.webhook, request, policy.hold_timeout)
    log.info("call_held", run=ex.run, request=request["id"], timeout=policy.hold_timeout)
    return True


def holdable(host: HoldHost, ex: Exchange, pending: PendingCall) -> bool:
    """Whether a call the policy blocks is held for a human instead."""
    return (
        ex.may_hold
        and host.holds is not None
        and ex.policy.policy.on_out_of_scope == "hold"
        and pending.verdict.status is not None
        and not (ex.kind == "mcp" and legacy_session(ex))  # its answers go on another stream
    )


async def settle(host: HoldHost, ex: Exchange) -> None:
    """Wait until every held call of the exchange is decided (or times out).
    Then the exchange is either released (forward it as usual) or answered
    by offscope (`ex.synthetic`: a 403 saying denied or timed out)."""
    assert host.holds is not None
    start = host.clock()
    timeout = ex.policy.policy.hold_timeout
    results = await asyncio.gather(*(host.holds.wait(p.request_id or "", timeout) for p in ex.held))
    refused = [
        decided(host, ex, p, r, host.clock() - start) for p, r in zip(ex.held, results, strict=True)
    ]
    ex.held = []
    if any(refused):
        answer_refused(host, ex)


def decided(
    host: HoldHost, ex: Exchange, pending: PendingCall, res: Resolution, waited: float
) -> bool:
    """Apply one decision to a held call; True when it is refused."""
    assert pending.held is not None
    host.exporter.held(ex.ledger.id, res.outcome)
    pending.approval = {
        "request_id": pending.request_id,
        "outcome": res.outcome,
        "approver": res.approver,
        "at": res.at,
        "grants": list(res.grants),
        "scope": res.scope,
        "held_seconds": round(waited, 3),
    }
    if res.outcome == "approved":
        pending.tag = dataclasses.replace(
            pending.tag,
            targets=tuple(
                t
                if t.in_scope
                else TargetTag(t.kind, t.value, True, res.grant_for(f"{t.kind}:{t.value}"))
                for t in pending.tag.targets
            ),
        )
        pending.verdict = PolicyVerdict(
            "allow", reason=f"approved by {res.approver} (request {pending.request_id})"
        )
        log.info(
            "held_call_released", run=ex.run, request=pending.request_id, approver=res.approver
        )
        return False
    if (
        res.outcome == "timeout"
    ):  # the log says so, and a late approval is refused as already decided
        host.requests.write(
            {
                "schema": DECISION_SCHEMA,
                "request": pending.request_id,
                "decision": "timed_out",
                "approver": None,
                "reason": "hold_timeout passed",
                "ts": res.at,
                "grants": [],
            }
        )
    what = (
        "timed out waiting for approval"
        if res.outcome == "timeout"
        else f"was denied by {res.approver}"
        if res.approver
        else f"was refused: {res.reason}"
    )
    body = {
        **(pending.held.body or {}),
        "message": f"Blocked by offscope: this call was held for approval and {what}.",
        "held": {
            "outcome": res.outcome,
            "held_seconds": round(waited, 3),
            "approver": res.approver,
        },
    }
    pending.verdict = PolicyVerdict(
        "block", 403, body, reason=f"{pending.held.reason}; held, {res.outcome}"
    )
    log.info("held_call_refused", run=ex.run, request=pending.request_id, outcome=res.outcome)
    return True


def answer_refused(host: HoldHost, ex: Exchange) -> None:
    """Answer an exchange one of whose held calls was refused; nothing goes upstream."""
    if ex.kind == "mcp":
        # As for a block: the batch is answered whole, calls allowed alongside are not sent.
        replies = []
        for pending in ex.calls:
            v = pending.verdict
            if v.status is not None:
                text = f"HTTP {v.status}: {json.dumps(v.body, sort_keys=True)}"
                modern = getattr(ex.state, "modern", False)
                replies.append(mcp_result(pending.mcp_id, text, True, modern=modern))
                host.record_call(ex, pending, v.status, injected=True, excerpt=text.encode())
            else:
                replies.append(
                    {
                        "jsonrpc": "2.0",
                        "id": pending.mcp_id,
                        "error": {
                            "code": -32000,
                            "message": "not sent: batch contained a refused call",
                        },
                    }
                )
                host.record_call(ex, pending, None, injected=True, excerpt=b"not sent")
        single = len(replies) == 1 and not (ex.req.body or b"").lstrip().startswith(b"[")
        ex.synthetic = Synthetic(200, json.dumps(replies[0] if single else replies).encode())
    else:
        pending = ex.calls[0]
        ex.synthetic = json_response(403, pending.verdict.body or {})
        host.record_call(ex, pending, 403, injected=True, excerpt=ex.synthetic.body)
    ex.done = True


def target_strings(call: CallInput, tag: TagResult, only_out: bool = False) -> list[str]:
    """`kind:value` of a call's targets, redacted as in the trace (for the request log)."""
    secrets = secret_values(call.headers, call.query, call.args)
    return [
        f"{t.kind}:{redact_target(t.kind, t.value, secrets)}"
        for t in tag.targets
        if not (only_out and t.in_scope)
    ]
