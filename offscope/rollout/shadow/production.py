"""Shadow-compare's input from production: a production trace folded with the
same code as the eval suite (`load_production`), and the eval cells it is held
to (`choose_cells`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from offscope.errors import InputError
from offscope.evalmode.report.results_model import Results
from offscope.trace.events import (
    AssemblyEvent,
    Event,
    OperatorEvent,
    RunStart,
    ToolCallEvent,
)
from offscope.trace.metrics import RunState, fold
from offscope.trace.reader import read_traces

INTENDED = "closed-sentinel-broken"
TODAY = "open-affirmative-broken"
KNOBS = ("scope", "reply", "friction")


@dataclass
class Production:
    """A production trace, folded with the same code as the eval suite."""

    path: str
    runs: dict[str, RunState]
    tool_calls: int  # tagged tool calls (steps), all sources but llm proposals
    non_host_target_calls: int  # tool calls carrying a target other than a host
    replies: Counter  # operator reply policy -> count
    ledgers: Counter  # ledger id -> runs
    policies: Counter  # policy id (RunStart) -> runs
    cells: Counter  # grid cell label (if any) -> runs
    assembly: list[AssemblyEvent] = field(default_factory=list)  # the four changes, as recorded

    @property
    def open_runs(self) -> int:
        return sum(r.ended is None for r in self.runs.values())


def load_production(
    path: str | Path, ledger: str | None = None, labels: dict[str, str] | None = None
) -> Production:
    """A production trace, optionally only the runs under one ledger and the runs
    whose labels (set when the run was started: docs/runs.md) include `labels`."""
    events = list(read_traces([path]))  # rotated, compressed segments; a glob
    if ledger is not None:
        ledgers = {e.ledger for e in events}
        if ledger not in ledgers:
            raise InputError(
                f"no runs under ledger {ledger!r} in the trace",
                path=str(path),
                hint=f"ledgers in it: {', '.join(sorted(ledgers)) or 'none'}",
            )
        events = [e for e in events if e.ledger == ledger]
    if labels:
        matched = matching_runs(events, labels)
        if not matched:
            seen = sorted(
                {
                    f"{k}={v}"
                    for e in events
                    if isinstance(e, RunStart)
                    for k, v in e.labels.items()
                    if k != "auth"
                }
            )
            raise InputError(
                f"no runs labelled {', '.join(f'{k}={v}' for k, v in labels.items())} in the trace",
                path=str(path),
                hint=f"labels in it: {', '.join(seen[:20]) or 'none'}",
            )
        events = matched
    return production_from_events(str(path), events)


def matching_runs(events: Iterable[Event], labels: dict[str, str]) -> list[Event]:
    """The events of the runs whose run_start labels include every `labels` item.
    A run id started again is judged by its new run_start (fold's instances)."""
    keep: dict[str, bool] = {}
    out = []
    for e in events:
        if isinstance(e, RunStart):
            keep[e.run] = all(e.labels.get(k) == v for k, v in labels.items())
        if keep.get(e.run):
            out.append(e)
    return out


def production_from_events(path: str, events: Iterable[Event]) -> Production:
    events = list(events)
    runs = {k: s for k, s in fold(events).items() if not s.infra_error}  # never results
    calls = non_host = 0
    replies: Counter = Counter()
    policies: Counter = Counter()
    cells: Counter = Counter()
    assembly: list[AssemblyEvent] = []
    for e in events:
        if isinstance(e, ToolCallEvent) and e.step is not None:
            calls += 1
            if any(t.kind != "host" for t in e.call.targets):
                non_host += 1
        elif isinstance(e, OperatorEvent):
            replies[e.policy] += 1
        elif isinstance(e, RunStart):
            policies[e.policy or "?"] += 1
            cell = _cell_label(e.labels)
            if cell:
                cells[cell] += 1
        elif isinstance(e, AssemblyEvent):
            assembly.append(e)
    return Production(
        path=path,
        runs=runs,
        tool_calls=calls,
        non_host_target_calls=non_host,
        replies=replies,
        ledgers=Counter(r.ledger for r in runs.values()),
        policies=policies,
        cells=cells,
        assembly=assembly,
    )


def _cell_label(labels: dict[str, str]) -> str | None:
    if labels.get("cell"):
        return labels["cell"]
    if all(labels.get(k) for k in KNOBS):
        return "-".join(labels[k] for k in KNOBS)
    return None


def choose_cells(
    results: Results, prod: Production, requested: Sequence[str] = ()
) -> list[tuple[str, str]]:
    """[(cell, why it was chosen)], the primary first."""
    available = list(results.cells)
    if requested:
        missing = [c for c in requested if c not in results.cells]
        if missing:
            raise InputError(
                f"no cell {missing[0]!r} in the eval results",
                path=results.source,
                hint=f"cells: {', '.join(available)}",
            )
        return [(c, "--cell") for c in dict.fromkeys(requested)]
    if prod.cells:
        labelled = sorted(prod.cells)
        if len(labelled) > 1:
            raise InputError(
                f"the production trace mixes runs labelled with cells {', '.join(labelled)}",
                path=prod.path,
                hint="pick the one to compare with --cell",
            )
        cell = labelled[0]
        if cell not in results.cells:
            raise InputError(
                f"production runs are labelled with cell {cell!r}, which the eval results lack",
                path=results.source,
                hint=f"cells: {', '.join(available)}; or pass --cell",
            )
        return [(cell, "production runs are labelled with this cell")]
    diagonal = [c for c in (INTENDED, TODAY) if c in results.cells]
    if diagonal:
        why = {
            INTENDED: "the intended configuration (closed-world clause, no-authority sentinel, broken route)",
            TODAY: "what most harnesses run today (open-world brief, synthetic affirmative, broken route)",
        }
        return [(c, why[c] + "; production's configuration is not labelled") for c in diagonal]
    if len(available) == 1:
        return [(available[0], "the only cell in the eval results")]
    raise InputError(
        "production's configuration is not labelled and the eval results have neither diagonal cell",
        path=results.source,
        hint=f"pick one with --cell: {', '.join(available)}",
    )
