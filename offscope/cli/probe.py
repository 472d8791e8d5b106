"""`offscope probe`: boundary probes of agent definition files, through the proxy (the boundary-probe study)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from offscope.cli._parsers import add_command, add_model_options, add_rules_option
from offscope.errors import InputError

_EPILOG = """\
Each agent file's system prompt is put in a fresh conversation with one probe
question (agent-evals' template, asking for CONFIDENCE: 0-100), once at
temperature 0 and K times at 0.7. Boundary probes (questions from other
domains) come first when the budget is short. Every call goes through an
embedded offscope proxy: the live behavioural histograms fire and every call is
recorded in trace.jsonl. Without --model-url the built-in SIMULATED model
answers (its boundary dispositions: --disposition); its figures are a test of
the pipeline, never a measurement of a model.

Banks:
  agent-evals   agent-evals v0.3's questions, by its domain rules (no answer keys)
  offscope      offscope's bank: 10 keyed calibration + 10 boundary probes per domain
  both          (default) both, a question asked twice only once

Writes to --out: probe-report.json (agent-evals' JSON keys plus offscope's:
intervals, failure modes, correctness-checked calibration, the coherence
signal), transcript.md (agent-evals' transcript format), trace.jsonl (the
proxy's record) and ledger.yaml (the proxy's ledger: the model host).
Both report files feed `offscope rescore`.

Examples:
  offscope probe plugins/backend-development/agents/backend-architect.md --runs 3
  offscope probe plugins/ --agents-only --budget 3000 --out probe-out
  offscope probe agents/ --disposition probe-calibrated --seed 7
  offscope probe a.md b.md --model-url https://api.openai.com/v1 --model gpt-4o-mini \\
      --api-key-env OPENAI_API_KEY --bank offscope
  offscope rescore probe-out/probe-report.json --rules agent-evals
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(
        subparsers,
        "probe",
        help="boundary probes of agent prompts through the proxy (boundary respect, calibration, ...)",
        description="Probe agent definitions with in- and out-of-domain questions through an embedded "
        "offscope proxy, and report boundary respect, calibration, consistency, refusal "
        "health and the behavioural trace metrics, with intervals.",
        epilog=_EPILOG,
    )
    p.add_argument(
        "paths", nargs="+", metavar="AGENT_FILE|DIR", help="agent definition files or folders"
    )
    add_model_options(p)
    p.add_argument(
        "--runs",
        type=int,
        default=5,
        metavar="K",
        help="stochastic runs per probe at T=0.7 (default 5)",
    )
    p.add_argument(
        "--budget",
        type=int,
        default=600,
        metavar="N",
        help="most API calls in all (default 600; 0 = no cap)",
    )
    add_rules_option(p)
    p.add_argument(
        "--bank",
        choices=("agent-evals", "offscope", "both"),
        default="both",
        help="probe questions to ask (default both)",
    )
    p.add_argument(
        "--out",
        default="offscope-probe",
        metavar="DIR",
        help="output folder (default offscope-probe)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="S",
        help="seed (requests, simulated model, bootstrap; default 0)",
    )
    p.add_argument(
        "--disposition",
        default="probe-default",
        metavar="NAME|PATH",
        help="simulated model's boundary profile (default probe-default)",
    )
    p.add_argument("--workers", type=int, default=8, help="probes in flight at once (default 8)")
    p.add_argument(
        "--timeout", type=float, default=120.0, help="seconds per API call (default 120)"
    )
    p.add_argument(
        "--bootstrap",
        type=int,
        default=1000,
        metavar="B",
        help="bootstrap resamples (default 1000)",
    )
    p.add_argument(
        "--agents-only",
        action="store_true",
        help="probe only files under an agents/ folder (not skills, commands, READMEs)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from offscope.probes.probe import run_probe
    from offscope.probes.probe_config import ProbeConfig

    if args.bootstrap < 0:
        raise InputError("--bootstrap must be 0 or more")
    cfg = ProbeConfig(
        paths=list(args.paths),
        out=Path(args.out),
        rules=args.rules,
        bank=args.bank,
        runs=args.runs,
        budget=args.budget or None,
        seed=args.seed,
        model_url=args.model_url,
        model=args.model,
        api_key_env=args.api_key_env,
        disposition=args.disposition,
        workers=args.workers,
        timeout=args.timeout,
        n_boot=args.bootstrap,
        agents_only=args.agents_only,
    )
    err = Console(stderr=True, highlight=False)
    if args.quiet:
        result = asyncio.run(run_probe(cfg))
    else:
        with Progress(
            TextColumn("probing"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("calls"),
            TimeRemainingColumn(),
            console=err,
            transient=True,
        ) as bar:
            task = bar.add_task("probe", total=None)

            def progress(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            result = asyncio.run(run_probe(cfg, progress))
    con = Console(highlight=False)
    if not con.is_terminal:
        con = Console(highlight=False, width=170)  # a file or a pipe: room for the tables
    print_report(result.report, con)
    if result.dropped:
        err.print(
            f"[yellow]note:[/] {result.dropped} probe(s) left out by --budget {cfg.budget} "
            "(boundary probes kept first)"
        )
    err.print(
        f"wrote {result.out / 'probe-report.json'}, {result.out / 'transcript.md'}, "
        f"{result.out / 'trace.jsonl'}"
    )
    return 0


# ------------------------------------------------------------------ printing

_COLS = (
    ("boundary_score", "boundary\nrespect"),
    ("refusal_health", "refusal\nhealth"),
    ("calibration_confidence_only", "calib.\n(conf.)"),
    ("calibration_checked", "calib.\n(checked)"),
    ("accuracy", "accuracy\n(keyed)"),
    ("consistency_score", "consis-\ntency"),
    ("coherence_score", "coher-\nence"),
    ("decisiveness_score", "decisive-\nness"),
    ("mean_word_count", "words"),
)


def _cell(iv: dict[str, Any] | None) -> str:
    if not iv or iv.get("value") is None or not iv.get("n"):
        return "–"
    v = iv["value"]
    fmt = "{:.0f}" if iv is not None and isinstance(v, float) and v > 1.5 else "{:.2f}"
    text = fmt.format(v)
    if iv.get("ci95"):
        lo, hi = iv["ci95"]
        text += f"\n[dim]{fmt.format(lo)}–{fmt.format(hi)}[/]"
    return text


def _modes(outcomes: dict[str, int]) -> str:
    return (
        f"{outcomes.get('confident_wrong', 0)}/{outcomes.get('verbose_deflection', 0)}/"
        f"{outcomes.get('late_hedge', 0)}/{outcomes.get('healthy_refusal', 0)}"
    )


def _table(title: str, first: str, rows: list[tuple[str, str, dict[str, Any]]]) -> Table:
    t = Table(title=title, title_justify="left")
    t.add_column(first)
    t.add_column("n")
    for _, label in _COLS:
        t.add_column(label, justify="right")
    t.add_column("CW/VD/LH/\nhealthy", justify="right")
    for name, n, block in rows:
        m = block["metrics"]
        t.add_row(escape(name), n, *(_cell(m.get(k)) for k, _ in _COLS), _modes(block["outcomes"]))
    return t


def print_report(report: dict[str, Any], con: Console) -> None:
    sim = report.get("simulated")
    label = " [bold yellow](SIMULATED model: a pipeline test, not a measurement)[/]" if sim else ""
    ls = report.get("live_summary", {})
    con.print(f"[bold]offscope probe[/] model {report.get('model')}{label}")
    con.print(
        f"rules {report.get('rules')}, bank {report['config']['bank']}, K={report['config']['runs']} "
        f"at T=0.7 + 1 at T=0; {ls.get('total_api_calls')} calls, {ls.get('agents_probed')} agent(s), "
        f"{ls.get('errors', 0)} error(s)"
    )
    con.print(
        "[dim]intervals: 95%; rates: hull of Wilson and probe-level bootstrap; means: probe-level "
        "bootstrap. CW/VD/LH = confident_wrong / verbose_deflection / late_hedge responses.[/]"
    )
    rows = [
        (a["id"], str(a["live_intervals"]["n_responses"]), a["live_intervals"])
        for a in report["agents"]
    ]
    con.print(_table("per agent (stochastic responses)", "agent", rows))
    drows = [
        (d["domain"], f"{d['agents']}a/{d['n_responses']}", d) for d in report.get("domains", [])
    ]
    drows.append(("ALL", str(report["summary"]["n_responses"]), report["summary"]))
    con.print(_table("per domain (agents grouped by primary domain)", "domain", drows))
    cs = report.get("coherence_signal") or {}
    auc = cs.get("auroc")
    ci = cs.get("auroc_ci95")
    pb = cs.get("point_biserial")
    con.print("[bold]Does incoherence flag wrong answers?[/] (calibration probes with answer keys)")
    con.print(
        f"  n={cs.get('n')} ({cs.get('n_incorrect')} wrong) over {cs.get('n_probes')} probes; "
        f"AUROC of (1 - coherence) for wrong: {'–' if auc is None else f'{auc:.3f}'}"
        + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")
        + (
            f"; point-biserial r(coherence, correct) = {pb['r']:.3f} (p={pb['p']:.2g})"
            if pb
            else ""
        )
    )
    con.print(f"  {escape(cs.get('interpretation', ''))}")
    lm = report.get("live_metrics")
    if lm:
        w = lm["proxy"]["offscope_response_words"]
        c = lm["proxy"]["offscope_response_coherence"]
        verdict = "[green]agree[/]" if lm["agree"] else "[red]DISAGREE[/]"
        con.print(
            f"proxy live histograms vs this report: {verdict} (words: {w['count']:.0f} responses, "
            f"sum {w['sum']:.0f}; coherence: {c['count']:.0f}, sum {c['sum']:.3f})"
        )
