"""`offscope shadow-compare`: production's scope metrics next to the eval suite's."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

from offscope.cli._parsers import add_command, add_output_option

EPILOG = """\
Both sides are folded by the same code (offscope.trace.metrics), so the numbers are
comparable by construction. Per key rate (investigated, prepared, acted, self-granted)
production is WORSE when it is significantly higher than the suite (Fisher exact,
two-sided) or above the upper bound of the suite's 95% interval (the one the grid
report prints) with at least --min-runs runs;
BETTER when significantly lower; NO WORSE THAN PREDICTED when at most --margin worse at 95%
(Newcombe interval); otherwise there are too few production runs to say, and it says
how many would. Touches per 1,000 runs are checked against the bound
deploy/prometheus/threshold.py computes from the same cell (the alert threshold).

production runs: all of them, or those under --ledger, or those whose labels include
--match-labels (set when the harness starts each run: docs/runs.md).

cell: --cell (repeatable, the first decides the exit code); else the cell production's
(matching) runs are labelled with; else both diagonal cells, closed-sentinel-broken (intended,
decides) and open-affirmative-broken (today's default).

With 200+ production runs it warns when no call carries a target other than a host or
no call is out of scope: a zero reading on a large sample usually means the traces are
not tagging targets.

exit codes: 0 production is not worse, 1 worse on a key rate, 2 bad input.

examples:
  offscope shadow-compare --baseline grid-out/results.json --candidate /var/lib/offscope/trace.jsonl
  offscope shadow-compare --baseline grid-out/ --candidate trace.jsonl --cell closed-sentinel-broken --markdown > shadow.md
  offscope shadow-compare --baseline results.json --candidate trace.jsonl --ledger billing-agent --json
  offscope shadow-compare results.json trace.jsonl --match-labels cell=closed-sentinel-broken   # positional form
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub,
        "shadow-compare",
        help="production trace vs the eval suite's cell: where production is worse; exit 1 if so",
        description="Shadow-mode rollout check: compute the scope metrics from a production trace "
        "and put them next to the eval grid's numbers for the matching cell, with "
        "intervals, saying where production is worse than the suite predicted.",
        epilog=EPILOG,
    )
    # The comparison commands' one convention (as gate): --baseline is the prediction,
    # --candidate what is checked against it. The two positionals still work.
    p.add_argument(
        "--baseline",
        metavar="RESULTS",
        help="the eval grid's results.json (or its directory): the prediction",
    )
    p.add_argument(
        "--candidate",
        metavar="TRACE",
        help="the production trace the sidecar wrote: what is checked against the prediction",
    )
    p.add_argument(
        "results",
        nargs="?",
        metavar="EVAL_RESULTS.json",
        help="the same as --baseline (positional form)",
    )
    p.add_argument(
        "trace",
        nargs="?",
        metavar="PRODUCTION_TRACE.jsonl",
        help="the same as --candidate (positional form)",
    )
    p.add_argument(
        "--cell",
        action="append",
        default=[],
        metavar="CELL",
        help="eval cell to compare with (repeatable; the first decides the exit code)",
    )
    p.add_argument("--ledger", default=None, help="only production runs under this ledger id")
    p.add_argument(
        "--match-labels",
        action="append",
        default=[],
        metavar="KEY=VALUE[,KEY=VALUE]",
        help="only production runs whose labels (POST /runs, docs/runs.md) include these "
        "(repeatable), e.g. --match-labels cell=closed-sentinel-broken",
    )
    p.add_argument(
        "--margin",
        type=float,
        default=0.05,
        help="'no worse than predicted' = at most this much worse, absolute (default 0.05)",
    )
    p.add_argument(
        "--alpha", type=float, default=0.05, help="two-sided significance level (default 0.05)"
    )
    p.add_argument(
        "--min-runs",
        type=int,
        default=20,
        help="production runs needed before 'above the suite's bound' counts (default 20)",
    )
    add_output_option(
        p, "--json", "print the comparison as JSON, or write it to FILE (default: not written)"
    )
    add_output_option(
        p,
        "--markdown",
        "print the Markdown report (an issue or PR comment), or write it to FILE "
        "(default: not written)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.markup import escape

    from offscope.errors import InputError
    from offscope.evalmode.report.results_model import load_results
    from offscope.rollout.shadow.compare import compare
    from offscope.rollout.shadow.production import load_production
    from offscope.rollout.shadow.render import headline, print_report, render_markdown

    md_stdout, json_stdout = args.markdown == "-", args.json == "-"
    if json_stdout and md_stdout:
        raise InputError(
            "--json and --markdown both print to stdout", hint="give one of them a FILE"
        )
    from offscope.cli._inputs import require_events, require_runs

    baseline = _one("--baseline", args.baseline, args.results, "EVAL_RESULTS.json")
    candidate = _one("--candidate", args.candidate, args.trace, "PRODUCTION_TRACE.jsonl")
    results = load_results(baseline)
    require_runs(results, "the grid results")
    require_events(candidate)
    prod = load_production(candidate, ledger=args.ledger, labels=_labels(args.match_labels))
    report = compare(
        results, prod, cells=args.cell, margin=args.margin, alpha=args.alpha, min_runs=args.min_runs
    )
    if args.markdown and not md_stdout:
        Path(args.markdown).write_text(render_markdown(report), encoding="utf-8")
    if args.json and not json_stdout:
        Path(args.json).write_text(
            json.dumps(report.as_dict(), indent=2, sort_keys=True), encoding="utf-8"
        )
    if json_stdout:
        print(json.dumps(report.as_dict(), indent=2, sort_keys=True))
    elif md_stdout:
        sys.stdout.write(render_markdown(report))
    else:
        print_report(report, Console(width=160))
        return report.exit_code
    # Machine output on stdout; the verdict in one line on stderr.
    style = "bold red" if report.finding else "bold green"
    Console(stderr=True, highlight=False).print(f"[{style}]{escape(headline(report))}[/]")
    return report.exit_code


def _labels(items: list[str]) -> dict[str, str]:
    from offscope.errors import InputError

    labels: dict[str, str] = {}
    for item in (part.strip() for spec in items for part in spec.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(
                f"--match-labels {item!r} is not KEY=VALUE",
                hint="e.g. --match-labels cell=closed-sentinel-broken",
            )
        labels[key] = value
    return labels


def _one(flag: str, named: str | None, positional: str | None, metavar: str) -> str:
    """The input given by its flag or by its position, never two different ones."""
    from offscope.errors import InputError

    if named and positional and named != positional:
        raise InputError(f"{flag} {named} and the positional {metavar} {positional} disagree")
    if not (named or positional):
        raise InputError(
            f"{flag} is required",
            hint="offscope shadow-compare --baseline RESULTS --candidate TRACE",
        )
    return str(named or positional)
