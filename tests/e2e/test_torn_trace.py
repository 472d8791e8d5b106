"""A full disk tears at most one line, and a torn final line costs that line only.

The disk is really full: a 64 KiB tmpfs mounted for the test (root is needed;
without it the proxy test writes to /dev/full, which fails every write with
ENOSPC). Readers (`offscope report`, grid resume, merge, the request log) skip
a torn final line with a warning and still reject a bad line in the middle.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from offscope.evalmode.grid import completed_runs, keep_only
from offscope.policies.requests import read_log
from offscope.proxy.sinks import JsonlWriter
from offscope.trace.events import read_trace, write_events
from tests.support.sidecar_kit import LEDGER_YAML, EchoUpstream, ProxyProcess, cli, scrape, total
from tests.support.trajectories import Run

pytestmark = pytest.mark.timeout(120)


def _events() -> list:
    return (
        Run("run-a").call().call(stage="act").end("exit", True).events
        + Run("run-b").call().end("idle").events
    )


def _torn(path: Path, events: list) -> str:
    """A trace whose last event was cut short mid-write; returns that event's line."""
    write_events(path, events[:-1])
    last = events[-1].to_json()
    with path.open("a", encoding="utf-8") as out:
        out.write(last[: len(last) // 2])  # no newline: the write stopped here
    return last


@contextlib.contextmanager
def small_disk(path: Path, size: str = "64k") -> Iterator[Path | None]:
    """A tmpfs of `size` at `path`, or None where mounting is not allowed."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
        ).returncode
        == 0
    )
    try:
        yield path if mounted else None
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _fill(disk: Path, leave: int) -> Path:
    """Fill the disk but about `leave` bytes; returns the filler file (delete it to free space)."""
    stat = os.statvfs(disk)
    filler = disk / "filler"
    filler.write_bytes(b"\0" * max(0, stat.f_bavail * stat.f_frsize - leave))
    return filler


# -- readers --------------------------------------------------------------------


def test_report_skips_a_torn_final_line_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    events = _events()
    _torn(path, events)
    proc = cli("report", str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    assert f"{path}:{len(events)}: skipped a torn final line" in proc.stderr
    assert json.loads(proc.stdout)["aggregate"]["runs"] == 2  # every whole line was read
    assert list(read_trace(path)) == events[:-1]


def test_a_torn_line_in_the_middle_is_still_an_error(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    events = _events()
    _torn(path, events[:3])
    with path.open("a", encoding="utf-8") as out:  # something was written after it
        out.write("\n" + "\n".join(e.to_json() for e in events[3:]) + "\n")
    proc = cli("report", str(path))
    assert proc.returncode == 2
    assert f"{path}:3: not an offscope.trace event" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_whole_bad_final_line_is_still_an_error(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    write_events(path, _events())
    with path.open("a", encoding="utf-8") as out:
        out.write('{"not": "an event"}\n')  # written whole: not a torn write
    proc = cli("report", str(path))
    assert proc.returncode == 2 and f"{path}:{len(_events()) + 1}:" in proc.stderr


def test_grid_resume_reads_a_torn_trace_and_drops_the_torn_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "trajectories.jsonl"
    events = _events()
    _torn(path, events)
    done = completed_runs(path)
    assert done == {"run-a"}  # run-b's end is the torn line: run-b is run again
    keep_only(path, done)
    assert "skipped a torn final line" in capsys.readouterr().err
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n")
    assert {e.run for e in read_trace(path)} == {"run-a"}


def test_request_log_skips_a_torn_final_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "requests.jsonl"
    whole = json.dumps(
        {"schema": "offscope.request/1", "id": "req-1", "run": "r", "status": "pending"}
    )
    path.write_text(whole + "\n" + whole[:20], encoding="utf-8")
    requests, _ = read_log(path)
    assert [r["id"] for r in requests] == ["req-1"]
    assert f"{path}:2: skipped a torn final line" in capsys.readouterr().err


# -- the writer -----------------------------------------------------------------


def test_writer_cuts_a_torn_tail_left_by_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    events = _events()
    _torn(path, events[:3])
    writer = JsonlWriter(path)
    for e in events[3:]:
        writer.write_line(e.to_json())
    writer.close()
    assert list(read_trace(path)) == events[:2] + events[3:]  # the torn event only is gone


def test_writer_on_a_full_disk_keeps_every_line_whole(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk") as disk:
        if disk is None:
            pytest.skip("cannot mount a tmpfs here (needs root)")
        filler = _fill(disk, leave=8192)  # two pages
        writer = JsonlWriter(disk / "trace.jsonl")
        line = Run("run-full").call().events[-1].to_json()
        written = failed = 0
        for _ in range(200):
            try:
                writer.write_line(line)
                written += 1
            except OSError as exc:
                assert exc.errno == 28  # ENOSPC: the disk is really full
                failed += 1
        assert written > 0 and failed > 0
        data = (disk / "trace.jsonl").read_bytes()
        assert data.endswith(b"\n") and data.count(b"\n") == written  # no torn bytes left
        filler.unlink()  # space again: the writer goes on where it was
        writer.write_line(line)
        writer.close()
        assert len(list(read_trace(disk / "trace.jsonl"))) == written + 1


# -- the proxy ------------------------------------------------------------------


def test_proxy_keeps_serving_on_a_full_disk_and_counts_it(tmp_path: Path, confdir: str) -> None:
    ledger = tmp_path / "ledger.yaml"
    ledger.write_text(LEDGER_YAML)
    up = EchoUpstream().start()
    with small_disk(tmp_path / "disk") as disk:
        filler = _fill(disk, leave=4000) if disk is not None else None
        trace = disk / "trace.jsonl" if disk is not None else Path("/dev/full")
        proxy = ProxyProcess(
            tmp_path,
            ledger=str(ledger),
            routes=up.routes(),
            confdir=confdir,
            name="full",
            extra=["--trace", str(trace)],
        )
        try:
            with proxy, httpx.Client(proxy=proxy.proxy_url("full-1"), timeout=20) as c:
                statuses = [
                    c.get(f"http://crm.acme.test/customers/4411?n={i}").status_code
                    for i in range(40)
                ]
                assert statuses == [200] * 40  # every agent call answered
                failures = total(scrape(proxy.metrics_port), "offscope_trace_write_failures_total")
                assert failures > 0
                assert "trace_write_failed" in proxy.stderr()
                if filler is not None:
                    filler.unlink()  # the volume is fixed: recording resumes
                    assert c.get("http://crm.acme.test/customers/4411?n=last").status_code == 200
                assert (
                    httpx.get(f"http://127.0.0.1:{proxy.metrics_port}/healthz").status_code == 200
                )
            assert proxy.proc.returncode == 0, proxy.stderr()[
                -2000:
            ]  # a clean stop, full disk or not
            if disk is not None:
                proc = cli("report", str(trace), "--json")
                assert proc.returncode == 0, proc.stderr  # the trace is readable as it is
                calls = [e for e in read_trace(trace) if e.type == "tool_call"]
                assert calls and (calls[-1].call.url or "").endswith("n=last")
        finally:
            proxy.terminate()
            up.stop()
