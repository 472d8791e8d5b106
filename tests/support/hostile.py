"""Hostile loopback upstreams and process probes for the resilience tests.

Every upstream is a real HTTP server on 127.0.0.1 (a thread of the test
process); the proxy under test is a real `offscope proxy` subprocess
(sidecar_kit.ProxyProcess), so its memory can be read from /proc and it can
be SIGTERMed.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# (status, headers, body) for a request (method, path, headers, body).
Reply = tuple[int, dict[str, str], bytes]
Script = Callable[[str, str, dict[str, str], bytes], Reply]


class ScriptedUpstream:
    """Answers each request with what `script` returns, and counts what it
    answered: a request is `answered` once its whole response was written."""

    def __init__(self, script: Script, delay: Callable[[], float] | None = None) -> None:
        self.answered: list[str] = []  # request paths, in the order their answers were sent
        self.bodies: list[bytes] = []  # their request bodies, in the same order
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two writes: without this, Nagle's algorithm
            # and the peer's delayed ACK add 40 ms to every response.
            disable_nagle_algorithm = True

            def _any(self) -> None:
                size = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(size) if size else b""
                if delay is not None:
                    time.sleep(delay())
                status, headers, out = script(
                    self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body
                )
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)
                self.wfile.flush()
                with outer._lock:
                    outer.answered.append(self.path)
                    outer.bodies.append(body)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

            def log_message(self, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 512

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def wait_answered(self, count: int, timeout: float = 10.0) -> list[str]:
        """`answered` once it holds at least `count` paths (or at the timeout). The
        client has the response before the handler thread records it: a test that
        reads `answered` right after a call must wait for that thread."""
        deadline = time.monotonic() + timeout
        while len(self.answered) < count and time.monotonic() < deadline:
            time.sleep(0.005)
        with self._lock:
            return list(self.answered)

    def __enter__(self) -> ScriptedUpstream:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def routes(self, *hosts: str) -> str:
        return ",".join(f"{h}=127.0.0.1:{self.port}" for h in hosts)


def memory_kb(pid: int) -> dict[str, int]:
    """VmRSS (resident now) and VmHWM (the peak resident size) of a process, in KiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = int(value.split()[0])
    return out


def gzip_bomb(decoded_mib: int) -> bytes:
    """A gzip body that decodes to `decoded_mib` MiB of zeros, about 1/1000 of
    that on the wire: one 64 MiB member repeated (gzip allows many members)."""
    member = gzip.compress(b"\0" * (64 << 20), compresslevel=9)
    return member * max(1, decoded_mib // 64)
