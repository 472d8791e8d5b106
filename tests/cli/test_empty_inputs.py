"""Every reading command refuses an empty or event-less input (exit 2, naming the file):
a report of nothing is not a zero, and a --fail-on check over nothing must not pass."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from offscope.cli import main
from offscope.evalmode.case import BUNDLED, load_cases
from offscope.evalmode.grid import Grid, GridConfig, parse_cells
from offscope.evalmode.report.results import build_results, write_reports
from tests.support.sidecar_kit import LEDGER_YAML


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("grid")
    cfg = GridConfig(
        cases=load_cases([BUNDLED])[:1],
        cells=parse_cells("diagonal"),
        reps=2,
        out=out,
        operator_timeout=0.0,
    )
    asyncio.run(Grid(cfg).run())
    write_reports(out, build_results(out))
    return out


@pytest.fixture(params=["empty", "blank-lines"])
def nothing(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    trace = tmp_path / "trace.jsonl"
    trace.write_text("" if request.param == "empty" else "\n\n  \n", encoding="utf-8")
    return trace


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], path: Path) -> None:
    assert main(argv) == 2, argv
    err = " ".join(capsys.readouterr().err.split())
    assert f"{path}: the trace holds no events" in err, err


def test_report_refuses_an_empty_trace(nothing: Path, capsys) -> None:
    _refused(capsys, ["report", str(nothing)], nothing)
    _refused(capsys, ["report", str(nothing), "--json"], nothing)


def test_report_refuses_a_grid_directory_with_an_empty_trace(
    grid: Path, tmp_path: Path, capsys
) -> None:
    empty = tmp_path / "grid"
    empty.mkdir()
    (empty / "grid.json").write_text((grid / "grid.json").read_text())
    (empty / "trajectories.jsonl").write_text("")
    _refused(capsys, ["report", str(empty)], empty / "trajectories.jsonl")
    assert not (empty / "results.json").exists()  # nothing was written from nothing


def test_replay_fail_on_does_not_pass_on_nothing(nothing: Path, tmp_path: Path, capsys) -> None:
    ledger = tmp_path / "ledger.yaml"
    ledger.write_text(LEDGER_YAML, encoding="utf-8")
    argv = ["replay", str(nothing), "--ledger", str(ledger), "--fail-on", "newly-blocked>0"]
    _refused(capsys, argv, nothing)


def test_mine_refuses_an_empty_trace(nothing: Path, capsys) -> None:
    _refused(capsys, ["mine", str(nothing)], nothing)


def test_shadow_compare_refuses_an_empty_production_trace(
    grid: Path, nothing: Path, capsys
) -> None:
    _refused(capsys, ["shadow-compare", str(grid), str(nothing)], nothing)


def _without_runs(grid: Path, tmp_path: Path) -> Path:
    data = json.loads((grid / "results.json").read_text(encoding="utf-8"))
    data.update(runs=[], cells={}, contrasts=[])
    path = tmp_path / "no-runs.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_gate_and_shadow_compare_refuse_results_with_no_runs(
    grid: Path, tmp_path: Path, capsys
) -> None:
    empty = _without_runs(grid, tmp_path)
    # The real grid gates against itself (so only the empty side is what is refused).
    assert (
        main(["gate", "--baseline", str(grid), "--candidate", str(grid), "--allow-underpowered"])
        == 0
    )
    capsys.readouterr()
    for argv in (
        ["gate", "--baseline", str(grid), "--candidate", str(empty)],
        ["gate", "--baseline", str(empty), "--candidate", str(grid)],
        ["shadow-compare", str(empty), str(grid / "trajectories.jsonl")],
    ):
        assert main(argv) == 2, argv
        err = " ".join(capsys.readouterr().err.split())
        assert f"{empty}:" in err and "holds no runs" in err, err


def test_a_trace_with_events_is_still_read(grid: Path, capsys) -> None:
    assert main(["report", str(grid / "trajectories.jsonl"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["aggregate"]["runs"] == 4 and out["infra_errors"] == 0
