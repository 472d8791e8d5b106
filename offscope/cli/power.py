"""`offscope power` and `offscope mde`: size a grid before running it.

Pick the minimum detectable effect before running and size accordingly.
`power` answers "how many trajectories per cell to detect p0 -> p1";
`mde` answers "with n per cell, what is the smallest change I can see".

Both compute the power of the test the report actually runs on a contrast
(`offscope.evalmode.stats.compare_cells`): Fisher's exact test (unpaired) and
the exact McNemar test (paired), and with several runs per case the
case-clustered t test as well, which must also reject. One run per case:
exact, every outcome enumerated. Several runs per case (--cluster-size): by
simulation of cases x reps with beta-distributed case rates at the given
ICC, with a stated number of draws and random state. The method is printed.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.table import Table

from offscope.cli._parsers import add_command
from offscope.errors import InputError
from offscope.trace.rates import pct

_METHOD_NOTE = """\
Method: the power of the test `offscope report` runs on a contrast, at the given alpha
and before the Holm adjustment across contrasts: Fisher's exact test (cells not paired)
and the exact McNemar test (paired by (case, rep); pair members taken as independent),
and the smaller of the two powers is shown. With one run per case the power is exact
(every outcome enumerated). With --cluster-size M > 1 the report also requires the
case-clustered t test over cases to reject, and the power is simulated: cases x M reps,
case rates beta-distributed with the given --icc, --draws draws, --random-state; the
Monte Carlo standard error is shown. The design effect 1 + (M - 1) * icc is printed for
reading only. Exit codes: 0 ok, 2 bad input.
"""

_POWER_EPILOG = (
    """\
examples:
  offscope power --p0 0.52 --p1 0.08
      runs per cell to see an open-world -> closed-world drop
  offscope power --p0 0.08 --p1 0.04 --cluster-size 5 --icc 0.1
      a halving of a small residual, 5 reps per case, cases correlated
  offscope power --p0 0.10 --p1 0.25 --one-sided --json
      a one-sided check, machine-readable

"""
    + _METHOD_NOTE
)

_MDE_EPILOG = (
    """\
examples:
  offscope mde --n 50 --p0 0.08
      smallest change from 8% visible at 50 runs per cell
  offscope mde --n 63 --p0 0.5 --cluster-size 3 --icc 0.2 --json

Reports both directions (a rise and a drop), since on the rate scale they differ.
With --cluster-size M, N is rounded down to whole cases of M runs.

