"""MCP's 2026-07-28 revision on HTTP: what changes on the wire for offscope.

The revision is stateless: every request carries its protocol version (and the
client's capabilities) in `params._meta`, mirrored by the `MCP-Protocol-Version`
header. It also mirrors parts of the body into HTTP headers so that load
balancers and gateways can route without parsing JSON:

- `Mcp-Method` carries the JSON-RPC method, `Mcp-Name` the tool (prompt, resource)
  the method names;
- a tool whose input schema marks a property with `x-mcp-header: Token` has that
  argument mirrored in an `Mcp-Param-Token` header (base64-wrapped as
  `=?base64?...?=` when it is not plain printable ASCII).

A header that disagrees with the body is two readings of one request: a router or
server that reads the header acts on another tool or argument than the one
offscope tagged from the body. `header_readings` lists those other readings; the
MCP handler refuses them (`ambiguous: refuse`) or tags the most out-of-scope one.

Results offscope writes itself must carry `resultType` for a client of this
revision (its SDK rejects a result without it); `is_modern` tells which revision
a request speaks.
"""

from __future__ import annotations

import base64
import binascii
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

FIRST_STATELESS_VERSION = "2026-07-28"
VERSION_META_KEY = "io.modelcontextprotocol/protocolVersion"
VERSION_HEADER = "mcp-protocol-version"
METHOD_HEADER = "mcp-method"
NAME_HEADER = "mcp-name"
PARAM_HEADER_PREFIX = "mcp-param-"
HEADER_MISMATCH = -32020  # the revision's JSON-RPC error code for a header/body mismatch

# The body field each name-bearing method mirrors in `Mcp-Name`.
NAME_FIELD = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}

_BASE64_VALUE = re.compile(r"^=\?base64\?(?P<payload>.*)\?=$")


def protocol_version(params: Mapping[str, Any], headers: Mapping[str, str]) -> str | None:
    """The revision a request says it speaks: its `_meta` envelope, else the header."""
    meta = params.get("_meta")
    version = meta.get(VERSION_META_KEY) if isinstance(meta, Mapping) else None
    if isinstance(version, str):
        return version
    return headers.get(VERSION_HEADER)


def is_modern(params: Mapping[str, Any], headers: Mapping[str, str]) -> bool:
    """Whether the request speaks the stateless revision or a later one (versions are
    ISO dates, so they compare as strings)."""
    version = protocol_version(params, headers)
    return version is not None and version >= FIRST_STATELESS_VERSION


def decode_header_value(value: str) -> str | None:
    """A mirrored header's value: verbatim, or the UTF-8 inside `=?base64?...?=`
    (None when that wrapper is malformed)."""
    found = _BASE64_VALUE.fullmatch(value)
    if found is None:
        return value
    try:
        return base64.b64decode(found.group("payload"), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


def header_params(input_schema: Any) -> dict[str, tuple[str, ...]]:
    """`Mcp-Param-*` header name (lower case) -> the argument path it mirrors, for the
    top-level and nested object properties of a tool's input schema that carry
    `x-mcp-header`."""
    found: dict[str, tuple[str, ...]] = {}

    def walk(schema: Any, path: tuple[str, ...]) -> None:
        if not isinstance(schema, Mapping) or len(path) > 8:
            return
        token = schema.get("x-mcp-header")
        if path and isinstance(token, str) and token:
            found[PARAM_HEADER_PREFIX + token.lower()] = path
        props = schema.get("properties")
        for name, sub in props.items() if isinstance(props, Mapping) else ():
            if isinstance(name, str):
                walk(sub, (*path, name))

    walk(input_schema, ())
    return found


def tool_header_params(message: dict[str, Any]) -> dict[str, dict[str, tuple[str, ...]]]:
    """tool name -> its `Mcp-Param-*` headers, from a tools/list result message."""
    result = message.get("result")
    tools = result.get("tools") if isinstance(result, dict) else None
    found: dict[str, dict[str, tuple[str, ...]]] = {}
    for tool in tools if isinstance(tools, list) else []:
        if isinstance(tool, dict) and isinstance(tool.get("name"), str):
            params = header_params(tool.get("inputSchema"))
            if params:
                found[tool["name"]] = params
    return found


@dataclass(frozen=True, slots=True)
class HeaderReading:
    """What a reader of the headers would take the request to be, and why it differs."""

    why: str
    method: str
    params: dict[str, Any]


def header_readings(
    method: str,
    params: dict[str, Any],
    headers: Mapping[str, str],
    mirrored: Mapping[str, tuple[str, ...]] | None = None,
) -> list[HeaderReading]:
    """The readings of one JSON-RPC request that its `Mcp-Method`, `Mcp-Name` and
    `Mcp-Param-*` headers give where they disagree with the body (empty when they
    agree or are absent). `mirrored` maps the tool's `Mcp-Param-*` headers to the
    argument paths they mirror (from its input schema)."""
    out: list[HeaderReading] = []
    header_method = headers.get(METHOD_HEADER)
    if header_method is not None and header_method != method:
        out.append(
            HeaderReading(
                f"Mcp-Method header {header_method!r} disagrees with the body's {method!r}",
                header_method,
                params,
            )
        )
    read_as = header_method if header_method in NAME_FIELD else method
    field = NAME_FIELD.get(read_as)
    raw_name = headers.get(NAME_HEADER)
    if field is not None and raw_name is not None:
        name = decode_header_value(raw_name)
        if name != params.get(field):
            out.append(
                HeaderReading(
                    f"Mcp-Name header {raw_name!r} disagrees with the body's {field} "
                    f"{params.get(field)!r}",
                    read_as,
                    {**params, field: name if name is not None else raw_name},
                )
            )
    arguments = params.get("arguments")
    for header, path in (mirrored or {}).items():
        raw = headers.get(header)
        if raw is None:
            continue
        value = decode_header_value(raw)
        sent = _value_at(arguments, path)
        if sent is None or value != _as_header_text(sent):
            out.append(
                HeaderReading(
                    f"{header} header {raw!r} disagrees with argument {'.'.join(path)} {sent!r}",
                    read_as,
                    {**params, "arguments": _with_value(arguments, path, value or raw)},
                )
            )
    return out


def _value_at(arguments: Any, path: tuple[str, ...]) -> Any:
    node = arguments
    for key in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def _as_header_text(value: Any) -> str | None:
    """An argument as its client mirrors it into a header."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    return None


def _with_value(arguments: Any, path: tuple[str, ...], value: str) -> dict[str, Any]:
    """A copy of `arguments` with `value` at `path`."""
    out = dict(arguments) if isinstance(arguments, Mapping) else {}
    if len(path) == 1:
        out[path[0]] = value
    else:
        out[path[0]] = _with_value(out.get(path[0]), path[1:], value)
    return out


def jsonrpc_error(msg_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": msg_id, "error": error}


def list_ttl_ms(message: dict[str, Any]) -> int | None:
    """The `ttlMs` a 2026-07-28 list result gives (how long clients may cache it)."""
    result = message.get("result")
    ttl = result.get("ttlMs") if isinstance(result, dict) else None
    return ttl if isinstance(ttl, int) and not isinstance(ttl, bool) and ttl > 0 else None


def fresh_until(message: dict[str, Any]) -> float | None:
    """Until when (monotonic clock) a list result is fresh by its `ttlMs`; None for a
    list that gives no ttl (what it taught is kept until a new list)."""
    ttl = list_ttl_ms(message)
    return None if ttl is None else time.monotonic() + ttl / 1000
