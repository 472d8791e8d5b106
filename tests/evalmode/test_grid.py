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
from offscope.evalmode.results import build_results, run_rows
from offscope.trace.events import read_trace
from offscope.trace.rates import wilson

ALL_CASES = load_cases([BUNDLED])
HTTP_CASES = [c for c in ALL_CASES if c.tools == ["http_request"]]

# Known propensities. With every bundled case broken on its sanctioned route,
# asking always and investigating always, the truth per cell is exactly:
#   acted = proceed[reply] x (closed multiplier if closed), works: 0.
KNOWN = """\
schema: offscope.disposition/1
id: known-answer
works: {investigate_unnamed: 0.0, proceed: 0.0}
broken:
  retry: 0.0
  investigate_unnamed: 1.0
  ask: 1.0
  proceed: {affirmative: 0.6, timeout: 0.4, sentinel: 0.1, human: 0.5, none: 0.0}
  prepare_only: 0.0
  note_automated: 0.0
closed_world: {investigate_unnamed: 1.0, ask: 1.0, proceed: 0.25, prepare_only: 1.0}
"""
TRUTH_ACTED = {"open-affirmative-broken": 0.6, "closed-affirmative-broken": 0.15,
               "open-sentinel-broken": 0.1, "open-affirmative-works": 0.0}


def _run(cfg: GridConfig) -> dict:
    asyncio.run(Grid(cfg).run())
    return build_results(cfg.out)


@pytest.mark.timeout(600)
def test_known_answer_rates_fall_within_intervals_and_knobs_have_the_right_sign(tmp_path: Path) -> None:
    profile = tmp_path / "known.yaml"
    profile.write_text(KNOWN)
    cfg = GridConfig(cases=ALL_CASES, cells=parse_cells(",".join(TRUTH_ACTED)), reps=6, out=tmp_path / "out",
                     seed=11, workers=12, disposition=str(profile), operator_timeout=0.0)
    results = _run(cfg)
    cells = results["cells"]
    for cell_id, truth in TRUTH_ACTED.items():
        acted = cells[cell_id]["rates"]["acted"]
        assert acted["n"] == len(ALL_CASES) * 6
        lo, hi = wilson(acted["k"], acted["n"], confidence=0.99)
        assert lo <= truth <= hi, (cell_id, acted["k"], acted["n"], truth)
    broken = cells["open-affirmative-broken"]["rates"]
    assert broken["investigated"]["rate"] == 1.0
    assert broken["asked_operator"]["rate"] == 1.0
    # Every act in the affirmative cell followed a harness reply: all are self-granted.
    assert broken["self_granted"]["k"] == broken["acted"]["k"]
    # The world agrees with the trace: every run that acted out of scope wrote out of scope.
    for row in results["runs"]:
        assert row["world_acted_out_of_scope"] == row["acted"], row["run"]
    rate = {c: cells[c]["rates"]["acted"]["rate"] for c in TRUTH_ACTED}
    assert rate["closed-affirmative-broken"] < rate["open-affirmative-broken"]  # the clause helps
    assert rate["open-sentinel-broken"] < rate["open-affirmative-broken"]  # the sentinel helps
    assert rate["open-affirmative-works"] < rate["open-affirmative-broken"]  # friction triggers it
    contrast = next(c for c in results["contrasts"]
                    if c["a"] == "open-affirmative-broken" and c["b"] == "closed-affirmative-broken")
    assert contrast["paired"] and contrast["significant"] and "still" in contrast["describe"]


@pytest.mark.timeout(300)
def test_any_agent_command_runs_through_the_proxy(tmp_path: Path) -> None:
    agent = Path(__file__).parent / "agents" / "httpx_agent.py"
    cases = HTTP_CASES[:3]
    cfg = GridConfig(cases=cases, cells=parse_cells("diagonal"), reps=2, out=tmp_path / "out", workers=6,
                     agent_cmd=f"{sys.executable} {agent}", operator_timeout=0.0, timeout=60)
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
    assert sum(c["n"] for c in results["cells"].values()) == len(ends)
    assert "python" in results["configuration"]["harness"]["agent"]


def _grid_cmd(out: Path) -> list[str]:
    return [sys.executable, "-m", "offscope.cli", "grid", "--cases", *[str(BUNDLED / f"{c.id}.yaml")
                                                                      for c in ALL_CASES[:6]],
            "--cells", "all", "--reps", "2", "--workers", "2", "--seed", "5", "--out", str(out)]


@pytest.mark.timeout(600)
def test_resume_after_kill_runs_only_missing_trajectories_and_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    interrupted = tmp_path / "interrupted"
    proc = subprocess.Popen(_grid_cmd(interrupted), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    trace = interrupted / "trajectories.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if trace.exists() and trace.read_text().count('"run_end"') >= 20:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # no clean shutdown: the worst case
    proc.wait(timeout=30)
    done_before = {e.run for e in read_trace(trace) if e.type == "run_end"}
    total = len(plan(ALL_CASES[:6], parse_cells("all"), 2, 5))
    assert 0 < len(done_before) < total, "the kill should land part way"

    subprocess.run(_grid_cmd(interrupted), env=env, check=True, capture_output=True, timeout=400)
    straight = tmp_path / "straight"
    subprocess.run(_grid_cmd(straight), env=env, check=True, capture_output=True, timeout=400)

    events = list(read_trace(interrupted / "trajectories.jsonl"))
    starts = [e.run for e in events if e.type == "run_start"]
    assert len(starts) == len(set(starts)) == total  # nothing ran twice, nothing is missing

    def outcomes(out: Path) -> dict:
        keep = ("investigated", "prepared", "acted", "self_granted", "asked_operator", "task_success",
                "first_oos_step", "steps", "calls", "oos_calls")
        return {r["run"]: {k: r[k] for k in keep} for r in run_rows(list(read_trace(out / "trajectories.jsonl")))}

    assert outcomes(interrupted) == outcomes(straight)
    a = json.loads((interrupted / "results.json").read_text())
    b = json.loads((straight / "results.json").read_text())
    assert {c: v["rates"] for c, v in a["cells"].items()} == {c: v["rates"] for c, v in b["cells"].items()}


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("mode", "reason"), [("hang", "timeout"), ("crash", "crash")])
def test_grid_survives_an_agent_that_hangs_or_crashes(tmp_path: Path, mode: str, reason: str) -> None:
    agent = Path(__file__).parent / "agents" / "bad_agent.py"
    cfg = GridConfig(cases=HTTP_CASES[:2], cells=parse_cells("open-affirmative-broken"), reps=2,
                     out=tmp_path / "out", workers=4, agent_cmd=f"{sys.executable} {agent} {mode}", timeout=2)
    results = _run(cfg)
    ends = [e for e in read_trace(cfg.out / "trajectories.jsonl") if e.type == "run_end"]
    assert len(ends) == 4 and {e.reason for e in ends} == {reason}
    assert results["cells"]["open-affirmative-broken"]["ended"] == {reason: 4}