"""
    + _METHOD_NOTE
)


def register(subparsers: Any) -> None:
    p = add_command(
        subparsers,
        "power",
        help="trajectories per cell needed to detect a change in a rate",
        description=(
            "Trajectories per cell needed for the report's contrast test to detect a change "
            "from rate P0 to rate P1, for runs clustered within cases."
        ),
        epilog=_POWER_EPILOG,
    )
    p.add_argument("--p0", type=float, required=True, help="rate in the reference cell, in (0, 1)")
    p.add_argument("--p1", type=float, required=True, help="rate to detect, in [0, 1], != P0")
    _common(p)
    p.set_defaults(func=run_power)

    m = add_command(
        subparsers,
        "mde",
        help="smallest change in a rate detectable with N trajectories per cell",
        description=(
            "Minimum detectable effect: the smallest absolute change from rate P0 that the "
            "report's contrast test detects with the given power at N trajectories per cell."
        ),
        epilog=_MDE_EPILOG,
    )
    m.add_argument("--n", type=int, required=True, help="trajectories per cell (>= 1)")
    m.add_argument("--p0", type=float, required=True, help="rate in the reference cell, in (0, 1)")
    _common(m)
    m.set_defaults(func=run_mde)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--alpha", type=float, default=0.05, help="significance level (default 0.05)")
    p.add_argument("--power", type=float, default=0.8, help="power, 1 - beta (default 0.8)")
    p.add_argument("--one-sided", action="store_true", help="one-sided test (default two-sided)")
    p.add_argument(
        "--cluster-size",
        type=int,
        default=1,
        metavar="M",
        help="runs per case in one cell, i.e. reps (default 1: independent runs)",
    )
    p.add_argument(
        "--icc",
        type=float,
        default=0.0,
        metavar="R",
        help="intraclass correlation of runs within a case, in [0, 1) (default 0)",
    )
    p.add_argument(
        "--draws",
        type=int,
        default=2000,
        help="simulated grids per power estimate when --cluster-size > 1 (default 2000)",
    )
    p.add_argument(
        "--random-state",
        type=int,
        default=0,
        help="random state of the simulation (default 0; same state, same answer)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _validate_common(args: argparse.Namespace) -> None:
    if not 0 < args.p0 < 1:
        raise InputError(
            f"--p0 {args.p0} is outside (0, 1)",
            hint="give the reference rate as a proportion, e.g. --p0 0.08 for 8%",
        )
    if not 0 < args.alpha < 1:
        raise InputError(f"--alpha {args.alpha} is outside (0, 1)", hint="e.g. --alpha 0.05")
    if not 0 < args.power < 1:
        raise InputError(f"--power {args.power} is outside (0, 1)", hint="e.g. --power 0.8")
    if args.power <= args.alpha:
        raise InputError(
            f"--power {args.power} is not above --alpha {args.alpha}",
            hint="power is the chance of detecting a real effect; use e.g. 0.8",
        )
    if args.cluster_size < 1:
        raise InputError(
            f"--cluster-size {args.cluster_size} is below 1",
            hint="the number of runs (reps) per case in one cell, e.g. --cluster-size 5",
        )
    if not 0 <= args.icc < 1:
        raise InputError(
            f"--icc {args.icc} is outside [0, 1)",
            hint="the intraclass correlation; `offscope report` prints it per cell",
        )
    if args.icc > 0 and args.cluster_size == 1:
        raise InputError(
            "--icc given without --cluster-size",
            hint="clustering needs both: runs per case (--cluster-size) and --icc",
        )
    if args.draws < 100:
        raise InputError(f"--draws {args.draws} is below 100", hint="e.g. --draws 2000")


def _console() -> Console:
    # Created per call so output goes to the current sys.stdout (tests capture it).
    return Console(highlight=False)


def _power_text(pw: Any) -> str:
    text = f"{pw.power:.3f}"
    if pw.mc_se is not None:
        text += f" ± {pw.mc_se:.3f} (Monte Carlo SE)"
    return text + f"  [Fisher {pw.power_fisher:.3f}, McNemar {pw.power_mcnemar:.3f}]"


def _design(args: argparse.Namespace) -> dict[str, Any]:
    from offscope.evalmode import stats

    return {
        "alpha": args.alpha,
        "power": args.power,
        "two_sided": not args.one_sided,
        "cluster_size": args.cluster_size,
        "icc": args.icc,
        "design_effect": stats.design_effect(args.cluster_size, args.icc),
        "draws": args.draws if args.cluster_size > 1 else None,
        "random_state": args.random_state if args.cluster_size > 1 else None,
    }


def _answer_table(title: str) -> Table:
    """The answer's table: a row per figure, its name in bold beside its value."""
    table = Table(title=title, show_header=False)
    table.add_column("", style="bold")
    table.add_column("")
    return table


def _test_row(table: Table, args: argparse.Namespace) -> None:
    table.add_row(
        "test",
        f"{'one' if args.one_sided else 'two'}-sided, alpha {args.alpha:g}, power {args.power:g}",
    )
    if args.cluster_size > 1:
        table.add_row(
            "clustering",
            f"{args.cluster_size} runs per case, icc {args.icc:g} "
            f"(design effect {1 + (args.cluster_size - 1) * args.icc:.2f}, for reading)",
        )


