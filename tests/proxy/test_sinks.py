"""The JSONL writer behind the trace and the request log: every line whole,
in order, in the kernel when `write_line` returns, and rotation by size loses
nothing it keeps."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from offscope.proxy.sinks import JsonlWriter


def _lines(paths: list[Path]) -> list[dict]:
    return [json.loads(line) for p in paths for line in p.read_text(encoding="utf-8").splitlines()]


def test_each_line_is_on_disk_when_write_returns(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    writer = JsonlWriter(path)
    writer.write_line(json.dumps({"n": 1, "text": "naïve ✓"}))
    # Read through a separate handle before close: nothing waits in a user-space buffer.
    assert _lines([path]) == [{"n": 1, "text": "naïve ✓"}]
    writer.close()


def test_rotation_keeps_every_line_whole_and_in_order(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    writer = JsonlWriter(path, max_bytes=2_000, backups=50)
    for n in range(300):
        writer.write_line(json.dumps({"n": n, "pad": "x" * (n % 37), "text": "é" * (n % 5)}))
    writer.close()
    rotated = sorted(tmp_path.glob("trace.jsonl.*"), key=lambda p: -int(p.suffix[1:]))
    files = [*rotated, path]  # oldest first
    assert len(rotated) > 5
    assert [e["n"] for e in _lines(files)] == list(range(300))
    assert all(p.stat().st_size <= 2_000 for p in files)


def test_rotation_drops_only_beyond_the_backup_count(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    writer = JsonlWriter(path, max_bytes=500, backups=2)
    for n in range(200):
        writer.write_line(json.dumps({"n": n}))
    writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "trace.jsonl",
        "trace.jsonl.1",
        "trace.jsonl.2",
    ]
    kept = [e["n"] for e in _lines([tmp_path / "trace.jsonl.2", tmp_path / "trace.jsonl.1", path])]
    assert kept == list(range(kept[0], 200))  # the newest lines, contiguous


def test_appends_to_an_existing_file_and_counts_its_size(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(json.dumps({"n": -1}) + "\n", encoding="utf-8")
    writer = JsonlWriter(path, max_bytes=40)
    writer.write_line(json.dumps({"n": 0, "pad": "y" * 20}))  # would overflow: rotates first
    writer.close()
    assert _lines([tmp_path / "trace.jsonl.1"]) == [{"n": -1}]
    assert _lines([path]) == [{"n": 0, "pad": "y" * 20}]


def test_concurrent_writers_never_interleave_lines(tmp_path: Path) -> None:
    # The control listener's thread and the event loop can both end runs.
    path = tmp_path / "trace.jsonl"
    writer = JsonlWriter(path, max_bytes=64 * 1024, backups=100)

    def write(worker: int) -> None:
        for n in range(250):
            writer.write_line(json.dumps({"w": worker, "n": n, "pad": "z" * 200}))

    threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.close()
    files = sorted(
        tmp_path.glob("trace.jsonl*"),
        key=lambda p: -int(p.suffix[1:]) if p.suffix != ".jsonl" else 0,
    )
    seen = _lines(files)
    assert len(seen) == 1000
    for w in range(4):
        assert [e["n"] for e in seen if e["w"] == w] == list(range(250))
    assert not any(os.path.getsize(p) > 64 * 1024 for p in files)
