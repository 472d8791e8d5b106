"""MCP over HTTP (streamable HTTP and the legacy HTTP+SSE transport): each
`tools/call` is a call; initialize, notifications, ping, tools/list, posted
responses, the session's GET stream and DELETE are protocol (no step, no
record). Tool annotations and output schemas learnt from tools/list results
live on the engine (`engine.tools`), per server and session.

`decide_messages` is the entry point for one JSON-RPC request (or batch) from
any transport: it tags and decides each `tools/call` and answers refused ones
with an MCP-native error result.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from offscope.proxy import assembly
from offscope.proxy.exchange import (
    Exchange,
    Handler,
    Pipeline,
    Synthetic,
    claimed_provenance,
    question_of,
    register_handler,
    stream_chunk,
)
from offscope.proxy.extract.http import HttpRequest, HttpResponse, split_path
from offscope.proxy.extract.input_rounds import is_retry
from offscope.proxy.extract.mcp import (
    RESPONSE,
    McpRequest,
    McpResponses,
    ToolRegistry,
    call_from_message,
    id_key,
    mcp_messages,
    response_messages,
    session_of,
    structured_text,
    tool_annotations,
    tool_output_schemas,
)
from offscope.proxy.extract.mcp_wire2026 import (
    HEADER_MISMATCH,
    HeaderReading,
    fresh_until,
    header_readings,
    is_modern,
    jsonrpc_error,
    tool_header_params,
)
from offscope.proxy.extract.sse import SseParser, sse_event
from offscope.proxy.handlers.http import severity
from offscope.proxy.handlers.mcp_rounds import (
    answer_elicitation,
    answer_round,
    elicitation_asked,
    open_round,
    task_created,
    task_result,
)
from offscope.proxy.handlers.offered import filter_session_event, filtering_stream
from offscope.proxy.handlers.operator import ask as ask_operator
from offscope.proxy.handlers.operator import record as record_operator

if TYPE_CHECKING:
    from offscope.ledgers.matcher import CallInput, TagResult

log = structlog.get_logger("offscope")

MCP_MAX_EVENT = 1024 * 1024  # one MCP SSE event larger than this is skipped (bounded memory)
LEGACY_MAX_EVENT = (
    16 * 1024 * 1024
)  # the legacy stream is passed on event by event: a larger one is lost


@dataclass(slots=True)
class McpState:
    server: str | None
    session: str | None
    list_ids: set[Any] = field(default_factory=set)  # id_key of the tools/list requests
    capabilities: Any = None  # what an `initialize` in this request declared (client class)
    collected: McpResponses | None = None  # what the response stream yields that the record needs
    sse: SseParser | None = None
    modern: bool = False  # the client speaks the stateless revision (2026-07-28 or later)


class McpHandler(Handler):
    kind = "mcp"
    order = 20
    streams = True

    def claim(self, engine: Pipeline, ex: Exchange) -> Any:
        return None if ex.streamed else mcp_messages(ex.req)

    def request(self, engine: Pipeline, ex: Exchange, claimed: Any) -> float:
        messages, notes = claimed
        return decide_messages(engine, ex, messages, notes)

    def stream(
        self, engine: Pipeline, ex: Exchange, content_type: str
    ) -> Callable[[bytes], Any] | None:
        state: McpState = ex.state
        if state.server is None or "text/event-stream" not in content_type:
            return None
        state.collected = collected = _collector(engine, ex)
        if _is_legacy_stream(ex):
            return _legacy_stream(engine, ex)
        if state.list_ids and ex.policy.policy.filter_tools:
            return filtering_stream(engine, ex, collected)
        state.sse = parser = SseParser(max_event=MCP_MAX_EVENT)

        def on_chunk(chunk: bytes) -> bytes:
            with stream_chunk(ex):
                for event in parser.feed(chunk):
                    collected.feed_payload(event.data)
            return chunk

        return on_chunk

    def response(
        self, engine: Pipeline, ex: Exchange, resp: HttpResponse | None, error: str | None
    ) -> None:
        state: McpState = ex.state
        if state.server is None:
            return
        _learn_client_class(engine, state, resp)
        collected = state.collected
        if collected is None:  # a whole (JSON) body
            collected = _collector(engine, ex)
            for m in response_messages(
                resp.body if resp else b"", resp.headers.get("content-type", "") if resp else ""
            ):
                collected.add(m)
        elif state.sse is not None:
            for event in state.sse.close():
                collected.feed_payload(event.data)
        status = resp.status if resp else None
        for pending in ex.calls:
            key = id_key(pending.mcp_id)
            found = collected.results.get(key)
            text = found[1] if found else (error or "")
            if (task_id := collected.tasks.get(key)) is not None:
                pending.notes = [*pending.notes, f"became task {task_id}: its result comes later"]
            engine.record_call(ex, pending, status, injected=False, excerpt=text.encode())
            if (asking := collected.input_required.get(key)) is not None:
                open_round(engine, ex, pending, asking)
            if task_id is not None:
                task_created(engine, ex, pending, task_id)
        if ex.ask and ex.ask.reply is None:
            found = collected.results.get(id_key(ex.ask.mcp_id))
            record_operator(engine, ex, found[1] if found else (error or "no reply"))


MCP = register_handler(McpHandler)


def _learn_client_class(engine: Pipeline, state: McpState, resp: HttpResponse | None) -> None:
    """After an `initialize`: the session the server opened (its response
    header, or the legacy transport's query) belongs to the class of clients
    with these capabilities (tool surfaces are compared within a class)."""
    if state.capabilities is None or state.server is None:
        return
    session = (resp.headers.get("mcp-session-id") if resp else None) or state.session
    if session:
        engine.drift.client_class(state.server, session, state.capabilities)


def decide_messages(
    engine: Pipeline, ex: Exchange, messages: list[McpRequest], notes: list[str]
) -> float:
    """Decide one MCP JSON-RPC request or batch (already parsed) on `ex`.

    Each `tools/call` is tagged, decided and, when refused, recorded and
    answered by offscope (`ex.synthetic`, or on the legacy session stream); an
    operator tool gets the reply policy. Returns how long the agent waits for
    a synthetic operator reply. The caller sends `ex.synthetic` instead of
    the request when it is set, else the request (`ex.new_body` if set), and
    later calls `engine.response(ex, ...)` with the server's answer."""
    ex.handler = MCP
    server = ToolRegistry.key(ex.req)
    session = session_of(ex.req)
    ex.state = state = McpState(server, session)
    state.modern = any(is_modern(m.params, ex.req.headers) for m in messages)
    synthetic: list[dict[str, Any]] = []
    delay = 0.0
    for msg in messages:
        if msg.method == "tools/list":
            state.list_ids.add(id_key(msg.id))
        if msg.method == "initialize":
            state.capabilities = msg.params.get("capabilities", {})
        if msg.method == "tasks/result":  # a task's result: the call that made it, recorded once
            task_result(engine, ex, msg)
        if msg.method == RESPONSE:  # the client answers a server request: an elicitation?
            delay = max(delay, answer_elicitation(engine, ex, msg))
        if msg.method != "tools/call":
            continue
        name = msg.params.get("name")
        ann = engine.tools.annotations(server, name, session) if isinstance(name, str) else None
        downgrade = None
        if ann and isinstance(name, str):  # a tool listed as write before stays a write tool
            ann, downgrade = engine.drift.kept_stage(server, name, ann)
        call = call_from_message(ex.req, msg, ann)
        if ex.ledger.is_operator(call):
            delay = ask_operator(
                engine,
                ex,
                "mcp",
                f"mcp:{call.tool}",
                question_of(call.args, b""),
                claimed_provenance(ex.req, call.args),
                msg.id,
                human=ex.ledger.reaches_person(call),
            )
            if ex.ask and ex.ask.reply is not None:
                schema = engine.tools.output_schema(server, call.tool)
                synthetic.append(
                    mcp_result(
                        msg.id,
                        ex.ask.reply,
                        False,
                        structured_text(schema, ex.ask.reply),
                        modern=state.modern,
                    )
                )
            continue
        call_notes = [*notes, downgrade] if downgrade else notes
        tag = None
        if len(messages) == 1 and (readings := _header_readings(engine, ex, msg)):
            why = "; ".join(r.why for r in readings)
            tag = _worst_tag(engine, ex, call, readings)
            if ex.policy.policy.refuses_ambiguous:
                return _refuse_header_mismatch(engine, ex, msg, why, tag)
            call_notes = [
                *call_notes,
                f"ambiguous (tagged by its most out-of-scope reading): {why}",
            ]
        continues = None
        if is_retry(msg.params):  # the answers to an input-required round: an operator channel
            continues, wait = answer_round(engine, ex, msg, call)
            delay = max(delay, wait)
        pending = engine.tag_call(ex, call, call_notes, msg.id, tag=tag, continues=continues)
        if server is not None:
            pending.verdict = assembly.pin_verdict(
                engine, ex, server, call.tool, pending.verdict, session
            )
        ex.calls.append(pending)
        v = pending.verdict
        if v.status is not None:
            text = f"HTTP {v.status}: {json.dumps(v.body, sort_keys=True)}"
            synthetic.append(mcp_result(msg.id, text, True, modern=state.modern))
            engine.record_call(ex, pending, v.status, injected=True, excerpt=text.encode())
    if synthetic:
        _answer(engine, ex, messages, synthetic)
    return delay


def _answer(
    engine: Pipeline, ex: Exchange, messages: list[McpRequest], synthetic: list[dict[str, Any]]
) -> None:
    # A batch answered in part by offscope is answered whole by it: calls that
    # were allowed alongside are refused rather than half-forwarded.
    answered = {id_key(m["id"]) for m in synthetic}
    for pending in ex.calls:
        if id_key(pending.mcp_id) not in answered:
            synthetic.append(
                {
                    "jsonrpc": "2.0",
                    "id": pending.mcp_id,
                    "error": {
                        "code": -32000,
                        "message": "not sent: batch contained a refused call",
                    },
                }
            )
            engine.record_call(ex, pending, None, injected=True, excerpt=b"not sent")
    if legacy_session(ex):
        _answer_on_stream(engine, ex, messages, synthetic)
    else:
        payload = synthetic[0] if len(synthetic) == 1 and len(messages) == 1 else synthetic
        ex.synthetic = Synthetic(200, json.dumps(payload).encode())


def mcp_result(
    msg_id: Any,
    text: str,
    is_error: bool,
    structured: dict[str, Any] | None = None,
    *,
    modern: bool = False,
) -> dict[str, Any]:
    """A `tools/call` result offscope writes itself. A client of the stateless
    revision requires `resultType` (its SDK rejects a result without one); older
    clients get the result their revision defines."""
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": is_error}
    if structured is not None:
        result["structuredContent"] = structured
    if modern:
        result["resultType"] = "complete"
    return {"jsonrpc": "2.0", "id": msg_id, "result": result}


def _header_readings(engine: Pipeline, ex: Exchange, msg: McpRequest) -> list[HeaderReading]:
    """Where the request's Mcp-Method / Mcp-Name / Mcp-Param-* headers read it
    otherwise than its body (offscope/proxy/extract/mcp_wire2026.py)."""
    state: McpState = ex.state
    name = msg.params.get("name")
    mirrored = (
        engine.tools.header_params(state.server, name, state.session)
        if state.server is not None and isinstance(name, str)
        else None
    )
    return header_readings(msg.method, msg.params, ex.req.headers, mirrored)


def _worst_tag(
    engine: Pipeline, ex: Exchange, call: CallInput, readings: list[HeaderReading]
) -> TagResult:
    """The most out-of-scope of the body's reading and the headers' readings (a
    header reading that names no tool call is read as the body's call)."""
    state: McpState = ex.state
    worst = ex.ledger.tag(call)
    for reading in readings:
        if reading.method != "tools/call":
            continue
        other = McpRequest(None, reading.method, reading.params)
        name = reading.params.get("name")
        ann = (
            engine.tools.annotations(state.server, name, state.session)
            if state.server is not None and isinstance(name, str)
            else None
        )
        other_tag = ex.ledger.tag(call_from_message(ex.req, other, ann))
        if severity(other_tag) > severity(worst):
            worst = other_tag
    return worst


def _refuse_header_mismatch(
    engine: Pipeline, ex: Exchange, msg: McpRequest, why: str, tag: TagResult
) -> float:
    """Refuse a request whose headers and body disagree, with the revision's own
    error (-32020, HTTP 400), recorded as a blocked call; nothing goes upstream."""
    message = (
        f"offscope: the request's headers and body disagree ({why}); servers and gateways "
        "that route by the header would act on another call. Send headers that mirror the body."
    )
    answer = jsonrpc_error(msg.id, HEADER_MISMATCH, message)
    return engine.refuse_request(
        ex,
        400,
        "offscope_ambiguous",
        message,
        "ambiguous request: " + why,
        tag=tag,
        answer=Synthetic(400, json.dumps(answer).encode()),
    )


def legacy_session(ex: Exchange) -> bool:
    """A POST of the legacy HTTP+SSE transport: the session is in the query,
    and responses travel on the session's GET stream, not in this response."""
    return (
        ex.state.session is not None
        and "mcp-session-id" not in ex.req.headers
        and ex.req.scheme not in ("ws", "wss")  # a WebSocket answers on the socket itself
    )


def _answer_on_stream(
    engine: Pipeline, ex: Exchange, messages: list[McpRequest], synthetic: list[dict[str, Any]]
) -> None:
    """Legacy transport: the client waits for answers on the session's stream.
    The refused requests still go to the server, renamed to a method it does
    not know (so nothing runs and it answers each id on the stream), and the
    stream swaps those answers for offscope's (see `_legacy_stream`)."""
    replies = {id_key(m["id"]): m for m in synthetic}
    out = []
    for msg in messages:
        item: dict[str, Any] = {"jsonrpc": "2.0", "method": msg.method, "params": msg.params}
        if msg.id is not None:
            item["id"] = msg.id
        if id_key(msg.id) in replies:
            item = {"jsonrpc": "2.0", "id": msg.id, "method": "offscope/refused"}
        out.append(item)
    key = (ex.state.server, ex.state.session)
    waiting = engine.stream_replies
    waiting.setdefault(key, {}).update(replies)
    waiting.move_to_end(key)
    while len(waiting) > 4096:  # bounded: sessions that never read their answers
        waiting.popitem(last=False)
    ex.new_body = json.dumps(out[0] if len(out) == 1 else out).encode()
    ex.calls = []  # every call of this POST is recorded already (refused or not sent)


def _is_legacy_stream(ex: Exchange) -> bool:
    """The legacy MCP transport's session stream (`GET .../sse`)."""
    return ex.req.method.upper() == "GET" and split_path(ex.req.path)[0].rstrip("/").endswith(
        "/sse"
    )


def _legacy_stream(engine: Pipeline, ex: Exchange) -> Callable[[bytes], list[bytes]]:
    """The legacy transport's session stream, passed on event by event (an
    event is held only until its last byte arrives): tools/list results on it
    are learnt, and the server's answers to requests offscope refused are
    replaced by offscope's."""
    state: McpState = ex.state
    state.sse = parser = SseParser(max_event=LEGACY_MAX_EVENT)
    assert state.collected is not None
    collected = state.collected

    def on_chunk(chunk: bytes) -> list[bytes]:
        # A list, never b"": an empty chunk would end a chunked response.
        out: list[bytes] = []
        with stream_chunk(ex):
            for event in parser.feed(chunk) + (parser.close() if not chunk else []):
                data = event.data
                if event.event == "endpoint":
                    _legacy_endpoint(ex, data)
                else:
                    data = _swap_refused(engine, ex, data)
                    collected.feed_payload(data)  # the registry learns the list as sent
                    data = filter_session_event(engine, ex, data)  # policy filter_tools
                out.append(sse_event(event.event, data))
        return out

    return on_chunk


def _swap_refused(engine: Pipeline, ex: Exchange, data: str) -> str:
    key = (ex.state.server, ex.state.session)
    waiting = engine.stream_replies.get(key)
    if not waiting or "offscope/refused" not in data and '"id"' not in data:
        return data
    try:
        msg = json.loads(data)
    except ValueError:
        return data
    reply = waiting.pop(id_key(msg.get("id")), None) if isinstance(msg, dict) else None
    if not waiting:
        engine.stream_replies.pop(key, None)
    return json.dumps(reply) if reply is not None else data


def _collector(engine: Pipeline, ex: Exchange) -> McpResponses:
    state: McpState = ex.state
    wanted = {id_key(p.mcp_id) for p in ex.calls}
    if ex.ask is not None and ex.ask.reply is None:
        wanted.add(id_key(ex.ask.mcp_id))

    def on_tools(message: dict[str, Any]) -> None:
        if state.server is not None:
            engine.tools.remember(
                state.server,
                tool_annotations(message),
                tool_output_schemas(message),
                state.session,
                tool_header_params(message),
                fresh_until(message),
            )
            assembly.tools_listed(engine, ex, state.server, message, state.session)

    return McpResponses(
        wanted, state.list_ids, on_tools, lambda message: elicitation_asked(engine, ex, message)
    )


def _legacy_endpoint(ex: Exchange, data: str) -> None:
    """The legacy HTTP+SSE transport names the URL its session posts to in
    the stream's first event; tools/list results on this stream are about
    that server and session."""
    path = data.strip()
    if "://" in path:
        path = "/" + path.split("://", 1)[1].partition("/")[2]
    posts = HttpRequest(
        method="POST", host=ex.req.host, path=path, scheme=ex.req.scheme, port=ex.req.port
    )
    ex.state.server, ex.state.session = ToolRegistry.key(posts), session_of(posts)
