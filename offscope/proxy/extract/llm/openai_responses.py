"""The OpenAI Responses API (`POST .../responses`)."""

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
class OpenAiResponses(Dialect):
    name = "openai-responses"
    telemetry_name = "openai"
    user_key = "input"

    def recognises(self, path: str) -> bool:
        return path.endswith("/responses")

    def whole(self, data: dict[str, Any], out: LlmResponseParser) -> None:
        out.set_model(data.get("model"))
        for item in items(data, "output"):
            if not isinstance(item, dict):
                continue
            if item.get("type") == "message":
                out.text.append(content_text(item.get("content")))
            elif item.get("type") == "function_call":
                out.add_call(item.get("name"), item.get("arguments"), item.get("call_id"))

    def event(self, data: dict[str, Any], out: LlmResponseParser) -> None:
        kind = data.get("type")
        if kind == "response.completed" and isinstance(data.get("response"), dict):
            # The final event carries the whole response: parse it as a body.
            out.text.clear()
            out.calls.clear()
            self.whole(data["response"], out)
        elif kind == "response.output_text.delta" and isinstance(data.get("delta"), str):
            out.text.append(data["delta"])
        elif kind == "response.output_item.added":
            item = data.get("item") or {}
            if item.get("type") == "function_call":
                out.calls.start(
                    data.get("output_index"),
                    item.get("name"),
                    item.get("call_id"),
                    str(item.get("arguments") or ""),
                )
        elif kind == "response.function_call_arguments.delta":
            out.calls.extend(out.calls.entry(data.get("output_index")), str(data.get("delta", "")))
        elif kind == "response.function_call_arguments.done":
            entry = out.calls.entry(data.get("output_index"))
            if "arguments" in data:
                entry["args"] = ""
                out.calls.extend(entry, str(data["arguments"]))

    def tool_results(self, body: dict[str, Any]) -> Iterator[ToolResult]:
        return tagged_results(
            items(body, "input"), ("type", "function_call_output"), "call_id", "output", str
        )
