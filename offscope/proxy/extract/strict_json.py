"""One strict reading of a JSON message, the same on every transport.

offscope decides a message by what it parsed, and the server acts on what it
parses. Where the two parsers can disagree, a lenient server runs a call
offscope never saw: Node's `JSON.parse` after a UTF-8 decode that replaces
invalid bytes, a parser with a deeper nesting limit than Python's, a parser
that keeps the first of two repeated keys where Python keeps the last.

`read_json(data)` reads a message (a stdio line, an HTTP body, a WebSocket
message) so that such a disagreement is never silent:

- `error` is set when offscope cannot read the message completely: invalid
  UTF-8 (or UTF-16/32), nesting deeper than `max_depth`, more than
  `max_bytes`, or not JSON at all (NaN and Infinity included: servers refuse
  them). Callers decide such a message by `on_error` (closed: refuse it and
  record a block; open: forward it and record it as uninspected).
- `ambiguity` is set when object keys repeat with different values: `value`
  is Python's reading (the last wins) and `other_readings` holds the one
  where the first wins. Callers decide it by `ambiguous` (refuse, or tag by
  the most out-of-scope reading).

It never raises. `lenient` is, for an encoding error only, the reading a
lenient server makes (bad bytes replaced by U+FFFD): what the record can show
of a call offscope refused, never what it decides on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_BYTES = 64 * 1024 * 1024  # the largest message offscope reads (HTTP's body limit)
# Deeper than any MCP or LLM message nests, and far below where Python's own
# parser gives up (near its recursion limit of 1000, less the caller's stack):
# a fixed limit makes the decision the same wherever the parse runs.
MAX_DEPTH = 256

_OPENERS = (b"[", b"{")
# The skeleton the depth is counted on: quotes and brackets only, braces read as
# brackets (a mismatched pair is not JSON: the parser reports it).
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
_AS_BRACKETS = bytes.maketrans(b"{}", b"[]")


@dataclass(frozen=True, slots=True)
class StrictJson:
    """A message as offscope read it (see the module's docstring)."""

    value: Any = None  # the parsed message (None with `error`)
    error: str | None = None  # why it cannot be read completely: uninspectable
    ambiguity: str | None = None  # why parsers could read it differently
    other_readings: tuple[Any, ...] = ()  # those other readings (with `ambiguity`)
    lenient: Any = None  # with an encoding `error`: a lenient server's reading, if any

    @property
    def readable(self) -> bool:
        """Read completely and one way only."""
        return self.error is None and self.ambiguity is None


def read_json(
    data: bytes | str, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH
) -> StrictJson:
    """Read one JSON message strictly. `data`: bytes (UTF-8, or UTF-16/32 as
    JSON allows, a byte-order mark skipped) or already-decoded text (then
    `max_bytes` counts characters). Never raises; see `StrictJson`."""
    if len(data) > max_bytes:
        return StrictJson(error=f"{len(data)} bytes, over the {max_bytes} byte limit")
    if isinstance(data, str):
        text = data
    else:
        try:
            text = _decode(data)
        except UnicodeDecodeError as exc:
            return StrictJson(
                error=f"not valid text ({exc.encoding.upper()}): byte {exc.start}",
                lenient=_lenient(data),
            )
    raw = data if isinstance(data, bytes) else text.encode("utf-8", "surrogatepass")
    if _too_deep(raw, max_depth):
        return StrictJson(error=f"nested deeper than {max_depth} levels")
    repeated: list[str] = []
    try:
        value = json.loads(text, object_pairs_hook=_last_wins(repeated), parse_constant=_refuse)
    except RecursionError:
        return StrictJson(error=f"nested deeper than offscope reads (limit {max_depth})")
    except ValueError as exc:
        return StrictJson(error=f"not valid JSON: {str(exc)[:80]}")
    if not repeated:
        return StrictJson(value=value)
    first = json.loads(text, object_pairs_hook=_first_wins, parse_constant=_refuse)
    if first == value:  # the same key, the same value: read one way all the same
        return StrictJson(value=value)
    names = ", ".join(sorted({repr(k) for k in repeated})[:5])
    return StrictJson(
        value=value,
        ambiguity=f"repeated object key ({names}): servers keep the first or the last",
        other_readings=(first,),
    )


def _decode(data: bytes) -> str:
    """Strictly: an encoded surrogate, an overlong form or a stray byte is an
    error (Python's json would pass surrogates; Node would replace them)."""
    encoding = json.detect_encoding(data)
    return data.decode(encoding)


def _lenient(data: bytes) -> Any:
    try:
        return json.loads(data.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return None


def _too_deep(data: bytes, max_depth: int) -> bool:
    """Nesting over `max_depth`, counted on the brackets outside strings; free
    for a message with fewer brackets than the limit (almost every message)."""
    if sum(data.count(o) for o in _OPENERS) <= max_depth:
        return False
    # Escaped backslashes, then escaped quotes, then everything but quotes and
    # brackets go; what is between quotes (a string, now escape-free) goes; each
    # pass then removes the innermost level of nesting.
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    skeleton = data.translate(_AS_BRACKETS, _NOT_STRUCTURE)
    skeleton = b"".join(skeleton.split(b'"')[::2])
    for _ in range(max_depth):
        inner = skeleton.replace(b"[]", b"")
        if not inner or len(inner) == len(skeleton):
            return False  # balanced within the limit, or not JSON (the parser says so)
        skeleton = inner
    return True


def _last_wins(repeated: list[str]):
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)
        if len(obj) != len(pairs):  # rare: find which keys repeat
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    repeated.append(key)
                seen.add(key)
        return obj

    return hook


def _first_wins(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        obj.setdefault(key, value)
    return obj


def _refuse(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")
