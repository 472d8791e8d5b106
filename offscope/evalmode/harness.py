"""What the grid and the probe runner share to run agents through a real proxy.

The proxy's CA (`trusted_ca`), ASGI apps on loopback in their own threads
(`LoopbackServer`: the fixture world, the simulated model), one embedded
offscope proxy in front of them (`harness`), and a bounded pool of workers
(`bounded`). The grid and the probe runner differ only in what they register
with the proxy and what each job sends.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import ExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn

if TYPE_CHECKING:
    from offscope.proxy.engine import Engine
    from offscope.proxy.mitm.server import ProxyConfig, RunningProxy


class LoopbackServer:
    """uvicorn on 127.0.0.1, port 0, in its own thread and event loop, so the
    servers a grid needs do not compete with the proxy's loop for turns."""

    def __init__(self, app, name: str) -> None:
        self.config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=0,
            log_level="error",
            lifespan="on",
            access_log=False,
            timeout_keep_alive=30,
        )
        self.server = uvicorn.Server(self.config)
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


def trusted_ca(confdir: str | Path) -> Path:
    """Quiet the proxy's logs and make (or load) its CA: the bundle agents are told to trust."""
    from offscope import logs
    from offscope.proxy.mitm.ca import ensure_ca

    logs.quiet()
    return ensure_ca(confdir)


@dataclass
class Harness:
    proxy: RunningProxy
    engine: Engine  # start_run / end_run register each run's labels, ledger and policy
    servers: dict[str, LoopbackServer]


@asynccontextmanager
async def harness(
    apps: Mapping[str, Any], proxy_config: Callable[[dict[str, LoopbackServer]], ProxyConfig]
) -> AsyncIterator[Harness]:
    """Start each app on loopback, then an embedded proxy configured from their
    ports (`proxy_config(servers)`: routes, ledger); on exit stop the proxy, then
    the servers."""
    from offscope.proxy.mitm.server import running_proxy

    with ExitStack() as stack:
        servers: dict[str, LoopbackServer] = {}
        for name, app in apps.items():
            servers[name] = stack.enter_context(LoopbackServer(app, name))
        async with running_proxy(proxy_config(servers)) as proxy:
            engine = proxy.addon.engine
            assert engine is not None
            yield Harness(proxy, engine, servers)


async def bounded(
    jobs: Sequence[Callable[[], Awaitable[None]]],
    workers: int,
    progress: Callable[[int, int], None] | None = None,
) -> None:
    """Run every job, at most `workers` at a time; `progress(done, total)` after each.

    `workers` tasks take the jobs in order, so a grid of 24,000 trajectories holds `workers`
    coroutines at a time, not 24,000 waiting on a semaphore."""
    queue = iter(jobs)
    finished = 0

    async def worker() -> None:
        nonlocal finished
        for job in queue:  # one shared iterator: each job is taken once
            await job()
            finished += 1
            if progress:
                progress(finished, len(jobs))

    await asyncio.gather(*(worker() for _ in range(max(1, min(workers, len(jobs))))))
