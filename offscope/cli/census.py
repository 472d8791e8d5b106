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
  agent-evals   default: agent-evals v0.3 exactly (substring keywords, its regexes)
  offscope      whole-word keywords, narrower boundary patterns
  PATH.yaml     your own (copy offscope/evalmode/rules/offscope.yaml to start)

"Boundary language" is a keyword classifier. Every run prints its precision and
recall (Wilson 95% intervals) against 160 hand-labelled prompts, a seeded random
sample of the bundled wshobson/agents corpus ("does the prompt limit the agent's
own scope?"). On that sample the offscope patterns are not better than
agent-evals' (lower recall, F1 and no better precision beyond noise), so
agent-evals is the default. Neither share is a measured share of prompts that
limit their scope: the labelled share is printed next to them.

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
    # agent-evals by default: the offscope boundary patterns did not beat it on the
    # labelled sample (census_validation; docs/probes.md).
    p.add_argument("--rules", default="agent-evals", metavar="NAME|PATH",
                   help="rule set: agent-evals (default), offscope, or a YAML file")
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
    _validation(con, report["rules"], report["boundary_validation"])


def _rate(r: dict[str, Any]) -> str:
    """A rate as `0.25 [0.07, 0.59] (2/8)`: point, Wilson 95% interval, counts."""
    if not r["n"]:
        return "–"
    lo, hi = r["ci95"]
    return f"{r['rate']:.2f} [{lo:.2f}, {hi:.2f}] ({r['k']}/{r['n']})"


def _validation(con: Console, rules: str, v: dict[str, Any]) -> None:
    con.print(f"[bold]How far to trust \"boundary language\"[/]: {v['question']}")
    con.print(f"sample: {v['sample']}; labelled share {_rate(v['labelled_share'])}")
    if v["validated"]:
        con.print(f"rules {rules} use the boundary patterns validated as {v['validated_as']!r}")
    else:
        con.print(f"rules {rules}: these boundary patterns are NOT validated (not one of the labelled "
                  "rule sets); the figures below are the built-in rule sets'")
    t = Table(title="boundary language vs hand labels (Wilson 95% intervals)")
    for col in ("rule set", "precision", "recall", "F1", "flags"):
        t.add_column(col, justify="left" if col == "rule set" else "right")
    for name, b in v["rule_sets"].items():
        t.add_row(name, _rate(b["precision"]), _rate(b["recall"]), _f(b["f1"]), _rate(b["flagged_share"]))
    con.print(t)
    for name, b in v["rule_sets"].items():
        if "precision_all_flagged" in b:
            con.print(f"{name}: precision over every prompt of the corpus it flags "
                      f"{_rate(b['precision_all_flagged'])}")
