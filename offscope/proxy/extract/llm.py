"""LLM API traffic: the tool calls a model asks for, and its text.

Three wire formats, streaming and not: OpenAI Chat Completions, the OpenAI
Responses API and Anthropic Messages. `LlmResponseParser` is fed the response
body in whatever chunks arrive (so a streamed response is parsed as it passes
through, without being held back) and `finish()` returns what it found.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from offscope.ledgers.matcher import CallInput, split_url
from offscope.proxy.extract.http import parse_json_body
from offscope.proxy.extract.sse import SseEvent, SseParser

Api = Literal["openai-chat", "openai-responses", "anthropic-messages"]
MAX_TEXT = 100_000  # characters of assistant text kept (the behavioural metrics read it)
MAX_ARGS = 64 * 1024  # characters of one tool call's arguments kept; longer ones are cut, with a note
MAX_CALLS = 256  # tool calls kept per response
MAX_EVENT = 1024 * 1024  # one stream event larger than this is skipped


def llm_api_of(path: str) -> Api | None:
    """Which LLM API a request path belongs to (None: not an LLM API call)."""
    p = path.split("?", 1)[0].rstrip("/")
    if p.endswith("/chat/completions"):
        return "openai-chat"
    if p.endswith("/responses"):
        return "openai-responses"
    if p.endswith("/messages") and "/v1/" in p + "/":
        return "anthropic-messages"
    return None


@dataclass(slots=True)
class LlmToolCall:
    name: str
    args: Any
    notes: list[str] = field(default_factory=list)
    id: str | None = None

    def to_call_input(self) -> CallInput:
        """The tagger's view: a `url` argument makes host/path/method visible."""
        call = CallInput(source="llm", tool=self.name, args=self.args)
        if isinstance(self.args, dict):
            url = self.args.get("url")
            if isinstance(url, str):
                call.host, call.path, call.query = split_url(url)
            method = self.args.get("method")
            if isinstance(method, str):
                call.method = method.upper()
        return call


@dataclass(slots=True)
class LlmRequestInfo:
    model: str | None = None
    stream: bool = False
    first_user: str | None = None
    notes: list[str] = field(default_factory=list)
    tool_annotations: dict[str, dict[str, Any]] = field(default_factory=dict)  # declared in `tools`


def _declared_annotations(tools: Any) -> dict[str, dict[str, Any]]:
    """name -> annotations (readOnlyHint, destructiveHint, ...) of the tools a
    request declares, when it declares them: on the tool (MCP-shaped, Anthropic,
    Responses API) or on its `function` (Chat Completions)."""
    found: dict[str, dict[str, Any]] = {}
    for tool in tools[:MAX_CALLS] if isinstance(tools, list) else []:
        if not isinstance(tool, dict):
            continue
        fn = tool.get("function") if isinstance(tool.get("function"), dict) else {}
        name = fn.get("name") if isinstance(fn.get("name"), str) else tool.get("name")
        ann = tool.get("annotations") if isinstance(tool.get("annotations"), dict) else fn.get("annotations")
        if isinstance(name, str) and isinstance(ann, dict):
            found[name] = ann
    return found


@dataclass(slots=True)
class LlmResult:
    api: Api
    model: str | None = None
    text: str = ""
    tool_calls: list[LlmToolCall] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, dict) and isinstance(block.get("text"), str):
                parts.append(block["text"])
        return "\n".join(parts)
    return ""


def parse_request(api: Api, body: bytes | Any) -> LlmRequestInfo:
    """Model, stream flag and the first user message (the brief), from the raw
    body or its already parsed JSON. Never raises."""
    data, notes = parse_json_body(body, "application/json") if isinstance(body, bytes) else (body, [])
    info = LlmRequestInfo(notes=notes)
    if not isinstance(data, dict):
        return info
    info.model = data.get("model") if isinstance(data.get("model"), str) else None
    info.stream = bool(data.get("stream"))
    info.tool_annotations = _declared_annotations(data.get("tools"))
    messages = data.get("messages") if api != "openai-responses" else data.get("input")
    if isinstance(messages, str):
        info.first_user = messages[:4000]
    elif isinstance(messages, list):
        for m in messages:
            if isinstance(m, dict) and m.get("role") == "user":
                info.first_user = _content_text(m.get("content"))[:4000]
                break
    return info


def _args(raw: Any) -> tuple[Any, list[str]]:
    if isinstance(raw, dict):
        return raw, []
    if isinstance(raw, str):
        if not raw.strip():
            return {}, []
        try:
            return json.loads(raw), []
        except ValueError:
            return {"_raw": raw[:2000]}, ["tool arguments are not valid JSON"]
    return {}, [] if raw is None else ["unexpected tool argument type"]


