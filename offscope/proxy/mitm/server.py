"""The embedded sidecar runner: a real mitmproxy Master with the addon.

`running_proxy(...)` starts one inside the current event loop (port 0 picks a
free port) for the CLI, the eval grid and the tests alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from mitmproxy import options
from mitmproxy.addons import (
    block,
    core,
    disable_h2c,
    errorcheck,
    next_layer,
    proxyserver,
    tlsconfig,
)
from mitmproxy.master import Master

from offscope.proxy import DEFAULT_CONFDIR
from offscope.proxy.addresses import format_listen, parse_listen
from offscope.proxy.extract.http import MAX_PARSE
from offscope.proxy.gateway import parse_gateways
from offscope.proxy.mitm.addon import OffscopeAddon
from offscope.proxy.mitm.dispatch import use_listener_dispatch
from offscope.proxy.mitm.drain import Drain

# How long a proxy may take to listen and start its addon (a loaded machine is slow).
START_SECONDS = 30.0


@dataclass
class ProxyConfig:
    ledger: str
    policy: str = "shadow"
    listen_host: str = "127.0.0.1"
    listen_port: int = 8080
    metrics: str = ""  # HOST:PORT, "" for none
    control: str = ""  # HOST:PORT of the control API (bearer token), "" for none
    control_token_file: str = ""  # else $OFFSCOPE_CONTROL_TOKEN, else generated
    trace: str = ""
    trace_max_bytes: int = -1  # rotate the trace at this size; 0 never; -1 the default
    requests: str = ""
    confdir: str = str(DEFAULT_CONFDIR)
    routes: str = ""
    run_header: str = "X-Offscope-Run"
    idle_timeout: float = 300.0
    max_runs: int = 100_000
    behavior: bool = True
    max_body: int = MAX_PARSE  # largest request body held for inspection
    upstream_insecure: bool = False  # verify upstream TLS unless told otherwise
    state: str = ""  # SQLite file of registered runs ('' in memory: the grid, tests)
    instance: str = ""  # stamped on every record as `sidecar` (a fleet's runs told apart)
    gateways: str = ""  # NAME=URL,... served under /NAME/ (gateway mode, offscope/proxy/gateway.py)
    gateway_listen: str = "127.0.0.1:0"  # HOST:PORT of the gateway listener
    drain_timeout: float = (
        20.0  # on stop, wait this long for in-flight flows (offscope/proxy/mitm/drain.py)
    )


@dataclass
class RunningProxy:
    master: Master
    addon: OffscopeAddon
    port: int
    drain: Drain | None = None
    gateway_port: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def proxy_url(self, run_id: str | None = None) -> str:
        return f"http://{run_id}:x@127.0.0.1:{self.port}" if run_id else self.url

    @property
    def metrics_port(self) -> int | None:
        return self.addon.metrics.port if self.addon.metrics else None

    @property
    def control_port(self) -> int | None:
        return self.addon.control.port if self.addon.control else None

    @property
    def control_token(self) -> str | None:
        return self.addon.control_token


def sidecar_addons() -> list:
    """The part of mitmproxy a sidecar uses: regular proxy mode, TLS interception,
    h2c hygiene, and refusing clients from public addresses (`block_global`).

    mitmdump loads about 35 addons (replay, map/modify rules, saving, scripts,
    onboarding...) and mitmproxy dispatches every flow event to every addon,
    used or not: on a small JSON request that dispatch is over a third of
    mitmdump's CPU. `offscope proxy` exposes none of those options, so it does
    not load them (users who want them run the addon in mitmdump instead)."""
    return [
        core.Core(),
        block.Block(),
        disable_h2c.DisableH2C(),
        proxyserver.Proxyserver(),
        next_layer.NextLayer(),
        tlsconfig.TlsConfig(),
        # No terminal log here: print start-up errors (a taken port) before exiting.
        errorcheck.ErrorCheck(repeat_errors_on_stderr=True),
    ]


def build_master(cfg: ProxyConfig) -> tuple[Master, OffscopeAddon]:
    Path(cfg.confdir).mkdir(parents=True, exist_ok=True)
    opts = options.Options(
        listen_host=cfg.listen_host, listen_port=cfg.listen_port, confdir=cfg.confdir
    )
    master = Master(opts, with_termlog=False)
    use_listener_dispatch(master)
    master.addons.add(*sidecar_addons())
    addon = OffscopeAddon()
    # Before the offscope addon: on stop, flows drain before the sinks close.
    master.addons.add(Drain(addon), addon)
    if cfg.gateways:  # gateway mode: a reverse-mode listener beside the forward proxy
        upstream = next(iter(parse_gateways(cfg.gateways).values()))
        master.options.update(
            mode=[
                "regular",
                f"reverse:{upstream.scheme}://{upstream.host}:{upstream.port}"
                f"@{_gateway_address(cfg)}",
            ]
        )
    master.options.update(
        offscope_gateways=cfg.gateways,
        offscope_instance=cfg.instance,
        offscope_state=cfg.state,
        # Fixture hosts and blocked targets may not exist: decide before connecting.
        connection_strategy="lazy",
        ssl_insecure=cfg.upstream_insecure,
        offscope_ledger=cfg.ledger,
        offscope_policy=cfg.policy,
        offscope_trace=cfg.trace,
        offscope_trace_max_bytes=cfg.trace_max_bytes,
        offscope_requests=cfg.requests,
        offscope_metrics=cfg.metrics,
        offscope_control=cfg.control,
        offscope_control_token_file=cfg.control_token_file,
        offscope_routes=cfg.routes,
        offscope_run_header=cfg.run_header,
        offscope_idle_timeout=cfg.idle_timeout,
        offscope_max_runs=cfg.max_runs,
        offscope_behavior=cfg.behavior,
        offscope_max_body=cfg.max_body,
        offscope_drain_timeout=cfg.drain_timeout,
        # No stream_large_bodies: mitmproxy would also stream a large request body
        # upstream before offscope read it. The addon streams responses itself
        # (event streams, large or open-ended plain HTTP bodies).
    )
    return master, addon


def _gateway_address(cfg: ProxyConfig) -> str:
    """The gateway's HOST:PORT. mitmproxy refuses two listeners on one spec, so with
    both on port 0 the gateway's free port is picked here."""
    host, port = parse_listen(cfg.gateway_listen, "--gateway-listen")
    if port == 0:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
            port = probe.getsockname()[1]
    return format_listen(host, port)


