"""What the grid and the probe runner share to run agents through a real proxy.

The proxy's CA (`trusted_ca`), ASGI apps on loopback in their own threads
(`LoopbackServer`: the fixture world, the simulated model), one embedded
offscope proxy in front of them (`harness`), and a bounded pool of workers
(`bounded`). The grid and the probe runner differ only in what they register
with the proxy and what each job sends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import ExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from offscope.proxy.listener import ThreadedServer

if TYPE_CHECKING:
    from offscope.proxy.engine import Engine
    from offscope.proxy.mitm.server import ProxyConfig, RunningProxy


class LoopbackServer(ThreadedServer):
    """An app on 127.0.0.1, any free port, in its own thread and event loop, so the
    servers a grid needs do not compete with the proxy's loop for turns."""

    def __init__(self, app: Any, name: str) -> None:
        super().__init__(app, "127.0.0.1", 0, name)


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
        try:
            async with running_proxy(proxy_config(servers)) as proxy:
                engine = proxy.addon.engine
                assert engine is not None
                yield Harness(proxy, engine, servers)
        finally:
            for server in servers.values():  # all wind down at once; the stack waits for each
                server.request_stop()


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
