"""`offscope mine`: grow the case set from your own denials."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from offscope.cli._parsers import add_command

EPILOG = """\
Finds every 401, 403, policy rejection (decision: block) and tool error saying
"not permitted" / "forbidden" / "permission denied" in a trace (production or eval),
shows what the run did in the next ten steps, and with --out writes one case skeleton
per distinct wall (same host + method or MCP tool + path template with ids collapsed +
status). Skeletons validate as written; review their TODOs (success effect, shortcut
kind, placeholder bodies) before adding them to the case set. The simulated model tells
cases apart by their brief, so run skeletons that share a brief in separate grids.

examples:
  offscope mine prod-trace.jsonl                           # the denials and the next ten steps
  offscope mine runs/diag/trajectories.jsonl --out eval/mined
  offscope mine prod-trace.jsonl --all-errors --out eval/mined   # also 404 and 5xx walls
  offscope validate eval/mined/*.yaml
  offscope grid --cases eval/mined --cells open-affirmative-broken --reps 5 --out runs/mined
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub,
        "mine",
        help="find denials in a trace; write a case skeleton per distinct wall",
        description="Mine a trace for denials (401, 403, policy blocks, 'not permitted' tool "
        "errors), show the next ten steps of each, and write case skeletons.",
        epilog=EPILOG,
    )
    p.add_argument("trace", metavar="TRACE.jsonl", help="an offscope.trace file (grid or proxy)")
    p.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="write one case skeleton YAML per distinct wall here",
    )
    p.add_argument(
        "--all-errors", action="store_true", help="also count 404 and 5xx responses as walls"
    )
    p.add_argument(
        "--every",
        action="store_true",
        help="show the next-ten-steps table for every occurrence (default: one per wall)",
    )
    p.set_defaults(func=run)


def _step_row(s, denial_step: int | None = None) -> tuple[str, ...]:
    from offscope.trace.events import OperatorEvent

    e = s.event
    if isinstance(e, OperatorEvent):
        return (
            str(s.step),
            "ask operator",
            e.question,
            "",
            "",
            f"{e.provenance}/{e.policy}",
        )
    call = e.call
    what = call.tool if call.source == "mcp" else (call.method or "")
    scope = call.scope
    result = f"{e.status if e.status is not None else '–'} {e.decision}"
    if e.friction:
        result += f" ({e.friction})"
    marker = "  <- wall" if denial_step == s.step else ""
    return (str(s.step), what, call.url or "", scope, call.stage, result + marker)


def _table(console: Console, d, title: str) -> None:
    """The denial and the steps after it, hiding nothing (offscope/cli/_table.py)."""
    from offscope.cli._table import emit

    rows = [_step_row(d.step, d.step.step), *(_step_row(s) for s in d.after)]
    if not d.after:
        rows.append(("", "(the run ended here)", "", "", "", ""))
    emit(console, title, ("step", "call", "url / question", "scope", "stage", "result"), rows)


def run(args: argparse.Namespace) -> int:
    from offscope.cli._inputs import require_events
    from offscope.rollout.mine.command import check_trace, mine
    from offscope.rollout.mine.walls import NEXT_STEPS, representative

    check_trace(args.trace)
    require_events(args.trace)
    result = mine(args.trace, args.out, all_errors=args.all_errors)
    console = Console()
    total = sum(len(v) for v in result.walls.values())
    console.print(
        f"{len(result.runs)} runs, {total} denial(s), {len(result.walls)} distinct wall(s) in {args.trace}"
    )
    for wall, denials in result.walls.items():
        n = len(denials)
        oos = sum(d.went_out_of_scope() for d in denials)
        acted = sum(d.acted_out_of_scope() for d in denials)
        asked = sum(d.asked() for d in denials)
        console.print(
            f"\n[bold]{escape(wall.label)}[/]: {n} occurrence(s) in {len({d.run.run for d in denials})} "
            f"run(s); in the next {NEXT_STEPS} steps {oos}/{n} touched an out-of-scope target, "
            f"{acted}/{n} acted on one, {asked}/{n} asked the operator"
        )
        shown = denials if args.every else [representative(denials)]
        for d in shown:
            _table(console, d, f"run {d.run.run}, step {d.step.step} and the next {NEXT_STEPS}")
    if args.out:
        console.print()
        for sk, path in zip(result.skeletons, result.written, strict=True):
            todo = f" (TODO: {', '.join(sk.todos)})" if sk.todos else ""
            console.print(f"wrote {path}{escape(todo)}")
        for why in result.skipped:
            console.print(f"[yellow]skipped:[/] {escape(why)}")
        for ids in result.shared_briefs:
            console.print(
                f"[yellow]note:[/] {', '.join(ids)} share a brief (one run hit several walls); "
                "the simulated model tells cases apart by brief: run them in separate grids"
            )
        console.print(f"check them with: offscope validate {Path(args.out)}/*.yaml")
    elif result.walls:
        console.print("\n(write case skeletons with --out DIR)")
    return 0
