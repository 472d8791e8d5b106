"""`offscope report`: metrics from a trace file (eval or production), or rebuild a grid's reports."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from offscope.cli._inputs import require_events
from offscope.cli._parsers import add_command
from offscope.cli._table import emit
from offscope.errors import InputError
from offscope.proxy import DEFAULT_TRACE
from offscope.trace import catalog
from offscope.trace.events import Event
from offscope.trace.metrics import Aggregate, Folder, RunState
from offscope.trace.metrics import results as result_runs
from offscope.trace.rates import pct

# The simulated model names itself so (offscope/evalmode/sim/simmodel.py MODEL_PREFIX); its responses
# also carry the disposition's content hash ("+disposition.sha256.<hex>").
SIM_PREFIX = "offscope-sim/"
SIM_WARNING = (
    "these numbers come from offscope's built-in simulated model with seeded dispositions; they are "
    "not any real model's propensity and must not be quoted as one"
)

EPILOG = """\
examples:
  offscope report trace.jsonl                     # per-run table and the aggregate
  offscope report trace.jsonl --json              # the same as JSON (for scripts)
  offscope report grid-out/                       # rebuild results.json, report.md, report.html
  offscope report trace.jsonl --coverage --ledger L.yaml   # which ledger entries no call used
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub,
        "report",
        help="scope metrics from a trace file, or rebuild a grid's reports",
        description="Compute the scope metrics (first out-of-scope step, funnel, self-granted "
        "permissions, out-of-scope call share, touches per 1,000 runs) from a trace.",
        epilog=EPILOG,
    )
    p.add_argument(
        "path",
        nargs="*",
        default=[str(DEFAULT_TRACE)],
        help="trace files (.jsonl, .jsonl.gz, .jsonl.zst; with their rotated segments) or globs "
        "such as 'fleet/*.jsonl*', read as one stream; or one grid output directory "
        f"(default {DEFAULT_TRACE}, where the proxy writes its trace by default). Runs of "
        "proxies started with --instance are told apart: two sidecars' run-1 are two runs",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument(
        "--runs", type=int, default=50, help="show at most this many runs in the table (default 50)"
    )
    p.add_argument(
        "--coverage",
        action="store_true",
        help="ledger coverage instead: which entries of --ledger the trace's calls used, and which "
        "none did (unused reach; the same count as the proxy's offscope_ledger_entries_used)",
    )
    p.add_argument("--ledger", help="the ledger whose coverage --coverage reports")
    p.set_defaults(func=run)


def simulated_runs(events: list[Event]) -> dict[str, str]:
    """Run -> simulated model name (with its disposition hash), for runs whose LLM calls the
    simulated model answered, or that a simulated grid started (its agent's LLM calls may not
    have crossed the proxy)."""
    out: dict[str, str] = {}
    for e in events:
        _note_simulated(out, e)
    return out


def _note_simulated(out: dict[str, str], e: Event) -> None:
    """Record in `out` the simulated model that `e` names, if any (see simulated_runs)."""
    if e.type == "run_start":
        model = e.labels.get("simulated_model")
    else:
        model = getattr(e, "model", None) if e.type == "llm" else None
    if isinstance(model, str) and model.startswith(SIM_PREFIX):
        out.setdefault(f"{e.sidecar}/{e.run}" if e.sidecar else e.run, model)


def summarize(
    runs: dict[str, RunState], simulated: dict[str, str] | None = None, with_runs: bool = True
) -> dict:
    """Per-ledger aggregates plus all runs (the JSON `offscope report --json` prints);
    `with_runs=False` leaves the runs out (`print_json` streams them)."""
    simulated = simulated or {}
    by_ledger: dict[str, list[RunState]] = {}
    counted = result_runs(runs.values())  # infra-error runs are in no aggregate
    for r in counted:
        by_ledger.setdefault(r.ledger, []).append(r)
    out = {
        "schema": "offscope.report/1",
        "aggregate": _with_intervals(counted).as_dict(),
        "infra_errors": len(runs) - len(counted),
        "by_ledger": {k: _with_intervals(v).as_dict() for k, v in sorted(by_ledger.items())},
        "runs": [_run_row(r, simulated) for r in runs.values()] if with_runs else [],
    }
    if simulated:
        out["simulated"] = {
            "label": "SIMULATED MODEL",
            "runs": len(simulated),
            "of_runs": len(runs),
            "models": sorted(set(simulated.values())),
            "warning": SIM_WARNING,
        }
    return out


def _run_row(r: RunState, simulated: dict[str, str]) -> dict:
    return {**r.as_dict(), **({"simulated_model": simulated[r.run]} if r.run in simulated else {})}


def print_json(runs: dict[str, RunState], simulated: dict[str, str]) -> None:
    """The same JSON as `json.dumps(summarize(...), indent=2, sort_keys=True)`, with the runs
    written one at a time: a day of traces has tens of thousands of runs, and their rows
    need not all be in memory at once."""
    head = json.dumps(summarize(runs, simulated, with_runs=False), indent=2, sort_keys=True)
    before, _, after = head.partition('\n  "runs": []')
    out = sys.stdout
    out.write(before + '\n  "runs": [')
    for i, r in enumerate(runs.values()):
        row = json.dumps(_run_row(r, simulated), indent=2, sort_keys=True)
        out.write(("," if i else "") + "\n    " + row.replace("\n", "\n    "))
    out.write(("\n  ]" if runs else "]") + after + "\n")


def sim_label(simulated: dict[str, str], n_runs: int) -> str | None:
    """The one-line SIMULATED label, or None when no run used the simulated model."""
    if not simulated:
        return None
    share = "all runs" if len(simulated) == n_runs else f"{len(simulated)} of {n_runs} runs"
    return (
        f"SIMULATED MODEL ({share}: {', '.join(sorted(set(simulated.values())))}): {SIM_WARNING}."
    )


def run(args: argparse.Namespace) -> int:
    paths = list(args.path)
    if len(paths) > 1 or not Path(paths[0]).is_dir():
        return _report_traces(args, paths)
    grid = Path(paths[0])
    require_events(grid)  # a report of nothing is an error, not a zero
    if args.coverage:
        return coverage(args)
    from offscope.evalmode.report.results import load_results, rebuild_reports

    code = rebuild_reports(grid)
    results = load_results(grid)
    if results.simulated:
        model = results.configuration.model
        Console(stderr=True).print(
            f"[bold yellow]SIMULATED MODEL[/] ({model.id}, disposition "
            f"sha256 {str(model.disposition_sha256)[:16]}): {SIM_WARNING}."
        )
    return code


def _report_traces(args: argparse.Namespace, paths: list[str]) -> int:
    """The report of trace files, read as one stream and folded as they are read: memory
    grows with the number of runs, not of events."""
    from offscope.trace.reader import read_traces

    if args.coverage:  # a fleet's coverage: every sidecar's trace at once
        for path in paths:
            require_events(path)
        return coverage(args)
    folder, seen = Folder(), 0
    simulated: dict[str, str] = {}
    for event in read_traces(paths):
        seen += 1
        folder.add(event)
        _note_simulated(simulated, event)
    if not seen:
        raise InputError(
            "the trace holds no events",
            path=", ".join(paths),
            hint="a report of nothing would print zeros; check the files",
        )
    runs = folder.finish()
    path = ", ".join(paths)
    if args.json:
        print_json(runs, simulated)
        return 0
    console = Console()
    label = sim_label(simulated, len(runs))
    if label:
        console.print(f"[bold yellow]{label}[/]", highlight=False)
    sim = " — SIMULATED MODEL" if simulated else ""
    mixed = bool(simulated) and len(simulated) < len(runs)  # then say which runs were simulated
    numeric = ("steps", "calls", "out", "first out", "first act", "asks")
    headers = [
        "run",
        "ledger",
        "steps",
        "calls",
        "out",
        "first out",
        "first act",
        "funnel",
        "self-granted",
        "asks",
        "ended",
    ] + (["model"] if mixed else [])
    rows = []
    for key, r in list(runs.items())[: args.runs]:  # key: the run id, `id#2` for a reused one
        funnel = (
            "act"
            if r.acted
            else "prepare"
            if r.prepared
            else "investigate"
            if r.investigated
            else "-"
        )
        row = [
            key,
            r.ledger,
            str(r.steps),
            str(r.calls),
            str(r.oos_calls),
            str(r.first_oos_step or "-"),
            str(r.first_oos_act_step or "-"),
            funnel,
            str(r.self_granted),
            str(r.operator_asks),
            r.ended or "open",
        ]
        rows.append(row + (["SIMULATED" if r.run in simulated else "-"] if mixed else []))
    emit(console, f"runs in {path} ({len(runs)}){sim}", headers, rows, right=numeric)
    if len(runs) > args.runs:
        console.print(f"({len(runs) - args.runs} more runs: --runs N, or --json)")
    counted = result_runs(runs.values())
    console.print(_aggregate_table(_with_intervals(counted), sim))
    if len(counted) < len(runs):
        console.print(
            f"[bold yellow]{len(runs) - len(counted)} run(s) ended on an infrastructure failure "
            "(infra_error): not results, left out of every rate above[/]"
        )
    if label:
        console.print(f"[bold yellow]{label}[/]", highlight=False)
    return 0


def _with_intervals(runs: list[RunState]) -> Aggregate:
    """The aggregate with each rate's one interval (case-clustered for a grid's trace)."""
    from offscope.rollout.replay import aggregate_with_intervals

    return aggregate_with_intervals(runs)


def _aggregate_table(a: Aggregate, suffix: str = "") -> Table:
    t = Table(
        title=f"aggregate (rates with 95% intervals, case-clustered when runs name several cases)"
        f"{suffix}"
    )
    t.add_column("metric", overflow="fold")
    t.add_column("value", justify="right", overflow="fold")
    t.add_row("runs", str(a.runs))
    t.add_row("tool calls / out of scope", f"{a.calls} / {a.oos_calls}")
    for m in catalog.METRICS:  # every metric a trace tells, in the catalog's order
        text = _aggregate_value(a, m.key) if m.per == "aggregate" else _aggregate_rate(a, m.key)
        if text is not None:
            t.add_row(m.label, text)
    return t


def _aggregate_rate(a: Aggregate, key: str) -> str | None:
    """A per-run outcome's row: its rate with its interval (None: not in a trace)."""
    rate = a.rate(key)
    if rate is None or (key == "task_success" and not rate.n):  # no run said
        return None
    return f"{rate}  total {a.self_granted}" if key == "self_granted" else str(rate)


def _median_text(steps: tuple[int, ...], censored: int, verb: str) -> str:
    ordered = sorted(steps)
    if not ordered:
        return f"none; {censored} never {verb}"
    return f"median {ordered[len(ordered) // 2]}, n={len(ordered)}; {censored} never {verb}"


def _aggregate_value(a: Aggregate, key: str) -> str:
    """An aggregate metric's row. A metric added to the catalog without a row here
    fails `offscope report` (and tests/cli/test_report_table.py) by name."""
    if key == "touches_per_1000_runs":
        return f"{a.touches_per_1000_runs:.0f}" if a.runs else "-"
    if key == "oos_share_pooled":
        return pct(a.oos_share_pooled) if a.calls else "-"
    if key == "first_oos_step":
        return _median_text(a.first_oos_steps, len(a.censored_steps), "touched")
    if key == "first_oos_act_step":
        return _median_text(a.first_oos_act_steps, len(a.act_censored_steps), "acted")
    if key == "harness_approvals":
        return str(a.harness_approvals)
    raise KeyError(f"the metric catalog's {key!r} has no row in offscope report's aggregate")


def coverage(args: argparse.Namespace) -> int:
    """`--coverage`: the trace's calls tagged again under the ledger (as `offscope
    replay` does), counting which entries they use."""
    from offscope.cli.replay import show_unused
    from offscope.ledgers import load_ledger
    from offscope.policies import load_policy
    from offscope.rollout.replay import replay

    if not args.ledger:
        raise InputError(
            "--coverage needs --ledger L.yaml (the trace does not hold the ledger's entries)"
        )
    result = replay(list(args.path), load_ledger(args.ledger), load_policy("shadow"))
    assert result.coverage is not None
    cov = {
        **result.coverage.as_dict(),
        "fallback_calls": result.counts["fallback"],
        "incomplete_calls": result.counts["incomplete"],
    }
    if args.json:
        print(json.dumps(cov, indent=2, sort_keys=True))
        return 0
    console = Console()
    console.print(
        f"{cov['calls']} tool calls in {escape(', '.join(args.path))} under ledger {escape(str(cov['ledger']))}",
        highlight=False,
    )
    show_unused(cov, console)
    if cov["fallback_calls"]:
        console.print(
            f"{cov['fallback_calls']} calls are offscope.trace/1 records: only their recorded targets "
            "were counted (extract rules could not be checked)",
            highlight=False,
        )
    return 0
