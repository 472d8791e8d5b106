"""Where events go: the JSONL trace and the scope-expansion request log.

Writes are appended, one unbuffered write per event (to the OS, not fsync'd:
a killed proxy loses nothing already handed to the kernel; SIGTERM closes
cleanly).
The trace rotates by size: `trace.jsonl` -> `trace.jsonl.1` -> ...
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, BinaryIO

from offscope.trace.events import Event


class JsonlWriter:
    """Appends lines with one unbuffered write each: a line is in the kernel
    when `write_line` returns, with no user-space buffer to flush or lose."""

    def __init__(self, path: str | Path, max_bytes: int = 256 * 1024 * 1024, backups: int = 5) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.backups = backups
        self._lock = threading.Lock()
        self._handle: BinaryIO = self._open()
        self._size = self.path.stat().st_size

    def _open(self) -> BinaryIO:
        return self.path.open("ab", buffering=0)  # type: ignore[return-value]

    def write_line(self, line: str) -> None:
        data = line.encode("utf-8") + b"\n"
        with self._lock:
            if self._size + len(data) > self.max_bytes and self._size > 0:
                self._rotate()
            view = memoryview(data)
            while view:  # a regular file takes it whole; loop in case it does not
                written = self._handle.write(view)
                if not written:
                    raise OSError(f"{self.path}: write made no progress")
                view = view[written:]
            self._size += len(data)

    def _rotate(self) -> None:
        self._handle.close()
        for i in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        self._handle = self._open()
        self._size = 0

    def close(self) -> None:
        with self._lock:
            if not self._handle.closed:
                self._handle.close()


class TraceSink:
    """The trace file (optional) behind one `write(event)`."""

    def __init__(self, path: str | Path | None, max_bytes: int = 256 * 1024 * 1024) -> None:
        self.writer = JsonlWriter(path, max_bytes) if path else None

    def write(self, event: Event) -> None:
        if self.writer:
            self.writer.write_line(event.to_json())

    def close(self) -> None:
        if self.writer:
            self.writer.close()


class RequestLog:
    """Scope-expansion requests, one JSON object per line."""

    def __init__(self, path: str | Path | None) -> None:
        self.writer = JsonlWriter(path) if path else None
        self.path = Path(path) if path else None

    def write(self, request: dict[str, Any]) -> None:
        if self.writer:
            self.writer.write_line(json.dumps(request, sort_keys=True))

    def close(self) -> None:
        if self.writer:
            self.writer.close()
