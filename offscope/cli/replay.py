"""`offscope replay`: recorded traffic under a candidate ledger or policy."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from offscope.cli._parsers import add_command
from offscope.cli._table import emit

EPILOG = """\
examples:
  offscope replay trace.jsonl --ledger narrowed.yaml                  # what would change
  offscope replay trace.jsonl --ledger L.yaml --policy enforce        # shadow -> enforce: who is interrupted
  offscope replay a.jsonl b.jsonl --ledger L.yaml --json --out replay/
  offscope replay trace.jsonl --ledger L.yaml --policy enforce --fail-on 'newly-blocked>0'

exit codes: 0 no --fail-on condition holds, 1 one holds, 2 bad input (file and line named).
--fail-on names: newly-blocked, newly-passed, newly-out, newly-in, changed, interrupted-runs,
incomplete, fallback, unused (unused ledger entries).
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub,
        "replay",
        help="re-tag and re-decide a recorded trace under a candidate ledger/policy",
        description="Tag every recorded tool call again under a candidate ledger and decide it "
        "under a candidate policy (the proxy's own tagger and decide()), and report "
        "what would change, the metrics before and after, the ledger's unused "
        "reach and the runs a blocking policy would have interrupted.",
        epilog=EPILOG,
    )
    p.add_argument(
        "traces",
        nargs="+",
        metavar="TRACE",
        help="trace files or globs (offscope.trace/2; /1 falls back), with their rotated and "
        "compressed segments (.gz, .zst); several traces are merged by time",
    )
    p.add_argument("--ledger", required=True, help="the candidate ledger (YAML)")
    p.add_argument(
        "--policy", default="shadow", help="candidate policy: preset or file path (default: shadow)"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--out", metavar="DIR", help="also write DIR/replay.json and DIR/replay.md")
    p.add_argument(
        "--fail-on",
        action="append",
        default=[],
        metavar="NAME>N",
        help="exit 1 when the condition holds (repeatable), e.g. 'newly-blocked>0'",
    )
    p.add_argument("--top", type=int, default=20, help="groups shown in the tables (default 20)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from offscope.cli._inputs import require_events
    from offscope.errors import InputError
    from offscope.ledgers import load_ledger
    from offscope.policies import load_policy
    from offscope.rollout.replay import failed_conditions, parse_condition, replay

    try:
        conditions = [parse_condition(c) for c in args.fail_on]
    except ValueError as exc:
        raise InputError(str(exc)) from None
    for trace in args.traces:  # a --fail-on check over nothing would pass
        require_events(trace)
    report = replay(args.traces, load_ledger(args.ledger), load_policy(args.policy)).as_dict()
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "replay.json").write_text(
            json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8"
        )
        (out / "replay.md").write_text(markdown(report), encoding="utf-8")
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        show(report, Console(), args.top)
    failed = failed_conditions(report, conditions)
    for f in failed:
        print(f"offscope replay: --fail-on: {f}", file=sys.stderr)
    return 1 if failed else 0


def _rate(d: dict[str, Any]) -> str:
    from offscope.trace.rates import rate_text

    return rate_text(d["k"], d["n"], tuple(d["ci95"]))


def metric_rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    m = report["metrics"]
    rows = []
    for name, get in (
        ("runs", lambda s: str(s["runs"])),
        ("tool calls / out of scope", lambda s: f"{s['calls']} / {s['oos_calls']}"),
        ("blocked calls", lambda s: str(s["blocked_calls"])),
        ("touches per 1,000 runs", lambda s: _touch(s["touches_per_1000_runs"])),
        ("investigated an unnamed target", lambda s: _rate(s["funnel"]["investigated"])),
        ("prepared against it", lambda s: _rate(s["funnel"]["prepared"])),
        ("acted on it", lambda s: _rate(s["funnel"]["acted"])),
        (
            "self-granted permissions (runs)",
            lambda s: f"{_rate(s['self_granted_runs'])}, total {s['self_granted']}",
        ),
        ("first out-of-scope step", lambda s: _first(s["first_oos_step"])),
    ):
        rows.append((name, get(m["recorded"]), get(m["candidate"])))
    return rows


def _touch(t: dict[str, Any]) -> str:
    if t["value"] is None:
        return "-"
    return f"{t['value']:.0f} [{t['ci95'][0]:.0f}, {t['ci95'][1]:.0f}]"


def _first(f: dict[str, Any]) -> str:
    if f["rmst"] is None:
        return f"{f['touched']} of {f['runs']} runs touched"
    lo, hi = f["rmst_ci95"]
    return (
        f"median {f['median'] or '-'}; restricted mean {f['rmst']:.2f} [{lo:.2f}, {hi:.2f}] "
        f"(up to step {f['tau']}); {f['touched']}/{f['runs']} touched"
    )


def show(report: dict[str, Any], console: Console, top: int) -> None:
    c = report["counts"]
    console.print(
        f"replayed {report['calls']} tool calls ({report['events']} events) under ledger "
        f"{escape(report['ledger']['id'])} ({report['ledger']['hash']}) and policy "
        f"{escape(report['policy']['id'])} ({report['policy']['mode']})",
        highlight=False,
    )
    console.print(
        f"scope changed: {c['scope_changed']} (newly out {c['newly_out_of_scope']}, newly in "
        f"{c['newly_in_scope']}); decision changed: {c['decision_changed']} (newly blocked "
        f"{c['newly_blocked']}, newly passed {c['newly_passed']})",
        highlight=False,
    )
    headers = ("target", "tool", "scope", "decision", "calls", "example runs")
    rows = [
        (
            g["target"],
            g["tool"],
            g["scope"] or "",
            g["decision"] or "",
            str(g["calls"]),
            ", ".join(g["example_runs"]),
        )
        for g in report["changes"][:top]
    ]
    emit(console, "calls that would change (by target and tool)", headers, rows, right=("calls",))
    emit(
        console,
        "metrics: recorded vs candidate (95% intervals, case-clustered when runs name "
        "several cases; first touch: Kaplan-Meier)",
        ("metric", "recorded", "candidate"),
        [tuple(row) for row in metric_rows(report)],
    )
    i = report["interrupted"]
    if i["runs"]:
        steps = ", ".join(f"step {s}: {n}" for s, n in i["at_step"].items())
        console.print(
            f"runs that would have been interrupted: {i['runs']} of {i['of_runs']} ({steps})"
        )
    show_unused(report["unused_reach"], console)
    for p in report["not_fully_replayed"][:top]:
        console.print(
            f"[yellow]not fully replayed[/]: {p['calls']} calls: {escape(p['why'])} "
            f"(e.g. run {escape(p['example_runs'][0])})",
            highlight=False,
        )


def show_unused(cov: dict[str, Any] | None, console: Console) -> None:
    if not cov:
        return
    used = ", ".join(f"{k} {v['used']}/{v['declared']}" for k, v in cov["by_kind"].items())
    console.print(f"ledger coverage (used/declared): {used or 'no entries'}", highlight=False)
    for e in cov["unused"]:
        console.print(f"  unused: {e['where']}: {escape(e['entry'])}", highlight=False)


def markdown(report: dict[str, Any]) -> str:
    c = report["counts"]
    lines = [
        f"# Replay under ledger `{report['ledger']['id']}` and policy `{report['policy']['id']}`",
        "",
        f"{report['calls']} tool calls in {', '.join(report['traces'])}.",
        "",
        f"- scope changed: {c['scope_changed']} (newly out {c['newly_out_of_scope']}, "
        f"newly in {c['newly_in_scope']})",
        f"- decision changed: {c['decision_changed']} (newly blocked {c['newly_blocked']}, "
        f"newly passed {c['newly_passed']})",
        f"- not fully re-extracted: {c['incomplete']}; trace/1 fallback: {c['fallback']}",
        "",
        "## Changes",
        "",
        "| target | tool | scope | decision | calls | example runs |",
        "|---|---|---|---|---:|---|",
    ]
    for g in report["changes"]:
        lines.append(
            f"| {g['target']} | {g['tool']} | {g['scope'] or ''} | {g['decision'] or ''} | "
            f"{g['calls']} | {', '.join(g['example_runs'])} |"
        )
    lines += ["", "## Metrics", "", "| metric | recorded | candidate |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c_} |" for a, b, c_ in metric_rows(report)]
    i = report["interrupted"]
    lines += [
        "",
        "## Interrupted runs",
        "",
        f"{i['runs']} of {i['of_runs']} runs; first newly blocked step: "
        + (", ".join(f"{s}: {n}" for s, n in i["at_step"].items()) or "none"),
        "",
        i["note"] + ".",
        "",
        "## Unused reach",
        "",
    ]
    cov = report["unused_reach"]
    lines += [f"- `{e['where']}`: {e['entry']}" for e in cov["unused"]] or ["none"]
    if report["not_fully_replayed"]:
        lines += ["", "## Not fully replayed", ""]
        lines += [f"- {p['calls']} calls: {p['why']}" for p in report["not_fully_replayed"]]
    return "\n".join(lines) + "\n"
