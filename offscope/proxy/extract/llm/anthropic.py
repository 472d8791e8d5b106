"""Anthropic Messages (`POST /v1/messages`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from offscope.proxy.extract.llm.base import (
    Dialect,
    LlmResponseParser,
    ToolResult,
    items,
    message_blocks,
    register,
    tagged_results,
)


@register
class AnthropicMessages(Dialect):
    name = "anthropic-messages"
    telemetry_name = "anthropic"

    def recognises(self, path: str) -> bool:
        return path.endswith("/messages") and "/v1/" in path + "/"

    def whole(self, data: dict[str, Any], out: LlmResponseParser) -> None:
        out.set_model(data.get("model"))
        for block in items(data, "content"):
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text":
                out.text.append(str(block.get("text", "")))
            elif block.get("type") == "tool_use":
                out.add_call(block.get("name"), block.get("input"), block.get("id"))

    def event(self, data: dict[str, Any], out: LlmResponseParser) -> None:
        kind = data.get("type")
        if kind == "message_start":
            out.set_model((data.get("message") or {}).get("model"))
        elif kind == "content_block_start":
            block = data.get("content_block") or {}
            if block.get("type") == "tool_use":
                initial = block.get("input")
                out.calls.start(
                    data.get("index"),
                    block.get("name"),
                    block.get("id"),
                    json.dumps(initial) if initial else "",
                )
            elif block.get("type") == "text" and block.get("text"):
                out.text.append(block["text"])
        elif kind == "content_block_delta":
            delta = data.get("delta") or {}
            if delta.get("type") == "text_delta":
                out.text.append(str(delta.get("text", "")))
            elif delta.get("type") == "input_json_delta":
                out.calls.extend(
                    out.calls.entry(data.get("index")), str(delta.get("partial_json", ""))
                )

    def tool_results(self, body: dict[str, Any]) -> Iterator[ToolResult]:
        return tagged_results(
            message_blocks(body), ("type", "tool_result"), "tool_use_id", "content"
        )
