"""`offscope proxy`: the sidecar."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import re
import signal
import socket
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from offscope.cli._parsers import add_command, config_from_args
from offscope.errors import InputError
from offscope.proxy import DEFAULT_CONFDIR, DEFAULT_TRACE, STATE_DIR
from offscope.proxy.client_env import ca_variables, inline, proxy_variables

if TYPE_CHECKING:  # imported when a command runs, not when the CLI starts
    from offscope.ledgers.matcher import CompiledLedger
    from offscope.policies.decide import CompiledPolicy
    from offscope.proxy.gateway import Upstream
    from offscope.proxy.mitm.addon import OffscopeAddon

TOKEN_ENV = "OFFSCOPE_CONTROL_TOKEN"  # offscope/proxy/control.py reads it

EPILOG = """\
examples:
  offscope proxy --ledger ledger.yaml                       # shadow mode: observe only
  offscope proxy --ledger ledger.yaml --policy enforce --trace trace.jsonl \\
      --metrics 127.0.0.1:9464 --requests requests.jsonl
  HTTPS_PROXY=http://run-42:x@127.0.0.1:8080 SSL_CERT_FILE=$(offscope ca --path) my-agent

runs: start one through the control API (POST /runs, docs/runs.md) and give the agent
http://RUN:CREDENTIAL@host:port; unregistered ids (http://RUN_ID:x@host:port, the
--run-header, a W3C traceparent, else the client address) are labelled unauthenticated
unless the ledger says runs.require_registered. Policies: a file or a preset
(shadow, enforce, enforce-strict, eval-sentinel, eval-affirmative, eval-timeout).
In a stock mitmproxy: mitmdump -s "$(offscope addon-path)" --set offscope_ledger=L.yaml
"""


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """The ledger and policy every call is decided under (`proxy` and `mcp` alike)."""
    p.add_argument("--ledger", required=True, help="target ledger YAML")
    p.add_argument(
        "--policy", default="shadow", help="preset name, or a policy file's path (default: shadow)"
    )


def add_requests_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--requests", default="", help="scope-expansion request log (default: beside the trace)"
    )


def add_confdir_argument(p: argparse.ArgumentParser) -> None:
    """Where the proxy's CA is (`proxy` signs with it, `ca` prints how to trust it)."""
    p.add_argument(
        "--confdir", default=str(DEFAULT_CONFDIR), help=f"CA directory (default {DEFAULT_CONFDIR})"
    )