@contextlib.asynccontextmanager
async def running_proxy(cfg: ProxyConfig) -> AsyncIterator[RunningProxy]:
    master, addon = build_master(cfg)
    task = asyncio.create_task(master.run())
    try:
        port, gateway = await wait_started(master, addon, task, cfg)
        yield RunningProxy(master, addon, port, master.addons.get("drain"), gateway)
    finally:
        master.shutdown()  # drains in-flight flows, then closes the sinks
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(task, cfg.drain_timeout + 10)


async def wait_started(
    master: Master,
    addon: OffscopeAddon,
    task: asyncio.Task,
    cfg: ProxyConfig,
    within: float = START_SECONDS,
) -> tuple[int, int | None]:
    """Wait until `task` (running `master`) listens and its addon has started; return the
    bound ports (the proxy's, the gateway's or None): with port 0 only now are they known."""
    ports = await _bound_ports(master, task, 2 if cfg.gateways else 1, within)
    # The listeners bind before the addons' `running` hook, which starts the metrics
    # and control servers: a caller may use those once this returns.
    await _until(lambda: addon.started or addon.engine is None, task, "start its addon", within)
    return ports[0], ports[1] if cfg.gateways else None


async def _bound_ports(
    master: Master, task: asyncio.Task, listeners: int, within: float
) -> list[int]:
    """The ports the proxy listens on: the forward proxy's, then the gateway's."""
    server = master.addons.get("proxyserver")

    def bound() -> dict[str, int]:
        return {
            type(instance.mode).__name__: instance.listen_addrs[0][1]
            for instance in server.servers
            if instance.listen_addrs
        }

    await _until(lambda: len(bound()) >= listeners, task, "start listening", within)
    by_mode = bound()
    return [by_mode["RegularMode"], *([by_mode["ReverseMode"]] if listeners > 1 else [])]


async def _until(ready: Callable[[], bool], task: asyncio.Task, what: str, within: float) -> None:
    """Poll `ready` while the proxy starts; its start-up error if it stops first."""
    deadline = time.monotonic() + within
    while not ready():
        if task.done():
            task.result()  # raises the start-up error
            raise RuntimeError("proxy stopped during start-up")
        if time.monotonic() > deadline:
            raise RuntimeError(f"proxy did not {what} within {within:g} s")
        await asyncio.sleep(0.01)