class LlmResponseParser:
    """Accumulates one response, streamed (SSE) or not, and parses it."""

    def __init__(self, api: Api, content_type: str = "") -> None:
        self.api = api
        self.streaming = "text/event-stream" in content_type
        self._sse = SseParser(max_event=MAX_EVENT)
        self._body = bytearray()
        self._too_big = False
        self.result = LlmResult(api)
        self._text = _Text()
        self._calls = _Calls()  # stream index -> {name, args(str)}, bounded

    def feed(self, chunk: bytes) -> None:
        try:
            if self.streaming:
                for event in self._sse.feed(chunk):
                    self._on_event_safe(event)
            elif not self._too_big:
                self._body += chunk
                if len(self._body) > 16 * 1024 * 1024:
                    self._too_big = True
                    self._body.clear()
                    self.result.notes.append("response over 16 MiB not parsed")
        except Exception as exc:  # extraction must never break the flow
            self.result.notes.append(f"parse error: {type(exc).__name__}")

    def finish(self) -> LlmResult:
        try:
            if self.streaming:
                for event in self._sse.close():
                    self._on_event_safe(event)
                self.result.notes.extend(self._sse.notes)
                for entry in self._calls.values():
                    args, notes = _args(entry.get("args", ""))
                    self.result.tool_calls.append(
                        LlmToolCall(entry.get("name") or "?", args, notes, entry.get("id")))
            elif self._body:
                data, notes = parse_json_body(bytes(self._body), "application/json")
                self.result.notes.extend(notes)
                if isinstance(data, dict):
                    self._whole(data)
        except Exception as exc:
            self.result.notes.append(f"parse error: {type(exc).__name__}")
        self.result.text = "".join(self._text)[:MAX_TEXT]
        self.result.notes.extend(self._text.notes + self._calls.notes)
        return self.result

    # -- whole (non-streamed) bodies ----------------------------------------

    def _whole(self, data: dict[str, Any]) -> None:
        if isinstance(data.get("model"), str):
            self.result.model = data["model"]
        if self.api == "openai-chat":
            for choice in data.get("choices") or []:
                msg = choice.get("message") if isinstance(choice, dict) else None
                if not isinstance(msg, dict):
                    continue
                self._text.append(_content_text(msg.get("content")))
                for tc in msg.get("tool_calls") or []:
                    fn = tc.get("function") if isinstance(tc, dict) else None
                    if isinstance(fn, dict):
                        args, notes = _args(fn.get("arguments"))
                        self.result.tool_calls.append(
                            LlmToolCall(str(fn.get("name") or "?"), args, notes, tc.get("id")))
        elif self.api == "openai-responses":
            for item in data.get("output") or []:
                if not isinstance(item, dict):
                    continue
                if item.get("type") == "message":
                    self._text.append(_content_text(item.get("content")))
                elif item.get("type") == "function_call":
                    args, notes = _args(item.get("arguments"))
                    self.result.tool_calls.append(
                        LlmToolCall(str(item.get("name") or "?"), args, notes, item.get("call_id")))
        else:
            for block in data.get("content") or []:
                if not isinstance(block, dict):
                    continue
                if block.get("type") == "text":
                    self._text.append(str(block.get("text", "")))
                elif block.get("type") == "tool_use":
                    args, notes = _args(block.get("input"))
                    self.result.tool_calls.append(
                        LlmToolCall(str(block.get("name") or "?"), args, notes, block.get("id")))

    # -- streamed events ------------------------------------------------------

    def _on_event_safe(self, event: SseEvent) -> None:
        """One malformed event must not cost the events after it."""
        try:
            self._on_event(event)
        except Exception as exc:
            self.result.notes.append(f"parse error: {type(exc).__name__}")

    def _on_event(self, event: SseEvent) -> None:
        if event.data.strip() == "[DONE]":
            return
        try:
            data = json.loads(event.data)
        except (ValueError, RecursionError):
            self.result.notes.append("stream event is not JSON")
            return
        if not isinstance(data, dict):
            return
        if self.api == "openai-chat":
            self._chat_chunk(data)
        elif self.api == "openai-responses":
            self._responses_event(data)
        else:
            self._anthropic_event(data)

    def _chat_chunk(self, data: dict[str, Any]) -> None:
        if isinstance(data.get("model"), str):
            self.result.model = data["model"]
        for choice in data.get("choices") or []:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict):
                continue
            if isinstance(delta.get("content"), str):
                self._text.append(delta["content"])
            for tc in delta.get("tool_calls") or []:
                if not isinstance(tc, dict):
                    continue
                entry = self._calls.entry(tc.get("index", len(self._calls)))
                if tc.get("id"):
                    entry["id"] = tc["id"]
                fn = tc.get("function") or {}
                if fn.get("name"):
                    entry["name"] = fn["name"]
                if isinstance(fn.get("arguments"), str):
                    self._calls.extend(entry, fn["arguments"])

    def _responses_event(self, data: dict[str, Any]) -> None:
        kind = data.get("type")
        if kind == "response.completed" and isinstance(data.get("response"), dict):
            # The final event carries the whole response: parse it as a body.
            self._text.clear()
            self._calls.clear()
            self._whole(data["response"])
        elif kind == "response.output_text.delta" and isinstance(data.get("delta"), str):
            self._text.append(data["delta"])
        elif kind == "response.output_item.added":
            item = data.get("item") or {}
            if item.get("type") == "function_call":
                entry = self._calls.entry(data.get("output_index"), fresh=True)
                entry.update(name=item.get("name"), id=item.get("call_id"))
                self._calls.extend(entry, str(item.get("arguments") or ""))
        elif kind == "response.function_call_arguments.delta":
            self._calls.extend(self._calls.entry(data.get("output_index")), str(data.get("delta", "")))
        elif kind == "response.function_call_arguments.done":
            entry = self._calls.entry(data.get("output_index"))
            if "arguments" in data:
                entry["args"] = ""
                self._calls.extend(entry, str(data["arguments"]))

    def _anthropic_event(self, data: dict[str, Any]) -> None:
        kind = data.get("type")
        if kind == "message_start":
            msg = data.get("message") or {}
            if isinstance(msg.get("model"), str):
                self.result.model = msg["model"]
        elif kind == "content_block_start":
            block = data.get("content_block") or {}
            if block.get("type") == "tool_use":
                initial = block.get("input")
                entry = self._calls.entry(data.get("index"), fresh=True)
                entry.update(name=block.get("name"), id=block.get("id"))
                self._calls.extend(entry, json.dumps(initial) if initial else "")
            elif block.get("type") == "text" and block.get("text"):
                self._text.append(block["text"])
        elif kind == "content_block_delta":
            delta = data.get("delta") or {}
            if delta.get("type") == "text_delta":
                self._text.append(str(delta.get("text", "")))
            elif delta.get("type") == "input_json_delta":
                self._calls.extend(self._calls.entry(data.get("index")), str(delta.get("partial_json", "")))


