"""Incremental Server-Sent Events parsing.

SSE event boundaries are not chunk boundaries: the proxy sees arbitrary
slices of the stream, so bytes are buffered and split on blank lines here.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_BUFFER = 8 * 1024 * 1024  # one event larger than this is dropped, with a note


@dataclass(frozen=True, slots=True)
class SseEvent:
    event: str
    data: str


class SseParser:
    def __init__(self) -> None:
        self._buffer = b""
        self._cr = False  # the last chunk ended in '\r': a following '\n' belongs to it
        self.notes: list[str] = []

    def feed(self, chunk: bytes) -> list[SseEvent]:
        if not chunk:
            return []
        if self._cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]  # the '\n' of a CRLF split across chunks
        self._cr = chunk.endswith(b"\r")
        self._buffer += chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        events: list[SseEvent] = []
        while True:
            end = self._buffer.find(b"\n\n")
            if end == -1:
                break
            block, self._buffer = self._buffer[:end], self._buffer[end + 2 :]
            event = _parse_block(block)
            if event is not None:
                events.append(event)
        if len(self._buffer) > MAX_BUFFER:
            self.notes.append("sse event over 8 MiB dropped")
            self._buffer = b""
        return events

    def close(self) -> list[SseEvent]:
        """Flush a final event that was not followed by a blank line."""
        block, self._buffer, self._cr = self._buffer, b"", False
        event = _parse_block(block.rstrip(b"\n")) if block.strip() else None
        return [event] if event else []


def _parse_block(block: bytes) -> SseEvent | None:
    name = "message"
    data: list[str] = []
    for raw in block.split(b"\n"):
        line = raw.decode("utf-8", errors="replace")
        if not line or line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            name = value
        elif field == "data":
            data.append(value)
    if not data:
        return None
    return SseEvent(name, "\n".join(data))


def parse_sse(body: bytes) -> list[SseEvent]:
    parser = SseParser()
    return parser.feed(body) + parser.close()
