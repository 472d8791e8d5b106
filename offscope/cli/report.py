"""`offscope report`: metrics from a trace file (eval or production), or rebuild a grid's reports."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from offscope.trace.events import read_trace
from offscope.trace.metrics import Aggregate, RunState, aggregate, fold

EPILOG = """\
examples:
  offscope report offscope-trace.jsonl            # per-run table and the aggregate
  offscope report offscope-trace.jsonl --json     # the same as JSON (for scripts)
  offscope report grid-out/                       # rebuild results.json, report.md, report.html
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="scope metrics from a trace file, or rebuild a grid's reports",
                       description="Compute the scope metrics (first out-of-scope step, funnel, self-granted "
                                   "permissions, out-of-scope call share, touches per 1,000 runs) from a trace.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", help="trace file (.jsonl) or a grid output directory")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--runs", type=int, default=50, help="show at most this many runs in the table (default 50)")
    p.set_defaults(func=run)


def summarize(runs: dict[str, RunState]) -> dict:
    """Per-ledger aggregates plus all runs (the JSON `offscope report --json` prints)."""
    by_ledger: dict[str, list[RunState]] = {}
    for r in runs.values():
        by_ledger.setdefault(r.ledger, []).append(r)
    return {
        "schema": "offscope.report/1",
        "aggregate": aggregate(runs.values()).as_dict(),
        "by_ledger": {k: aggregate(v).as_dict() for k, v in sorted(by_ledger.items())},
        "runs": [r.as_dict() for r in runs.values()],
    }


def run(args: argparse.Namespace) -> int:
    path = Path(args.path)
    if path.is_dir():
        from offscope.evalmode.results import rebuild_reports

        return rebuild_reports(path)
    runs = fold(read_trace(path))
    if args.json:
        print(json.dumps(summarize(runs), indent=2, sort_keys=True))
        return 0
    console = Console()
    table = Table(title=f"runs in {path} ({len(runs)})", show_lines=False)
    for col in ("run", "ledger", "steps", "calls", "out", "first out", "funnel", "self-granted", "asks", "ended"):
        table.add_column(col, justify="right" if col in ("steps", "calls", "out", "first out", "asks") else "left")
    for r in list(runs.values())[: args.runs]:
        funnel = "act" if r.acted else "prepare" if r.prepared else "investigate" if r.investigated else "-"
        table.add_row(r.run, r.ledger, str(r.steps), str(r.calls), str(r.oos_calls),
                      str(r.first_oos_step or "-"), funnel, str(r.self_granted), str(r.operator_asks),
                      r.ended or "open")
    console.print(table)
    if len(runs) > args.runs:
        console.print(f"… {len(runs) - args.runs} more runs (--runs N, or --json)")
    console.print(_aggregate_table(aggregate(runs.values())))
    return 0


def _aggregate_table(a: Aggregate) -> Table:
    t = Table(title="aggregate (rates with Wilson 95% intervals)")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("runs", str(a.runs))
    t.add_row("tool calls / out of scope", f"{a.calls} / {a.oos_calls}")
    t.add_row("out-of-scope touches per 1,000 runs", f"{a.touches_per_1000_runs:.0f}" if a.runs else "-")
    t.add_row("out-of-scope call share (pooled)", f"{a.oos_share_pooled:.1%}" if a.calls else "-")
    t.add_row("investigated an unnamed target", str(a.investigated))
    t.add_row("prepared against it", str(a.prepared))
    t.add_row("acted on it", str(a.acted))
    t.add_row("asked the operator", str(a.asked))
    t.add_row("self-granted permissions (runs)", f"{a.self_granted_runs}  total {a.self_granted}")
    steps = sorted(a.first_oos_steps)
    t.add_row("first out-of-scope step (touched runs)",
              f"median {steps[len(steps) // 2]}, n={len(steps)}; {len(a.censored_steps)} never touched"
              if steps else f"none; {len(a.censored_steps)} never touched")
    if a.task_success.n:
        t.add_row("task success", str(a.task_success))
    return t
