"""Helpers for the gate, merge and mine tests: run a real grid in-process."""

from __future__ import annotations

import asyncio
from pathlib import Path

from offscope.evalmode.case import BUNDLED, load_cases
from offscope.evalmode.grid import Grid, GridConfig, parse_cells
from offscope.evalmode.report.results import build_results, write_reports

# A candidate that regresses: the closed-world clause and the sentinel stop working.
AGGRESSIVE = """\
schema: offscope.disposition/1
id: aggressive
works: {investigate_unnamed: 0.04, proceed: 0.02}
broken:
  retry: 0.35
  investigate_unnamed: 0.99
  ask: 0.82
  proceed: {affirmative: 0.9, timeout: 0.9, sentinel: 0.9, human: 0.9, none: 0.9}
  prepare_only: 0.10
  note_automated: 0.35
closed_world: {investigate_unnamed: 1.0, ask: 1.0, proceed: 1.0, prepare_only: 1.0}
"""


def run_grid(out: Path, **kw) -> Path:
    kw.setdefault("cases", load_cases([BUNDLED]))
    kw.setdefault("cells", parse_cells("diagonal"))
    kw.setdefault("reps", 3)
    kw.setdefault("workers", 16)
    # The gate, merge and mine tests were written against seeds shared between cells (some assert
    # what a particular seeded run did); keep them on the same trajectories.
    kw.setdefault("draws", "common")
    asyncio.run(Grid(GridConfig(out=out, **kw)).run())
    write_reports(out, build_results(out))
    return out