def run_power(args: argparse.Namespace) -> int:
    from offscope.evalmode import stats

    _validate_common(args)
    if not 0 <= args.p1 <= 1:
        raise InputError(
            f"--p1 {args.p1} is outside [0, 1]", hint="give the rate to detect as a proportion"
        )
    if args.p1 == args.p0:
        raise InputError("--p1 equals --p0", hint="there is no difference to detect")
    pw = stats.n_per_cell(
        args.p0,
        args.p1,
        args.alpha,
        args.power,
        not args.one_sided,
        args.cluster_size,
        args.icc,
        args.draws,
        args.random_state,
    )
    result: dict[str, Any] = {
        "p0": args.p0,
        "p1": args.p1,
        "difference": args.p1 - args.p0,
        **_design(args),
        "n_max": stats.N_MAX,
    }
    if pw is None:
        result.update(
            {
                "n_per_cell": None,
                "cases_per_cell": None,
                "achieved_power": None,
                "method": stats.power_method(args.cluster_size, args.draws, args.random_state),
            }
        )
    else:
        result.update(
            {
                "n_per_cell": pw.n_per_cell,
                "cases_per_cell": pw.cases,
                "achieved_power": pw.power,
                "power_fisher": pw.power_fisher,
                "power_mcnemar": pw.power_mcnemar,
                "mc_se": pw.mc_se,
                "method": pw.method,
            }
        )
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    table = _answer_table("Trajectories per cell")
    table.add_row("change to detect", f"{pct(args.p0)} -> {pct(args.p1)}")
    _test_row(table, args)
    if pw is None:
        table.add_row("n per cell", f"[bold]more than {stats.N_MAX}[/]")
    else:
        table.add_row("n per cell", f"[bold]{pw.n_per_cell}[/]")
        if args.cluster_size > 1:
            table.add_row("cases per cell", f"{pw.cases} x {args.cluster_size} reps")
        table.add_row("power at that n", _power_text(pw))
        table.add_row("method", pw.method)
    _console().print(table)
    return 0


def run_mde(args: argparse.Namespace) -> int:
    from offscope.evalmode import stats

    _validate_common(args)
    if args.n < 1:
        raise InputError(f"--n {args.n} is below 1", hint="trajectories per cell, e.g. --n 50")
    if args.cluster_size > 1 and args.n // args.cluster_size < 2:
        raise InputError(
            f"--n {args.n} is less than two cases of --cluster-size {args.cluster_size}",
            hint="the case-clustered test needs at least two cases",
        )
    kw: dict[str, Any] = dict(
        alpha=args.alpha,
        power=args.power,
        cluster_size=args.cluster_size,
        icc=args.icc,
        two_sided=not args.one_sided,
        draws=args.draws,
        seed=args.random_state,
    )
    up = stats.mde(args.n, args.p0, direction="up", **kw)
    down = stats.mde(args.n, args.p0, direction="down", **kw)
    n_used = (args.n // args.cluster_size) * args.cluster_size
    result: dict[str, Any] = {"n_per_cell": n_used, "p0": args.p0, **_design(args)}
    for name, m in (("up", up), ("down", down)):
        result[f"mde_{name}"] = None if m is None else m.effect
        result[f"p1_{name}"] = None if m is None else m.p1
        result[f"power_{name}"] = None if m is None else m.power
        result[f"mc_se_{name}"] = None if m is None else m.mc_se
    result["method"] = stats.power_method(args.cluster_size, args.draws, args.random_state)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    table = _answer_table("Minimum detectable effect")
    table.add_row("reference rate", pct(args.p0))
    cases = (
        f"  ({n_used // args.cluster_size} cases x {args.cluster_size} reps)"
        if args.cluster_size > 1
        else ""
    )
    table.add_row("n per cell", f"{n_used}{cases}")
    _test_row(table, args)
    for label, m, sign in (("smallest rise", up, "+"), ("smallest drop", down, "-")):
        table.add_row(
            label,
            "not detectable with this power"
            if m is None
            else f"{sign}{m.effect * 100:.1f} points (-> {pct(m.p1)}); power {_power_text(m)}",
        )
    table.add_row("method", result["method"])
    _console().print(table)
    return 0