def add_log_level_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="structured log level on stderr (default info)",
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub,
        "proxy",
        help="run the enforcement proxy (sidecar) in front of an agent",
        description="Run the offscope proxy: tag every call against the ledger, apply the "
        "policy, write the trace, export Prometheus metrics.",
        epilog=EPILOG,
    )
    add_engine_arguments(p)
    p.add_argument(
        "--listen", default="127.0.0.1:8080", help="proxy address (default 127.0.0.1:8080)"
    )
    p.add_argument(
        "--metrics",
        default="127.0.0.1:9464",
        help="/metrics, /healthz, /readyz address (open; HOST:PORT or [IPv6]:PORT, e.g. "
        "[::1]:9464), '' to disable (default 127.0.0.1:9464)",
    )
    p.add_argument(
        "--control-listen",
        default="127.0.0.1:9465",
        metavar="HOST:PORT",
        help="control API address (runs: start, end, summary; bearer token required), "
        "'' to disable (default 127.0.0.1:9465). Never give the agent a route to it",
    )
    p.add_argument(
        "--control-token-file",
        default="",
        metavar="FILE",
        help=f"file holding the control API token; else ${TOKEN_ENV}; else one is generated "
        f"once, written (0600) to control-token in the state directory ({STATE_DIR}) and kept "
        "across restarts; only its path is printed, never the token",
    )
    p.add_argument(
        "--state",
        default=os.environ.get("OFFSCOPE_STATE") or str(STATE_DIR / "state.sqlite"),
        metavar="FILE|URL",
        help="where state that must outlive the proxy is kept. A SQLite FILE (one host): "
        "registered runs (POST /runs: credential digests, targets, labels, history-rule "
        "memory, budgets), shared safely by the proxies of one host. A postgresql:// URL (a "
        "fleet): those runs and the review queue (scope-expansion requests, decisions, "
        "grants), so a call held on any proxy is released by a decision made anywhere "
        "(docs/deploy.md). '' keeps runs in memory only "
        f"(default $OFFSCOPE_STATE, else {STATE_DIR}/state.sqlite)",
    )
    p.add_argument(
        "--trace",
        default=str(DEFAULT_TRACE),
        help=f"JSONL trace file (default {DEFAULT_TRACE}: a state directory, never the "
        "current one, so a trace is not committed by accident)",
    )
    add_requests_argument(p)
    add_confdir_argument(p)
    p.add_argument(
        "--run-header",
        default="X-Offscope-Run",
        help="header that carries the run id (default X-Offscope-Run)",
    )
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=300.0,
        help="end runs idle this long, seconds (default 300)",
    )
    p.add_argument(
        "--max-runs",
        type=int,
        default=100_000,
        help="most runs tracked at once; the least recently active is ended as idle (default 100000)",
    )
    p.add_argument(
        "--route",
        action="append",
        default=[],
        metavar="HOST=IP:PORT",
        help="send HOST's traffic to a loopback server (fixtures, testing; repeatable; default "
        "none). A routed request goes over plain http to IP:PORT whatever its scheme (the "
        "agent still sees HTTPS), keeps Host: HOST, and gains the header "
        "x-offscope-fixture-run: RUN_ID so a fixture can keep per-run state. Tagging uses "
        "HOST, as if the request had gone there",
    )
    p.add_argument(
        "--instance",
        default=os.environ.get("OFFSCOPE_INSTANCE") or os.environ.get("POD_NAME", ""),
        metavar="ID",
        help="this proxy's instance id, stamped on every trace record and scope-expansion "
        "request as `sidecar`, so that reading tools tell two sidecars' run-1 apart "
        "(default $OFFSCOPE_INSTANCE, else $POD_NAME, else none)",
    )
    p.add_argument(
        "--gateway",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="gateway mode, for clients that take a server URL and ignore proxy settings "
        "(repeatable): serve URL under http://GATEWAY-LISTEN/NAME/, e.g. --gateway "
        "tickets=https://mcp.tickets.example makes http://127.0.0.1:8081/tickets/mcp reach "
        "https://mcp.tickets.example/mcp. Same ledger, policy, trace and metrics as the forward "
        "proxy; the run comes from the x-offscope-run or run-credential header",
    )
    p.add_argument(
        "--gateway-listen",
        default="127.0.0.1:8081",
        metavar="HOST:PORT",
        help="where the gateway listens when --gateway is given (default 127.0.0.1:8081)",
    )
    p.add_argument(
        "--max-body",
        default="64m",
        metavar="SIZE",
        help="largest request body held for inspection (k/m/g suffixes; default 64m); a "
        "larger one is refused (413) by a fail-closed policy, else streamed uninspected",
    )
    p.add_argument(
        "--upstream-insecure", action="store_true", help="do not verify upstream TLS certificates"
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=20.0,
        help="on SIGTERM/SIGINT, stop accepting and wait this long for in-flight calls to complete "
        "and be recorded before exiting; a second signal stops at once (default 20)",
    )
    add_log_level_argument(p)
    p.set_defaults(func=run)


def _addr(spec: str, flag: str) -> tuple[str, int]:
    from offscope.proxy.addresses import parse_listen

    return parse_listen(spec, flag)


