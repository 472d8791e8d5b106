"""Plain HTTP(S) requests: method, host, port, path, query and JSON body."""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from offscope.ledgers.matcher import CallInput

MAX_PARSE = 4 * 1024 * 1024  # bodies larger than this are not parsed (noted)


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

    @property
    def url(self) -> str:
        default = {"http": 80, "https": 443}.get(self.scheme)
        port = f":{self.port}" if self.port and self.port != default else ""
        return f"{self.scheme}://{self.host}{port}{self.path}"


@dataclass(slots=True)
class HttpResponse:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


def parse_json_body(body: bytes, content_type: str = "") -> tuple[Any, list[str]]:
    """Parse a JSON body; (None, notes) when it is not JSON. Never raises."""
    if not body:
        return None, []
    if len(body) > MAX_PARSE:
        return None, [f"body not parsed: {len(body)} bytes over the {MAX_PARSE} byte limit"]
    looks_json = "json" in content_type or body[:1] in (b"{", b"[")
    if not looks_json:
        return None, []
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None, ["body is not UTF-8"]
    try:
        return json.loads(text), []
    except (ValueError, RecursionError) as exc:
        return None, [f"body is not valid JSON: {str(exc)[:80]}"]


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
        parts = urlsplit(path)
    except ValueError:
        return path.split("?", 1)[0], {}
    return parts.path or "/", parse_qs(parts.query, keep_blank_values=True)


def extract_http(req: HttpRequest) -> tuple[CallInput, list[str]]:
    """The call a plain HTTP request makes, with parse notes."""
    path, query = split_path(req.path)
    body, notes = parse_json_body(req.body, req.headers.get("content-type", ""))
    call = CallInput(
        source="http",
        tool="http",
        method=req.method.upper(),
        host=req.host,
        path=path,
        query=query,
        args=body,
        headers=req.headers,
        basic_auth_user=basic_auth_user(req.headers.get("authorization")),
    )
    return call, notes
