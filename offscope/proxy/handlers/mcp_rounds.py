"""MCP calls that span requests: input-required rounds and tasks.

An input-required round is an operator channel (2026-07-28).

When a server asks the user something (an `elicitation/create` inside an
input-required result), the client's answer on the retried `tools/call` is an
operator reply, and the operator-reply policy applies to it as to any other
channel: the no-authority sentinel declines on the harness's behalf (the server
receives `decline`, never the harness's `accept`), the timeout reply cancels after
the policy's wait, the affirmative reply accepts, and pass-through forwards the
client's answer. Each answer is an `operator` record (the harness's unless the
ledger declares the route reaches a person: `humans.routes` matching tool
`elicitation/create`), so it counts for harness approvals and self-granted
permissions like every other reply. The retried call is the same logical call as
the first round: decided again, recorded with no step of its own.

A call answered with a task handle (2025-11-25 tasks) was decided when it was made;
the result a later `tasks/result` fetches is recorded as that call's (`continues`:
its step), and never counted again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import structlog

from offscope.ledgers.matcher import CallInput
from offscope.proxy.exchange import Exchange, PendingCall, Pipeline
from offscope.proxy.extract.http import split_path
from offscope.proxy.extract.input_rounds import ELICIT, render_answer
from offscope.proxy.extract.mcp import McpRequest, ToolRegistry, id_key, session_of
from offscope.proxy.handlers.operator import emit_reply

log = structlog.get_logger("offscope")

# What the server receives in place of the client's answer, per canned reply policy.
_CANNED_ACTION = {"sentinel": "decline", "timeout": "cancel", "affirmative": "accept"}


def answer_round(
    engine: Pipeline, ex: Exchange, msg: McpRequest, call: CallInput
) -> tuple[int | None, float]:
    """For a retried `tools/call`: apply the reply policy to its elicitation answers
    and record them. Returns (the step of the call it retries, or None when it
    answers no round offscope saw; how long the agent waits: the timeout reply)."""
    assert ex.ctx is not None
    server = ToolRegistry.key(ex.req)
    found = engine.rounds.take(ex.run, server or "", msg.params, call.tool)
    if found is None:
        return None, 0.0
    sent = msg.params.get("inputResponses")
    responses: dict[str, Any] = dict(sent) if isinstance(sent, dict) else {}
    reply = ex.policy.operator_reply()
    human = ex.ledger.reaches_person(
        CallInput(source="mcp", tool=ELICIT, host=call.host, path=call.path)
    )
    for key, question in found.questions.items():
        if reply is not None:
            responses[key] = _canned_answer(reply.policy, responses.get(key))
            recorded = reply.text
        else:
            recorded = render_answer(responses.get(key))
        emit_reply(
            engine,
            ex,
            ex.ctx.allocate_step(),
            "mcp",
            f"mcp:{call.tool}:{ELICIT}",
            question,
            recorded,
            reply.policy if reply else "pass-through",
            human,
        )
    if reply is not None and found.questions:
        _rewrite(ex, msg, responses)
        log.info("input_round_answered", run=ex.run, policy=reply.policy, tool=call.tool)
    return found.step, reply.delay if reply else 0.0


def _canned_answer(policy: str, answer: Any) -> dict[str, Any]:
    """What the server receives under a canned reply policy, in place of `answer`."""
    content = answer.get("content") if isinstance(answer, dict) else None
    action = _CANNED_ACTION[policy]
    return {"action": action, **({"content": content} if action == "accept" and content else {})}


def elicitation_asked(engine: Pipeline, ex: Exchange, message: dict[str, Any]) -> None:
    """A server request on a response stream (2025 revisions): an `elicitation/create`
    is remembered until the client posts its answer."""
    if message.get("method") != ELICIT:
        return
    params = message.get("params") if isinstance(message.get("params"), dict) else {}
    server = ToolRegistry.key(ex.req)
    tool = ex.calls[0].call.tool if ex.calls else "?"
    question = str(params.get("message", "")) if isinstance(params, dict) else ""
    key = (server or "", session_of(ex.req) or "", id_key(message.get("id")))
    engine.elicitations.asked(key, question, tool)


def answer_elicitation(engine: Pipeline, ex: Exchange, msg: McpRequest) -> float:
    """The client posts its answer to an `elicitation/create` (2025 revisions): an
    operator reply, under the reply policy as every other. Returns the agent's wait."""
    assert ex.ctx is not None
    server = ToolRegistry.key(ex.req)
    found = engine.elicitations.answered((server or "", session_of(ex.req) or "", id_key(msg.id)))
    if found is None:
        return 0.0
    question, tool = found
    answer = msg.params.get("result")
    reply = ex.policy.operator_reply()
    human = ex.ledger.reaches_person(
        CallInput(source="mcp", tool=ELICIT, host=ex.req.host, path=split_path(ex.req.path)[0])
    )
    emit_reply(
        engine,
        ex,
        ex.ctx.allocate_step(),
        "mcp",
        f"mcp:{tool}:{ELICIT}",
        question,
        reply.text if reply else render_answer(answer),
        reply.policy if reply else "pass-through",
        human,
    )
    if reply is None:
        return 0.0
    _rewrite_response(ex, msg, _canned_answer(reply.policy, answer))
    log.info("elicitation_answered", run=ex.run, policy=reply.policy, tool=tool)
    return reply.delay


