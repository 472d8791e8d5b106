"""Plain HTTP(S) requests: method, host, port, path, query and JSON body."""

from __future__ import annotations

import base64
import binascii
import codecs
import contextlib
import json
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from offscope.ledgers.matcher import CallInput, raw_body_digest
from offscope.proxy.extract.strict_json import read_json

# Bodies up to this size are decoded and parsed. LLM requests carry images
# (base64, several MiB each), so the limit is what real traffic needs, and it
# is also the largest request body the proxy holds in enforce mode.
MAX_PARSE = 64 * 1024 * 1024
_BOMS = (
    codecs.BOM_UTF8,
    codecs.BOM_UTF16_LE,
    codecs.BOM_UTF16_BE,
    codecs.BOM_UTF32_LE,
    codecs.BOM_UTF32_BE,
)


@dataclass(slots=True)
class HttpRequest:
    """A transport-neutral view of a request (the proxy builds it from a flow)."""

    method: str
    host: str
    path: str  # including the query string, as sent
    scheme: str = "http"
    port: int | None = None
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names
    body: bytes = b""
    host_header: str | None = None  # the Host header's host when it disagrees with `host`
    _json: JsonBody | None = None

    def json_body(self) -> JsonBody:
        """The body decoded and parsed the way a server would (once per request)."""
        if self._json is None:
            self._json = read_json_body(self.body, self.headers)
        return self._json

    @property
    def url(self) -> str:
        default = {"http": 80, "https": 443, "ws": 80, "wss": 443}.get(self.scheme)
        port = f":{self.port}" if self.port and self.port != default else ""
        return f"{self.scheme}://{self.host}{port}{self.path}"


@dataclass(slots=True)
class HttpResponse:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    notes: list[str] = field(default_factory=list)  # e.g. a body too large to decode


@dataclass(slots=True)
class JsonBody:
    """A request body as offscope read it."""

    value: Any = None  # the parsed JSON, or None when the body is not JSON
    notes: list[str] = field(default_factory=list)
    # Set when the body is, or claims to be, JSON (or is content-encoded) and
    # could not be read: what a server parses, offscope could not inspect.
    error: str | None = None
    # Set when servers could read the body differently (repeated object keys):
    # `value` is one reading, `other_readings` the others (strict_json.py).
    ambiguity: str | None = None
    other_readings: tuple[Any, ...] = ()


def read_json_body(raw: bytes, headers: dict[str, str]) -> JsonBody:
    """Decode (content-encoding, BOM, charset) and parse a JSON request body as a
    server would. Never raises; an unreadable body that should be JSON is an `error`."""
    if not raw:
        return JsonBody()
    encoding = headers.get("content-encoding", "").strip().lower()
    if encoding and encoding != "identity":
        try:
            raw = decode_content(raw, encoding, MAX_PARSE)
        except ValueError as exc:
            return JsonBody(error=f"body could not be decoded ({encoding}): {exc}")
    return _read_strict(raw, headers.get("content-type", ""))


def _read_strict(body: bytes, content_type: str) -> JsonBody:
    """A request body read the one way every transport reads a message
    (strict_json.read_json): what the engine decides is what a server parses."""
    if not body or not _looks_json(body, content_type):
        return JsonBody()
    charset = _charset(content_type)
    data: str | bytes = body  # UTF-8/16/32 and a byte-order mark detected, like servers do
    if charset and not charset.startswith("utf"):
        try:
            data = body.decode(charset)
        except (LookupError, UnicodeDecodeError) as exc:
            return JsonBody(error=f"body is not valid text: {str(exc)[:80]}")
    read = read_json(data, max_bytes=MAX_PARSE)
    if read.error is not None:
        # The lenient reading (bad bytes replaced), if any, feeds the tags and the
        # record; the request is decided as uninspectable all the same.
        return JsonBody(read.lenient, error=f"body not inspected: {read.error}")
    return JsonBody(read.value, ambiguity=read.ambiguity, other_readings=read.other_readings)


def parse_json_body(body: bytes, content_type: str = "") -> tuple[Any, list[str]]:
    """Parse a JSON body (a response, a message already decided); (None, notes)
    when it is not JSON. Never raises."""
    value, notes, error = _parse_json(body, content_type)
    return value, notes + ([error] if error else [])


_LEADING_WS = re.compile(rb"[ \t\r\n]*")


