"""What every LLM API dialect provides, and the parts they share.

A dialect is one wire format (OpenAI Chat Completions, Anthropic Messages,
...). It recognises its request path, reads a request (model, stream flag,
the first user message, the tools it declares), extracts the tool calls and
text of a response (a whole JSON body, or its stream's events as they pass:
server-sent events unless the dialect brings its own `stream_decoder`),
and finds the tool results in a request, so the operator-reply policy can
swap a harness's answer for the policy's sentinel. Dialects register
themselves (`register`); a path no dialect recognises is not parsed as any
of them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from offscope.ledgers.matcher import CallInput, split_url
from offscope.proxy.extract.http import parse_json_body
from offscope.proxy.extract.sse import SseEvent, SseParser

Api = str  # a registered dialect's name, e.g. "openai-chat"
MAX_TEXT = 100_000  # characters of assistant text kept (the behavioural metrics read it)
MAX_ARGS = (
    64 * 1024
)  # characters of one tool call's arguments kept; longer ones are cut, with a note
MAX_CALLS = 256  # tool calls kept per response
MAX_EVENT = 1024 * 1024  # one stream event larger than this is skipped
MAX_BODY = 16 * 1024 * 1024  # a whole (non-streamed) response larger than this is not parsed

# Calls on an LLM host that carry no model output and so no tool calls
# (embeddings, token counts, files, model lists): plain HTTP calls, not an
# unrecognised dialect.
AUXILIARY_SUFFIXES = (
    "/embeddings",
    "/moderations",
    "/models",
    "/count_tokens",
    ":countTokens",
    ":embedContent",
    ":batchEmbedContents",
)
AUXILIARY_PARTS = (
    "/files",
    "/audio/",
    "/images/",
    "/batches",
    "/uploads",
    "/fine_tuning/",
    "/cachedContents",
)


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


@dataclass(slots=True)
class LlmResult:
    api: Api
    model: str | None = None
    text: str = ""
    tool_calls: list[LlmToolCall] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(slots=True)
class ToolResult:
    """One tool result a request carries: whose call it answers, its text, and
    how to replace that text in the (parsed, mutable) request body."""

    call_id: str
    text: str
    replace: Callable[[str], None]


class Dialect:
    """One LLM API. Subclasses set `name` and implement the hooks; the
    defaults read the fields most APIs share."""

    name: ClassVar[str]
    user_key: ClassVar[str] = "messages"  # where the conversation is in a request
    # gen_ai.provider.name of OpenTelemetry's GenAI conventions (None: not named there)
    telemetry_name: ClassVar[str | None] = None
    # The response content types this API streams in (decoded by `stream_decoder`).
    stream_types: ClassVar[tuple[str, ...]] = ("text/event-stream",)

    def streams(self, content_type: str) -> bool:
        """Whether a response of this content type is this API's stream."""
        return any(t in content_type for t in self.stream_types)

    def stream_decoder(self) -> StreamDecoder:
        """A fresh decoder of one streamed response into its events' JSON (`event`
        gets each): server-sent events by default; an API framed otherwise brings its own."""
        return SseJson()

    def recognises(self, path: str) -> bool:
        """Whether a POST to this path (query removed, no trailing slash) is this API."""
        raise NotImplementedError

    def request_info(self, data: dict[str, Any], path: str) -> LlmRequestInfo:
        info = LlmRequestInfo()
        info.model = data.get("model") if isinstance(data.get("model"), str) else None
        info.stream = bool(data.get("stream"))
        info.tool_annotations = declared_annotations(self.tools(data))
        info.first_user = self.first_user(data)
        return info

    def first_user(self, data: dict[str, Any]) -> str | None:
        messages = data.get(self.user_key)
        if isinstance(messages, str):
            return messages[:4000]
        for m in messages if isinstance(messages, list) else []:
            if isinstance(m, dict) and m.get("role") == "user":
                return content_text(m.get("content"))[:4000]
        return None

    def tools(self, data: dict[str, Any], limit: int | None = MAX_CALLS) -> list[dict[str, Any]]:
        """The tool declarations of a request, each a dict with its `name`
        (and `annotations` when the client sent them); at most `limit`."""
        return [t for t in items(data, "tools")[:limit] if isinstance(t, dict)]

    def declares_tools(self, data: dict[str, Any]) -> bool:
        """Whether the request carries a tool list at all (an empty one counts: the
        model was offered nothing, which is a surface too)."""
        return self.tool_array(data) is not None

    def tool_array(self, data: dict[str, Any]) -> list[Any] | None:
        """The request's own list of tool entries, which `filter_tools` edits in place
        (an entry may group several functions, as Gemini's do)."""
        tools = data.get("tools")
        return tools if isinstance(tools, list) else None

    def drop_tools(self, data: dict[str, Any]) -> None:
        """Remove an emptied tool list and what only it allowed (several APIs reject
        an empty one)."""
        data.pop("tools", None)
        data.pop("parallel_tool_calls", None)

    def forget_tools(self, data: dict[str, Any], gone: set[str]) -> None:
        """Drop this API's own references to removed tools (a forced choice of one),
        beyond the `tool_choice` and Gemini allow-lists `filter_tools` handles."""

    def body(self, data: Any, out: LlmResponseParser) -> None:
        """A whole response body, parsed as JSON."""
        if isinstance(data, dict):
            self.whole(data, out)

    def whole(self, data: dict[str, Any], out: LlmResponseParser) -> None:
        raise NotImplementedError

    def event(self, data: dict[str, Any], out: LlmResponseParser) -> None:
        """One streamed event's JSON (already decoded; `[DONE]` is skipped)."""
        raise NotImplementedError

    def tool_results(self, body: dict[str, Any]) -> Iterator[ToolResult]:
        """The tool results a request carries (the first one answering a call
        is the one recorded)."""
        raise NotImplementedError