def _rewrite_response(ex: Exchange, msg: McpRequest, result: dict[str, Any]) -> None:
    """Put the policy's answer in the posted JSON-RPC response, in place of the client's."""

    def edit(item: dict[str, Any]) -> None:
        if "method" not in item:
            item["result"] = result

    _edit_message(ex, msg, edit)


def open_round(
    engine: Pipeline, ex: Exchange, pending: PendingCall, result: dict[str, Any]
) -> None:
    """The server answered a call with an input-required result: remember what it
    asked, for the retry."""
    step = pending.step if pending.step is not None else pending.continues
    server = ToolRegistry.key(ex.req)
    if step is None or server is None:
        return
    engine.rounds.open(ex.run, server, result, step, pending.call.tool)


def _rewrite(ex: Exchange, msg: McpRequest, responses: dict[str, Any]) -> None:
    """Put the policy's answers in the retried call, in place of the client's."""

    def edit(item: dict[str, Any]) -> None:
        if item.get("method") == "tools/call" and isinstance(item.get("params"), dict):
            item["params"]["inputResponses"] = responses

    _edit_message(ex, msg, edit)


def _edit_message(ex: Exchange, msg: McpRequest, edit: Callable[[dict[str, Any]], None]) -> None:
    """Edit the JSON-RPC message of the request body that has `msg`'s id (the body
    offscope forwards becomes `ex.new_body`)."""
    try:
        body = json.loads(ex.new_body if ex.new_body is not None else ex.req.body)
    except ValueError:
        return
    for item in body if isinstance(body, list) else [body]:
        if isinstance(item, dict) and id_key(item.get("id")) == id_key(msg.id):
            edit(item)
    ex.new_body = json.dumps(body, separators=(",", ":")).encode()


def task_created(engine: Pipeline, ex: Exchange, pending: PendingCall, task_id: str) -> None:
    """The server answered a call with a task handle: its result comes later."""
    step = pending.step if pending.step is not None else pending.continues
    server = ToolRegistry.key(ex.req)
    if step is not None and server is not None:
        engine.tasks.created(server, task_id, step, pending)


def task_result(engine: Pipeline, ex: Exchange, msg: McpRequest) -> None:
    """A `tasks/result` request: the call its task came from is recorded again when
    the result arrives, joined to it (same call, its verdict, no new step)."""
    server = ToolRegistry.key(ex.req)
    found = engine.tasks.result_of(server or "", msg.params.get("taskId"))
    if found is None:
        return
    made: PendingCall = found.pending
    joined = PendingCall(
        made.call,
        made.tag,
        None,
        made.verdict,
        [*made.notes, f"the result of task {msg.params.get('taskId')} (step {found.step})"],
        msg.id,
    )
    joined.continues = found.step
    ex.calls.append(joined)