class _Text(list):
    """Assistant text deltas, kept up to MAX_TEXT characters (an endless stream
    must not grow memory)."""

    def __init__(self) -> None:
        super().__init__()
        self.size = 0
        self.notes: list[str] = []

    def append(self, part: str) -> None:  # type: ignore[override]
        if self.size >= MAX_TEXT:
            if not self.notes:
                self.notes.append(f"assistant text over {MAX_TEXT} characters not kept")
            return
        part = part[:MAX_TEXT - self.size]
        self.size += len(part)
        super().append(part)

    def clear(self) -> None:
        super().clear()
        self.size = 0


class _Calls(dict):
    """Streamed tool calls by index, at most MAX_CALLS, arguments capped at MAX_ARGS."""

    def __init__(self) -> None:
        super().__init__()
        self.notes: list[str] = []
        self._spare: dict[str, Any] = {"name": None, "args": ""}  # absorbs calls over the cap

    def entry(self, index: Any, fresh: bool = False) -> dict[str, Any]:
        if index in self and not fresh:
            return self[index]
        if len(self) >= MAX_CALLS and index not in self:
            if not any("tool calls" in n for n in self.notes):
                self.notes.append(f"more than {MAX_CALLS} tool calls: the rest not kept")
            self._spare = {"name": None, "args": ""}
            return self._spare
        self[index] = {"name": None, "args": ""}
        return self[index]

    def extend(self, entry: dict[str, Any], part: str) -> None:
        room = MAX_ARGS - len(entry["args"])
        if len(part) > room:
            if not any("arguments" in n for n in self.notes):
                self.notes.append(f"tool arguments over {MAX_ARGS} characters cut")
            part = part[:max(room, 0)]
        entry["args"] += part


def parse_response(api: Api, body: bytes, content_type: str) -> LlmResult:
    parser = LlmResponseParser(api, content_type)
    parser.feed(body)
    return parser.finish()


def _key(value: Any) -> str | None:
    """A call id usable as a dict key (agents may send anything)."""
    return value if isinstance(value, str) else None


def _items(body: dict[str, Any], key: str) -> list[Any]:
    value = body.get(key)
    return value if isinstance(value, list) else []


def substitute_tool_results(api: Api, body: Any, replies: dict[str, str]) -> list[tuple[str, str]]:
    """Replace the content of tool results whose call id is in `replies`.

    This is how the operator-reply policy reaches an agent whose "ask a
    human" tool runs inside its own harness: the harness's answer travels to
    the model in the next request, and the proxy swaps it for the policy's
    reply. Mutates `body` in place; returns (call id, original text) pairs.
    """
    found: list[tuple[str, str]] = []
    if not isinstance(body, dict):
        return found
    if api == "openai-chat":
        for m in _items(body, "messages"):
            if isinstance(m, dict) and m.get("role") == "tool" and _key(m.get("tool_call_id")) in replies:
                found.append((m["tool_call_id"], _content_text(m.get("content"))))
                m["content"] = replies[m["tool_call_id"]]
    elif api == "openai-responses":
        for item in _items(body, "input"):
            if isinstance(item, dict) and item.get("type") == "function_call_output" \
                    and _key(item.get("call_id")) in replies:
                found.append((item["call_id"], str(item.get("output", ""))))
                item["output"] = replies[item["call_id"]]
    else:
        for m in _items(body, "messages"):
            content = m.get("content") if isinstance(m, dict) else None
            for block in content if isinstance(content, list) else []:
                if isinstance(block, dict) and block.get("type") == "tool_result" \
                        and _key(block.get("tool_use_id")) in replies:
                    found.append((block["tool_use_id"], _content_text(block.get("content"))))
                    block["content"] = replies[block["tool_use_id"]]
    return found
