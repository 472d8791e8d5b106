"""Operator asks: an agent asking a human, over HTTP, MCP or its own LLM tools.

A plain HTTP request to an operator route is handed to this handler by the
HTTP handler (it claims nothing itself). `ask` and `record` are shared with
the MCP and LLM handlers, whose operator tools are asked inside their own
exchanges.
"""

from __future__ import annotations

from typing import Any

import structlog

from offscope.ledgers.matcher import CallInput
from offscope.proxy.exchange import (
    EXCERPT,
    Exchange,
    Handler,
    OperatorAsk,
    Pipeline,
    claimed_provenance,
    flow_stamp,
    json_response,
    question_of,
    register_handler,
    scrub,
)
from offscope.proxy.extract.http import HttpResponse, parse_json_body
from offscope.trace.events import OperatorEvent
from offscope.trace.redact import redact_claim, redact_text, redact_url
from offscope.vocab import Source

log = structlog.get_logger("offscope")


class OperatorHandler(Handler):
    kind = "operator"

    def request(self, engine: Pipeline, ex: Exchange, claimed: Any) -> float:
        """An operator ask over plain HTTP; `claimed` is its extracted call."""
        call: CallInput = claimed
        return ask(
            engine,
            ex,
            "http",
            f"{ex.req.method} {ex.req.host}{call.path}",
            question_of(call.args, ex.req.body),
            claimed_provenance(ex.req, call.args),
            human=ex.ledger.reaches_person(call),
        )

    def response(
        self, engine: Pipeline, ex: Exchange, resp: HttpResponse | None, error: str | None
    ) -> None:
        if ex.ask is None or ex.ask.reply is not None:
            return
        body = resp.body if resp else b""
        data, _ = parse_json_body(body, resp.headers.get("content-type", "") if resp else "")
        reply: str = (
            data["reply"]
            if isinstance(data, dict) and isinstance(data.get("reply"), str)
            else body[:EXCERPT].decode("utf-8", "replace")
        )
        record(engine, ex, reply if resp else f"no reply: {error}")


OPERATOR = register_handler(OperatorHandler, claims=False)


def ask(
    engine: Pipeline,
    ex: Exchange,
    source: Source,
    channel: str,
    question: str,
    claimed: str | None,
    mcp_id: Any = None,
    *,
    human: bool = False,
) -> float:
    """Apply the reply policy to an ask. `human`: the ledger declares this route
    reaches a person; a passed-through reply on any other route is the harness's."""
    assert ex.ctx is not None
    reply = ex.policy.operator_reply()
    if claimed:
        claimed = redact_claim(claimed)  # the agent chose it: it may be anything, a key too
        log.warning(
            "provenance_claim_ignored", run=ex.run, claimed=claimed, channel=redact_url(channel)
        )
    ex.ask = OperatorAsk(
        ex.ctx.allocate_step(),
        source,
        channel,
        question,
        claimed,
        reply.policy if reply else "pass-through",
        reply.text if reply else None,
        mcp_id,
        human=human and reply is None,
    )
    if reply is None:
        return 0.0
    if source == "http":
        ex.synthetic = json_response(200, {"reply": reply.text})
    record(engine, ex, reply.text)
    return reply.delay


def record(engine: Pipeline, ex: Exchange, reply: str) -> None:
    assert ex.ctx is not None and ex.ask is not None
    a = ex.ask
    emit_reply(
        engine, ex, a.step, a.source, a.channel, a.question, reply, a.policy, a.human, a.claimed
    )


def emit_reply(
    engine: Pipeline,
    ex: Exchange,
    step: int,
    source: Source,
    channel: str,
    question: str,
    reply: str,
    policy: str,
    human: bool,
    claimed: str | None = None,
) -> None:
    """The trace record of one operator exchange (redacted as every record is). A reply
    is a person's only where the ledger says the route reaches one and the policy
    passed it through; anything else is the harness's."""
    assert ex.ctx is not None
    engine.emit(
        ex.ctx,
        OperatorEvent(
            **flow_stamp(ex, engine.clock()),
            step=step,
            source=source,
            channel=channel,
            question=redact_text(scrub(ex, question)),
            reply=redact_text(scrub(ex, reply)),
            provenance="human" if human and policy == "pass-through" else "harness",
            policy=policy,
            claimed_provenance=claimed,
        ),
    )
