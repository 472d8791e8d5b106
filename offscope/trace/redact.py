"""Redaction: secrets are removed before anything is stored or logged.

Keys are redacted by name (headers, query parameters, JSON fields) and values
by shape (bearer tokens, well-known key prefixes), so a secret pasted into an
unexpected field is still caught.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

REDACTED = "[redacted]"

_SECRET_KEY = re.compile(
    r"(authorization|cookie|password|passwd|secret|token|api[-_]?key|apikey|access[-_]?key"
    r"|private[-_]?key|credential|session|signature|x-api-key|proxy-authorization)",
    re.IGNORECASE,
)
_SECRET_VALUE = re.compile(
    # The lookahead names every branch's first character: a necessary condition
    # the regex engine checks before trying seven branches at each position
    # (2.5x faster on typical bodies; same matches).
    r"(?=[BTsprgxAe])"
    r"(?:\b(?:Bearer|Basic|Token)\s+[A-Za-z0-9._~+/=-]{8,}"
    r"|\b(?:sk|pk|rk)-[A-Za-z0-9_-]{16,}"
    r"|\bgh[pousr]_[A-Za-z0-9]{20,}"
    r"|\bxox[abposr]-[A-Za-z0-9-]{10,}"
    r"|\bAKIA[0-9A-Z]{16}\b"
    r"|\bAIza[0-9A-Za-z_-]{35}"
    r"|\beyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,})"
)
# `password=hunter2`, `"api_key": "..."`, `db_password: ...` written in free text
# or in a body excerpt: the value goes when the key names a secret. The
# lookahead is the keys' first letters (as for _SECRET_VALUE: a fast reject).
_SECRET_ASSIGNMENT = re.compile(
    r"(?=[pPsStTaAcC])(?<![A-Za-z])"
    r"(password|passwd|passphrase|secret|token|api[-_]?key|apikey|access[-_]?key|private[-_]?key"
    r"|client[-_]?secret|credentials?)"
    r"(\"?\s*[:=]\s*\"?)(?!\[redacted|%5Bredacted)([^\s\"'&,;}]{4,})",  # not what is already gone
    re.IGNORECASE,
)
_ASSIGNMENT_HINTS = ("pass", "secret", "token", "key", "credential")
# user:password@ in a URL written inside a value (redact_url handles whole URLs).
_USERINFO = re.compile(r"(?<=://)[^\s/?#@:]+:[^\s/?#@]+@")
MAX_STRING = 2000
MAX_ITEMS = 200
MAX_DEPTH = 12


@lru_cache(maxsize=4096)  # names repeat on every flow (headers, fields); the cache is bounded
def is_secret_key(name: str) -> bool:
    return bool(_SECRET_KEY.search(name))


def redact_text(text: str, limit: int = MAX_STRING) -> str:
    text = _SECRET_VALUE.sub(REDACTED, text)
    lowered = text.lower()  # a case-insensitive scan costs µs per line: look for a key first
    if any(hint in lowered for hint in _ASSIGNMENT_HINTS):
        text = _SECRET_ASSIGNMENT.sub(rf"\1\2{REDACTED}", text)
    if "://" in text:  # userinfo only follows a scheme
        text = _USERINFO.sub(REDACTED + "@", text)
    if len(text) > limit:
        return text[:limit] + f"…[{len(text) - limit} more chars]"
    return text


def redact_headers(headers: dict[str, str]) -> dict[str, str]:
    return {k: (REDACTED if is_secret_key(k) else redact_text(v)) for k, v in headers.items()}


def redact_value(value: Any, depth: int = 0) -> Any:
    """Redact a JSON-like value: secret-named keys, secret-shaped strings, size caps."""
    if depth > MAX_DEPTH:
        return "[truncated: too deep]"
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for i, (k, v) in enumerate(value.items()):
            if i >= MAX_ITEMS:
                out["…"] = f"[{len(value) - MAX_ITEMS} more keys]"
                break
            key = str(k)
            out[key] = REDACTED if is_secret_key(key) and v not in (None, "") else redact_value(v, depth + 1)
        return out
    if isinstance(value, list):
        items = [redact_value(v, depth + 1) for v in value[:MAX_ITEMS]]
        if len(value) > MAX_ITEMS:
            items.append(f"[{len(value) - MAX_ITEMS} more items]")
        return items
    if isinstance(value, str):
        return redact_text(value)
    return value


def redact_url(url: str) -> str:
    """Drop credentials from the authority and secret query parameters."""
    if "?" not in url and "@" not in url:
        return redact_text(url)  # nothing to take apart
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact_text(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    query = urlencode(
        [(k, REDACTED if is_secret_key(k) else redact_text(v, 500))
         for k, v in parse_qsl(parts.query, keep_blank_values=True)]
    )
    return redact_text(urlunsplit((parts.scheme, netloc, parts.path, query, "")))
