"""Graceful stop: no answered call goes unrecorded.

A SIGTERM under load used to close the trace while flows were still
completing, and every response that arrived after that was lost. On stop,
this addon drains before the offscope addon closes anything:

1. stop accepting: the listening sockets close; open connections go on, and
   a new request on one of them gets a 503 "stopping" (`connection: close`)
   without reaching any upstream;
2. finish in-flight flows: wait until every flow that had started (request
   headers read) has its response or error recorded, for at most
   `offscope_drain_timeout` seconds (a second signal cuts the wait short);
3. a flow still open then (a stream that never ends) is recorded as failed,
   "proxy stopped before the response completed";
4. then the offscope addon's `done` ends the runs and closes the sinks.

mitmproxy calls `done` hooks in the order the addons were added, awaiting
each: this addon must come before `OffscopeAddon`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine
from typing import Any

import structlog
from mitmproxy import ctx, http

from offscope.proxy.mitm.addon import OffscopeAddon

log = structlog.get_logger("offscope")

_STOPPING = (
    b'{"error":"offscope_stopping","message":"the offscope proxy is shutting down; '
    b'retry against its replacement"}'
)


class Drain:
    def __init__(self, offscope: OffscopeAddon) -> None:
        self.offscope = offscope
        self.flows: dict[str, http.HTTPFlow] = {}  # started, not yet answered or failed
        self.draining = False
        self._hurry = asyncio.Event()

    def load(self, loader: Any) -> None:
        loader.add_option(
            "offscope_drain_timeout",
            float,
            20.0,
            "On stop, wait this many seconds for in-flight flows to complete.",
        )

    # -- flow tracking -------------------------------------------------------------

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if self.draining:
            headers = {"content-type": "application/json", "retry-after": "1"}
            if flow.request.http_version.startswith("HTTP/1"):
                headers["connection"] = "close"
            flow.response = http.Response.make(503, _STOPPING, headers)
            return
        self.flows[flow.id] = flow

    def response(self, flow: http.HTTPFlow) -> None:
        if self.flows.pop(flow.id, None) is None or not self.draining or flow.response is None:
            return
        if flow.response.http_version.startswith("HTTP/1") and not flow.response.stream:
            flow.response.headers["connection"] = "close"  # the agent reconnects elsewhere

    def error(self, flow: http.HTTPFlow) -> None:
        self.flows.pop(flow.id, None)

    # -- stopping ------------------------------------------------------------------

    def hurry(self) -> None:
        """Stop waiting for in-flight flows (a second SIGTERM or SIGINT)."""
        self._hurry.set()

    def done(self) -> Coroutine[Any, Any, None]:
        # A coroutine returned, not an `async def`: mitmproxy also calls `done`
        # synchronously when a script's addons are reloaded, and that must not drain.
        return self.drain()

    async def drain(self) -> None:
        if self.draining:
            return
        self.draining = True
        t0 = time.monotonic()
        engine = self.offscope.engine
        if engine is not None and engine.holds is not None:
            engine.holds.close()  # held calls are refused now, not left to their timeout
        server = ctx.master.addons.get("proxyserver")
        if server is not None:
            with contextlib.suppress(Exception):  # stop accepting; open connections go on
                await server.servers.update([])
        started = len(self.flows)
        deadline = t0 + max(0.0, ctx.options.offscope_drain_timeout)
        while self._open() and not self._hurry.is_set() and time.monotonic() < deadline:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._hurry.wait(), 0.05)
        left = self._open()
        for flow in self.flows.values():  # recorded as failed, unless already recorded
            self.offscope.abandon(flow)
        self.flows.clear()
        if server is not None:
            await _close_connections(server)
        log.info(
            "drained",
            in_flight=started,
            completed=started - len(left),
            abandoned=len(left),
            seconds=round(time.monotonic() - t0, 3),
        )

    def _open(self) -> list[http.HTTPFlow]:
        # A flow that is no longer live without a response or error hook (its
        # connection is gone) will not complete: stop waiting for it.
        return [f for f in self.flows.values() if f.live]


async def _close_connections(server: Any, wait: float = 1.0) -> None:
    """Close the agents' remaining (idle keep-alive) connections and let their
    handlers finish, rather than have the event loop cancel them at exit
    (Python 3.11 logs each cancelled one as an unhandled exception)."""
    for handler in list(server.connections.values()):
        with contextlib.suppress(Exception):  # mitmproxy internals: best effort
            io = handler.transports.get(handler.client)
            if io is not None and io.writer is not None:
                io.writer.close()
    deadline = time.monotonic() + wait
    while server.connections and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
