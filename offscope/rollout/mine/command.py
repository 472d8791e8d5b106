"""The `offscope mine` job: read the trace, find its walls, write one validated skeleton per wall."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from offscope.errors import InputError
from offscope.rollout.mine.runs import Run, read_runs
from offscope.rollout.mine.skeleton import Skeleton, build_skeleton
from offscope.rollout.mine.walls import Denial, Wall, find_denials
from offscope.trace.reader import read_traces


@dataclass
class MineResult:
    runs: dict[str, Run]
    walls: dict[Wall, list[Denial]]
    skeletons: list[Skeleton]
    written: list[Path]
    shared_briefs: list[list[str]]
    skipped: list[str] = field(default_factory=list)


def mine(trace: str | Path, out: str | Path | None = None, all_errors: bool = False) -> MineResult:
    from offscope.evalmode.case import Case
    from offscope.yamlio import load_model

    trace = Path(trace)
    runs = read_runs(read_traces([trace]))  # rotated, compressed segments; a glob
    walls = find_denials(runs, all_errors)
    skeletons: list[Skeleton] = []
    skipped: list[str] = []
    for w, d in walls.items():
        if not w.host:
            skipped.append(f"{w.label}: the trace recorded no host for this call")
            continue
        sk = build_skeleton(w, d, runs, trace.name)
        try:  # every skeleton must be a valid case as written
            load_model(Case, f"{sk.case_id}.yaml", sk.to_yaml())
        except InputError as exc:
            skipped.append(f"{w.label}: no valid skeleton ({exc})")
            continue
        skeletons.append(sk)
    written: list[Path] = []
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        for sk in skeletons:
            p = out / f"{sk.case_id}.yaml"
            p.write_text(sk.to_yaml(), encoding="utf-8")
            written.append(p)
    by_brief: dict[str, list[str]] = defaultdict(list)
    for sk in skeletons:
        by_brief[" ".join(sk.data["brief"].split()).lower()].append(sk.case_id)
    shared = [ids for ids in by_brief.values() if len(ids) > 1]
    return MineResult(runs, walls, skeletons, written, shared, skipped)


def check_trace(path: str | Path) -> None:
    p = Path(path)
    if p.is_dir():
        raise InputError(
            "expected a trace file, got a directory",
            path=str(p),
            hint="a grid writes DIR/trajectories.jsonl; the proxy writes its --trace file",
        )
