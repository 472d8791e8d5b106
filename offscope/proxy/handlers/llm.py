"""LLM API calls: the model's proposed tool calls and text, and the operator
reply policy applied to tool results the agent's own harness sends back.
The wire format is the dialect's (offscope/proxy/extract/llm/)."""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from offscope.ledgers.matcher import CallInput
from offscope.proxy import assembly
from offscope.proxy.exchange import (
    Exchange,
    Handler,
    OperatorAsk,
    Pipeline,
    flow_stamp,
    question_of,
    record_stamp,
    register_handler,
    stream_chunk,
    tool_call_fields,
)
from offscope.proxy.extract.http import HttpRequest, HttpResponse, split_path
from offscope.proxy.extract.llm import (
    Dialect,
    LlmResponseParser,
    LlmToolCall,
    dialect,
    dialect_for,
    is_auxiliary,
    parse_request,
    substitute_tool_results,
)
from offscope.proxy.handlers import operator
from offscope.proxy.handlers.offered import filter_request
from offscope.proxy.runs import traceparent_of
from offscope.trace.events import LlmEvent, ToolCall, ToolCallEvent
from offscope.trace.redact import redact_text

if TYPE_CHECKING:
    from offscope.ledgers.matcher import CompiledLedger

log = structlog.get_logger("offscope")


@dataclass(slots=True)
class LlmState:
    api: str
    model: str | None = None
    first_user: str | None = None
    stream: bool = False
    tools: dict[str, dict[str, Any]] = field(
        default_factory=dict
    )  # annotations the request declared
    parser: LlmResponseParser | None = None


