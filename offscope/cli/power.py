"""`offscope power` and `offscope mde`: size a grid before running it.

The seed's advice is "pick your minimum detectable effect before you run and
size accordingly". `power` answers "how many trajectories per cell to detect
p0 -> p1"; `mde` answers "with n per cell, what is the smallest change I can
see". Both account for runs being clustered within cases via the design
effect 1 + (m - 1) * icc, where m is the runs per case in one cell (reps).
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from rich.console import Console
from rich.table import Table

from offscope.errors import InputError

_POWER_EPILOG = """\
examples:
  offscope power --p0 0.52 --p1 0.08
      runs per cell to see the seed's open-world -> closed-world drop
  offscope power --p0 0.08 --p1 0.04 --cluster-size 5 --icc 0.1
      a halving of a small residual, 5 reps per case, cases correlated
  offscope power --p0 0.10 --p1 0.15 --one-sided --json
      a one-sided regression check, machine-readable

Method: arcsine effect size (Cohen's h, Cohen 1988) via statsmodels
NormalIndPower, equal cells, times the design effect 1 + (m - 1) * icc
(Donner & Klar 2000). Exit codes: 0 ok, 2 bad input.
"""

_MDE_EPILOG = """\
examples:
  offscope mde --n 50 --p0 0.08
      smallest change from 8% visible at 50 runs per cell
  offscope mde --n 200 --p0 0.5 --cluster-size 10 --icc 0.2 --json

Reports both directions (a rise and a drop), since on the rate scale they
differ. Exit codes: 0 ok, 2 bad input.
"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "power",
        help="trajectories per cell needed to detect a change in a rate",
        description=(
            "Trajectories per cell needed to detect a change from rate P0 to rate P1 "
            "with a two-cell comparison, inflated for runs clustered within cases."
        ),
        epilog=_POWER_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--p0", type=float, required=True, help="rate in the reference cell, in (0, 1)")
    p.add_argument("--p1", type=float, required=True, help="rate to detect, in [0, 1], != P0")
    _common(p)
    p.set_defaults(func=run_power)

    m = subparsers.add_parser(
        "mde",
        help="smallest change in a rate detectable with N trajectories per cell",
        description=(
            "Minimum detectable effect: the smallest absolute change from rate P0 that a "
            "two-cell comparison with N trajectories per cell detects with the given power."
        ),
        epilog=_MDE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
        help="intraclass correlation of runs within a case, in [0, 1] (default 0)",
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
    if not 0 <= args.icc <= 1:
        raise InputError(
            f"--icc {args.icc} is outside [0, 1]",
            hint="the intraclass correlation; clustered_rate() estimates it from a grid",
        )
    if args.icc > 0 and args.cluster_size == 1:
        raise InputError(
            "--icc given without --cluster-size",
            hint="the design effect needs both: runs per case (--cluster-size) and --icc",
        )


def _console() -> Console:
    # Created per call so output goes to the current sys.stdout (tests capture it).
    return Console(highlight=False)


def _pct(x: float) -> str:
    return f"{x:.1%}"


def run_power(args: argparse.Namespace) -> int:
    from offscope.evalmode import stats
    _validate_common(args)
    if not 0 <= args.p1 <= 1:
        raise InputError(
            f"--p1 {args.p1} is outside [0, 1]", hint="give the rate to detect as a proportion"
        )
    if args.p1 == args.p0:
        raise InputError("--p1 equals --p0", hint="there is no difference to detect")
    two_sided = not args.one_sided
    n_iid = stats.n_per_cell(args.p0, args.p1, args.alpha, args.power, two_sided)
    deff = stats.design_effect(args.cluster_size, args.icc)
    n = stats.n_per_cell(
        args.p0, args.p1, args.alpha, args.power, two_sided, args.cluster_size, args.icc
    )
    h = 2 * math.asin(math.sqrt(args.p1)) - 2 * math.asin(math.sqrt(args.p0))
    result = {
        "p0": args.p0,
        "p1": args.p1,
        "difference": args.p1 - args.p0,
        "cohens_h": h,
        "alpha": args.alpha,
        "power": args.power,
        "two_sided": two_sided,
        "cluster_size": args.cluster_size,
        "icc": args.icc,
        "n_independent": n_iid,
        "design_effect": deff,
        "n_per_cell": n,
        "cases_per_cell": math.ceil(n / args.cluster_size),
        "method": "arcsine (Cohen's h, Cohen 1988) via statsmodels NormalIndPower; "
        "design effect 1+(m-1)*icc (Donner & Klar 2000)",
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    table = Table(title="Trajectories per cell", show_header=False)
    table.add_column("", style="bold")
    table.add_column("")
    table.add_row("change to detect", f"{_pct(args.p0)} -> {_pct(args.p1)}")
    table.add_row("Cohen's h", f"{h:+.3f}")
    table.add_row(
        "test", f"{'two' if two_sided else 'one'}-sided, alpha {args.alpha:g}, power {args.power:g}"
    )
    table.add_row("n if runs were independent", str(n_iid))
    table.add_row(
        "design effect", f"{deff:.2f}  (m={args.cluster_size} runs per case, icc={args.icc:g})"
    )
    table.add_row("n per cell", f"[bold]{n}[/]")
    if args.cluster_size > 1:
        table.add_row("cases per cell", f"{result['cases_per_cell']} x {args.cluster_size} reps")
    _console().print(table)
    return 0


def run_mde(args: argparse.Namespace) -> int:
    from offscope.evalmode import stats
    _validate_common(args)
    if args.n < 1:
        raise InputError(f"--n {args.n} is below 1", hint="trajectories per cell, e.g. --n 50")
    two_sided = not args.one_sided
    deff = stats.design_effect(args.cluster_size, args.icc)
    kw: dict[str, Any] = dict(
        alpha=args.alpha,
        power=args.power,
        cluster_size=args.cluster_size,
        icc=args.icc,
        two_sided=two_sided,
    )
    up = stats.mde(args.n, args.p0, direction="up", **kw)
    down = stats.mde(args.n, args.p0, direction="down", **kw)
    result = {
        "n_per_cell": args.n,
        "p0": args.p0,
        "alpha": args.alpha,
        "power": args.power,
        "two_sided": two_sided,
        "cluster_size": args.cluster_size,
        "icc": args.icc,
        "design_effect": deff,
        "effective_n": args.n / deff,
        "mde_up": up,
        "p1_up": None if up is None else args.p0 + up,
        "mde_down": down,
        "p1_down": None if down is None else args.p0 - down,
        "method": "arcsine (Cohen's h, Cohen 1988) via statsmodels NormalIndPower; "
        "design effect 1+(m-1)*icc (Donner & Klar 2000)",
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    table = Table(title="Minimum detectable effect", show_header=False)
    table.add_column("", style="bold")
    table.add_column("")
    table.add_row("reference rate", _pct(args.p0))
    table.add_row(
        "n per cell", f"{args.n}  (effective {args.n / deff:.1f}, design effect {deff:.2f})"
    )
    table.add_row(
        "test", f"{'two' if two_sided else 'one'}-sided, alpha {args.alpha:g}, power {args.power:g}"
    )
    table.add_row(
        "smallest rise",
        "not detectable" if up is None else f"+{up * 100:.1f} points (-> {_pct(args.p0 + up)})",
    )
    table.add_row(
        "smallest drop",
        "not detectable"
        if down is None
        else f"-{down * 100:.1f} points (-> {_pct(args.p0 - down)})",
    )
    _console().print(table)
    return 0
