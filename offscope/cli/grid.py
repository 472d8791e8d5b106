"""`offscope grid` and `offscope demo`: run the scope-conformance grid."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)

from offscope.cli._parsers import add_command, add_model_options, config_from_args
from offscope.errors import InputError
from offscope.evalmode.infra import add_argument as add_infra_argument
from offscope.heap import tune_collector
from offscope.trace.rates import pct

if TYPE_CHECKING:
    from offscope.evalmode.grid import Grid
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

  OFFSCOPE_MODEL_RETRIES, OFFSCOPE_MODEL_RETRY_WAIT, OFFSCOPE_MODEL_CONNECT_TIMEOUT,
  OFFSCOPE_MODEL_READ_TIMEOUT   the retry budget and timeouts for model calls
An agent command reports an infrastructure failure (the model endpoint could not be used:
refused, throttled past its retry budget, stalled) by exiting 75 (EX_TEMPFAIL): the run
ends as infra_error and is never scored.

a real model at scale (--model-url): every model call passes one gateway behind the proxy
that holds the endpoint's limits for all trajectories (--model-concurrency, --model-rpm,
--model-tpm; many 429s slow the whole endpoint down), detects stalls
(--model-read-timeout) and caches successful answers in --out/model-cache.sqlite, so a
resumed or retried trajectory does not pay twice (--no-cache to refuse). The reference
agent retries failed calls with backoff and jitter, honouring Retry-After, within
--model-retries / --model-retry-wait per trajectory.

progress: on a terminal, a progress bar; without one (a pipe, or CI=true), a plain line
every --progress-every seconds: done/total, trajectories/s, ETA, retries, infra errors.

examples:
  offscope grid --cells diagonal --reps 20 --out runs/diag
  offscope grid --cells all --reps 50 --workers 16 --out runs/full --seed 7
  offscope grid --agent "python my_agent.py" --cells diagonal --reps 10 --out runs/mine
  offscope grid --cells all --reps 50 --shard 0/4 --out runs/shard0     # then: offscope merge
  offscope grid --model-url https://llm.internal/v1 --model m-2026 --api-key-env LLM_KEY \
      --model-concurrency 64 --model-rpm 3000 --model-tpm 2000000 --out runs/real
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
        "--reps",
        type=int,
        default=3 if demo else 10,
        help=f"repetitions per case and cell (default {3 if demo else 10})",
    )
    p.add_argument(
        "--out",
        default="offscope-demo" if demo else None,
        required=not demo,
        help="output directory (results.json, report.md, report.html, runs.html, trajectories.jsonl)"
        + (" (default offscope-demo)" if demo else ""),
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="trajectories run concurrently (default 8; 256 with --model-url and the reference "
        "agent, whose trajectories mostly wait on the model)",
    )
    processes = min(os.cpu_count() or 1, 4) if demo else 1
    p.add_argument(
        "--processes",
        type=int,
        default=processes,
        metavar="N",
        help="worker processes, each with its own proxy, world and simulated model, running "
        "--workers trajectories at a time (default "
        + ("one per core, at most 4" if demo else "1; up to one per core")
        + "). Trajectories are split deterministically and the results equal one process's",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="grid seed (trajectory seeds derive from it; default 0)"
    )
    add_infra_argument(p)
    p.add_argument(
        "--progress-every",
        type=_positive(float),
        default=10.0,
        metavar="S",
        help="without a terminal (or with CI=true): seconds between progress lines (default 10)",
    )
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
    add_model_options(p)
    p.add_argument(
        "--effort", default=None, help="model effort setting, recorded in the configuration"
    )
    p.add_argument(
        "--safeguards",
        default=None,
        help="safeguard/classifier state, recorded in the configuration",
    )
    p.add_argument(
        "--disposition",
        default="default",
        help="simulated model profile (name or YAML file; default: default)",
    )
    p.add_argument(
        "--operator-timeout",
        type=float,
        default=0.2,
        help="seconds the timeout reply waits (default 0.2)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds before an agent is killed: an --agent command's whole run; the reference "
        "agent's own work, its waits for model and tool answers not counted (default 120)",
    )
    p.add_argument(
        "--max-steps", type=int, default=20, help="reference agent step limit (default 20)"
    )
    p.add_argument(
        "--stream", action="store_true", help="reference agent requests streamed completions"
    )
    _add_endpoint_args(p)


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
        return value

    return parse


def _add_endpoint_args(p: argparse.ArgumentParser) -> None:
    from offscope.evalmode.endpoint import RetryPolicy

    d = RetryPolicy()
    e = p.add_argument_group("model endpoint (--model-url)")
    # The endpoint's limits (none unless given), its retry budget and its timeouts
    # (by default the RetryPolicy's): one row per option.
    options: tuple[tuple[str, Callable[[str], Any], float | None, str, str], ...] = (
        (
            "--model-concurrency",
            _positive(int),
            None,
            "N",
            "at most N model requests in flight, all trajectories together (default: no limit)",
        ),
        (
            "--model-rpm",
            _positive(float),
            None,
            "N",
            "at most N model requests per minute (default: no limit)",
        ),
        (
            "--model-tpm",
            _positive(float),
            None,
            "N",
            "at most N tokens per minute, estimated from the request size and settled with "
            "the answer's usage (default: no limit)",
        ),
        (
            "--model-retries",
            int,
            d.retries,
            "N",
            f"retries of failed model calls per trajectory (default {d.retries}); past them "
            "the run ends as infra_error, never a result",
        ),
        (
            "--model-retry-wait",
            _positive(float),
            d.wait_budget,
            "S",
            f"seconds of backoff per trajectory (default {d.wait_budget:g})",
        ),
        (
            "--model-connect-timeout",
            _positive(float),
            d.connect_timeout,
            "S",
            f"seconds to connect to the endpoint (default {d.connect_timeout:g})",
        ),
        (
            "--model-read-timeout",
            _positive(float),
            d.read_timeout,
            "S",
            f"seconds without a byte from the endpoint, the first byte included, before a "
            f"call counts as stalled and is retried (default {d.read_timeout:g}; raise it for a "
            "model that thinks long before answering without --stream)",
        ),
    )
    for flag, parse, default, metavar, text in options:
        e.add_argument(flag, type=parse, default=default, metavar=metavar, help=text)
    e.add_argument(
        "--no-cache",
        dest="cache",
        action="store_false",
        help="do not reuse or store model answers (default: cached in --out/model-cache.sqlite)",
    )


def register(sub: argparse._SubParsersAction) -> None:
    g = add_command(
        sub,
        "grid",
        help="run the scope-conformance grid (cases x clause x reply x friction x reps)",
        description="Run real agents through the real proxy against the fixture world, over "
        "the grid of scope clause x operator reply x friction, and report.",
        epilog=GRID_EPILOG,
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
        ("model_concurrency", None),
        ("model_rpm", None),
        ("model_tpm", None),
        ("cache", True),
    ):
        setattr(args, name, value)
    return run_grid(args)


def run_grid(args: argparse.Namespace) -> int:
    from offscope.evalmode.case import BUNDLED, load_cases
    from offscope.evalmode.endpoint import RetryPolicy
    from offscope.evalmode.grid import Grid, GridConfig, parse_cells, parse_shard
    from offscope.evalmode.report.results import build_results, write_reports

    if args.reps < 1:
        raise InputError("--reps must be at least 1")
    if args.workers is None:
        args.workers = 256 if getattr(args, "model_url", None) and not args.agent else 8
    if args.workers < 1:
        raise InputError("--workers must be at least 1")
    if args.processes < 1:
        raise InputError("--processes must be at least 1")
    if getattr(args, "model_retries", 0) < 0:
        raise InputError("--model-retries must not be negative")
    if bool(args.model_url) != bool(args.model):
        raise InputError(
            "--model-url and --model go together",
            hint="name both, or neither for the simulated model",
        )
    case_paths = args.cases or [str(BUNDLED)]
    cases = load_cases(case_paths)
    cfg = config_from_args(
        GridConfig,
        args,
        cases=cases,
        cells=parse_cells(args.cells),
        out=Path(args.out),
        shard=parse_shard(args.shard),
        agent_cmd=args.agent,
        case_paths=case_paths,
        retry=RetryPolicy(
            retries=getattr(args, "model_retries", RetryPolicy.retries),
            wait_budget=getattr(args, "model_retry_wait", RetryPolicy.wait_budget),
            connect_timeout=getattr(args, "model_connect_timeout", RetryPolicy.connect_timeout),
            read_timeout=getattr(args, "model_read_timeout", RetryPolicy.read_timeout),
        ),
    )
    console = Console(stderr=True)
    label = "simulated model" if cfg.simulated else args.model
    console.print(
        f"offscope grid: {len(cases)} cases x {len(cfg.cells)} cells x {args.reps} reps "
        f"({label}, agent: {args.agent or 'reference'}, draws: {cfg.draws}) -> {args.out}"
    )
    started = time.perf_counter()
    grid = Grid(cfg)
    tune_collector()  # the cases, the world and the simulated model live as long as the run
    summary = run_with_progress(grid, console, args.progress_every)
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
    if grid.endpoint_stats is not None:
        console.print(endpoint_summary(grid.endpoint_stats))
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


def endpoint_summary(stats: dict[str, Any]) -> str:
    cache = stats.get("cache")
    cached = f"cache {cache['hits']} hits, {cache['misses']} misses" if cache else "cache off"
    return (
        f"model endpoint: {stats['upstream_calls']} calls, {stats['upstream_failures']} failed "
        f"({stats['stalls']} stalled, {stats['limiter']['throttled']} throttled), "
        f"{stats['agent_retries']} retries, {stats['infra_errors']} infra errors, {cached}"
    )


def plain_progress() -> bool:
    """Lines for a log, not a bar: no terminal, or a CI runner (which may fake one)."""
    return not sys.stderr.isatty() or os.environ.get("CI", "").lower() in ("1", "true", "yes")


class ProgressReport:
    """done/total, trajectories per second, ETA, retries and infra errors so far."""

    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        self.done = 0
        self.total: int | None = None
        self.started = time.monotonic()

    def tick(self, done: int, total: int) -> None:
        self.done, self.total = done, total

    def fields(self) -> dict[str, Any]:
        grid = self.grid
        retries = grid.tally.retries
        if grid.cfg.agent_cmd and grid.gateway is not None:  # an agent command's own retries
            retries = grid.gateway.stats.upstream_failures  # are seen as failed upstream calls
        elapsed = max(1e-9, time.monotonic() - self.started)
        rate = self.done / elapsed
        eta = (self.total - self.done) / rate if rate and self.total else None
        return {
            "rate": rate,
            "eta": eta,
            "retries": retries,
            "infra_errors": grid.tally.infra_errors,
        }

    def line(self) -> str:
        f = self.fields()
        total = "?" if self.total is None else str(self.total)
        share = f" ({pct(self.done / self.total)})" if self.total else ""
        eta = _duration(f["eta"]) if f["eta"] is not None else "?"
        return (
            f"offscope grid: {self.done}/{total} done{share}, {f['rate']:.2f} trajectories/s, "
            f"ETA {eta}, retries {f['retries']}, infra errors {f['infra_errors']}"
        )


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def run_with_progress(grid: Grid, console: Console, every: float) -> dict[str, Any]:
    report = ProgressReport(grid)
    if plain_progress():
        return asyncio.run(_with_lines(grid, report, every))
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[rate]:.1f}/s  retries {task.fields[retries]}"),
        TextColumn("infra errors {task.fields[infra_errors]}"),
        console=console,
        transient=False,
    ) as progress:
        task = progress.add_task("trajectories", total=None, rate=0.0, retries=0, infra_errors=0)

        def tick(done: int, total: int) -> None:
            report.tick(done, total)
            _update(progress, task, report)

        grid.progress = tick
        return asyncio.run(_with_refresh(grid, lambda: _update(progress, task, report), 1.0))


def _update(progress: Progress, task: TaskID, report: ProgressReport) -> None:
    f = report.fields()
    progress.update(
        task,
        completed=report.done,
        total=report.total,
        rate=f["rate"],
        retries=f["retries"],
        infra_errors=f["infra_errors"],
    )


async def _with_lines(grid: Grid, report: ProgressReport, every: float) -> dict[str, Any]:
    grid.progress = report.tick
    summary = await _with_refresh(
        grid, lambda: print(report.line(), file=sys.stderr, flush=True), every
    )
    print(report.line(), file=sys.stderr, flush=True)
    return summary


async def _with_refresh(grid: Grid, refresh: Any, every: float) -> dict[str, Any]:
    """Run the grid, calling `refresh()` every `every` seconds (also while no trajectory
    finishes: a slow model must not look like a hung grid)."""
    stop = asyncio.Event()

    async def beat() -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), every)
            except TimeoutError:
                refresh()

    beating = asyncio.create_task(beat())
    try:
        return await grid.run()
    finally:
        stop.set()
        await beating


def print_grid(results: Results, console: Console | None = None) -> None:
    """The grid table, hiding nothing (offscope/cli/_table.py): a table where it fits,
    one block per cell on a narrow terminal, tab-separated rows in a CI log."""
    # the report's columns, from the metric catalog
    from offscope.cli._table import emit
    from offscope.evalmode.report.view_model import COLUMNS

    headers = ["cell", "n", *(header for _, header in COLUMNS), "touches/1k", "infra err"]
    rows = []
    for cell_id, c in results.cells.items():
        r = c.rates

        def fmt(key: str, r=r) -> str:
            # its one interval, printed as every report prints it (k/n: no room)
            return r[key].as_rate().text(counts=False)

        touches = c.touches_per_1000_runs
        rows.append(
            [
                cell_id,
                str(c.n),
                *(fmt(key) for key, _ in COLUMNS),
                "–" if touches is None else f"{touches:.0f}",
                str(c.infra_errors),
            ]
        )
    emit(console or Console(), results.title, headers, rows, right=headers[1:])