def _check_free(host: str, port: int, flag: str) -> None:
    """Fail before start-up, with the flag to change, when the address is taken."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise InputError(
                f"{flag} {host}:{port}: {exc.strerror or exc}",
                hint=f"another process listens there; pick another port with {flag}",
            ) from None


def run(args: argparse.Namespace) -> int:
    from offscope import logs
    from offscope.ledgers import load_ledger
    from offscope.policies import load_policy
    from offscope.proxy.mitm.server import ProxyConfig

    logs.configure(args.log_level)
    ledger = load_ledger(args.ledger)  # validate up front: exit 2 with file:line
    policy = load_policy(args.policy)
    from offscope.proxy.surface import load_salt

    load_salt()  # an unreadable OFFSCOPE_FINGERPRINT_SALT_FILE: exit 2 before listening
    if args.drain_timeout < 0:
        raise InputError(
            f"--drain-timeout {args.drain_timeout}: must be 0 or more",
            hint="e.g. --drain-timeout 20",
        )
    if args.max_runs < 1:
        raise InputError(
            f"--max-runs {args.max_runs}: must be at least 1", hint="e.g. --max-runs 100000"
        )
    max_body = _size(args.max_body, "--max-body")
    host, port = _addr(args.listen, "--listen")
    _check_free(host, port, "--listen")
    if args.metrics:
        _check_free(*_addr(args.metrics, "--metrics"), "--metrics")
    if args.control_listen:
        _check_free(*_addr(args.control_listen, "--control-listen"), "--control-listen")
        control_at = _addr(args.control_listen, "--control-listen")
        if args.metrics and control_at[1] and control_at == _addr(args.metrics, "--metrics"):
            raise InputError(
                f"--control-listen {args.control_listen} is the --metrics address",
                hint="the control API needs its own port, e.g. --control-listen 127.0.0.1:9465",
            )
    if args.control_token_file:
        _check_token_file(args.control_token_file)
    from offscope.proxy.mitm.addon import parse_routes

    parse_routes(",".join(args.route))  # a bad --route exits 2 here, before the banner
    from offscope.proxy.gateway import parse_gateways

    gateways = parse_gateways(",".join(args.gateway))  # a bad --gateway exits 2 here too
    if gateways:
        _check_free(*_addr(args.gateway_listen, "--gateway-listen"), "--gateway-listen")
    from offscope.proxy.otel import describe_environment

    otel = describe_environment()  # an OTLP protocol offscope does not speak exits 2 here
    if args.trace:
        Path(args.trace).parent.mkdir(parents=True, exist_ok=True)
    requests = args.requests or (
        str(Path(args.trace).with_suffix("")) + ".requests.jsonl" if args.trace else ""
    )
    cfg = config_from_args(
        ProxyConfig,
        args,
        policy=policy.spec,  # the preset's name, or the file's absolute path
        listen_host=host,
        listen_port=port,
        control=args.control_listen,
        requests=requests,
        routes=",".join(args.route),
        gateways=",".join(args.gateway),
        max_body=max_body,
    )
    banner = partial(_banner, args, ledger, policy, requests, otel, gateways)
    return asyncio.run(_serve(cfg, banner))


async def _serve(cfg, banner: Callable[[int, int | None, OffscopeAddon], None]) -> int:
    from offscope.heap import tune_collector
    from offscope.proxy.mitm.server import build_master, wait_started

    master, addon = build_master(cfg)
    tune_collector()  # mitmproxy's addons and the ledger live as long as the process
    drain = master.addons.get("drain")
    signals = 0

    def stop() -> None:
        # The first signal drains (offscope/proxy/mitm/drain.py); another one cuts the wait short.
        nonlocal signals
        signals += 1
        if signals == 1:
            master.shutdown()
        elif drain is not None:
            drain.hurry()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)
    task = asyncio.create_task(master.run())
    # The banner says where each listener is once it is bound: with port 0 (a free port,
    # as an orchestrator or a test asks) only then is the address known.
    try:
        port, gateway_port = await wait_started(master, addon, task, cfg, within=math.inf)
    except RuntimeError:
        if not signals:
            raise
        await task  # stopped while starting: no banner, and the usual clean exit
        return 0
    banner(port, gateway_port, addon)
    await task
    return 0


def _banner(
    args: argparse.Namespace,
    ledger: CompiledLedger,
    policy: CompiledPolicy,
    requests: str,
    otel: str | None,
    gateways: dict[str, Upstream],
    port: int,
    gateway_port: int | None,
    addon: OffscopeAddon,
) -> None:
    """Where the sidecar listens (the bound ports), what it enforces, and how to use it."""
    from offscope.proxy.addresses import format_listen

    host = _addr(args.listen, "--listen")[0]
    where = format_listen(host, port)
    print(
        f"offscope proxy listening on http://{where}  ledger {ledger.id} ({ledger.hash})  "
        f"policy {policy.id} ({policy.mode}; {policy.source}, {policy.hash})",
        file=sys.stderr,
    )

    def bound(spec: str, flag: str, listener_port: int) -> str:
        return format_listen(_addr(spec, flag)[0], listener_port)

    metrics = (
        f"http://{bound(args.metrics, '--metrics', addon.metrics.port)}/metrics"
        if addon.metrics
        else "off"
    )
    print(
        f"  metrics {metrics}  trace {args.trace or '-'}  requests {requests or '-'}",
        file=sys.stderr,
    )
    control = (
        f"http://{bound(args.control_listen, '--control-listen', addon.control.port)}/runs "
        "(bearer token)"
        if addon.control
        else "off"
    )
    print(f"  control {control}", file=sys.stderr)
    for name, up in gateways.items():
        gw = bound(args.gateway_listen, "--gateway-listen", gateway_port or 0)
        print(
            f"  gateway http://{gw}/{name}/ -> {up.scheme}://{up.host_header}{up.base_path}/",
            file=sys.stderr,
        )
    if otel:
        print(f"  OpenTelemetry spans to {otel} (OTLP/HTTP)", file=sys.stderr)
    client = proxy_variables(f"http://RUN_ID:x@{where}") | ca_variables(
        Path(args.confdir).resolve() / "mitmproxy-ca-cert.pem"
    )
    print(f"  point an agent at it:  {inline(client)} my-agent", file=sys.stderr)


def _check_token_file(path: str) -> None:
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise InputError(
            f"cannot read control token: {exc.strerror or exc}",
            path=path,
            hint=f"give a readable file with the token, or set {TOKEN_ENV}",
        ) from None
    if not token:
        raise InputError("control token file is empty", path=path, hint="put the token in it")


_SIZE = re.compile(r"^\s*(\d+)\s*([bkmgt]?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def _size(text: str, flag: str) -> int:
    """`64m` -> bytes (binary units, as mitmproxy's own options read them)."""
    match = _SIZE.match(text)
    size = int(match[1]) * _UNITS[match[2].lower()] if match else None
    if size is None or size < 1:
        raise InputError(f"{flag} {text!r}: not a size", hint=f"e.g. {flag} 64m (k, m, g suffixes)")
    return size