class StreamDecoder(Protocol):
    """Turns a response's bytes, as they pass, into its events' decoded JSON values.
    `notes` says what could not be read (bounded, never raised)."""

    notes: list[str]

    def feed(self, chunk: bytes) -> Iterable[Any]: ...

    def close(self) -> Iterable[Any]: ...


class SseJson:
    """Server-sent events whose data is JSON (OpenAI, Anthropic, Gemini); `[DONE]` ends
    an OpenAI stream and is skipped."""

    def __init__(self) -> None:
        self._sse = SseParser(max_event=MAX_EVENT)
        self.notes: list[str] = []

    def feed(self, chunk: bytes) -> Iterable[Any]:
        return self._decoded(self._sse.feed(chunk))

    def close(self) -> Iterable[Any]:
        out = list(self._decoded(self._sse.close()))
        self.notes.extend(self._sse.notes)
        return out

    def _decoded(self, events: Iterable[SseEvent]) -> Iterator[Any]:
        for event in events:
            if event.data.strip() == "[DONE]":
                continue
            try:
                yield json.loads(event.data)
            except (ValueError, RecursionError):
                self.notes.append("stream event is not JSON")


DIALECTS: dict[str, Dialect] = {}


def register(cls: type[Dialect]) -> type[Dialect]:
    """Class decorator: make a dialect known by its `name`."""
    if cls.name in DIALECTS:
        raise ValueError(f"LLM dialect {cls.name!r} registered twice")
    DIALECTS[cls.name] = cls()
    return cls


def dialect(api: Api) -> Dialect:
    """The registered dialect of this name; an unknown name is an error."""
    try:
        return DIALECTS[api]
    except KeyError:
        raise ValueError(f"unknown LLM API {api!r}; known: {', '.join(DIALECTS)}") from None


def normal_path(path: str) -> str:
    return path.split("?", 1)[0].rstrip("/")


def dialect_for(path: str) -> Dialect | None:
    """The dialect a request path belongs to (None: no registered LLM API)."""
    p = normal_path(path)
    return next((d for d in DIALECTS.values() if d.recognises(p)), None)


def llm_api_of(path: str) -> Api | None:
    """Which LLM API a request path belongs to (None: not an LLM API call)."""
    found = dialect_for(path)
    return found.name if found else None


def is_auxiliary(path: str) -> bool:
    """A call on an LLM host that produces no model output (see AUXILIARY_*)."""
    p = normal_path(path)
    return p.endswith(AUXILIARY_SUFFIXES) or any(part in p + "/" for part in AUXILIARY_PARTS)


# -- helpers the dialects share ------------------------------------------------


def items(body: dict[str, Any], key: str) -> list[Any]:
    value = body.get(key)
    return value if isinstance(value, list) else []


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)
        )
    return ""


def str_key(value: Any) -> str | None:
    """A call id usable as a dict key (agents may send anything)."""
    return value if isinstance(value, str) else None


