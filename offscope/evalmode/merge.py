"""Merge shard outputs of one grid into the result a single machine would produce.

`offscope grid ... --shard I/N --out shardI` runs every N-th trajectory of the
grid's fixed plan. `merge` checks that the shards belong to one grid (their
configuration blocks agree on everything but `shard`), that together they
hold every planned run exactly once (it names the missing or doubled runs),
then writes one `trajectories.jsonl` with the runs in plan order (cell, case,
rep; each run's events in their recorded order), one `grid.json` with
`shard: null` and the shards' `model_endpoint_stats` combined (counts summed,
peaks the largest), and rebuilds results.json / report.md / report.html from that
trace with the same `build_results` as `offscope grid` and `offscope report`.
Results are computed from the trace in canonical run order, so the merged
results.json equals the unsharded one field for field.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from offscope.errors import InputError
from offscope.evalmode.endpoint import combine_stats
from offscope.evalmode.grid import trajectory_seed
from offscope.evalmode.outdir import OutdirLock, runs_of, trace_exists, trace_segments
from offscope.evalmode.report.results_model import Configuration, Results

SHARD_KEY = "shard"
STATS_KEY = "model_endpoint_stats"


@dataclass
class Shard:
    path: Path
    meta: dict[str, Any]
    config: Configuration
    spec: tuple[int, int] | None
    runs: dict[str, list[str]]  # run id -> raw event lines, in recorded order
    finished: set[str]
    requests: list[str]


def _read_shard(path: Path) -> Shard:
    meta_path, trace = path / "grid.json", path / "trajectories.jsonl"
    if not meta_path.exists() or not trace_exists(trace):
        raise InputError(
            "not a grid output directory (grid.json and trajectories.jsonl expected)",
            path=str(path),
            hint="pass the --out directories of `offscope grid --shard I/N`",
        )
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise InputError(f"grid.json is not JSON: {exc}", path=str(meta_path)) from None
    if not isinstance(meta, dict) or not isinstance(meta.get("configuration"), dict):
        raise InputError("grid.json has no configuration block", path=str(meta_path))
    try:
        config = Configuration.model_validate(meta["configuration"])
    except ValidationError as exc:
        problem = exc.errors(include_url=False)[0]
        where = ".".join(str(x) for x in problem["loc"])
        raise InputError(
            f"grid.json configuration: {where}: {problem['msg']}",
            path=str(meta_path),
            hint="pass the --out directories of `offscope grid --shard I/N`",
        ) from None
    spec = None
    if config.shard:
        i, _, n = config.shard.partition("/")
        spec = (int(i), int(n))
    # Runs that ended, with a result or on an infrastructure failure: both are the shard's
    # (an infra-error run is counted as such in the merged results, and fails its threshold).
    runs, finished = runs_of(trace)
    requests = [
        x if x.endswith("\n") else x + "\n"
        for segment in trace_segments(path / "requests.jsonl")
        for x in segment.read_text(encoding="utf-8").splitlines()
        if x.strip()
    ]
    return Shard(path, meta, config, spec, runs, finished, requests)


def planned_runs(config: Configuration) -> list[tuple[str, str]]:
    """(run id, trajectory seed) of every planned run, in plan order."""
    out = []
    independent = config.draws == "independent"  # grids before --draws shared seeds
    for cell in config.cells:
        for case in config.cases:
            for rep in range(config.reps or 0):
                seed = trajectory_seed(config.seed, case, rep, cell if independent else None)
                out.append((f"{cell}.{case}.r{rep}", str(seed)))
    return out


def _without_shard(config: Configuration) -> dict[str, Any]:
    """The block as written, but for `shard` (the one key shards of one grid differ in)."""
    return {k: v for k, v in config.as_dict().items() if k != SHARD_KEY}


def _differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def _listing(items: list[str], limit: int = 8) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def merge(shard_dirs: list[str | Path], out: str | Path) -> Results:
    """Merge shard directories into `out`; returns the results (also written)."""
    if not shard_dirs:
        raise InputError("no shard directories given")
    out = Path(out)
    dirs = [Path(d) for d in shard_dirs]
    resolved = [d.resolve() for d in dirs]
    if len(set(resolved)) != len(resolved):
        raise InputError("the same shard directory is given twice", path=str(dirs[0]))
    if out.resolve() in resolved:
        raise InputError("--out must not be one of the shard directories", path=str(out))
    # A shard a grid is still writing would merge half a shard: each is locked while read.
    with ExitStack() as held:
        for d in dirs:
            held.enter_context(OutdirLock(d, "offscope merge (reading it)", reading=True))
        held.enter_context(OutdirLock(out, "offscope merge"))
        return _merge(dirs, out)


def _merge(dirs: list[Path], out: Path) -> Results:
    from offscope.evalmode.report.results import build_results, write_reports

    shards = [_read_shard(d) for d in dirs]

    first = shards[0]
    ref = _without_shard(first.config)
    for s in shards[1:]:
        diff = _differences(ref, _without_shard(s.config))
        if diff:
            raise InputError(
                f"shard configuration differs from {first.path} in {', '.join(diff)}",
                path=str(s.path / "grid.json"),
                hint="only shards of one grid (same cases, cells, reps, seed, model, harness) merge",
            )
    for key in ("cells", "cases", "reps", "seed"):
        if key not in ref:
            raise InputError(
                f"configuration block has no {key!r}", path=str(first.path / "grid.json")
            )

    # Shard specs: one N, each index once (an unsharded directory is the whole grid).
    specs = [s.spec for s in shards]
    ns = {sp[1] for sp in specs if sp}
    if len(ns) > 1:
        raise InputError(
            f"shards split the grid differently (N = {', '.join(map(str, sorted(ns)))})",
            hint="merge the shards of one `--shard I/N` split",
        )
    seen_spec: dict[tuple[int, int], Path] = {}
    for s in shards:
        if s.spec in seen_spec:
            raise InputError(
                f"shard {s.spec[0]}/{s.spec[1]} given twice (also {seen_spec[s.spec]})",
                path=str(s.path),
            )
        if s.spec:
            seen_spec[s.spec] = s.path

    planned = planned_runs(first.config)
    plan_ids = [r for r, _ in planned]
    plan_set = set(plan_ids)
    owner: dict[str, Path] = {}
    overlap: list[str] = []
    unknown: list[str] = []
    for s in shards:
        for run in s.finished:
            if run not in plan_set:
                unknown.append(f"{run} ({s.path})")
            elif run in owner:
                overlap.append(f"{run} ({owner[run]} and {s.path})")
            else:
                owner[run] = s.path
    if overlap:
        raise InputError(
            f"{len(overlap)} run(s) are in more than one shard: {_listing(sorted(overlap))}",
            hint="each shard of `--shard I/N` holds different runs; do not merge a shard twice",
        )
    if unknown:
        raise InputError(
            f"{len(unknown)} run(s) are not in the grid's plan: {_listing(sorted(unknown))}"
        )
    missing = [r for r in plan_ids if r not in owner]
    if missing:
        hint = "re-run the same `offscope grid --shard I/N` command into the shard's --out to resume it"
        if ns:
            n = next(iter(ns))
            absent = [f"{i}/{n}" for i in range(n) if (i, n) not in seen_spec]
            if absent:
                hint = f"shard(s) {', '.join(absent)} not given; " + hint
        raise InputError(
            f"{len(missing)} of {len(plan_ids)} planned run(s) are missing: {_listing(missing)}",
            hint=hint,
        )

    out.mkdir(parents=True, exist_ok=True)
    by_path = {s.path: s for s in shards}
    with (out / "trajectories.jsonl").open("w", encoding="utf-8") as trace:
        for run in plan_ids:
            trace.writelines(by_path[owner[run]].runs[run])
    requests = sorted((line for s in shards for line in s.requests), key=_request_key)
    (out / "requests.jsonl").write_text("".join(requests), encoding="utf-8")
    meta = dict(first.meta)
    meta["configuration"] = {**first.meta["configuration"], SHARD_KEY: None}
    meta["merged_from"] = [str(s.path) for s in shards]
    # What the shards paid the model endpoint, together (retries, infra errors, calls...).
    stats = combine_stats([s.meta.get(STATS_KEY) for s in shards])
    meta.pop(STATS_KEY, None)
    if stats is not None:
        meta[STATS_KEY] = stats
    (out / "grid.json").write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")
    results = build_results(out)
    write_reports(out, results)
    return results


def _request_key(line: str) -> tuple:
    try:
        obj = json.loads(line)
    except ValueError:
        return ("", "", line)
    return (str(obj.get("run", "")), str(obj.get("ts", obj.get("created", ""))), line)
