"""`offscope grid` and `offscope demo`: run the scope-conformance grid."""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from offscope.errors import InputError
from offscope.evalmode.infra import add_argument as add_infra_argument

if TYPE_CHECKING:
    from offscope.evalmode.report.results_model import Results

GRID_EPILOG = """\
cells: SCOPE-REPLY-FRICTION with scope open|closed, reply affirmative|timeout|sentinel,
friction works|broken; `all` (12 cells) or `diagonal` (closed-sentinel-broken and
open-affirmative-broken, the two to run first).

agents: by default the in-process reference agent talks to the built-in simulated
model (a seeded stand-in, labelled as simulated in every report). Use a real model
with --model-url URL --model NAME [--api-key-env VAR], or any agent program with
--agent "COMMAND"; it runs once per trajectory with this environment:
  HTTPS_PROXY/HTTP_PROXY   the offscope proxy, with the run id as proxy user
  SSL_CERT_FILE, REQUESTS_CA_BUNDLE, NODE_EXTRA_CA_CERTS   the proxy's CA bundle
  OFFSCOPE_BRIEF, OFFSCOPE_SYSTEM_PROMPT, OFFSCOPE_SCOPE_CLAUSE   the task and the clause
  OFFSCOPE_TOOLS           JSON: {"tools": [...], "mcp_servers": [urls]}
  OFFSCOPE_OPERATOR_URL    POST {"question": ...} here to ask the operator
  OFFSCOPE_RUN_ID, OFFSCOPE_CASE, OFFSCOPE_CELL, OFFSCOPE_SEED, OFFSCOPE_MAX_STEPS
  OFFSCOPE_MODEL_URL, OFFSCOPE_MODEL   the model to use (the simulated one unless named)

examples:
  offscope grid --cells diagonal --reps 20 --out runs/diag
  offscope grid --cells all --reps 50 --workers 16 --out runs/full --seed 7
  offscope grid --agent "python my_agent.py" --cells diagonal --reps 10 --out runs/mine
  offscope grid --cells all --reps 50 --shard 0/4 --out runs/shard0     # then: offscope merge
Re-running the same command into the same --out resumes: only missing trajectories run,
and the runs that ended on an infrastructure failure (infra_error) run again.

infrastructure failures: a trajectory whose model endpoint or agent process failed for an
infrastructure reason ends with `infra_error` (an --agent command reports one by exiting
with 75, EX_TEMPFAIL). It is never a result: in no rate and no n, counted per cell.
Exit code 1 when more runs than --max-infra-errors (default 0) ended so; the reports are
written either way. One process per --out: a second one exits 2 naming the holder.
"""


def _add_grid_args(p: argparse.ArgumentParser, *, demo: bool) -> None:
    p.add_argument(
        "--cases",
        nargs="+",
        default=None,
        metavar="DIR|FILE",
        help="case files or directories (default: the bundled cases)",
    )
    p.add_argument(
        "--cells", default="all", help="all | diagonal | comma list of cell ids (default all)"
    )
    p.add_argument(
        "--reps", type=int, default=3 if demo else 10, help="repetitions per case and cell"
    )
    p.add_argument(
        "--out",
        default="offscope-demo" if demo else None,
        required=not demo,
        help="output directory (results.json, report.md, report.html, trajectories.jsonl)",
    )
    p.add_argument(
        "--workers", type=int, default=8, help="trajectories run concurrently (default 8)"
    )
    p.add_argument(
        "--seed", type=int, default=0, help="grid seed (trajectory seeds derive from it)"
    )
    add_infra_argument(p)
    p.add_argument(
        "--draws",
        choices=("independent", "common"),
        default="independent",
        help="independent (default): every (cell, case, rep) gets its own seed, contrasts are "
        "unpaired; common: the same (case, rep) seed in every cell (the simulated model "
        "then shares its random draws across cells, which makes paired p-values optimistic)",
    )
    if demo:
        return
    p.add_argument("--shard", default=None, help="I/N: run only this shard of the trajectories")
    p.add_argument(
        "--agent", default=None, help="agent command run per trajectory (default: reference agent)"
    )
    p.add_argument(
        "--model-url", default=None, help="OpenAI-compatible base URL (default: simulated model)"
    )
    p.add_argument("--model", default=None, help="model name at --model-url")
    p.add_argument("--api-key-env", default=None, help="environment variable holding the API key")
    p.add_argument(
        "--effort", default=None, help="model effort setting, recorded in the configuration"
    )
    p.add_argument(
        "--safeguards",
        default=None,
        help="safeguard/classifier state, recorded in the configuration",
    )
    p.add_argument(
        "--disposition", default="default", help="simulated model profile (name or YAML file)"
    )
    p.add_argument(
        "--operator-timeout", type=float, default=0.2, help="seconds the timeout reply waits"
    )
    p.add_argument("--timeout", type=float, default=120.0, help="seconds before an agent is killed")
    p.add_argument("--max-steps", type=int, default=20, help="reference agent step limit")
    p.add_argument(
        "--stream", action="store_true", help="reference agent requests streamed completions"
    )


