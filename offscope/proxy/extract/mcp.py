"""MCP over HTTP: JSON-RPC requests, batches, JSON or SSE responses, for the
streamable HTTP transport and the legacy HTTP+SSE one (`GET /sse` +
`POST /messages?session_id=`).

Only `tools/call` requests are calls by the agent. Everything else is protocol:
`initialize`, `notifications/*`, `ping`, `tools/list`, JSON-RPC responses the
client posts, the session's GET stream and its closing DELETE. `tools/list`
results are remembered per server and session so that tool annotations
(readOnlyHint, destructiveHint) feed the stage of later calls.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from offscope.ledgers.hostnames import ascii_host
from offscope.ledgers.matcher import CallInput
from offscope.proxy.extract.http import HttpRequest, basic_auth_user, parse_json_body, split_path
from offscope.proxy.extract.mcp_tasks import task_id_of
from offscope.proxy.extract.readings import canonical_path
from offscope.proxy.extract.sse import parse_sse


@dataclass(slots=True)
class McpRequest:
    id: Any
    method: str  # RESPONSE ("") for a result the client posts to a server request
    params: dict[str, Any]  # for a RESPONSE: {"result": ...}


RESPONSE = ""


def id_key(value: Any) -> str:
    """A JSON-RPC id as a hashable key (an agent may send any JSON value as an id;
    1, "1" and true stay distinct)."""
    return json.dumps(value, sort_keys=True)


def is_transport(req: HttpRequest) -> bool:
    """MCP protocol traffic that carries no JSON-RPC request: the streamable
    HTTP session's GET stream and closing DELETE (they carry the session or
    protocol-version header), and the legacy transport's `GET .../sse`."""
    method = req.method.upper()
    if method not in ("GET", "DELETE"):
        return False
    if "mcp-session-id" in req.headers or "mcp-protocol-version" in req.headers:
        return True
    return (
        method == "GET"
        and "text/event-stream" in req.headers.get("accept", "")
        and split_path(req.path)[0].rstrip("/").endswith("/sse")
    )


def session_of(req: HttpRequest) -> str | None:
    """The MCP session a request belongs to (header, or the legacy query parameter)."""
    sid = req.headers.get("mcp-session-id")
    if sid:
        return sid
    if "?" in req.path:
        query = split_path(req.path)[1]
        for name in ("session_id", "sessionId"):
            if query.get(name):
                return query[name][0]
    return None


# The methods a client sends to an MCP server (the 2025-11-25 schema, tasks
# included, and the 2026-07-28 revision's server/discover; tests check the SDK's
# list against this one). A JSON-RPC message with any other method is not MCP:
# on HTTP it is a plain HTTP call tagged by the extract rules, on a WebSocket a
# `websocket` call, so that a JSON-RPC server which is not MCP cannot be reached
# through "protocol" messages that MCP never tags.
MCP_CLIENT_METHODS = frozenset(
    {
        "initialize",
        "ping",
        "tools/list",
        "tools/call",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "resources/subscribe",
        "resources/unsubscribe",
        "prompts/list",
        "prompts/get",
        "completion/complete",
        "logging/setLevel",
        "tasks/get",
        "tasks/result",
        "tasks/list",
        "tasks/cancel",
        "server/discover",
    }
)
_REQUEST_KEYS = frozenset({"jsonrpc", "id", "method", "params"})
_RESPONSE_KEYS = frozenset({"jsonrpc", "id", "result", "error"})


def mcp_requests(value: Any) -> list[McpRequest] | None:
    """The MCP requests in a message's JSON, or None when it is not MCP.

    MCP: a JSON-RPC 2.0 object, or a non-empty batch of them, each a request
    with an MCP method or a response (to the server's own requests), with
    no member JSON-RPC does not define (a server that is not MCP could read
    one). Responses give no request: protocol, like notifications."""
    items = value if isinstance(value, list) and value else [value]
    requests: list[McpRequest] = []
    for item in items:
        if not isinstance(item, dict) or item.get("jsonrpc") != "2.0":
            return None
        method = item.get("method")
        if isinstance(method, str):
            known = method in MCP_CLIENT_METHODS or method.startswith("notifications/")
            if not known or not item.keys() <= _REQUEST_KEYS:
                return None
            params = item.get("params", {})
            if not isinstance(params, dict):  # positional params are not MCP
                return None
            requests.append(McpRequest(item.get("id"), method, params))
        elif "id" not in item or not item.keys() <= _RESPONSE_KEYS:
            return None
    return requests


