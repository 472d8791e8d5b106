"""A loopback JSON upstream for tests that need a real server behind the proxy."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def send_json(
    handler: BaseHTTPRequestHandler,
    status: int,
    payload: Any,
    headers: dict[str, str] | None = None,
) -> None:
    """Answer the request `handler` holds with `payload` as JSON (and any extra headers)."""
    body = json.dumps(payload).encode()
    handler.send_response(status)
    for name, value in {"content-type": "application/json", **(headers or {})}.items():
        handler.send_header(name, value)
    handler.send_header("content-length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


class _Answer(BaseHTTPRequestHandler):
    """Answers every request with `{"ok": true, "path": ...}` (the body is read and dropped)."""

    def _answer(self) -> None:
        size = int(self.headers.get("content-length") or 0)
        if size:
            self.rfile.read(size)
        send_json(self, 200, {"ok": True, "path": self.path})

    do_GET = do_POST = do_PUT = do_PATCH = _answer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass


class _Server(ThreadingHTTPServer):
    request_queue_size = 512  # the stdlib default (5) drops connections under concurrent load
    daemon_threads = True


@contextlib.contextmanager
def json_upstream() -> Iterator[int]:
    """Serve on 127.0.0.1, port 0; yields the port."""
    server = _Server(("127.0.0.1", 0), _Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
