"""`offscope view`: every run of a grid or a trace, step by step, in a browser."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from offscope.cli._parsers import add_command
from offscope.errors import InputError

EPILOG = """\
The page lists every run (cell, case, labels, outcome: acted, self-granted, infra
error, ...) and shows a selected run's steps in order: tool calls with scope, stage,
decision and targets; operator exchanges with the reply exactly as the agent saw it
and its provenance; LLM calls with the tools the model proposed. Filters live in the
URL fragment, e.g. runs.html#cell=open-affirmative-broken&outcome=acted.

examples:
  offscope view offscope-demo                    # a grid: writes offscope-demo/runs.html
  offscope view trace.jsonl --out review.html    # a production trace (runs by label)
  offscope view trace.jsonl --serve              # serve it on 127.0.0.1 until Ctrl-C
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub,
        "view",
        help="every run of a grid or a trace, step by step (a self-contained page)",
        description="Write (or serve on loopback) the trajectory viewer for a grid output "
        "directory or a trace file.",
        epilog=EPILOG,
    )
    p.add_argument("source", metavar="DIR|TRACE", help="a grid --out directory or a trace file")
    p.add_argument(
        "--out",
        metavar="FILE",
        help="where the page goes (default: DIR/runs.html, or TRACE's name + .runs.html)",
    )
    p.add_argument(
        "--serve", action="store_true", help="serve the page on --listen instead of only writing it"
    )
    p.add_argument(
        "--listen",
        default="127.0.0.1:0",
        metavar="HOST:PORT",
        help="with --serve: loopback address (default 127.0.0.1:0, a free port)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from offscope.evalmode.outdir import trace_events
    from offscope.evalmode.report.viewer import collect_runs, render_viewer

    source = Path(args.source)
    if source.is_dir():
        trace = source / "trajectories.jsonl"
        if not trace.exists():
            raise InputError(
                "not a grid output directory (trajectories.jsonl expected)", path=str(source)
            )
        default_out, title = source / "runs.html", f"Grid {source.name}"
    elif source.exists():
        trace, title = source, f"Trace {source.name}"
        default_out = source.with_name(source.name + ".runs.html")
    else:
        raise InputError("no such grid directory or trace file", path=str(source))
    runs = collect_runs(trace_events(trace))  # with its rotated segments, oldest first
    if not runs:
        raise InputError("no run in this trace: nothing to view", path=str(trace))
    page = render_viewer(runs, title, str(trace))
    out = Path(args.out) if args.out else default_out
    out.write_text(page, encoding="utf-8")
    print(f"{len(runs)} runs -> {out}", file=sys.stderr)
    if args.serve:
        return _serve(page, args.listen)
    return 0


def _serve(page: str, listen: str) -> int:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse
    from starlette.routing import Route

    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise InputError(f"--listen {listen}: the viewer serves on loopback only")
    try:
        port_number = int(port)
    except ValueError:
        raise InputError(f"--listen {listen}: HOST:PORT expected, e.g. 127.0.0.1:8765") from None

    async def index(_request: object) -> HTMLResponse:
        return HTMLResponse(page)

    app = Starlette(routes=[Route("/", index)])
    config = uvicorn.Config(app, host=host, port=port_number, log_level="warning")
    server = uvicorn.Server(config)

    import asyncio

    async def serve() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started:
            bound = server.servers[0].sockets[0].getsockname()
            shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
            print(f"serving http://{shown}:{bound[1]}/  (Ctrl-C to stop)", flush=True)
        await task

    asyncio.run(serve())
    return 0