def declared_annotations(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """name -> annotations (readOnlyHint, destructiveHint, ...) of the tools a
    request declares, when it declares them: on the tool (MCP-shaped, Anthropic,
    Responses API) or on its `function` (Chat Completions)."""
    found: dict[str, dict[str, Any]] = {}
    for tool in tools:
        fn: dict[str, Any] = tool["function"] if isinstance(tool.get("function"), dict) else {}
        name = fn.get("name") if isinstance(fn.get("name"), str) else tool.get("name")
        ann = (
            tool.get("annotations")
            if isinstance(tool.get("annotations"), dict)
            else fn.get("annotations")
        )
        if isinstance(name, str) and isinstance(ann, dict):
            found[name] = ann
    return found


def parse_args(raw: Any) -> tuple[Any, list[str]]:
    """A tool call's arguments: an object, or a JSON string of one."""
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


def message_blocks(body: dict[str, Any]) -> Iterator[Any]:
    """The content blocks of a request's messages, in order, for the APIs whose
    message content is a list of blocks (Anthropic, Bedrock); a message with
    string content has none."""
    for m in items(body, "messages"):
        content = m.get("content") if isinstance(m, dict) else None
        yield from content if isinstance(content, list) else []


def setter(container: dict[str, Any], key: str) -> Callable[[str], None]:
    def replace(text: str) -> None:
        container[key] = text

    return replace


def tagged_results(
    entries: Iterable[Any],
    tag: tuple[str, str],
    id_key: str,
    text_key: str,
    as_text: Callable[[Any], str] = content_text,
) -> Iterator[ToolResult]:
    """The tool results among a request's entries, for the APIs that mark one
    with a tag (`("role", "tool")`, `("type", "tool_result")`, ...): each dict
    entry with that tag and a call id under `id_key`, its text `as_text` of
    what it holds under `text_key` (replaced there by the operator-reply policy)."""
    tag_key, tag_value = tag
    for entry in entries:
        if (
            isinstance(entry, dict)
            and entry.get(tag_key) == tag_value
            and (cid := str_key(entry.get(id_key)))
        ):
            yield ToolResult(cid, as_text(entry.get(text_key, "")), setter(entry, text_key))


# -- the response parser, the same for every dialect ---------------------------


class LlmResponseParser:
    """Accumulates one response, streamed (SSE) or not, and parses it with its
    dialect. Dialects report through `text`, `calls` (streamed calls by index,
    bounded) and `add_call` (a complete call)."""

    def __init__(self, api: Api, content_type: str = "") -> None:
        self.dialect = dialect(api)
        self.api = api
        self.streaming = self.dialect.streams(content_type)
        self._stream = self.dialect.stream_decoder() if self.streaming else None
        self._body = bytearray()
        self._too_big = False
        self.result = LlmResult(api)
        self.text = _Text()
        self.calls = _Calls()

    def feed(self, chunk: bytes) -> None:
        try:
            if self._stream is not None:
                for data in self._stream.feed(chunk):
                    self._on_event_safe(data)
            elif not self._too_big:
                self._body += chunk
                if len(self._body) > MAX_BODY:
                    self._too_big = True
                    self._body.clear()
                    self.result.notes.append("response over 16 MiB not parsed")
        except Exception as exc:  # extraction must never break the flow
            self.result.notes.append(f"parse error: {type(exc).__name__}")

    def finish(self) -> LlmResult:
        try:
            if self._stream is not None:
                for data in self._stream.close():
                    self._on_event_safe(data)
                # "not JSON" once per event, in arrival order: as each was met
                self.result.notes.extend(self._stream.notes)
                for entry in self.calls.values():
                    args, notes = parse_args(entry.get("args", ""))
                    self.result.tool_calls.append(
                        LlmToolCall(entry.get("name") or "?", args, notes, entry.get("id"))
                    )
            elif self._body:
                data, notes = parse_json_body(bytes(self._body), "application/json")
                self.result.notes.extend(notes)
                self.dialect.body(data, self)
        except Exception as exc:
            self.result.notes.append(f"parse error: {type(exc).__name__}")
        self.result.text = "".join(self.text)[:MAX_TEXT]
        self.result.notes.extend(self.text.notes + self.calls.notes)
        return self.result

    def add_call(self, name: Any, raw_args: Any, call_id: Any) -> None:
        """A tool call that arrived whole (a non-streamed body)."""
        args, notes = parse_args(raw_args)
        self.result.tool_calls.append(LlmToolCall(str(name or "?"), args, notes, str_key(call_id)))

    def set_model(self, value: Any) -> None:
        if isinstance(value, str):
            self.result.model = value

    def _on_event_safe(self, data: Any) -> None:
        """One malformed event must not cost the events after it."""
        try:
            if isinstance(data, dict):
                self.dialect.event(data, self)
        except Exception as exc:
            self.result.notes.append(f"parse error: {type(exc).__name__}")


class _Text(list):
    """Assistant text deltas, kept up to MAX_TEXT characters (an endless stream
    must not grow memory)."""

    def __init__(self) -> None:
        super().__init__()
        self.size = 0
        self.notes: list[str] = []

    def append(self, part: str) -> None:
        if self.size >= MAX_TEXT:
            if not self.notes:
                self.notes.append(f"assistant text over {MAX_TEXT} characters not kept")
            return
        part = part[: MAX_TEXT - self.size]
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
            self.over_cap()
            self._spare = {"name": None, "args": ""}
            return self._spare
        self[index] = {"name": None, "args": ""}
        return self[index]

    def start(self, index: Any, name: Any, call_id: Any, args: str = "") -> None:
        """A streamed call that begins at `index` (a fresh entry: an API may reuse
        an index for a new call), with whatever arguments came with its start."""
        entry = self.entry(index, fresh=True)
        entry.update(name=name, id=call_id)
        self.extend(entry, args)

    def over_cap(self) -> None:
        if not any("tool calls" in n for n in self.notes):
            self.notes.append(f"more than {MAX_CALLS} tool calls: the rest not kept")

    def extend(self, entry: dict[str, Any], part: str) -> None:
        room = MAX_ARGS - len(entry["args"])
        if len(part) > room:
            if not any("arguments" in n for n in self.notes):
                self.notes.append(f"tool arguments over {MAX_ARGS} characters cut")
            part = part[: max(room, 0)]
        entry["args"] += part
