"""`offscope mcp`: wrap an MCP server that speaks stdio (offscope/proxy/stdio.py)."""

from __future__ import annotations

import argparse
import asyncio
import os
import uuid
from pathlib import Path

from offscope.cli._parsers import add_command
from offscope.cli.proxy import add_engine_arguments, add_log_level_argument, add_requests_argument
from offscope.errors import InputError
from offscope.proxy import DEFAULT_TRACE

EPILOG = """\
examples:
  offscope mcp --ledger ledger.yaml -- npx -y @modelcontextprotocol/server-filesystem /srv
  offscope mcp --ledger ledger.yaml --policy enforce --trace trace.jsonl --run ticket-42 \\
      -- mcp-server-git --repository /srv/app

In an MCP client's config, put `offscope` as the command and `mcp --ledger L.yaml --`
before the server's own command and arguments. stdout carries only the protocol;
offscope's logs and the server's stderr go to stderr. The exit code is the server's.
Run id: --run, else $OFFSCOPE_RUN, else a fresh `stdio-...` id per start.
See docs/stdio-mcp.md.
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub,
        "mcp",
        help="wrap a stdio MCP server: tag, decide and record its tool calls",
        description="Start an MCP server that speaks stdio as a child process and relay its "
        "JSON-RPC, applying the ledger and policy to every tools/call as the "
        "proxy does for MCP over HTTP.",
        epilog=EPILOG,
    )
    add_engine_arguments(p)
    p.add_argument(
        "--trace",
        default=str(DEFAULT_TRACE),
        help=f"JSONL trace file, appended line by line (default {DEFAULT_TRACE}); '' for none",
    )
    add_requests_argument(p)
    p.add_argument(
        "--run", default="", help="run id (default: $OFFSCOPE_RUN, else a new id per start)"
    )
    p.add_argument(
        "--host",
        default="",
        help="a name for this server that its calls carry as their host target, so that "
        "ledger rules naming a host (operator routes, extract and stage rules) apply to "
        "it; list it under targets.hosts (default: none)",
    )
    p.add_argument(
        "--metrics",
        default="",
        metavar="HOST:PORT",
        help="also serve /metrics (the proxy's Prometheus names) while the server runs "
        "(default: off; the trace is the record, `offscope report` reads it)",
    )
    p.add_argument(
        "--max-line",
        default="64m",
        metavar="SIZE",
        help="longest client message inspected (k/m/g; default 64m); a longer one is "
        "dropped by a fail-closed policy, else relayed uninspected",
    )
    add_log_level_argument(p)
    p.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND [ARGS...]",
        help="the MCP server to start",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from offscope import logs
    from offscope.cli.proxy import _addr, _check_free, _size
    from offscope.proxy.runs import run_id_from
    from offscope.proxy.stdio import StdioConfig

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise InputError(
            "no server command",
            hint="put it after `--`: offscope mcp --ledger L.yaml -- COMMAND ARGS",
        )
    from offscope.proxy.otel import describe_environment

    logs.configure(args.log_level)
    describe_environment()  # OTEL_*: an OTLP protocol offscope does not speak exits 2 here
    max_line = _size(args.max_line, "--max-line")
    metrics = _addr(args.metrics, "--metrics") if args.metrics else None
    if metrics:
        _check_free(*metrics, "--metrics")
    run_id = run_id_from(
        args.run or os.environ.get("OFFSCOPE_RUN") or f"stdio-{uuid.uuid4().hex[:12]}", {}, "", None
    )
    cfg = StdioConfig(command=command, run_id=run_id, host=args.host, max_line=max_line)
    requests = args.requests or (
        str(Path(args.trace).with_suffix("")) + ".requests.jsonl" if args.trace else ""
    )
    engine = build_engine(args.ledger, args.policy, args.trace, requests)
    try:
        return asyncio.run(_serve(engine, cfg, metrics))
    except OSError as exc:
        raise InputError(
            f"cannot start the server: {exc.strerror or exc}: {command[0]!r}",
            hint="check the command after `--` (is it on PATH?)",
        ) from None


def build_engine(ledger_path: str, policy_spec: str, trace: str, requests: str):
    """The proxy's engine, with the proxy's sinks and exporter (one definition
    of each record and metric, OpenTelemetry spans when OTEL_* asks for them);
    exits 2 on a bad ledger or policy."""
    import structlog

    from offscope.ledgers import load_ledger
    from offscope.policies import load_policy
    from offscope.proxy.engine import Engine
    from offscope.proxy.exporter import Exporter
    from offscope.proxy.otel import record_sinks
    from offscope.proxy.reload import policy_fields
    from offscope.proxy.runs import RunTable
    from offscope.proxy.sinks import RequestLog, TraceSink

    ledger = load_ledger(ledger_path)
    policy = load_policy(policy_spec)  # a preset by name, a file by path (docs/policy.md)
    structlog.get_logger("offscope").info("policy_loaded", **policy_fields(policy))
    exporter = Exporter()
    exporter.ensure_ledger(ledger.id)
    # One run lives as long as the server: it never idles out.
    return Engine(
        ledger,
        policy,
        trace=TraceSink(trace or None, extra=record_sinks(exporter)),
        requests=RequestLog(requests or None),
        exporter=exporter,
        runs=RunTable(idle_timeout=float("inf")),
    )


async def _serve(engine, cfg, metrics: tuple[str, int] | None) -> int:
    from offscope.proxy.stdio import serve

    # /metrics, /healthz, /readyz only: the wrapper serves one run, which the
    # MCP client starts and ends with the server process (no control API).
    listener = None
    if metrics:
        from offscope.proxy.control import MetricsServer  # starlette, uvicorn: ~25 ms

        listener = MetricsServer(*metrics, engine.exporter, engine)
        listener.start()
    try:
        return await serve(engine, cfg)
    finally:
        if listener:
            listener.stop()