def _looks_json(body: bytes, content_type: str) -> bool:
    """JSON by its declared type, its first character, a byte-order mark, or the
    NUL bytes of UTF-16/32 text without one."""
    # All the leading whitespace (JSON allows any amount): a body padded past a fixed
    # window had been taken for not-JSON and forwarded untagged. The regex scans in C.
    first = match.end() if (match := _LEADING_WS.match(body)) else 0
    start = body[first : first + 8]
    return (
        "json" in content_type.lower()
        or start[:1] in (b"{", b"[")
        or start.startswith(_BOMS)
        or b"\0" in start[:4]
    )


def _parse_json(body: bytes, content_type: str) -> tuple[Any, list[str], str | None]:
    if not body or not _looks_json(body, content_type):
        return None, [], None
    if len(body) > MAX_PARSE:
        return None, [], f"body not inspected: {len(body)} bytes over the {MAX_PARSE} byte limit"
    charset = _charset(content_type)
    try:
        if charset and not charset.startswith("utf"):
            text: str | bytes = body.decode(charset)
        else:
            text = body  # json detects UTF-8/16/32 and a byte-order mark, like servers do
        return json.loads(text), [], None
    except (LookupError, UnicodeDecodeError) as exc:
        # Servers differ here (most reject the body, some replace the bad bytes):
        # it is an extraction error, and the lenient reading still feeds the tags.
        lenient = None
        with contextlib.suppress(ValueError, RecursionError):
            lenient = json.loads(body.decode("utf-8", "replace"))
        return lenient, [], f"body is not valid text: {str(exc)[:80]}"
    except (ValueError, RecursionError) as exc:
        return None, [], f"body is not valid JSON: {str(exc)[:80]}"


def _charset(content_type: str) -> str | None:
    for part in content_type.split(";")[1:]:
        name, _, value = part.strip().partition("=")
        if name.strip().lower() == "charset":
            return value.strip().strip('"').lower() or None
    return None


def decode_content(data: bytes, encoding: str, limit: int) -> bytes:
    """Undo a content-encoding, refusing output over `limit` bytes (a bomb).

    The decoders are the proxy's bounded ones (offscope/proxy/bodies.py): they
    stop at the limit, so a bomb costs the limit, whatever its ratio."""
    from offscope.proxy.bodies import decode_body

    decoded = decode_body(data, encoding, limit)
    if decoded.note:
        raise ValueError(decoded.note)
    if not decoded.complete:
        raise ValueError(f"decoded body over the {limit} byte limit")
    return decoded.body


def basic_auth_user(authorization: str | None) -> str | None:
    if not authorization or authorization[:6].lower() != "basic ":
        return None
    try:
        decoded = base64.b64decode(authorization[6:].strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return decoded.split(":", 1)[0] or None


def split_path(path: str) -> tuple[str, dict[str, list[str]]]:
    if "?" not in path and "#" not in path and "%" not in path:
        return path or "/", {}  # the common case: nothing to parse
    try:
        # A path starting with '//' is a path, not an authority: urlsplit would read
        # `//mcp?x=1` as host `mcp`, path "" (and a pin or extract rule would miss it).
        parts = urlsplit("http://h" + path if path.startswith("//") else path)
    except ValueError:
        return path.split("?", 1)[0], {}
    return parts.path or "/", parse_qs(parts.query, keep_blank_values=True)


def extract_http(req: HttpRequest) -> tuple[CallInput, list[str]]:
    """The call a plain HTTP request makes, with parse notes."""
    path, query = split_path(req.path)
    parsed = req.json_body()
    body, notes = parsed.value, parsed.notes + ([parsed.error] if parsed.error else [])
    # Any token: a server may accept `Upgrade: WebSocket, h2c` (mitmproxy relays
    # messages whenever the server's 101 says websocket).
    upgrade = req.headers.get("upgrade")
    websocket = upgrade is not None and "websocket" in (
        t.strip().lower() for t in upgrade.split(",")
    )
    call = CallInput(
        source="http",
        tool="websocket" if websocket else "http",
        method=req.method.upper(),
        host=req.host,
        path=path,
        query=query,
        args=body,
        headers=req.headers,
        basic_auth_user=basic_auth_user(req.headers.get("authorization")),
        # a body not read as JSON (a form, text) is bound by its bytes: a grant for the
        # bodyless call must not admit it
        body_digest=raw_body_digest(req.body)
        if req.body and (body is None or parsed.error)
        else None,
    )
    return call, notes
