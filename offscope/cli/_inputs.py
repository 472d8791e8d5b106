"""What every reading command checks first: its input holds something to read.

A trace with no events (an empty file, a wrong path the shell created, a proxy
that never saw a run) or a results file with no runs measures nothing, and a
check computed over nothing passes: `--fail-on 'newly-blocked>0'` on an empty
trace would exit 0. So `report`, `replay`, `shadow-compare`, `mine` and `gate`
refuse such input with exit 2, naming the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from offscope.errors import InputError

if TYPE_CHECKING:
    from offscope.evalmode.report.results_model import Results

GRID_TRACE = "trajectories.jsonl"


def require_events(path: str | Path) -> None:
    """Raise InputError (exit 2) unless the trace file, or a grid directory's trace and
    its segments, holds at least one event. Reads only up to the first event."""
    from offscope.evalmode.outdir import trace_events, trace_exists
    from offscope.trace.reader import read_traces

    p = Path(path)
    if p.is_dir():
        trace = p / GRID_TRACE
        if not trace_exists(trace):
            raise InputError(
                "not a grid output directory (no trajectories.jsonl)",
                path=str(p),
                hint="pass a trace file or the --out directory of `offscope grid`",
            )
        events = trace_events(trace)
        shown = trace
    else:  # a file with its rotated segments, or a glob (offscope/trace/reader.py)
        events = read_traces([p])
        shown = p
    for _ in events:
        return
    raise InputError(
        "the trace holds no events" + (" (the file is empty)" if _empty(shown) else ""),
        path=str(shown),
        hint="nothing to measure: check the path, and that the proxy or grid wrote this file "
        "(a proxy writes its --trace once a run starts)",
    )


def require_runs(results: Results, what: str) -> None:
    """Raise InputError (exit 2) when a results file holds no run that is a result."""
    if results.runs:
        return
    extra = (
        f"; {results.infra_error_count} ended on an infrastructure failure"
        if results.infra_error_count
        else ""
    )
    raise InputError(
        f"{what} holds no runs{extra}",
        path=results.source,
        hint="nothing to compare: run the grid (again) into that directory, then pass its "
        "results.json",
    )


def _empty(path: Path) -> bool:
    try:
        return path.stat().st_size == 0
    except OSError:
        return False