def mcp_messages(req: HttpRequest) -> tuple[list[McpRequest], list[str]] | None:
    """JSON-RPC requests in an HTTP request, or None if it is not MCP/JSON-RPC.

    MCP traffic that is not a request (the session stream, its DELETE, a
    JSON-RPC response the client posts) gives an empty list: protocol, not a call."""
    if req.method.upper() != "POST":
        return ([], []) if is_transport(req) else None
    parsed = req.json_body()
    body, notes = parsed.value, list(parsed.notes)
    items = body if isinstance(body, list) else [body]
    messages: list[McpRequest] = []
    responses = 0
    for item in items:
        if not isinstance(item, dict) or item.get("jsonrpc") != "2.0":
            continue
        if isinstance(item.get("method"), str):
            params = item.get("params")
            messages.append(
                McpRequest(
                    item.get("id"), item["method"], params if isinstance(params, dict) else {}
                )
            )
        elif "id" in item and ("result" in item or "error" in item):
            responses += 1
            if isinstance(item.get("result"), dict):  # the client's answer to a server request
                messages.append(McpRequest(item["id"], RESPONSE, {"result": item["result"]}))
    if not messages and not responses:
        return None
    if all(m.method == RESPONSE for m in messages) and not responses:
        return None
    # Only MCP is MCP: JSON-RPC whose every method is foreign to MCP is a plain HTTP
    # call, tagged by the extract rules like any body. Taken as MCP "protocol" it
    # had been forwarded untagged and unrecorded (a JSON-RPC server runs it).
    if not responses and not any(_is_mcp_method(m.method) for m in messages):
        return None
    return messages, notes


def _is_mcp_method(method: str) -> bool:
    return method in MCP_CLIENT_METHODS or method.startswith("notifications/")


def call_from_message(
    req: HttpRequest, msg: McpRequest, annotations: dict[str, Any] | None
) -> CallInput:
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
    return {
        t["name"]: t["outputSchema"]
        for t in (tools if isinstance(tools, list) else [])
        if isinstance(t, dict)
        and isinstance(t.get("name"), str)
        and isinstance(t.get("outputSchema"), dict)
    }


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
    texts = (
        [c.get("text", "") for c in content if isinstance(c, dict)]
        if isinstance(content, list)
        else []
    )
    return bool(result.get("isError")), "\n".join(t for t in texts if isinstance(t, str) and t)


def is_tools_list_result(message: dict[str, Any]) -> bool:
    """A `tools/list` result by its shape (on the legacy transport it arrives on
    the GET stream, apart from the request that asked for it)."""
    result = message.get("result")
    tools = result.get("tools") if isinstance(result, dict) else None
    return isinstance(tools, list) and all(
        isinstance(t, dict) and isinstance(t.get("name"), str) for t in tools
    )


MAX_RESULT_TEXT = 4096  # of a call's result, kept for the record's excerpt


