"""OpenAI Chat Completions (`POST .../chat/completions`), also served by most
OpenAI-compatible providers and Azure OpenAI."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from offscope.proxy.extract.llm.base import (
    Dialect,
    LlmResponseParser,
    ToolResult,
    content_text,
    items,
    register,
    tagged_results,
)


@register
class OpenAiChat(Dialect):
    name = "openai-chat"
    telemetry_name = "openai"

    def recognises(self, path: str) -> bool:
        return path.endswith("/chat/completions")

    def whole(self, data: dict[str, Any], out: LlmResponseParser) -> None:
        out.set_model(data.get("model"))
        for msg in _choice_parts(data, "message"):
            out.text.append(content_text(msg.get("content")))
            for tc in items(msg, "tool_calls"):
                fn = tc.get("function") if isinstance(tc, dict) else None
                if isinstance(fn, dict):
                    out.add_call(fn.get("name"), fn.get("arguments"), tc.get("id"))

    def event(self, data: dict[str, Any], out: LlmResponseParser) -> None:
        out.set_model(data.get("model"))
        for delta in _choice_parts(data, "delta"):
            if isinstance(delta.get("content"), str):
                out.text.append(delta["content"])
            for tc in items(delta, "tool_calls"):
                if not isinstance(tc, dict):
                    continue
                entry = out.calls.entry(tc.get("index", len(out.calls)))
                if tc.get("id"):
                    entry["id"] = tc["id"]
                fn = tc.get("function") or {}
                if fn.get("name"):
                    entry["name"] = fn["name"]
                if isinstance(fn.get("arguments"), str):
                    out.calls.extend(entry, fn["arguments"])

    def tool_results(self, body: dict[str, Any]) -> Iterator[ToolResult]:
        return tagged_results(items(body, "messages"), ("role", "tool"), "tool_call_id", "content")


def _choice_parts(data: dict[str, Any], key: str) -> Iterator[dict[str, Any]]:
    """What each choice holds under `key`: its `message` in a whole response, its
    `delta` in a streamed chunk (a choice without one is skipped)."""
    for choice in items(data, "choices"):
        part = choice.get(key) if isinstance(choice, dict) else None
        if isinstance(part, dict):
            yield part
