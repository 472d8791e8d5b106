"""`offscope rescore`: recompute behavioural metrics from stored responses, no API call."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

from offscope.cli._parsers import add_command, add_rules_option
from offscope.errors import InputError

_EPILOG = """\
Reads response texts from the report's agents[].live_details[].responses[].raw
(agent-evals JSON or offscope probe report); if no agent has them, from a
markdown transcript (## agent-id / ### Probe N: id (type) / #### Response (...)).
Writes the report back with live_scores.coherence_score, decisiveness_score and
mean_word_count recomputed, a `rescore` block per agent (all per-agent scores,
failure-mode counts) and per response. Without REPORT, builds a new report from
the transcript.

Examples:
  offscope rescore report.json --out rescored.json
  offscope rescore report.json --transcript transcript.md --rules agent-evals
  offscope rescore --transcript transcript.md          # report from the transcript alone
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(
        subparsers,
        "rescore",
        help="recompute coherence, decisiveness, verbosity from stored responses",
        description="Recompute behavioural trace metrics (coherence, decisiveness, verbosity, "
        "failure modes) from an existing probe report or transcript, without API calls.",
        epilog=_EPILOG,
    )
    p.add_argument(
        "report",
        nargs="?",
        metavar="REPORT.json",
        help="agent-evals or offscope probe report (JSON)",
    )
    p.add_argument(
        "--transcript", metavar="FILE.md", help="markdown transcript with the raw responses"
    )
    add_rules_option(p)
    p.add_argument("--out", metavar="FILE", help="write the enriched report here (default: stdout)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from offscope.behavior.rules import load_rules
    from offscope.probes.rescore import read_json, read_text, rescore

    if args.report is None and args.transcript is None:
        raise InputError(
            "nothing to rescore", hint="give REPORT.json, --transcript FILE.md, or both"
        )
    rules = load_rules(args.rules)
    report = read_json(args.report) if args.report else None
    transcript = read_text(args.transcript) if args.transcript else None
    result = rescore(report, rules, transcript)

    err = Console(stderr=True, highlight=False)
    if result.source == "none":
        err.print(
            "[yellow]warning:[/] no agent has live_details and no --transcript given; "
            "report returned unchanged"
        )
    else:
        err.print(
            f"rescored {len(result.rescored)} agent(s) from {result.source} (rules: {rules.name})"
        )
    if result.unmatched:
        err.print(
            f"[yellow]warning:[/] transcript agents not in the report (skipped): "
            f"{', '.join(sorted(result.unmatched))}"
        )
    text = json.dumps(result.report, indent=2) + "\n"
    if args.out:
        try:
            Path(args.out).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise InputError(f"cannot write: {exc}", path=args.out) from None
    else:
        sys.stdout.write(text)
    return 0
