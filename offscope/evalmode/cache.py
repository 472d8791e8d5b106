"""A local cache of model responses, so a resumed or retried trajectory does not pay twice.

Keyed by a digest of the exact request the model endpoint receives: the URL path and the
canonical JSON body (model, messages, tools, seed, temperature, ... with keys sorted), so two
requests that differ in anything the model reads never share an answer. Only successful
responses (2xx with a JSON body) are stored; a streamed request (`"stream": true`) is never
cached, because its answer is a byte stream the proxy reads as it comes.

One sqlite3 file in the grid's --out directory (write-ahead log, so several writers, e.g. two
shards sharing a volume, are safe; each insert is its own transaction, so a killed grid keeps
every answer it got).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

CACHE_FILE = "model-cache.sqlite"


def request_key(path: str, body: bytes) -> str | None:
    """The digest of a model request, or None for one that must not be cached (a stream, or a
    body that is not a JSON object)."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    if not isinstance(parsed, dict) or parsed.get("stream"):
        return None
    canonical = json.dumps(parsed, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{path}\n{canonical}".encode()).hexdigest()


def cacheable(status: int, body: bytes) -> bool:
    """Only a 2xx whose body parses as a JSON object is an answer worth keeping."""
    if not 200 <= status < 300:
        return False
    try:
        return isinstance(json.loads(body), dict)
    except ValueError:
        return False


class ResponseCache:
    """get/put of (status, content type, body) by request key; counts hits and misses."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        # One connection, used from whichever thread serves the model gateway; the lock keeps
        # it to one statement at a time.
        self._db = sqlite3.connect(path, timeout=30.0, check_same_thread=False)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS responses ("
                " key TEXT PRIMARY KEY, status INTEGER NOT NULL,"
                " content_type TEXT NOT NULL, body BLOB NOT NULL)"
            )
            self._db.commit()
        self.hits = 0
        self.misses = 0
        self.stored = 0

    def get(self, key: str) -> tuple[int, str, bytes] | None:
        with self._lock:
            row = self._db.execute(
                "SELECT status, content_type, body FROM responses WHERE key = ?", (key,)
            ).fetchone()
        if row is None:
            self.misses += 1
            return None
        self.hits += 1
        return int(row[0]), str(row[1]), bytes(row[2])

    def put(self, key: str, status: int, content_type: str, body: bytes) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO responses (key, status, content_type, body) "
                "VALUES (?, ?, ?, ?)",
                (key, status, content_type, body),
            )
            self._db.commit()
        self.stored += 1

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0])

    def stats(self) -> dict[str, Any]:
        return {"hits": self.hits, "misses": self.misses, "stored": self.stored}

    def close(self) -> None:
        with self._lock:
            self._db.close()
