"""What the agent is offered (policy `filter_tools`): the exchange side of
offscope/proxy/toolfilter.py. An MCP tools/list result (a whole JSON body,
or an SSE stream passed on event by event) and an LLM request's tools lose
the tools that can never be in scope; each removal is a `tools_filtered`
event. What the tool registry learns (and any tool-surface hashing) is the
list as the server sent it: the filter runs on what is passed on, after.

In shadow mode nothing is changed (shadow changes no traffic): what would
have been removed is recorded, as a `tools_filtered` event marked `shadow`."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import structlog

from offscope.proxy.exchange import Exchange, Pipeline, record_stamp, stream_chunk
from offscope.proxy.extract.http import split_path
from offscope.proxy.extract.llm import dialect
from offscope.proxy.extract.mcp import McpResponses, id_key
from offscope.proxy.extract.sse import SseParser, sse_event
from offscope.proxy.toolfilter import filter_request_tools, filter_tools_result
from offscope.trace.events import RemovedTool, ToolsFiltered
from offscope.trace.redact import redact_url

log = structlog.get_logger("offscope")

MAX_EVENT = (
    16 * 1024 * 1024
)  # an event is re-sent whole: a larger one is lost (as on the legacy stream)


# The parts of an LLM request body the filter changes (a shadow run filters a copy of these).
_REQUEST_TOOL_KEYS = ("tools", "tool_choice", "parallel_tool_calls", "toolConfig", "tool_config")


def filter_request(engine: Pipeline, ex: Exchange, body: Any, api: str) -> bool:
    """Remove never-in-scope tools from an LLM request body (in place); True:
    the body changed. In shadow only the would-be removal is recorded."""
    assert ex.ctx is not None
    shadow = _shadow(ex)
    target = _tool_fields(body) if shadow else body
    removed, offered = filter_request_tools(target, ex.ledger, dialect(api))
    if removed:
        _record(engine, ex, "llm", api, offered, removed)
    return bool(removed) and not shadow


def _shadow(ex: Exchange) -> bool:
    return ex.policy.policy.mode == "shadow"


def _tool_fields(body: Any) -> Any:
    """A copy of just the fields the filter may change (not the whole body:
    an LLM request can carry megabytes of images)."""
    if not isinstance(body, dict):
        return body
    return {k: copy.deepcopy(body[k]) for k in _REQUEST_TOOL_KEYS if k in body}


def filter_listed(engine: Pipeline, ex: Exchange, body: bytes) -> bytes | None:
    """A whole (JSON) MCP response body with never-in-scope tools removed from
    the tools/list results it answers; None: unchanged (or not filtered)."""
    if not (
        ex.kind == "mcp"
        and getattr(ex.state, "list_ids", None)
        and ex.policy.policy.filter_tools
        and body
    ):
        return None
    text = body.decode("utf-8", "surrogateescape")
    filtered = filter_payload(engine, ex, text)
    if filtered is text or _shadow(ex):  # shadow: recorded, passed on as sent
        return None
    return filtered.encode("utf-8", "surrogateescape")


def filtering_stream(
    engine: Pipeline, ex: Exchange, collected: McpResponses
) -> Callable[[bytes], list[bytes]]:
    """An MCP response stream that answers a tools/list, passed on event by
    event (an event is held only until its last byte arrives), each tools/list
    result filtered. `collected` (the record, the tool registry) gets the
    events as the server sent them. In shadow the stream passes byte for byte;
    the would-be removals are recorded."""

    ex.state.sse = parser = SseParser(max_event=MAX_EVENT)
    if _shadow(ex):
        return _observing_stream(engine, ex, collected, parser)

    def on_chunk(chunk: bytes) -> list[bytes]:
        # A list, never b"": an empty chunk would end a chunked response.
        out: list[bytes] = []
        with stream_chunk(ex):
            for event in parser.feed(chunk) + (parser.close() if not chunk else []):
                collected.feed_payload(event.data)
                out.append(sse_event(event.event, filter_payload(engine, ex, event.data)))
        return out

    return on_chunk


def _observing_stream(
    engine: Pipeline, ex: Exchange, collected: McpResponses, parser: SseParser
) -> Callable[[bytes], list[bytes]]:
    """Shadow: each chunk passed on as it came; each tools/list result is
    filtered only to record what would have been removed."""

    def on_chunk(chunk: bytes) -> list[bytes]:
        with stream_chunk(ex):
            for event in parser.feed(chunk) + (parser.close() if not chunk else []):
                collected.feed_payload(event.data)
                filter_payload(engine, ex, event.data)  # recorded, not applied
        return [chunk] if chunk else []

    return on_chunk


def filter_payload(engine: Pipeline, ex: Exchange, data: str) -> str:
    """One JSON-RPC payload (a message or a batch) with the tools/list results
    this exchange asked for filtered; the same string when nothing was removed."""
    filtered = _filter_messages(
        engine, ex, data, lambda m: id_key(m.get("id")) in ex.state.list_ids
    )
    return filtered if filtered is not None else data


def filter_session_event(engine: Pipeline, ex: Exchange, data: str) -> str:
    """One event of a legacy HTTP+SSE session stream with its tools/list results
    filtered (the transport answers a POSTed tools/list on this stream, not in
    the POST's response); the same string when nothing was removed, and always
    in shadow (the removal is only recorded)."""
    if not ex.policy.policy.filter_tools:
        return data
    filtered = _filter_messages(engine, ex, data, _is_tools_list_result)
    return filtered if filtered is not None and not _shadow(ex) else data


def _filter_messages(
    engine: Pipeline, ex: Exchange, data: str, wanted: Callable[[dict[str, Any]], bool]
) -> str | None:
    """The payload (a message or a batch) with the tools/list results `wanted` picks
    filtered, re-serialised; None when nothing was removed (or it is not JSON)."""
    if '"tools"' not in data:
        return None
    try:
        parsed = json.loads(data)
    except ValueError:
        return None
    removed_any = False
    for message in parsed if isinstance(parsed, list) else [parsed]:
        if isinstance(message, dict) and wanted(message):
            removed_any |= _filter_result(engine, ex, message)
    return json.dumps(parsed) if removed_any else None


def _is_tools_list_result(message: dict[str, Any]) -> bool:
    """An answer shaped as a tools/list result: every tool has the `name` and
    `inputSchema` MCP requires (the stream does not say which request it answers)."""
    result = message.get("result")
    tools = result.get("tools") if isinstance(result, dict) else None
    return (
        "id" in message
        and isinstance(tools, list)
        and all(isinstance(t, dict) and "name" in t and "inputSchema" in t for t in tools)
    )


def _filter_result(engine: Pipeline, ex: Exchange, message: dict[str, Any]) -> bool:
    result = message.get("result")
    tools = result.get("tools") if isinstance(result, dict) else None
    offered = len(tools) if isinstance(tools, list) else 0
    removed = filter_tools_result(message, ex.ledger, ex.req.host, split_path(ex.req.path)[0])
    if removed:
        _record(engine, ex, "mcp", redact_url(ex.req.url), offered, removed)
    return bool(removed)


def _record(
    engine: Pipeline,
    ex: Exchange,
    source: str,
    server: str | None,
    offered: int,
    removed: list[tuple[str, str]],
) -> None:
    assert ex.ctx is not None
    engine.emit(
        ex.ctx,
        ToolsFiltered(
            **record_stamp(ex, engine.clock()),
            source=source,
            server=server,
            offered=offered,
            removed=[RemovedTool(name=n, reason=r) for n, r in removed],
            shadow=_shadow(ex),
        ),
    )
