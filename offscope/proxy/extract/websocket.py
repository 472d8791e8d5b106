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
from offscope.proxy.extract.strict_json import read_json as strict_read_json

_JSON_START = (b"{", b"[")
_WHITESPACE = b" \t\r\n"  # the only whitespace JSON allows around a value
_BOM = b"\xef\xbb\xbf"  # some parsers skip it: JSON after one is JSON to them


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
