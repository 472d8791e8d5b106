"""Amazon Bedrock Converse (`POST /model/{modelId}/converse` and `.../converse-stream`).

Its stream is not server-sent events but AWS's binary event stream
(`application/vnd.amazon.eventstream`): length-prefixed frames with CRCs, whose
`:event-type` header names the event and whose payload is its JSON. The
decoder below reads frames as bytes pass and hands `event` {type: payload}.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import unquote

from offscope.proxy.extract.llm.base import (
    MAX_CALLS,
    MAX_EVENT,
    Dialect,
    LlmRequestInfo,
    LlmResponseParser,
    StreamDecoder,
    ToolResult,
    content_text,
    declared_annotations,
    items,
    message_blocks,
    register,
    str_key,
)

_PRELUDE = 12  # total length, headers length, prelude CRC (4 bytes each, big-endian)


class EventStream:
    """AWS event-stream frames -> {event type: payload JSON}, bounded: a frame over
    MAX_EVENT or with a bad CRC is skipped with a note."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self.notes: list[str] = []

    def feed(self, chunk: bytes) -> Iterable[Any]:
        self._buf += chunk
        return list(self._frames())

    def close(self) -> Iterable[Any]:
        if self._buf:
            self.notes.append(f"event stream ended inside a frame ({len(self._buf)} bytes)")
            self._buf.clear()
        return []

    def _frames(self) -> Iterator[Any]:
        while len(self._buf) >= _PRELUDE:
            total, headers_len, prelude_crc = struct.unpack(">III", self._buf[:_PRELUDE])
            if zlib.crc32(self._buf[:8]) != prelude_crc or total > MAX_EVENT or total < 16:
                self.notes.append("event stream frame unreadable: the rest not parsed")
                self._buf.clear()
                return
            if len(self._buf) < total:
                return
            frame = bytes(self._buf[:total])
            del self._buf[:total]
            if zlib.crc32(frame[:-4]) != struct.unpack(">I", frame[-4:])[0]:
                self.notes.append("event stream frame with a bad CRC skipped")
                continue
            headers = _headers(frame[_PRELUDE : _PRELUDE + headers_len])
            if headers.get(":message-type", "event") != "event":
                self.notes.append(f"event stream {headers.get(':exception-type', 'error')}")
                continue
            try:
                payload = json.loads(frame[_PRELUDE + headers_len : -4] or b"{}")
            except (ValueError, RecursionError):
                self.notes.append("stream event is not JSON")
                continue
            yield {headers.get(":event-type", ""): payload}


def _headers(raw: bytes) -> dict[str, str]:
    """String-valued headers (type 7); other types are skipped by their length."""
    out: dict[str, str] = {}
    sizes = {0: 0, 1: 0, 2: 1, 3: 2, 4: 4, 5: 8, 8: 8, 9: 16}
    i = 0
    while i < len(raw):
        n = raw[i]
        name = raw[i + 1 : i + 1 + n].decode("utf-8", "replace")
        kind = raw[i + 1 + n]
        i += 2 + n
        if kind in (6, 7):
            (length,) = struct.unpack(">H", raw[i : i + 2])
            if kind == 7:
                out[name] = raw[i + 2 : i + 2 + length].decode("utf-8", "replace")
            i += 2 + length
        else:
            i += sizes.get(kind, len(raw))
    return out


@register
class BedrockConverse(Dialect):
    name = "bedrock-converse"
    telemetry_name = "aws.bedrock"
    stream_types = ("application/vnd.amazon.eventstream",)

    def recognises(self, path: str) -> bool:
        return path.startswith("/model/") and path.endswith(("/converse", "/converse-stream"))

    def stream_decoder(self) -> StreamDecoder:
        return EventStream()

    def request_info(self, data: dict[str, Any], path: str) -> LlmRequestInfo:
        info = LlmRequestInfo()  # the model and streaming are in the path
        info.model = unquote(path.split("/")[2]) if path.count("/") >= 3 else None
        info.stream = path.split("?")[0].endswith("/converse-stream")
        info.tool_annotations = declared_annotations(self.tools(data))
        info.first_user = self.first_user(data)
        return info

    def tools(self, data: dict[str, Any], limit: int | None = MAX_CALLS) -> list[dict[str, Any]]:
        config = data.get("toolConfig")
        listed = items(config, "tools") if isinstance(config, dict) else []
        specs = [
            t["toolSpec"]
            for t in listed
            if isinstance(t, dict) and isinstance(t.get("toolSpec"), dict)
        ]
        return specs[:limit]

    def tool_array(self, data: dict[str, Any]) -> list[Any] | None:
        config = data.get("toolConfig")
        tools = config.get("tools") if isinstance(config, dict) else None
        return tools if isinstance(tools, list) else None

    def drop_tools(self, data: dict[str, Any]) -> None:
        data.pop("toolConfig", None)  # with its toolChoice: Converse rejects an empty list

    def forget_tools(self, data: dict[str, Any], gone: set[str]) -> None:
        """`toolConfig.toolChoice.tool` may name only a declared tool."""
        config = data.get("toolConfig")
        choice = config.get("toolChoice") if isinstance(config, dict) else None
        forced = choice.get("tool") if isinstance(choice, dict) else None
        if isinstance(config, dict) and isinstance(forced, dict) and forced.get("name") in gone:
            config.pop("toolChoice")

    def whole(self, data: dict[str, Any], out: LlmResponseParser) -> None:
        message = (data.get("output") or {}).get("message") or {}
        for block in items(message, "content") if isinstance(message, dict) else []:
            if not isinstance(block, dict):
                continue
            if isinstance(block.get("text"), str):
                out.text.append(block["text"])
            use = block.get("toolUse")
            if isinstance(use, dict):
                out.add_call(use.get("name"), use.get("input"), use.get("toolUseId"))

    def event(self, data: dict[str, Any], out: LlmResponseParser) -> None:
        for kind, payload in data.items():
            if not isinstance(payload, dict):
                continue
            index = payload.get("contentBlockIndex")
            if kind == "contentBlockStart":
                use = (payload.get("start") or {}).get("toolUse")
                if isinstance(use, dict):
                    out.calls.start(index, use.get("name"), use.get("toolUseId"))
            elif kind == "contentBlockDelta":
                delta = payload.get("delta") or {}
                if isinstance(delta.get("text"), str):
                    out.text.append(delta["text"])
                use = delta.get("toolUse")
                if isinstance(use, dict):
                    out.calls.extend(out.calls.entry(index), str(use.get("input", "")))

    def tool_results(self, body: dict[str, Any]) -> Iterator[ToolResult]:
        for block in message_blocks(body):
            result = block.get("toolResult") if isinstance(block, dict) else None
            if isinstance(result, dict) and (cid := str_key(result.get("toolUseId"))):
                yield ToolResult(cid, content_text(result.get("content")), _replacer(result))


def _replacer(result: dict[str, Any]) -> Callable[[str], None]:
    def replace(text: str) -> None:
        result["content"] = [{"text": text}]  # a tool result's content is a list of blocks

    return replace
