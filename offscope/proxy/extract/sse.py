"""Incremental Server-Sent Events parsing, in bounded memory.

SSE event boundaries are not chunk boundaries: the proxy sees arbitrary
slices of the stream, so bytes are buffered and split on blank lines here.
Only the event being received is held, and at most `max_event` bytes of it:
a larger event is skipped whole (with a note), so an endless stream, or one
endless event, never grows the proxy's memory.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_BUFFER = 8 * 1024 * 1024  # default cap on one event; a larger one is skipped, with a note


@dataclass(frozen=True, slots=True)
class SseEvent:
    event: str
    data: str


class SseParser:
    def __init__(self, max_event: int = MAX_BUFFER) -> None:
        self._buffer = bytearray()
        self._scanned = 0  # bytes of the buffer already searched for a boundary
        self._cr = False  # the last chunk ended in '\r': a following '\n' belongs to it
        self._skipping = False  # inside an over-long event: drop bytes until its end
        self._last = b""  # while skipping, the last byte seen (a boundary may straddle chunks)
        self.max_event = max_event
        self.notes: list[str] = []
        self.skipped = 0  # events dropped for size

    def feed(self, chunk: bytes) -> list[SseEvent]:
        if not chunk:
            return []
        if self._cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]  # the '\n' of a CRLF split across chunks
        self._cr = chunk.endswith(b"\r")
        chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if self._skipping:
            joined = self._last + chunk
            end = joined.find(b"\n\n")
            if end == -1:
                self._last = joined[-1:]
                return []
            self._skipping, self._last = False, b""
            chunk = joined[end + 2 :]
        self._buffer += chunk
        events: list[SseEvent] = []
        start = 0
        while True:
            end = self._buffer.find(b"\n\n", max(start, self._scanned - 1))
            if end == -1:
                break
            event = _parse_block(bytes(self._buffer[start:end]))
            if event is not None:
                events.append(event)
            start = end + 2
            self._scanned = start
        if start:
            del self._buffer[:start]
        self._scanned = len(self._buffer)
        if len(self._buffer) > self.max_event:
            self.skipped += 1
            if len(self.notes) < 5:
                self.notes.append(f"sse event over {self.max_event} bytes skipped")
            self._skipping, self._last = True, bytes(self._buffer[-1:])
            self._buffer.clear()
            self._scanned = 0
        return events

    def close(self) -> list[SseEvent]:
        """Flush a final event that was not followed by a blank line."""
        block = bytes(self._buffer)
        self._buffer.clear()
        self._scanned, self._cr = 0, False
        if self._skipping:
            self._skipping = False
            return []
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


def sse_event(name: str, data: str) -> bytes:
    """One server-sent event, framed (the default `message` event has no `event:` line)."""
    head = "" if name == "message" else f"event: {name}\n"
    return (head + "".join(f"data: {line}\n" for line in data.split("\n")) + "\n").encode()
