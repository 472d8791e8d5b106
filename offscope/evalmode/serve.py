"""Serve an ASGI app on loopback from a background thread (fixture world, simulated model)."""

from __future__ import annotations

import asyncio
import threading
import time

import uvicorn


class LoopbackServer:
    """uvicorn on 127.0.0.1, port 0, in its own thread and event loop, so the
    servers a grid needs do not compete with the proxy's loop for turns."""

    def __init__(self, app, name: str) -> None:
        self.config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error", lifespan="on",
                                     access_log=False, timeout_keep_alive=30)
        self.server = uvicorn.Server(self.config)
        self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self.thread = threading.Thread(target=self._run, name=f"offscope-{name}", daemon=True)
        self.port = 0
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            asyncio.run(self.server.serve())
        except BaseException as exc:  # reported to the starter
            self.error = exc

    def start(self, timeout: float = 10.0) -> LoopbackServer:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if self.error or not self.thread.is_alive():
                raise RuntimeError(f"server failed to start: {self.error}")
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start in time")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def __enter__(self) -> LoopbackServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
