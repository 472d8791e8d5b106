"""Grid throughput: trajectories per second for the 12-cell grid over the bundled cases.

Runs the real grid (reference agent, simulated model, real proxy, fixture world)
twice in one process: with the in-process reference agent, and with the same
agent as a subprocess per trajectory (`--agent`), and prints JSON with the
rates, their ratio, the share of wall time spent inside the proxy addon, and the
projected time for the issue's target (12 cells x 20 cases x 50 reps = 12,000
trajectories in under 15 minutes with the in-process agent). `--full` runs the
12,000 for real instead of projecting. With `--processes N` (default 2) it also runs the
in-process grid over N worker processes and prints the ratio of the two rates.

    python bench/grid.py [--reps 4] [--agent-reps 1] [--workers 8] [--processes 2] [--full]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
from pathlib import Path

from offscope.evalmode.case import BUNDLED, load_cases
from offscope.evalmode.grid import Grid, GridConfig, parse_cells


def run(cases, reps: int, workers: int, agent: str | None, out: Path, processes: int = 1) -> dict:
    cfg = GridConfig(
        processes=processes,
        cases=cases,
        cells=parse_cells("all"),
        reps=reps,
        out=out,
        workers=workers,
        agent_cmd=agent,
        operator_timeout=0.0,
    )
    grid = Grid(cfg)
    asyncio.run(grid.run())
    t = grid.timings
    return {
        "trajectories": t["trajectories"],
        "wall_seconds": round(t["wall_seconds"], 2),
        "trajectories_per_second": round(t["trajectories"] / t["wall_seconds"], 2),
        "proxy_share_of_wall": round(t["proxy_share"], 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--agent-reps", type=int, default=1)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument(
        "--processes",
        type=int,
        default=2,
        help="also run the in-process grid with this many worker processes (1: skip)",
    )
    ap.add_argument(
        "--full", action="store_true", help="run 50 reps in-process (the 12,000-trajectory target)"
    )
    args = ap.parse_args()
    cases = load_cases([BUNDLED])
    with tempfile.TemporaryDirectory() as tmp:
        inproc = run(
            cases, 50 if args.full else args.reps, args.workers, None, Path(tmp) / "inproc"
        )
        multi = (
            run(cases, args.reps, args.workers, None, Path(tmp) / "multi", args.processes)
            if args.processes > 1
            else None
        )
        sub = run(
            cases,
            args.agent_reps,
            args.workers,
            f"{sys.executable} -m offscope.evalmode.agent",
            Path(tmp) / "subprocess",
        )
    target = 12 * 20 * 50
    projected = target / inproc["trajectories_per_second"] / 60
    print(
        json.dumps(
            {
                "bench": "grid",
                "python": platform.python_version(),
                "cases": len(cases),
                "cells": 12,
                "in_process": inproc,
                "processes": args.processes,
                "in_process_with_processes": multi,
                "processes_over_one_rate": round(
                    multi["trajectories_per_second"] / inproc["trajectories_per_second"], 3
                )
                if multi
                else None,
                "agent_subprocess": sub,
                "subprocess_over_in_process_rate": round(
                    sub["trajectories_per_second"] / inproc["trajectories_per_second"], 3
                ),
                "target": {"trajectories": target, "minutes_lt": 15},
                "projected_minutes_for_target": None if args.full else round(projected, 1),
                "measured_minutes_for_target": round(inproc["wall_seconds"] / 60, 1)
                if args.full
                else None,
                "met": (inproc["wall_seconds"] / 60 if args.full else projected) < 15,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
