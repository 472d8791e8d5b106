"""`offscope merge`: combine the shards of one grid into one result."""

from __future__ import annotations

import argparse

from rich.console import Console

from offscope.cli._parsers import add_command
from offscope.evalmode.infra import add_argument as add_infra_argument

EPILOG = """\
Each shard is the --out directory of `offscope grid ... --shard I/N`, all with the same
cases, cells, reps, seed, model and harness. The merged directory holds the same
results.json a single machine would have written for that grid (the configuration's
`shard` is null), plus report.md, report.html, trajectories.jsonl and grid.json.
Refuses (exit 2) shards of different grids, a run present in two shards, missing
runs (it names them), and a shard a grid is still writing. Runs that ended on an
infrastructure failure are carried over and counted; above --max-infra-errors (default 0)
the merge is written and exits 1: resume those shards, then merge again.

examples:
  offscope grid --cells all --reps 50 --shard 0/4 --out runs/shard0   # ... 1/4, 2/4, 3/4
  offscope merge runs/shard0 runs/shard1 runs/shard2 runs/shard3 --out runs/full
  offscope merge shards/grid-candidate-* --out out/candidate
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub,
        "merge",
        help="merge `grid --shard I/N` outputs into one result",
        description="Merge shard outputs of one grid into the result a single-machine run of "
        "the same grid and seed produces.",
        epilog=EPILOG,
    )
    p.add_argument("shards", nargs="+", metavar="DIR", help="shard output directories")
    p.add_argument("--out", required=True, metavar="DIR", help="where the merged result goes")
    add_infra_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from offscope.cli.grid import infra_exit_code, print_grid
    from offscope.evalmode.merge import merge

    results = merge(args.shards, args.out)
    print_grid(results)
    console = Console(stderr=True)
    console.print(
        f"merged {len(args.shards)} shard(s), {len(results.runs)} runs -> {args.out} "
        "(results.json, report.md, report.html)"
    )
    return infra_exit_code(results, args.max_infra_errors, console)
