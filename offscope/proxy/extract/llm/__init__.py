"""LLM API traffic: the tool calls a model asks for, and its text.

One dialect per wire format, each in its own module of this package and
registered there (see base.py for what a dialect provides). Every module here
is imported below, so adding an API is adding one file. `LlmResponseParser`
is fed the response body in whatever chunks arrive (a streamed response is
parsed as it passes through, without being held back) and `finish()` returns
what it found.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from offscope.proxy.extract.http import parse_json_body
from offscope.proxy.extract.llm.base import (
    DIALECTS,
    MAX_ARGS,
    MAX_CALLS,
    MAX_EVENT,
    MAX_TEXT,
    Api,
    Dialect,
    LlmRequestInfo,
    LlmResponseParser,
    LlmResult,
    LlmToolCall,
    ToolResult,
    dialect,
    dialect_for,
    is_auxiliary,
    llm_api_of,
    register,
)

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")


def parse_request(api: Api, body: bytes | Any, path: str = "") -> LlmRequestInfo:
    """Model, stream flag, the declared tools' annotations and the first user
    message (the brief), from the raw body or its already parsed JSON. Never
    raises on bad input (an unknown `api` is a programming error)."""
    found = dialect(api)
    data, notes = (
        parse_json_body(body, "application/json") if isinstance(body, bytes) else (body, [])
    )
    if not isinstance(data, dict):
        return LlmRequestInfo(notes=notes)
    info = found.request_info(data, path)
    info.notes = notes + info.notes
    return info


def parse_response(api: Api, body: bytes, content_type: str) -> LlmResult:
    parser = LlmResponseParser(api, content_type)
    parser.feed(body)
    return parser.finish()


def substitute_tool_results(api: Api, body: Any, replies: dict[str, str]) -> list[tuple[str, str]]:
    """Replace the content of tool results whose call id is in `replies`.

    This is how the operator-reply policy reaches an agent whose "ask a
    human" tool runs inside its own harness: the harness's answer travels to
    the model in the next request, and the proxy swaps it for the policy's
    reply. Mutates `body` in place (every result answering a call in
    `replies`); returns (call id, original text) pairs, one per call id.
    """
    found: list[tuple[str, str]] = []
    if not isinstance(body, dict):
        return found
    done: set[str] = set()
    for result in dialect(api).tool_results(body):
        if result.call_id in replies:
            if result.call_id not in done:
                done.add(result.call_id)
                found.append((result.call_id, result.text))
            result.replace(replies[result.call_id])
    return found


__all__ = [
    "DIALECTS",
    "MAX_ARGS",
    "MAX_CALLS",
    "MAX_EVENT",
    "MAX_TEXT",
    "Api",
    "Dialect",
    "LlmRequestInfo",
    "LlmResponseParser",
    "LlmResult",
    "LlmToolCall",
    "ToolResult",
    "dialect",
    "dialect_for",
    "is_auxiliary",
    "llm_api_of",
    "parse_request",
    "parse_response",
    "register",
    "substitute_tool_results",
]
