"""Reading many traces as one stream (offscope/trace/reader.py), without sockets: globs,
rotated and compressed segments, and a fleet's runs told apart by sidecar."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
import zstandard

from offscope.errors import InputError
from offscope.trace.events import write_events
from offscope.trace.metrics import Folder
from offscope.trace.reader import read_traces, trace_groups
from tests.support.trajectories import Run


def _stamped(run: Run, sidecar: str | None) -> list:
    for e in run.events:
        e.sidecar = sidecar
    return run.events


def _write(path: Path, events: list) -> Path:
    write_events(path, events)
    return path


def test_rotated_and_compressed_segments_are_read_oldest_first(tmp_path: Path) -> None:
    run = Run("r1").call().call().oos("act").call()
    e = run.events
    live = _write(tmp_path / "trace.jsonl", e[3:])
    _write(tmp_path / "trace.jsonl.1", e[2:3])
    raw = "".join(x.to_json() + "\n" for x in e[1:2]).encode()
    (tmp_path / "trace.jsonl.2.gz").write_bytes(gzip.compress(raw))
    raw = "".join(x.to_json() + "\n" for x in e[0:1]).encode()
    (tmp_path / "trace.jsonl.3.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))

    (group,) = trace_groups([live])
    assert [p.name for p in group] == [
        "trace.jsonl.3.zst",
        "trace.jsonl.2.gz",
        "trace.jsonl.1",
        "trace.jsonl",
    ]
    assert [x.ts for x in read_traces([live])] == [x.ts for x in e]
    # A glob that names every segment reads each once.
    assert len(list(read_traces([str(tmp_path / "trace.jsonl*")]))) == len(e)


def test_two_sidecars_run_1_are_two_runs(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.jsonl", _stamped(Run("run-1").oos("act"), "pod-a"))
    b = _write(tmp_path / "b.jsonl", _stamped(Run("run-1").call(), "pod-b"))
    folder = Folder()
    for event in read_traces([a, b]):
        folder.add(event)
    runs = folder.finish()
    assert sorted(runs) == ["pod-a/run-1", "pod-b/run-1"]
    assert runs["pod-a/run-1"].acted and not runs["pod-b/run-1"].acted


def test_traces_are_merged_by_time(tmp_path: Path) -> None:
    early, late = Run("x"), Run("y")
    late.t += 0.5  # interleaved: x at 1, 2, 3; y at 1.5, 2.5, 3.5
    early.call().call()
    late.call().call()
    a = _write(tmp_path / "a.jsonl", early.events)
    b = _write(tmp_path / "b.jsonl", late.events)
    ts = [e.ts for e in read_traces([a, b])]
    assert ts == sorted(ts) and len(ts) == 6


def test_a_spec_that_names_nothing_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such trace file"):
        trace_groups([tmp_path / "missing.jsonl"])
    with pytest.raises(InputError, match="no trace file matches"):
        trace_groups([str(tmp_path / "*.jsonl")])


def test_a_damaged_compressed_segment_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "t.jsonl.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(InputError) as info:
        list(read_traces([bad]))
    assert "t.jsonl.gz" in str(info.value.path)


def test_report_reads_a_fleet_of_traces_and_a_glob(tmp_path: Path) -> None:
    _write(tmp_path / "pod-a.jsonl", _stamped(Run("run-1").oos("act"), "pod-a"))
    raw = "".join(x.to_json() + "\n" for x in _stamped(Run("run-1").call(), "pod-b")).encode()
    (tmp_path / "pod-b.jsonl.gz").write_bytes(gzip.compress(raw))
    proc = subprocess.run(
        [sys.executable, "-m", "offscope.cli", "report", "--json", str(tmp_path / "pod-*")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert sorted(r["run"] for r in report["runs"]) == ["pod-a/run-1", "pod-b/run-1"]
    assert report["aggregate"]["runs"] == 2
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    proc = subprocess.run(
        [sys.executable, "-m", "offscope.cli", "report", str(empty)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "no events" in proc.stderr
