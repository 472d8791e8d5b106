"""MCP over streamable HTTP: JSON-RPC requests, batches, JSON or SSE responses.

Only `tools/call` requests are calls by the agent; `tools/list` results are
remembered per server so that tool annotations (readOnlyHint,
destructiveHint) feed the stage of later calls.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from offscope.ledgers.matcher import CallInput
from offscope.proxy.extract.http import HttpRequest, basic_auth_user, parse_json_body, split_path
from offscope.proxy.extract.sse import parse_sse


@dataclass(slots=True)
class McpRequest:
    id: Any
    method: str
    params: dict[str, Any]


def mcp_messages(req: HttpRequest) -> tuple[list[McpRequest], list[str]] | None:
    """JSON-RPC requests in an HTTP request, or None if it is not JSON-RPC."""
    if req.method.upper() != "POST":
        return None
    parsed = req.json_body()
    body, notes = parsed.value, list(parsed.notes)
    items = body if isinstance(body, list) else [body]
    messages: list[McpRequest] = []
    for item in items:
        if isinstance(item, dict) and item.get("jsonrpc") == "2.0" and isinstance(item.get("method"), str):
            params = item.get("params")
            messages.append(McpRequest(item.get("id"), item["method"], params if isinstance(params, dict) else {}))
    if not messages:
        return None
    return messages, notes


def call_from_message(req: HttpRequest, msg: McpRequest, annotations: dict[str, Any] | None) -> CallInput:
    path, query = split_path(req.path)
    name = msg.params.get("name")
    arguments = msg.params.get("arguments")
    return CallInput(
        source="mcp",
        tool=name if isinstance(name, str) else "?",
        host=req.host,
        path=path,
        query=query,
        args=arguments if isinstance(arguments, dict) else {},
        headers=req.headers,
        basic_auth_user=basic_auth_user(req.headers.get("authorization")),
        annotations=annotations,
    )


def response_messages(body: bytes, content_type: str) -> list[dict[str, Any]]:
    """JSON-RPC messages in a response body (JSON, batch, or SSE). Never raises."""
    payloads: list[Any] = []
    if "text/event-stream" in content_type:
        for event in parse_sse(body):
            try:
                payloads.append(json.loads(event.data))
            except (ValueError, RecursionError):
                continue
    else:
        data, _ = parse_json_body(body, content_type or "application/json")
        payloads.append(data)
    out: list[dict[str, Any]] = []
    for p in payloads:
        for item in p if isinstance(p, list) else [p]:
            if isinstance(item, dict) and item.get("jsonrpc") == "2.0":
                out.append(item)
    return out


def tool_annotations(message: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """name -> annotations, from a tools/list result message."""
    result = message.get("result")
    tools = result.get("tools") if isinstance(result, dict) else None
    found: dict[str, dict[str, Any]] = {}
    for tool in tools if isinstance(tools, list) else []:
        if isinstance(tool, dict) and isinstance(tool.get("name"), str):
            ann = tool.get("annotations")
            found[tool["name"]] = ann if isinstance(ann, dict) else {}
    return found


def tool_output_schemas(message: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """name -> outputSchema, from a tools/list result message (tools that declare one)."""
    result = message.get("result")
    tools = result.get("tools") if isinstance(result, dict) else None
    return {t["name"]: t["outputSchema"] for t in (tools if isinstance(tools, list) else [])
            if isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("outputSchema"), dict)}


def structured_text(schema: dict[str, Any] | None, text: str) -> dict[str, Any] | None:
    """Structured content carrying `text` for a tool whose output schema is one
    string field (FastMCP wraps `-> str` as {"result": str}); None otherwise.

    A synthetic result (an operator reply) for a tool with an output schema
    must carry structured content, or SDK clients reject the result."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return None
    props = schema.get("properties")
    if not isinstance(props, dict):
        return None
    strings = [k for k, v in props.items() if isinstance(v, dict) and v.get("type") == "string"]
    required = schema.get("required") or []
    if len(strings) == 1 and set(required) <= set(strings):
        return {strings[0]: text}
    return None


def result_text(message: dict[str, Any]) -> tuple[bool, str]:
    """(is_error, text) of a tools/call result or a JSON-RPC error."""
    if "error" in message:
        err = message["error"]
        return True, str(err.get("message", err) if isinstance(err, dict) else err)
    result = message.get("result")
    if not isinstance(result, dict):
        return False, ""
    content = result.get("content")
    texts = [c.get("text", "") for c in content if isinstance(c, dict)] if isinstance(content, list) else []
    return bool(result.get("isError")), "\n".join(t for t in texts if isinstance(t, str) and t)


class ToolRegistry:
    """Annotations of MCP tools per server, bounded (LRU over servers)."""

    def __init__(self, max_servers: int = 1024) -> None:
        self._servers: OrderedDict[str, dict[str, dict[str, Any]]] = OrderedDict()
        self._schemas: dict[str, dict[str, dict[str, Any]]] = {}
        self._max = max_servers

    @staticmethod
    def key(req: HttpRequest) -> str:
        return f"{req.host}:{req.port}{split_path(req.path)[0]}"

    def remember(self, server: str, tools: dict[str, dict[str, Any]],
                 schemas: dict[str, dict[str, Any]] | None = None) -> None:
        known = self._servers.setdefault(server, {})
        known.update(tools)
        if schemas:
            self._schemas.setdefault(server, {}).update(schemas)
        self._servers.move_to_end(server)
        while len(self._servers) > self._max:
            old, _ = self._servers.popitem(last=False)
            self._schemas.pop(old, None)

    def annotations(self, server: str, tool: str) -> dict[str, Any] | None:
        return self._servers.get(server, {}).get(tool)

    def output_schema(self, server: str, tool: str) -> dict[str, Any] | None:
        return self._schemas.get(server, {}).get(tool)
