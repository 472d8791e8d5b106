"""`offscope grid --processes N`: worker processes with their own proxy and world give the
results one process gives, share one model gateway (limits, cache), and what a worker
finished before an interruption is kept."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from offscope.cli import main
from offscope.evalmode.case import BUNDLED, load_cases
from offscope.evalmode.grid import Grid, GridConfig, parse_cells, plan
from offscope.evalmode.harness import LoopbackServer
from offscope.evalmode.outdir import PARTS_DIR
from offscope.evalmode.processes import split
from tests.support.faulty_model import Faults, FaultyModel

CASES = load_cases([BUNDLED])
HTTP_CASES = [c for c in CASES if c.tools == ["http_request"]][:2]


def _results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


def _grid(out: Path, processes: int, *extra: str, reps: int = 2) -> None:
    args = ["grid", "--cells", "diagonal", "--reps", str(reps), "--workers", "4", "--seed", "9"]
    args += ["--operator-timeout", "0", "--processes", str(processes), "--out", str(out)]
    assert main([*args, *extra]) == 0


@pytest.mark.timeout(600)
def test_two_processes_give_the_results_of_one(tmp_path: Path) -> None:
    # One rep: every bundled case in both cells, each worker with a share of all of them.
    _grid(tmp_path / "one", 1, reps=1)
    _grid(tmp_path / "two", 2, reps=1)
    one, two = _results(tmp_path / "one"), _results(tmp_path / "two")
    assert len(one["runs"]) == len(CASES) * 2
    assert two["runs"] == one["runs"]
    assert two == one
    assert not (tmp_path / "two" / PARTS_DIR).exists()  # the workers' traces were folded in


@pytest.mark.timeout(300)
def test_both_workers_run_their_share(tmp_path: Path) -> None:
    cfg = GridConfig(
        cases=HTTP_CASES,
        cells=parse_cells("diagonal"),
        reps=3,
        out=tmp_path / "out",
        workers=2,
        processes=2,
        operator_timeout=0.0,
    )
    grid = Grid(cfg)
    summary = asyncio.run(grid.run())
    assert summary["ran"] == 12
    assert grid.timings["processes"] == 2 and grid.timings["per_process"] == [6, 6]
    ends = [x for x in (cfg.out / "trajectories.jsonl").read_text().splitlines() if "run_end" in x]
    assert len(ends) == 12


def test_split_is_deterministic_and_covers_every_trajectory() -> None:
    todo = plan(CASES, parse_cells("all"), 2, seed=1)
    parts = split(todo, 3)
    assert split(todo, 3) == parts
    assert sorted(t.run_id for p in parts for t in p) == sorted(t.run_id for t in todo)
    assert [len(p) for p in parts] == [len(todo[k::3]) for k in range(3)]


@pytest.mark.timeout(300)
def test_runs_a_killed_worker_finished_are_kept_on_resume(tmp_path: Path) -> None:
    """A grid interrupted while its workers ran leaves their traces under .processes; the
    next run folds the finished runs in and runs only the rest."""
    done = tmp_path / "done"
    _grid(done, 1, "--cases", *[str(BUNDLED / f"{c.id}.yaml") for c in HTTP_CASES])
    out = tmp_path / "out"
    part = out / PARTS_DIR / "part-000"
    part.mkdir(parents=True)
    shutil.copy(done / "grid.json", out / "grid.json")
    lines = (done / "trajectories.jsonl").read_text().splitlines(keepends=True)
    runs = sorted({json.loads(x)["run"] for x in lines})
    kept = set(runs[:5])
    # five finished runs, and one the worker was still running (no run_end): dropped
    partial = [x for x in lines if json.loads(x)["run"] in kept or json.loads(x)["run"] == runs[5]]
    partial = [x for x in partial if not (json.loads(x)["run"] == runs[5] and "run_end" in x)]
    (part / "trajectories.jsonl").write_text("".join(partial))
    cfg = GridConfig(
        cases=HTTP_CASES,
        cells=parse_cells("diagonal"),
        reps=2,
        out=out,
        seed=9,
        workers=4,
        processes=2,
        operator_timeout=0.0,
        case_paths=[str(BUNDLED / f"{c.id}.yaml") for c in HTTP_CASES],
    )
    summary = asyncio.run(Grid(cfg).run())
    assert summary == {"planned": 8, "ran": 3, "resumed_from": 5}
    assert main(["report", str(out)]) == 0
    assert _results(out)["runs"] == _results(done)["runs"]


@pytest.mark.timeout(600)
def test_workers_share_one_model_gateway(tmp_path: Path) -> None:
    """Two processes of 4 workers each against a model limited to 2 concurrent calls: the
    model never sees more than 2 at once, one cache serves both, and the runs are those of
    one process."""
    model = FaultyModel(latency=0.05, faults=Faults.none())
    cases = ["--cases", *[str(BUNDLED / f"{c.id}.yaml") for c in HTTP_CASES]]
    with LoopbackServer(model, "model") as srv:
        endpoint = ["--model-url", srv.url + "/v1", "--model", "m", "--model-concurrency", "2"]
        _grid(tmp_path / "two", 2, *cases, *endpoint)
        calls = model.calls
        assert model.peak_in_flight == 2
        stats = _results(tmp_path / "two")["model_endpoint_stats"]
        assert stats["cache"]["misses"] == stats["upstream_calls"] == calls
        assert stats["limiter"]["peak_in_flight"] == 2
        _grid(tmp_path / "one", 1, *cases, *endpoint, "--no-cache")
    assert _results(tmp_path / "two")["runs"] == _results(tmp_path / "one")["runs"]
