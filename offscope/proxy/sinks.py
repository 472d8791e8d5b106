"""Where events go: the JSONL trace and the scope-expansion request log.

Writes are appended, one unbuffered write per event (to the OS, not fsync'd:
a killed proxy loses nothing already handed to the kernel; SIGTERM closes
cleanly).
The trace rotates by size: `trace.jsonl` -> `trace.jsonl.1` -> ... (the
size: `OFFSCOPE_TRACE_MAX_BYTES`, default 256 MiB; 0 never rotates). The eval
grid's own trace never rotates: it is the grid's result, and rotation keeps only
`backups` segments.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import structlog

from offscope.policies.requests import DECISION_SCHEMA
from offscope.state.db import StoreError
from offscope.state.review import ReviewStore
from offscope.trace.events import Event
from offscope.trace.metrics import Signal

log = structlog.get_logger("offscope")

DEFAULT_MAX_BYTES = 256 * 1024 * 1024
MAX_BYTES_ENV = "OFFSCOPE_TRACE_MAX_BYTES"


def default_max_bytes() -> int:
    """The trace's rotation size: $OFFSCOPE_TRACE_MAX_BYTES (0: never rotate), else 256 MiB."""
    raw = os.environ.get(MAX_BYTES_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_BYTES
    try:
        return max(int(raw), 0)
    except ValueError:
        log.warning("trace_max_bytes_ignored", env=MAX_BYTES_ENV, value=raw)
        return DEFAULT_MAX_BYTES


class JsonlWriter:
    """Appends lines with one unbuffered write each: a line is in the kernel
    when `write_line` returns, with no user-space buffer to flush or lose."""

    def __init__(
        self, path: str | Path, max_bytes: int = DEFAULT_MAX_BYTES, backups: int = 5
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.backups = backups
        self._lock = threading.Lock()
        self._handle: BinaryIO = self._open()
        self._size = self.path.stat().st_size
        self._torn = False
        self._repair()

    def _repair(self) -> None:
        """A file that does not end with a newline (a crash or a full disk before
        this process) ends with a torn line: cut it off, so that appending does
        not bury it in the middle where readers must reject it."""
        whole = _whole_lines_size(self.path, self._size)
        if whole == self._size:
            return
        log.warning("trace_torn_line_removed", file=str(self.path), bytes=self._size - whole)
        try:
            os.ftruncate(self._handle.fileno(), whole)
            self._size = whole
        except OSError:
            self._torn = True  # the next line starts on a line of its own

    def _open(self) -> BinaryIO:
        return self.path.open("ab", buffering=0)

    def write_line(self, line: str) -> None:
        """Append one line, whole or not at all: a write that fails part-way (a
        full disk) is cut back to the last whole line, and if even that fails
        the next line starts on a line of its own, so one failure tears at most
        one line and readers can tell it from the rest. The error is raised."""
        data = line.encode("utf-8") + b"\n"
        with self._lock:
            if 0 < self.max_bytes < self._size + len(data) and self._size > 0:
                self._rotate()
            if self._torn:
                data = b"\n" + data
            try:
                self._write(data)
            except OSError:
                self._after_failure()
                raise
            self._torn = False
            self._size += len(data)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:  # a regular file takes it whole; loop in case it does not
            written = self._handle.write(view)
            if not written:
                raise OSError(f"{self.path}: write made no progress")
            view = view[written:]

    def _after_failure(self) -> None:
        """Remove what a failed write left: shrinking a file needs no space."""
        try:
            os.ftruncate(self._handle.fileno(), self._size)
            self._torn = False
        except OSError:
            self._torn = self._handle.tell() > self._size

    def _rotate(self) -> None:
        self._handle.close()
        for i in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        self._handle = self._open()
        self._size = 0
        self._torn = False

    def close(self) -> None:
        with self._lock:
            if not self._handle.closed:
                self._handle.close()


def _whole_lines_size(path: Path, size: int, chunk: int = 65536) -> int:
    """Bytes up to and including the file's last newline."""
    with path.open("rb") as handle:
        end = size
        while end > 0:
            start = max(0, end - chunk)
            handle.seek(start)
            block = handle.read(end - start)
            cut = block.rfind(b"\n")
            if cut >= 0:
                return start + cut + 1
            end = start
    return 0


class RecordSink(Protocol):
    """A consumer of the very records the trace file gets (the OpenTelemetry
    exporter, offscope/proxy/otel.py). `emit` must not block and must not raise."""

    def emit(self, event: Event, signals: Sequence[Signal]) -> None: ...

    def close(self) -> None: ...


class TraceSink:
    """The trace file (optional) and the record sinks behind one `write(event)`."""

    def __init__(
        self,
        path: str | Path | None,
        max_bytes: int | None = None,
        extra: Sequence[RecordSink] = (),
        sidecar: str | None = None,
    ) -> None:
        """`max_bytes`: rotate at this size (0: never; None: `default_max_bytes()`).
        `sidecar`: this proxy's instance id, stamped on every record."""
        size = default_max_bytes() if max_bytes is None else max_bytes
        self.writer = JsonlWriter(path, size) if path else None
        self.extra = list(extra)
        self.sidecar = sidecar or None

    def write(self, event: Event, signals: Sequence[Signal] = ()) -> None:
        """Write the record to the file, then hand it to the other sinks. A file
        that fails (a full disk) still lets them have it; its error is raised.
        A record that cannot be serialised raises before any sink sees it, so
        the printable copy the caller retries with reaches each sink once."""
        if self.sidecar is not None:
            event.sidecar = self.sidecar
        try:
            if self.writer:
                self.writer.write_line(event.to_json())
        except OSError:
            self._hand_on(event, signals)
            raise
        self._hand_on(event, signals)

    def _hand_on(self, event: Event, signals: Sequence[Signal]) -> None:
        for sink in self.extra:
            sink.emit(event, signals)

    def close(self) -> None:
        if self.writer:
            self.writer.close()
        for sink in self.extra:
            sink.close()


class RequestLog:
    """Scope-expansion requests (and the proxy's own decisions on them: a hold that
    timed out), one JSON object per line; with a review store (a fleet's PostgreSQL),
    in the store as well, where every reviewer and every proxy of the fleet sees them."""

    def __init__(
        self,
        path: str | Path | None,
        sidecar: str | None = None,
        store: ReviewStore | None = None,
    ) -> None:
        self.writer = JsonlWriter(path) if path else None
        self.path = Path(path) if path else None
        self.sidecar = sidecar or None  # stamped on every request: one review queue, many proxies
        self.store = store
        self.on_store_failure: Callable[[], None] = lambda: None

    def write(self, request: dict[str, Any]) -> bool:
        """Append a request or a decision. A failed file write (a full disk) is logged,
        not raised: the blocked call is still answered and its trace event names the id.
        False when the review store could not take it (nobody can decide it there)."""
        if self.sidecar is not None and request.get("schema") != DECISION_SCHEMA:
            request = {**request, "sidecar": self.sidecar}
        if self.writer:
            try:
                self.writer.write_line(json.dumps(request, sort_keys=True))
            except OSError as exc:
                log.error(
                    "request_log_write_failed", file=str(self.path), error=exc.strerror or str(exc)
                )
        if self.store is None:
            return True
        try:
            if request.get("schema") == DECISION_SCHEMA:
                self.store.record(request)
            else:
                self.store.file(request)
        except StoreError as exc:
            self.on_store_failure()
            log.error("state_write_failed", what="request", id=request.get("id"), error=str(exc))
            return False
        return True

    def close(self) -> None:
        if self.writer:
            self.writer.close()
