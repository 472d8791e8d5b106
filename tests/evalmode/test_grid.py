"""The grid, end to end: real agents through the real proxy against the fixture world."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from offscope.evalmode.case import BUNDLED, load_cases
from offscope.evalmode.grid import Grid, GridConfig, parse_cells, plan
from offscope.evalmode.report.results import build_results, run_rows
from offscope.evalmode.report.results_model import Results
from offscope.trace.events import read_trace

ALL_CASES = load_cases([BUNDLED])
HTTP_CASES = [c for c in ALL_CASES if c.tools == ["http_request"]]


def _run(cfg: GridConfig) -> Results:
    asyncio.run(Grid(cfg).run())
    return build_results(cfg.out)


# The known-answer test of the grid (exact per-run values) is test_known_answer.py.


@pytest.mark.timeout(300)
def test_any_agent_command_runs_through_the_proxy(tmp_path: Path) -> None:
    agent = Path(__file__).parent / "agents" / "httpx_agent.py"
    cases = HTTP_CASES[:3]
    cfg = GridConfig(
        cases=cases,
        cells=parse_cells("diagonal"),
        reps=2,
        out=tmp_path / "out",
        workers=6,
        agent_cmd=f"{sys.executable} {agent}",
        operator_timeout=0.0,
        timeout=60,
    )
    results = _run(cfg)
    events = list(read_trace(cfg.out / "trajectories.jsonl"))
    ends = [e for e in events if e.type == "run_end"]
    assert len(ends) == len(cases) * 2 * 2
    assert all(e.exit_code in (0, 1) for e in ends), [(e.run, e.exit_code, e.detail) for e in ends]
    # Its HTTP calls and its model calls crossed the proxy and were tagged per case.
    calls = [e for e in events if e.type == "tool_call"]
    assert {e.ledger for e in calls} == {c.id for c in cases}
    assert any(e.type == "llm" for e in events)
    assert any(e.type == "operator" for e in events)
    assert sum(c.n for c in results.cells.values()) == len(ends)
    harness = results.configuration.harness
    assert harness is not None and "python" in harness.agent


# Three cases x 12 cells x 1 rep = 36 trajectories: the kill (after 20 have ended)
# lands part way with several in flight (4 workers), as it did with six cases and 2 reps.
RESUME_CASES = 3
RESUME_REPS = 1


def _grid_cmd(out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "offscope.cli",
        "grid",
        "--cases",
        *[str(BUNDLED / f"{c.id}.yaml") for c in ALL_CASES[:RESUME_CASES]],
        "--cells",
        "all",
        "--reps",
        str(RESUME_REPS),
        "--workers",
        "4",
        "--seed",
        "5",
        "--out",
        str(out),
    ]


@pytest.mark.timeout(600)
def test_resume_after_kill_runs_only_missing_trajectories_and_matches_an_uninterrupted_run(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    interrupted = tmp_path / "interrupted"
    proc = subprocess.Popen(
        _grid_cmd(interrupted),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    trace = interrupted / "trajectories.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if trace.exists() and trace.read_text().count('"run_end"') >= 20:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # no clean shutdown: the worst case
    proc.wait(timeout=30)
    done_before = {e.run for e in read_trace(trace) if e.type == "run_end"}
    total = len(plan(ALL_CASES[:RESUME_CASES], parse_cells("all"), RESUME_REPS, 5))
    assert 0 < len(done_before) < total, "the kill should land part way"

    subprocess.run(_grid_cmd(interrupted), env=env, check=True, capture_output=True, timeout=400)
    straight = tmp_path / "straight"
    subprocess.run(_grid_cmd(straight), env=env, check=True, capture_output=True, timeout=400)

    events = list(read_trace(interrupted / "trajectories.jsonl"))
    starts = [e.run for e in events if e.type == "run_start"]
    assert len(starts) == len(set(starts)) == total  # nothing ran twice, nothing is missing

    def outcomes(out: Path) -> dict:
        keep = (
            "investigated",
            "prepared",
            "acted",
            "self_granted",
            "asked_operator",
            "task_success",
            "first_oos_step",
            "steps",
            "calls",
            "oos_calls",
        )
        return {
            r.run: {k: getattr(r, k) for k in keep}
            for r in run_rows(list(read_trace(out / "trajectories.jsonl")))
        }

    assert outcomes(interrupted) == outcomes(straight)
    a = json.loads((interrupted / "results.json").read_text())
    b = json.loads((straight / "results.json").read_text())
    assert {c: v["rates"] for c, v in a["cells"].items()} == {
        c: v["rates"] for c, v in b["cells"].items()
    }


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("mode", "reason"), [("hang", "timeout"), ("crash", "crash")])
def test_grid_survives_an_agent_that_hangs_or_crashes(
    tmp_path: Path, mode: str, reason: str
) -> None:
    agent = Path(__file__).parent / "agents" / "bad_agent.py"
    cfg = GridConfig(
        cases=HTTP_CASES[:2],
        cells=parse_cells("open-affirmative-broken"),
        reps=2,
        out=tmp_path / "out",
        workers=4,
        agent_cmd=f"{sys.executable} {agent} {mode}",
        timeout=2,
    )
    results = _run(cfg)
    ends = [e for e in read_trace(cfg.out / "trajectories.jsonl") if e.type == "run_end"]
    assert len(ends) == 4 and {e.reason for e in ends} == {reason}
    assert results.cells["open-affirmative-broken"].ended == {reason: 4}
