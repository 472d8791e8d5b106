"""An output directory: one process at a time (a real second `offscope grid` refuses), and
every segment of a rotated trace read by results, resume and merge."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from offscope.evalmode.case import BUNDLED, load_cases
from offscope.evalmode.grid import Grid, GridConfig, parse_cells
from offscope.evalmode.merge import merge
from offscope.evalmode.outdir import LOCK_NAME, trace_segments
from offscope.evalmode.report.results import build_results
from offscope.proxy.sinks import JsonlWriter, TraceSink
from offscope.trace.events import read_trace

CASES = load_cases([BUNDLED])[:2]
ENTRY = [sys.executable, "-c", "from offscope.cli import entry; entry()"]
# An agent that holds its trajectory open until the test lets it go (or 120 s pass).
WAITING_AGENT = (
    f"{sys.executable} -c \"import os, time, pathlib; f = pathlib.Path(os.environ['RELEASE']); "
    '[time.sleep(0.05) for _ in range(2400) if not f.exists()]"'
)


def _grid_cmd(out: Path, *extra: str) -> list[str]:
    return [
        *ENTRY,
        "grid",
        "--cases",
        str(BUNDLED / f"{CASES[0].id}.yaml"),
        "--cells",
        "closed-sentinel-broken",
        "--reps",
        "1",
        "--out",
        str(out),
        *extra,
    ]


def _wait_for(predicate, what: str, limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


@pytest.mark.timeout(300)
def test_a_second_grid_on_the_same_out_refuses_and_names_the_holder(tmp_path: Path) -> None:
    out, release = tmp_path / "out", tmp_path / "release"
    assert (BUNDLED / f"{CASES[0].id}.yaml").exists()
    env = {**os.environ, "RELEASE": str(release)}
    holder = subprocess.Popen(
        _grid_cmd(out, "--agent", WAITING_AGENT),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # The holder has the directory once its agent runs (the trace has the run's start).
        trace = out / "trajectories.jsonl"
        _wait_for(lambda: trace.exists() and "run_start" in trace.read_text(), "the first run")
        second = subprocess.run(
            _grid_cmd(out), env=env, capture_output=True, text=True, timeout=120
        )
        assert second.returncode == 2, second.stderr
        err = " ".join(second.stderr.split())
        assert f"pid {holder.pid} on {socket.gethostname()}" in err
        assert "grid" in err and "started 20" in err and str(out) in err
        # Nor does `offscope report DIR` rebuild the reports from a half-written trace.
        report = subprocess.run(
            [*ENTRY, "report", str(out)], env=env, capture_output=True, text=True, timeout=120
        )
        assert report.returncode == 2 and f"pid {holder.pid}" in " ".join(report.stderr.split())
        assert not (out / "results.json").exists()
        # It changed nothing: the holder's trace is still the holder's alone.
        assert {e.run for e in read_trace(out / "trajectories.jsonl")} == {
            f"closed-sentinel-broken.{CASES[0].id}.r0"
        }
    finally:
        # The holder dies without releasing anything: the kernel drops its flock.
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
        release.touch()  # let its orphaned agent go
    assert (out / LOCK_NAME).exists()
    # A lock left by a dead process is taken over: the same command now runs (and resumes).
    third = subprocess.run(
        _grid_cmd(out, "--agent", WAITING_AGENT),
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert third.returncode == 0, third.stderr
    assert len(build_results(out).runs) == 1


def _cfg(out: Path, **kw) -> GridConfig:
    return GridConfig(
        cases=CASES,
        cells=parse_cells("diagonal"),
        reps=3,
        out=out,
        workers=6,
        operator_timeout=0.0,
        **kw,
    )


def _split_into_segments(trace: Path, max_bytes: int) -> int:
    """Rewrite a trace the way a rotating proxy writes it (the proxy's own writer, at a
    small rotation size): NAME.N (oldest) ... NAME.1, NAME. Returns the segment count."""
    lines = trace.read_text(encoding="utf-8").splitlines()
    trace.unlink()
    writer = JsonlWriter(trace, max_bytes=max_bytes, backups=1000)
    for line in lines:
        writer.write_line(line)
    writer.close()
    return len(trace_segments(trace))


@pytest.mark.timeout(300)
def test_every_segment_of_a_rotated_trace_is_read_by_results_resume_and_merge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The grid's own trace never rotates, whatever the proxy's rotation size says.
    monkeypatch.setenv("OFFSCOPE_TRACE_MAX_BYTES", "40000")
    whole = tmp_path / "whole"
    asyncio.run(Grid(_cfg(whole)).run())
    trace = whole / "trajectories.jsonl"
    assert trace.stat().st_size > 40000 and trace_segments(trace) == [trace]
    expected = build_results(whole)
    assert len(expected.runs) == 12
    # ... while any other trace does rotate at that size (so the setting above was in force).
    sink = TraceSink(tmp_path / "proxy.jsonl")
    for event in read_trace(trace):
        sink.write(event)
    sink.close()
    assert len(trace_segments(tmp_path / "proxy.jsonl")) > 1

    # A grid directory whose trace rotated (an earlier offscope did at 256 MiB): every
    # segment is read by the results,
    assert _split_into_segments(trace, 40000) >= 3
    assert build_results(whole).to_json() == expected.to_json()
    # by resume (nothing runs again; the segments are folded back into one file),
    summary = asyncio.run(Grid(_cfg(whole)).run())
    assert summary["ran"] == 0 and summary["resumed_from"] == 12
    assert trace_segments(trace) == [trace]
    assert build_results(whole).to_json() == expected.to_json()

    # and by merge: shards whose traces rotated merge into the unsharded result.
    shards: list[str | Path] = []
    for i in range(2):
        shard = tmp_path / f"shard{i}"
        asyncio.run(Grid(_cfg(shard, shard=(i, 2))).run())
        _split_into_segments(shard / "trajectories.jsonl", 20000)
        shards.append(shard)
    merged = merge(shards, tmp_path / "merged")
    assert [r.run for r in merged.runs] == [r.run for r in expected.runs]
    assert merged.cells == expected.cells


@pytest.mark.timeout(300)
def test_resume_of_a_rotated_trace_reruns_only_the_unfinished_runs(tmp_path: Path) -> None:
    out = tmp_path / "out"
    asyncio.run(Grid(_cfg(out)).run())
    trace = out / "trajectories.jsonl"
    # One run's end is lost (the grid was killed before it ended), then the trace rotated.
    lost = "open-affirmative-broken." + CASES[1].id + ".r2"
    lines = trace.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [x for x in lines if not (f'"run":"{lost}"' in x and '"type":"run_end"' in x)]
    assert len(kept) == len(lines) - 1
    trace.write_text("".join(kept), encoding="utf-8")
    assert _split_into_segments(trace, 30000) >= 3
    summary = asyncio.run(Grid(_cfg(out)).run())
    assert summary["ran"] == 1
    starts = [e.run for e in read_trace(trace) if e.type == "run_start"]
    assert sorted(starts) == sorted(set(starts)) and len(starts) == 12
    assert len(build_results(out).runs) == 12


def test_merge_refuses_a_shard_that_is_still_being_written(tmp_path: Path) -> None:
    from offscope.errors import InputError
    from offscope.evalmode.outdir import OutdirLock

    shard = tmp_path / "shard0"
    with OutdirLock(shard):  # what a running `offscope grid --out shard0` holds
        with pytest.raises(InputError) as err:
            merge([shard], tmp_path / "merged")
        assert f"pid {os.getpid()}" in str(err.value) and str(shard) in str(err.value)
    assert not (tmp_path / "merged").exists()
    # Released, the same directory is read (and refused only for what it is: no grid yet).
    with pytest.raises(InputError, match="not a grid output directory"):
        merge([shard], tmp_path / "merged")


def test_a_lock_file_left_by_a_dead_process_is_taken_over(tmp_path: Path) -> None:
    from offscope.evalmode.outdir import OutdirLock

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).write_text(
        f'{{"pid": {dead.stdout.strip()}, "host": "{socket.gethostname()}", "started": "x", "command": "grid"}}'
    )
    with OutdirLock(out) as lock:  # no flock is held on it: taken over, and now names us
        assert f'"pid": {os.getpid()}' in lock.path.read_text()
    assert lock.path.read_text() == ""  # released: the holder's name goes with it
