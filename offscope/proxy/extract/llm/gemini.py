"""Google's Gemini API: `POST .../models/{model}:generateContent` and
`:streamGenerateContent` (`?alt=sse` streams SSE events; without it, a JSON
array of the same chunks). Also the Vertex AI paths, which end the same way.

Tool calls are `functionCall` parts of `candidates[].content.parts`, whole in
one chunk (arguments are never split across events). Tool results are
`functionResponse` parts in the request's `contents`. A call may carry an
`id`; when it does not, a result answers the call of the same name, so the
call is keyed `name:<name>` and only the newest result of that name is the
answer (older ones are history the harness re-sends).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

from offscope.proxy.extract.llm.base import (
    MAX_CALLS,
    Dialect,
    LlmRequestInfo,
    LlmResponseParser,
    ToolResult,
    items,
    register,
    str_key,
)

_PATH = re.compile(
    r"/(?:tuned)?[mM]odels/(?P<model>[^/:]+):(?P<verb>generateContent|streamGenerateContent)$"
)
NAME_KEY = "name:"  # call key prefix for a functionCall without an `id`


def call_key(part: dict[str, Any]) -> str | None:
    """The key a functionCall / functionResponse is matched by."""
    if (cid := str_key(part.get("id"))) is not None:
        return cid
    name = str_key(part.get("name"))
    return NAME_KEY + name if name is not None else None


def _text_of(parts: list[Any]) -> str:
    return "".join(
        p["text"]
        for p in parts
        if isinstance(p, dict) and isinstance(p.get("text"), str) and not p.get("thought")
    )


@register
class Gemini(Dialect):
    name = "gemini"
    telemetry_name = "gcp.gemini"

    def recognises(self, path: str) -> bool:
        return _PATH.search(path) is not None

    def request_info(self, data: dict[str, Any], path: str) -> LlmRequestInfo:
        info = super().request_info(data, path)
        found = _PATH.search(path.split("?", 1)[0])
        if found:
            info.model = info.model or found["model"]
            info.stream = found["verb"] == "streamGenerateContent"
        return info

    def first_user(self, data: dict[str, Any]) -> str | None:
        for content in items(data, "contents"):
            if isinstance(content, dict) and content.get("role", "user") == "user":
                text = _text_of(items(content, "parts"))
                if text:
                    return text[:4000]
        return None

    def tools(self, data: dict[str, Any], limit: int | None = MAX_CALLS) -> list[dict[str, Any]]:
        """`tools[].functionDeclarations[]` (`function_declarations` in the REST
        API's snake_case spelling, which it also accepts), one entry per function; a
        built-in tool (`googleSearch`, `codeExecution`: no declarations) as it is."""
        found: list[dict[str, Any]] = []
        for tool in items(data, "tools"):
            if not isinstance(tool, dict):
                continue
            decls = tool.get("functionDeclarations", tool.get("function_declarations"))
            if isinstance(decls, list):
                found.extend(d for d in decls if isinstance(d, dict))
            else:
                found.append(tool)
        return found[:limit]

    def body(self, data: Any, out: LlmResponseParser) -> None:
        """A non-SSE stream is a JSON array of chunks."""
        for chunk in data if isinstance(data, list) else [data]:
            if isinstance(chunk, dict):
                self.whole(chunk, out)

    def whole(self, data: dict[str, Any], out: LlmResponseParser) -> None:
        self._chunk(data, out, streamed=False)

    def event(self, data: dict[str, Any], out: LlmResponseParser) -> None:
        self._chunk(data, out, streamed=True)

    def _chunk(self, data: dict[str, Any], out: LlmResponseParser, *, streamed: bool) -> None:
        out.set_model(data.get("modelVersion"))
        for candidate in items(data, "candidates")[:1]:  # the answer the agent acts on
            content = candidate.get("content") if isinstance(candidate, dict) else None
            parts = items(content, "parts") if isinstance(content, dict) else []
            text = _text_of(parts)
            if text:
                out.text.append(text)
            for part in parts:
                fc = part.get("functionCall") if isinstance(part, dict) else None
                if not isinstance(fc, dict):
                    continue
                if not streamed:
                    out.add_call(fc.get("name"), fc.get("args"), call_key(fc))
                    continue
                entry = out.calls.entry(len(out.calls), fresh=True)  # a new index per call (capped)
                entry.update(name=fc.get("name"), id=call_key(fc))
                args = fc.get("args")
                out.calls.extend(entry, json.dumps(args) if args is not None else "")

    def tool_results(self, body: dict[str, Any]) -> Iterator[ToolResult]:
        """Newest first, so that a name-keyed call is answered by its latest result."""
        for content in reversed(items(body, "contents")):
            if not isinstance(content, dict):
                continue
            for part in items(content, "parts"):
                fr = part.get("functionResponse") if isinstance(part, dict) else None
                if isinstance(fr, dict) and (key := call_key(fr)) is not None:
                    yield ToolResult(key, _response_text(fr.get("response")), _replacer(fr))


def _response_text(response: Any) -> str:
    """A function's response object as text: its single string field (`output`,
    `result`, `content`, ...), else the object as JSON."""
    if isinstance(response, dict) and len(response) == 1:
        (value,) = response.values()
        if isinstance(value, str):
            return value
    return json.dumps(response, sort_keys=True) if response is not None else ""


def _replacer(fr: dict[str, Any]) -> Callable[[str], None]:
    def replace(text: str) -> None:
        fr["response"] = {"output": text}  # the API's documented key for a function's output

    return replace
