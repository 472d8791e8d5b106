"""One WebSocket message, read the way a server would read it.

mitmproxy hands the addon whole messages: it reassembles fragments and
inflates permessage-deflate before the `websocket_message` hook, and it
closes the connection (1007) on a text message that is not UTF-8 before
any hook runs (tests/security/test_websocket_hostile.py checks all three).

A message is either read completely (JSON, or text that is not JSON) or it
is not (`WsReading.error`), and then the policy's `on_error` decides it:

- text: parsed as JSON whatever its first bytes; text that does not parse
  and does not start like JSON is plain text (read, no JSON targets); text
  that starts like JSON and does not parse is an error.
- binary: inspected like text when its bytes are UTF-8 JSON (a server may
  well parse them); any other binary payload is opaque: an error.

JSON-RPC in a message is MCP (`mcp_requests`) when it is an MCP request or
batch; anything else stays a `websocket` call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from offscope.proxy.extract.http import MAX_PARSE
from offscope.proxy.extract.mcp import McpRequest
from offscope.proxy.extract.strict_json import read_json as strict_read_json

_JSON_START = (b"{", b"[")
_WHITESPACE = b" \t\r\n"  # the only whitespace JSON allows around a value
_BOM = b"\xef\xbb\xbf"  # some parsers skip it: JSON after one is JSON to them

# The methods a client sends to an MCP server (the 2025-11-25 schema, tasks
# included; tests check the SDK's list against this one). A JSON-RPC
# message with any other method is not MCP: it is tagged as a `websocket`
# call, so that a JSON-RPC server which is not MCP cannot be reached through
# "protocol" messages that MCP never tags.
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
    }
)
_REQUEST_KEYS = frozenset({"jsonrpc", "id", "method", "params"})
_RESPONSE_KEYS = frozenset({"jsonrpc", "id", "result", "error"})


@dataclass(slots=True)
class WsReading:
    value: Any = None  # the parsed JSON (None: none)
    is_json: bool = False
    error: str | None = None  # why the message cannot be read completely (on_error decides)
    note: str | None = None  # what was read, for the record
    closed: int | None = None  # the proxy's parser closed the socket on it (this code)


def read_json(data: bytes) -> tuple[Any, str | None]:
    """The JSON value of a message's bytes, or (None, why not): the strict reader
    every transport uses (offscope/proxy/extract/strict_json.py), so HTTP, stdio
    and WebSocket decide the same bytes the same way. A message parsers could
    read two ways (a repeated key) cannot be read completely here: it goes to
    `on_error` like any unreadable message."""
    reading = strict_read_json(data, max_bytes=MAX_PARSE)
    if reading.error is not None:
        return None, f"message not inspected: {reading.error}"
    if reading.ambiguity is not None:
        return None, f"message not inspected: ambiguous: {reading.ambiguity}"
    return reading.value, None


def read_message(content: bytes, is_text: bool) -> WsReading:
    """What offscope reads of one whole message (see the module docstring)."""
    value, error = read_json(content)
    if error is None:
        return WsReading(value, True, note=None if is_text else "binary message read as JSON")
    if not _starts_like_json(content):
        if is_text:
            return WsReading(note="text message, not JSON")
        error = f"{len(content)} bytes that are not JSON"
    return WsReading(error=f"{'text' if is_text else 'binary'} message: {error}")


def _starts_like_json(content: bytes) -> bool:
    head = content.lstrip(_WHITESPACE)
    head = head.removeprefix(_BOM).lstrip(_WHITESPACE)
    return head.startswith(_JSON_START)


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