class LlmHandler(Handler):
    kind = "llm"
    order = 10
    streams = True

    def claim(self, engine: Pipeline, ex: Exchange) -> Dialect | str | None:
        """The request's dialect; `UNRECOGNISED` for a model call no dialect
        reads (an extraction error: its tool calls would go untagged). With
        on_error open that is noted and the request left to the other handlers."""
        req = ex.req
        if (
            ex.streamed
            or req.method.upper() != "POST"
            or not ex.ledger.is_llm_host(req.host, req.port)
        ):
            return None
        found = dialect_for(req.path)
        if found is not None or is_auxiliary(req.path):
            return found
        if ex.policy.policy.fail_closed:
            return UNRECOGNISED
        ex.notes.append(
            f"extraction error: {_unrecognised(req)}; forwarded as a plain HTTP call (on_error: open)"
        )
        return None

    def request(self, engine: Pipeline, ex: Exchange, claimed: Any) -> float:
        assert ex.ctx is not None
        if claimed is UNRECOGNISED:
            return engine.refuse_request(
                ex,
                400,
                "offscope_uninspectable",
                f"offscope could not inspect this LLM request ({_unrecognised(ex.req)}); "
                "it was not sent.",
                "extraction error (on_error: closed)",
            )
        api = claimed.name
        # The body as the API server reads it: decoded (gzip, br, ...; bounded)
        # and parsed once. A body set below is re-encoded by mitmproxy with the
        # request's Content-Encoding (or sent as identity, the header dropped,
        # for a coding it cannot write).
        body = ex.req.json_body().value
        info = parse_request(api, body, ex.req.path)
        ex.state = LlmState(api, info.model, info.first_user, info.stream, info.tool_annotations)
        assembly.llm_request(engine, ex, info.model, body)  # the tools as the agent sent them
        pending = ex.ctx.pending_llm_operator
        filtering = (
            ex.policy.policy.filter_tools
            and isinstance(body, dict)
            and dialect(api).declares_tools(body)  # where its tools are is the dialect's
        )
        if filtering and filter_request(engine, ex, body, api):
            ex.new_body = json.dumps(body).encode()
        if pending:
            self._replies(engine, ex, api, pending, body)
        return 0.0

    def _replies(
        self,
        engine: Pipeline,
        ex: Exchange,
        api: str,
        pending: dict[str, tuple[int, str]],
        body: Any,
    ) -> None:
        """The agent's harness answered an operator tool: apply the reply policy."""
        reply = ex.policy.operator_reply()
        replies = {cid: reply.text for cid in pending} if reply else {}
        originals = substitute_tool_results(api, body, replies or dict.fromkeys(pending, ""))
        human = reply is None and _human_marked(ex.ledger, ex.req)
        for call_id, original in originals:
            step, question = pending.pop(call_id)
            ex.ask = OperatorAsk(
                step,
                "llm",
                "llm:operator-tool",
                question,
                None,
                reply.policy if reply else "pass-through",
                None,
                human=human,
            )
            operator.record(engine, ex, reply.text if reply else original)
        ex.ask = None
        if reply and originals:
            ex.new_body = json.dumps(body).encode()

    def stream(
        self, engine: Pipeline, ex: Exchange, content_type: str
    ) -> Callable[[bytes], bytes] | None:
        state: LlmState = ex.state
        parser = LlmResponseParser(state.api, content_type)
        if not parser.streaming:  # not its dialect's stream: parsed whole at the response
            return None
        state.parser = parser

        def on_chunk(chunk: bytes) -> bytes:
            with stream_chunk(ex):
                parser.feed(chunk)
            return chunk

        return on_chunk

    def response(
        self, engine: Pipeline, ex: Exchange, resp: HttpResponse | None, error: str | None
    ) -> None:
        assert ex.ctx is not None
        state: LlmState = ex.state
        parser = state.parser
        if parser is None:
            parser = LlmResponseParser(
                state.api, resp.headers.get("content-type", "") if resp else ""
            )
            if resp:
                parser.feed(resp.body)
        result = parser.finish()
        calls: list[ToolCall] = []
        for tc in result.tool_calls:
            call = tc.to_call_input()
            call.annotations = state.tools.get(tc.name)  # staged like an MCP tool when declared
            if ex.ledger.is_operator(call):
                # An operator tool run by the agent's own harness: its reply arrives
                # in the next LLM request, where the reply policy is applied.
                if tc.id:
                    ex.ctx.pending_llm_operator[tc.id] = (
                        ex.ctx.allocate_step(),
                        question_of(tc.args, b""),
                    )
                continue
            calls.append(self._tool_call(engine, ex, tc, call))
        if engine.behavior and result.text:
            coherence, _, words = engine.behavior(result.text)
            engine.exporter.observe_behavior(ex.ledger.id, coherence, words)
        engine.emit(
            ex.ctx,
            LlmEvent(
                **flow_stamp(ex, engine.clock()),
                api=state.api,
                model=result.model or state.model,
                text=redact_text(result.text, 20_000),
                tool_calls=calls,
                first_user=redact_text(state.first_user, 4000) if state.first_user else None,
                stream=state.stream,
                notes=result.notes
                + (resp.notes if resp else [])
                + ([f"upstream error: {error}"] if error else []),
            ),
        )

    def _tool_call(
        self, engine: Pipeline, ex: Exchange, tc: LlmToolCall, call: CallInput
    ) -> ToolCall:
        assert ex.ctx is not None
        tag = ex.ledger.tag(call)
        model = ToolCall.model_validate(
            {
                **tool_call_fields(call, tag, tc.notes, None, 0, ledger=ex.ledger),
                "stage_from": tag.stage_from,
            }
        )
        if ex.ledger.ledger.llm.tool_calls_are_steps:  # recorded as a call: its coverage counts
            engine.cover(ex.ledger, tag)
            engine.emit(
                ex.ctx,
                ToolCallEvent(
                    **record_stamp(ex, engine.clock()),
                    step=ex.ctx.allocate_step(),
                    call=model,
                    call_id=tc.id,
                    traceparent=traceparent_of(ex.req.headers),
                ),
            )
        return model


LLM = register_handler(LlmHandler)
UNRECOGNISED = "unrecognised LLM API"


def _unrecognised(req: HttpRequest) -> str:
    return f"no LLM dialect recognises POST {split_path(req.path)[0]}"


def _human_marked(ledger: CompiledLedger, req: HttpRequest) -> bool:
    """Whether the harness marked this LLM request as carrying a person's reply:
    the ledger's `humans.llm_header` with the secret only the harness holds."""
    humans = ledger.ledger.humans
    if not humans.llm_header:
        return False
    given = req.headers.get(humans.llm_header.lower())
    secret = _human_token(humans.token_env, humans.token_file)
    if not given or not secret:
        return False
    return hmac.compare_digest(given.encode(), secret.encode())


def _human_token(env: str | None, path: str | None) -> str | None:
    """The harness's secret, from the environment or a file (read per use: a
    rotated secret applies at once; the file is small)."""
    if env and os.environ.get(env):
        return os.environ[env].strip()
    if path:
        try:
            return Path(path).read_text(encoding="utf-8").strip() or None
        except OSError as exc:
            log.error("human_token_unreadable", path=path, error=exc.strerror or str(exc))
    return None