def register(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser(
        "grid",
        help="run the scope-conformance grid (cases x clause x reply x friction x reps)",
        description="Run real agents through the real proxy against the fixture world, over "
        "the grid of scope clause x operator reply x friction, and report.",
        epilog=GRID_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_grid_args(g, demo=False)
    g.set_defaults(func=run_grid)
    d = sub.add_parser(
        "demo",
        help="the main job: the 12-cell grid on the bundled cases (simulated model)",
        description="Run the full 12-cell grid on the bundled cases with the reference agent and "
        "the simulated model through the real proxy, print the grid table and where "
        "the HTML report is. The model is SIMULATED: this demonstrates the product, "
        "it does not measure any real model.",
        epilog="example:  offscope demo --reps 5 --out my-demo",
    )
    _add_grid_args(d, demo=True)
    d.set_defaults(func=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    for name, value in (
        ("shard", None),
        ("agent", None),
        ("model_url", None),
        ("model", None),
        ("api_key_env", None),
        ("effort", None),
        ("safeguards", None),
        ("disposition", "default"),
        ("operator_timeout", 0.2),
        ("timeout", 120.0),
        ("max_steps", 20),
        ("stream", False),
    ):
        setattr(args, name, value)
    return run_grid(args)


def run_grid(args: argparse.Namespace) -> int:
    from offscope.evalmode.case import BUNDLED, load_cases
    from offscope.evalmode.grid import Grid, GridConfig, parse_cells, parse_shard
    from offscope.evalmode.report.results import build_results, write_reports

    if args.reps < 1:
        raise InputError("--reps must be at least 1")
    if args.workers < 1:
        raise InputError("--workers must be at least 1")
    if bool(args.model_url) != bool(args.model):
        raise InputError(
            "--model-url and --model go together",
            hint="name both, or neither for the simulated model",
        )
    case_paths = args.cases or [str(BUNDLED)]
    cases = load_cases(case_paths)
    cfg = GridConfig(
        cases=cases,
        cells=parse_cells(args.cells),
        reps=args.reps,
        out=Path(args.out),
        seed=args.seed,
        workers=args.workers,
        shard=parse_shard(args.shard),
        agent_cmd=args.agent,
        model_url=args.model_url,
        model=args.model,
        api_key_env=args.api_key_env,
        disposition=args.disposition,
        effort=args.effort,
        safeguards=args.safeguards,
        operator_timeout=args.operator_timeout,
        timeout=args.timeout,
        max_steps=args.max_steps,
        stream=args.stream,
        case_paths=case_paths,
        draws=args.draws,
    )
    console = Console(stderr=True)
    label = "simulated model" if cfg.simulated else args.model
    console.print(
        f"offscope grid: {len(cases)} cases x {len(cfg.cells)} cells x {args.reps} reps "
        f"({label}, agent: {args.agent or 'reference'}, draws: {cfg.draws}) -> {args.out}"
    )
    started = time.perf_counter()
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    ) as progress:
        task = progress.add_task("trajectories", total=None)

        def tick(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        summary = asyncio.run(Grid(cfg, tick).run())
    if summary["resumed_from"]:
        console.print(
            f"resumed: {summary['resumed_from']} trajectories were already done, ran {summary['ran']}"
        )
    results = build_results(cfg.out)
    paths = write_reports(cfg.out, results)
    print_grid(results)
    console.print(
        f"{summary['ran']} trajectories in {time.perf_counter() - started:.0f}s. "
        f"Report: {paths['html'].resolve()}  (also {paths['md'].name}, {paths['json'].name})"
    )
    return infra_exit_code(results, args.max_infra_errors, console)


def infra_exit_code(results: Results, threshold, console: Console) -> int:
    """1 when more runs ended on an infrastructure failure than the threshold allows
    (the result is incomplete and must not look clean), else 0."""
    from rich.markup import escape

    from offscope.evalmode.infra import RESUME_HINT, over_threshold, summary

    problem = over_threshold(results, threshold)
    if problem:
        console.print(f"[bold red]incomplete:[/] {escape(problem)}. {RESUME_HINT}.")
        return 1
    if results.infra_error_count:
        console.print(f"[yellow]{escape(summary(results))}, within --max-infra-errors[/]")
    return 0


def print_grid(results: Results) -> None:
    # the report's columns, from the metric catalog
    from offscope.evalmode.report.render import COLUMNS
    from offscope.trace.rates import rate_text

    table = Table(title=results.title)
    for col in ("cell", "n", *(header for _, header in COLUMNS), "touches/1k", "infra err"):
        table.add_column(col, justify="left" if col == "cell" else "right")
    for cell_id, c in results.cells.items():
        r = c.rates

        def fmt(key: str, r=r) -> str:
            x = r[key]  # its one interval, printed as every report prints it (k/n: no room)
            return rate_text(x.k, x.n, x.interval, counts=False)

        touches = c.touches_per_1000_runs
        table.add_row(
            cell_id,
            str(c.n),
            *(fmt(key) for key, _ in COLUMNS),
            "–" if touches is None else f"{touches:.0f}",
            str(c.infra_errors),
        )
    Console(width=160).print(table)
