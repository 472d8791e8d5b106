"""Command-line tables never cut an identifier or a header: at 80 columns on a
terminal, in a pipe, and on a wide terminal, every run id and header is whole."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from offscope.evalmode.case import BUNDLED, load_cases
from offscope.evalmode.grid import Grid, GridConfig, parse_cells
from offscope.trace.events import ToolCallEvent, read_trace
from offscope.trace.metrics import fold

HEADERS = ["run", "ledger", "steps", "calls", "out", "first out", "first act", "funnel"]


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tables-grid")
    cfg = GridConfig(
        cases=load_cases([BUNDLED])[:2], cells=parse_cells("diagonal"), reps=1, out=out, seed=1
    )
    asyncio.run(Grid(cfg).run())
    return out / "trajectories.jsonl"


def _report(trace: Path, columns: int, tty: bool) -> str:
    env = os.environ | {"COLUMNS": str(columns), "TERM": "dumb", "NO_COLOR": "1"}
    argv = [sys.executable, "-m", "offscope.cli", "report", str(trace)]
    if tty:  # a real terminal: `script` gives the command a pty
        if not shutil.which("script"):
            pytest.skip("util-linux `script` not installed")
        argv = ["script", "-qec", shlex.join(argv), "/dev/null"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.replace("\r\n", "\n")


@pytest.mark.parametrize(
    ("columns", "tty"), [(80, True), (80, False), (240, True)], ids=["tty80", "pipe", "tty240"]
)
def test_report_never_cuts_a_run_id_or_a_header(trace: Path, columns: int, tty: bool) -> None:
    out = _report(trace, columns, tty)
    assert "…" not in out
    for run in fold(read_trace(trace)):
        assert run in out, f"run id {run!r} cut or missing at {columns} columns"
    for header in HEADERS:
        assert header in out, f"header {header!r} cut at {columns} columns"


def test_a_pipe_gets_tab_separated_rows_when_the_table_cannot_fit(trace: Path) -> None:
    out = _report(trace, 80, tty=False)
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("run\tledger\t"))
    runs = list(fold(read_trace(trace)))
    rows = [line.split("\t") for line in lines[header + 1 : header + 1 + len(runs)]]
    assert [row[0] for row in rows] == runs
    assert {len(row) for row in rows} == {len(lines[header].split("\t"))}


def _cli(args: list[str], columns: int) -> str:
    env = os.environ | {"COLUMNS": str(columns), "TERM": "dumb", "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "offscope.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode in (0, 1), done.stderr
    return done.stdout


def test_mine_shows_whole_urls_and_run_ids(trace: Path) -> None:
    out = _cli(["mine", str(trace), "--all-errors"], 80)
    assert "…" not in out and "wall" in out
    recorded = {
        e.call.url for e in read_trace(trace) if isinstance(e, ToolCallEvent) and e.call.url
    }
    shown = set(re.findall(r"https?://[^\s\t]+", out))
    assert shown, out
    assert shown <= recorded, f"URLs cut or changed: {shown - recorded}"


def test_grid_table_in_a_ci_log_is_rows_not_a_hard_wrapped_table(tmp_path: Path) -> None:
    out = _cli(
        ["grid", "--cells", "diagonal", "--reps", "1", "--out", str(tmp_path / "g")]
        + ["--cases", str(BUNDLED / "billing-refund-forbidden-admin.yaml")],
        80,
    )
    assert "…" not in out
    rows = [line.split("\t") for line in out.splitlines() if "\t" in line]
    assert rows[0][:2] == ["cell", "n"] and {r[0] for r in rows[1:]} == {
        "closed-sentinel-broken",
        "open-affirmative-broken",
    }
