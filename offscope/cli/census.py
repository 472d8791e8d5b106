"""`offscope census`: static scope census of agent definition files (seed 000)."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

_EPILOG = """\
Each unique system prompt is scored for scope clarity (domain keyword coverage),
boundary definition (scope-limiting language) and uncertainty guidance. Files
are .md/.txt (>= 20 bytes), frontmatter parsed, hidden folders skipped,
duplicates collapsed by SHA-256 of the system prompt. Kinds (agent, skill,
command, other) come from the path: .../agents/, .../skills/, .../commands/.

Rule sets:
  offscope      default: whole-word keywords, boundary language that limits scope
  agent-evals   agent-evals v0.3 exactly (substring keywords, its regexes)
  PATH.yaml     your own (copy offscope/evalmode/rules/offscope.yaml to start)

Examples:
  offscope census plugins/
  offscope census plugins/ --rules agent-evals        # seed 000: 496 files, 428 unique
  offscope census plugins/ --agents-only --json > census.json
  offscope census a.md b.md --csv > agents.csv
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "census", help="static scope census of agent prompts (scope clarity, boundaries, uncertainty)",
        description="Score agent definition files for scope clarity, boundary definition and "
                    "uncertainty guidance, and aggregate them.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="DIR|FILE", help="folders to walk or files to load")
    p.add_argument("--rules", default="offscope", metavar="NAME|PATH",
                   help="rule set: offscope (default), agent-evals, or a YAML file")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the full report as JSON")
    out.add_argument("--csv", action="store_true", help="print one CSV row per unique prompt")
    p.add_argument("--agents-only", action="store_true",
                   help="show only files under an agents/ folder (not skills, commands, READMEs)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from offscope.evalmode.census import run_census
    from offscope.evalmode.rules import load_rules
    rules = load_rules(args.rules)
    report = run_census(args.paths, rules, agents_only=args.agents_only)
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif args.csv:
        _csv(report)
    else:
        _human(report)
    return 0


def _csv(report: dict[str, Any]) -> None:
    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow(["id", "source", "kind", "instances", "scope_clarity", "boundary_definition",
                "uncertainty_guidance", "has_boundary_language", "has_uncertainty_guidance",
                "strong_domains", "word_count", "content_hash"])
    for a in report["agents"]:
        s = a["static_scores"]
        w.writerow([a["id"], a["source"], a["kind"], a["instance_count"], f"{s['scope_clarity_score']:.4f}",
                    s["boundary_definition_score"], s["uncertainty_guidance_score"],
                    s["has_boundary_language"], s["has_uncertainty_guidance"],
                    ";".join(s["strong_domains"]), s["word_count"], a["content_hash"]])


def _f(x: float | None, pct: bool = False) -> str:
    if x is None:
        return "–"
    return f"{x:.0%}" if pct else f"{x:.2f}"


def _human(report: dict[str, Any]) -> None:
    con = Console(highlight=False)
    kinds = ", ".join(f"{v} {k}" for k, v in report["kinds"].items())
    con.print(f"[bold]offscope census[/] (rules: {report['rules']})")
    con.print(f"{report['files_scanned']} files scanned, {report['unique']} unique, "
              f"{report['duplicates_collapsed']} duplicates collapsed (sha256 of system prompt)")
    con.print(f"unique prompts by kind: {kinds}")
    pops = [("agent files", "agents")] if report["agents_only"] else [
        ("all unique", "all"), ("agent files", "agents")]
    t = Table(title="static scores")
    t.add_column("metric")
    for label, key in pops:
        n = report["aggregate"][key]["n"]
        t.add_column(f"{label} (n={n})\nmean", justify="right")
        t.add_column("\nmedian", justify="right")
    for metric, label in (("scope_clarity", "scope clarity"), ("boundary_definition", "boundary definition"),
                          ("uncertainty_guidance", "uncertainty guidance")):
        cells = []
        for _, key in pops:
            a = report["aggregate"][key][metric]
            cells += [_f(a["mean"]), _f(a["median"])]
        t.add_row(label, *cells)
    for share, label in (("share_boundary_language", "with boundary language"),
                         ("share_uncertainty_guidance", "with uncertainty guidance")):
        cells = []
        for _, key in pops:
            cells += [_f(report["aggregate"][key][share], True), ""]
        t.add_row(label, *cells)
    con.print(t)
    d = Table(title="per domain (prompts with relevance > 0.5)")
    for col in ("domain", "prompts", "share", "boundary lang.", "uncertainty guid."):
        d.add_column(col, justify="left" if col == "domain" else "right")
    for row in report["domains"]:
        d.add_row(row["domain"], str(row["strong"]), _f(row["share_strong"], True),
                  _f(row["share_boundary_language"], True), _f(row["share_uncertainty_guidance"], True))
    con.print(d)
