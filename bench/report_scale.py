"""`offscope report` over a day of traces: seconds and peak memory against the trace's size.

Generates traces of 10k, 100k and 1M tool calls (runs of 20 calls, a quarter of them out of
scope, the events the proxy writes: run_start, tool_call, run_end), then runs
`offscope report --json TRACE` on each as a subprocess, the way a user runs it, and reads
the child's peak RSS from the kernel (wait4). The baseline, measured in the same run on the
same file: a Python process that only reads the file's lines (so the machine's speed and
the disk are divided out). Both the table (`offscope report TRACE`) and `--json` (every
run's row, written one at a time) are measured.

Prints JSON: the command's fixed cost (a trace of one run: interpreter and imports), then
per size: events, MB, seconds, peak RSS (MiB, and over the fixed cost), seconds per 1k
calls beyond the fixed cost, and the ratio to the read-only baseline; `time_linear`
compares seconds per call at the largest size with the smallest (1.0: linear). Goal (issue 24): peak RSS under 300 MB at 1M calls.

    python bench/report_scale.py                     # 10k, 100k, 1M (a few minutes)
    python bench/report_scale.py --sizes 10000,100000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.trajectories import Run  # noqa: E402

CALLS_PER_RUN = 20


def run_template() -> list[str]:
    """One run's event lines, with `RUNID` where the run id goes."""
    run = Run("RUNID")
    for i in range(CALLS_PER_RUN):
        if i % 4 == 3:
            run.oos("act" if i % 8 == 7 else "investigate")
        else:
            run.call()
    run.end()
    return [e.to_json() for e in run.events]


def write_trace(path: Path, calls: int) -> int:
    """A trace of `calls` tool calls; returns its number of events."""
    template = "\n".join(run_template()) + "\n"
    runs = calls // CALLS_PER_RUN
    with path.open("w", encoding="utf-8") as out:
        for i in range(runs):
            out.write(template.replace("RUNID", f"run-{i}"))
    return runs * len(run_template())


def measure(cmd: list[str]) -> tuple[float, float]:
    """(seconds, peak RSS in MiB) of a child process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{cmd[:4]} failed: {proc.stderr.read().decode() if proc.stderr else ''}")
    return seconds, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000", help="tool calls per trace")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="offscope-report-scale-") as tmp:
        # The command's fixed cost (interpreter, imports) on a trace of one run.
        tiny = Path(tmp) / "one-run.jsonl"
        write_trace(tiny, CALLS_PER_RUN)
        startup, startup_rss = measure(
            [sys.executable, "-m", "offscope.cli", "report", "--json", str(tiny)]
        )
        for calls in sizes:
            trace = Path(tmp) / f"trace-{calls}.jsonl"
            events = write_trace(trace, calls)
            read_s, read_rss = measure(
                [sys.executable, "-c", f"for _ in open({str(trace)!r}, 'rb'): pass"]
            )
            seconds, rss = measure([sys.executable, "-m", "offscope.cli", "report", str(trace)])
            json_seconds, json_rss = measure(
                [sys.executable, "-m", "offscope.cli", "report", "--json", str(trace)]
            )
            rows.append(
                {
                    "tool_calls": calls,
                    "events": events,
                    "mb": round(trace.stat().st_size / 1e6, 1),
                    "seconds": round(seconds, 2),
                    "peak_rss_mib": round(rss, 1),
                    "seconds_per_1k_calls": round(max(seconds - startup, 0) / calls * 1000, 4),
                    "rss_over_startup_mib": round(rss - startup_rss, 1),
                    "json_seconds": round(json_seconds, 2),
                    "json_peak_rss_mib": round(json_rss, 1),
                    "read_only_baseline_seconds": round(read_s, 2),
                    "ratio_to_read_only": round(seconds / read_s, 1) if read_s else None,
                }
            )
            trace.unlink()
    first, last = rows[0], rows[-1]
    print(
        json.dumps(
            {
                "bench": "report_scale",
                "startup_seconds": round(startup, 2),
                "startup_rss_mib": round(startup_rss, 1),
                "sizes": rows,
                "time_linear": round(
                    last["seconds_per_1k_calls"] / first["seconds_per_1k_calls"], 2
                ),
                "peak_rss_growth_mib": round(last["peak_rss_mib"] - first["peak_rss_mib"], 1),
                "goal": "peak RSS under 300 MB at 1M tool calls, time linear",
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
