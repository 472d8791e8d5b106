"""An ASGI app served by uvicorn on its own thread and event loop.

The sidecar's listeners (/metrics and the control API, control.py) and the grid's loopback
servers (the fixture world, the model gateway) run beside mitmproxy's event loop, never on
it: a slow scrape or a burst of control calls takes no turns from the flows, and a flood
of flows does not starve a scrape.

The socket is bound when the server is made, not when its thread starts, so a bad or busy
address fails at once with the OSError that names it (`--metrics 127.0.0.1:9464` already in
use), and port 0 has its port before anything runs.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any, Literal, Self

import uvicorn

# Connections the kernel queues for a listener whose loop is busy (uvicorn's default too);
# mitmproxy's listeners get it as well (offscope/proxy/mitm/backlog.py).
ACCEPT_BACKLOG = 2048


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host` (an IPv6 address has a colon) and `port` (0: any)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # create_server sets SO_REUSEADDR: a restarted sidecar rebinds through TIME_WAIT.
    return socket.create_server((host, port), family=family, backlog=ACCEPT_BACKLOG)


class ThreadedServer:
    """uvicorn serving `app` on `host:port` in a daemon thread with its own loop."""

    def __init__(
        self, app: Any, host: str, port: int, name: str, *, lifespan: Literal["on", "off"] = "on"
    ) -> None:
        self.sock = bind(host, port)
        self.host, self.port = host, self.sock.getsockname()[1]
        self.config = uvicorn.Config(
            app,
            log_level="error",
            lifespan=lifespan,
            access_log=False,
            timeout_keep_alive=30,
            # Stopping waits this long for requests in flight, then closes them.
            timeout_graceful_shutdown=2,
        )
        self.server = uvicorn.Server(self.config)
        self.thread = threading.Thread(target=self._run, name=f"offscope-{name}", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            asyncio.run(self.server.serve(sockets=[self.sock]))
        except BaseException as exc:  # reported to the starter
            self.error = exc

    def start(self, timeout: float = 10.0) -> Self:
        """Start serving; returns once the server accepts requests."""
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if self.error or not self.thread.is_alive():
                raise RuntimeError(f"server failed to start: {self.error!r}")
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start in time")
            time.sleep(0.01)
        return self

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def request_stop(self) -> None:
        """Ask the server to stop, without waiting: several then wind down at once (uvicorn
        notices on its next tick, up to 0.1 s later, then closes its connections)."""
        self.server.should_exit = True

    def stop(self) -> None:
        self.request_stop()
        if self.thread.is_alive():
            self.thread.join(timeout=10)
        self.sock.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