class McpResponses:
    """What the engine keeps of MCP responses, in bounded memory: the result
    text (capped) of the requests it waits for, and `tools/list` results handed
    to `on_tools` as they pass. Notifications and other messages are dropped."""

    def __init__(
        self,
        wanted: set[Any],
        lists: set[Any],
        on_tools: Callable[[dict[str, Any]], None],
        on_server_request: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.wanted = wanted
        self.lists = lists
        self.on_tools = on_tools
        self.on_server_request = on_server_request  # e.g. elicitation/create (2025 revisions)
        self.results: dict[Any, tuple[bool, str]] = {}
        # 2026-07-28: results that ask the client for input (the call is retried with it)
        self.input_required: dict[Any, dict[str, Any]] = {}
        self.tasks: dict[Any, str] = {}  # calls answered with a task handle: their task ids

    def add(self, message: dict[str, Any]) -> None:
        if self.on_server_request is not None and isinstance(message.get("method"), str):
            if "id" in message:
                self.on_server_request(message)
            return
        key = id_key(message.get("id"))
        if key in self.lists or ("id" in message and is_tools_list_result(message)):
            self.on_tools(message)
        if key in self.wanted and key not in self.results:
            is_error, text = result_text(message)
            self.results[key] = (is_error, text[:MAX_RESULT_TEXT])
            result = message.get("result")
            if isinstance(result, dict) and result.get("resultType") == "input_required":
                self.input_required[key] = result
            if (task_id := task_id_of(result)) is not None:
                self.tasks[key] = task_id

    def feed_payload(self, data: str) -> None:
        """One SSE event's data (a message or a batch)."""
        try:
            payload = json.loads(data)
        except (ValueError, RecursionError):
            return
        for item in payload if isinstance(payload, list) else [payload]:
            if isinstance(item, dict) and item.get("jsonrpc") == "2.0":
                self.add(item)


class ToolRegistry:
    """Annotations of MCP tools per server and per session, bounded (LRU).

    A session's own `tools/list` wins over what another session of the same
    server listed; a server's tools are known to all its sessions."""

    def __init__(self, max_servers: int = 4096) -> None:
        self._servers: OrderedDict[str, dict[str, dict[str, Any]]] = OrderedDict()
        self._schemas: dict[str, dict[str, dict[str, Any]]] = {}
        # tool -> its Mcp-Param-* headers and the arguments they mirror (2026-07-28)
        self._header_params: dict[str, dict[str, dict[str, tuple[str, ...]]]] = {}
        self._max = max_servers
        self._fresh_until: dict[str, float] = {}  # key -> until when its list is fresh (ttlMs)

    @staticmethod
    def key(req: HttpRequest) -> str:
        """The server an MCP request is for, as `host:port/path` in the canonical
        spelling (`canonical_path`): every alias a server routes to the same
        endpoint (`/MCP`, `/mcp/`, `/%6dcp`) is one server for annotations,
        tool surfaces and pins."""
        return f"{ascii_host(req.host)}:{req.port}{canonical_path(split_path(req.path)[0])}"

    def remember(
        self,
        server: str,
        tools: dict[str, dict[str, Any]],
        schemas: dict[str, dict[str, Any]] | None = None,
        session: str | None = None,
        header_params: dict[str, dict[str, tuple[str, ...]]] | None = None,
        fresh_until: float | None = None,
    ) -> None:
        """Learn a list result. `fresh_until` (monotonic clock): when the list's own
        `ttlMs` (2026-07-28) runs out; past it the annotations are stale (`stale`)."""
        for key in (server, f"{server}#{session}") if session else (server,):
            if fresh_until is None:
                self._fresh_until.pop(key, None)
            else:
                self._fresh_until[key] = fresh_until
            self._servers.setdefault(key, {}).update(tools)
            if schemas:
                self._schemas.setdefault(key, {}).update(schemas)
            if header_params is not None:  # a new list replaces what the old one mirrored
                mirrored = self._header_params.setdefault(key, {})
                for tool in tools:
                    mirrored.pop(tool, None)
                mirrored.update(header_params)
            self._servers.move_to_end(key)
        while len(self._servers) > self._max:
            old, _ = self._servers.popitem(last=False)
            self._schemas.pop(old, None)
            self._header_params.pop(old, None)
            self._fresh_until.pop(old, None)

    def stale(self, server: str, session: str | None, now: float) -> bool:
        """Whether the list offscope learnt this server's tools from said (by its ttl) it
        is no longer fresh: an agent's cached list may since have changed under it."""
        key = (
            f"{server}#{session}" if session and f"{server}#{session}" in self._servers else server
        )
        until = self._fresh_until.get(key)
        return until is not None and now >= until

    def header_params(
        self, server: str, tool: str, session: str | None = None
    ) -> dict[str, tuple[str, ...]] | None:
        """The tool's `Mcp-Param-*` headers (lower case) and the argument paths they
        mirror, as its server's input schema declared them."""
        if session:
            found = self._header_params.get(f"{server}#{session}", {}).get(tool)
            if found is not None:
                return found
        return self._header_params.get(server, {}).get(tool)

    def annotations(
        self, server: str, tool: str, session: str | None = None
    ) -> dict[str, Any] | None:
        if session:
            found = self._servers.get(f"{server}#{session}", {}).get(tool)
            if found is not None:
                return found
        return self._servers.get(server, {}).get(tool)

    def output_schema(self, server: str, tool: str) -> dict[str, Any] | None:
        return self._schemas.get(server, {}).get(tool)
