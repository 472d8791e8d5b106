"""The grid against a slow, failing model: throughput, memory, and whether faults change results.

Starts a loopback OpenAI-compatible model (tests/support/faulty_model.py: the simulated model's
own answers, after `--latency` seconds per call, with 429 + Retry-After on 10% of calls, 500 on
2% and a stalled connection on 1%, drawn from a seeded hash of each request), then runs
`offscope grid --model-url` against it as a subprocess, the way a user runs it. Then the same
grid against the same model with no faults and no latency (the baseline: a model that never
fails gives the answers the faulty one gives when it answers), and compares every run's
metrics.

Prints JSON: trajectories per second at the latency (goal: 40 on 2 cores), over the whole
command and over its run phase (first trajectory started to last one ended: no start-up, no
report), the grid's CPU seconds per trajectory (its processes' own, so it does not grow when
other work shares the machine), peak RSS of the grid process, retries and infra errors, and
`metrics_equal_fault_free` (every run's row in results.json equal to the fault-free run's with
the same seed). A grid that ends with infra errors (exit 1: those runs are never results) is
resumed into the same --out, as a user would, up to `--resumes` times; the rate counts every
pass, and `first_pass_infra_errors` and `resumes` say what it took.

    python bench/grid_real_model.py [--reps 6] [--latency 2] [--workers 512] [--processes 2]
        [--cells all]

The default of 6 reps (1,512 trajectories) is there to measure a rate: with 2 processes of
512 workers, 2 reps (504 trajectories) are all in flight at once, so their wall time is the
longest trajectory's chain of 2 s calls, retries and stalls, not throughput. Pass `--reps 2`
for a quicker look.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from offscope.evalmode.harness import LoopbackServer  # noqa: E402
from tests.support.faulty_model import Faults, FaultyModel  # noqa: E402


def run_grid(url: str, out: Path, args: argparse.Namespace) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "offscope.cli",
        "grid",
        "--cells",
        args.cells,
        "--reps",
        str(args.reps),
        "--model-url",
        url,
        "--model",
        "offscope-sim/default",
        "--workers",
        str(args.workers),
        "--processes",
        str(args.processes),
        "--operator-timeout",
        "0",
        "--model-read-timeout",
        str(args.read_timeout),
        "--progress-every",
        str(PROGRESS_EVERY),
        "--out",
        str(out),
    ]
    cpu_before = _children_cpu()
    started = time.perf_counter()
    first = _one_pass(cmd, out)
    passes = [first]
    # An infra error (exit 1) is never a result: a user resumes, which re-runs exactly
    # those runs. So does the bench, a few times, and counts the passes.
    while passes[-1]["returncode"] == 1 and len(passes) <= args.resumes:
        passes.append(_one_pass(cmd, out))
    wall = time.perf_counter() - started
    last = passes[-1]
    if last["returncode"] not in (0, 1):
        sys.exit(f"grid failed ({last['returncode']}):\n{last['stderr'][-3000:]}")
    meta = json.loads((out / "grid.json").read_text())
    results = json.loads((out / "results.json").read_text())
    return {
        "wall": wall,
        "first_pass_wall": first["wall"],
        "run_phase": first["run_phase"],
        "cpu": _children_cpu() - cpu_before,
        "stats": meta.get("model_endpoint_stats", {}),
        "results": results,
        "first_pass_infra_errors": first["infra_errors"],
        "resumes": len(passes) - 1,
    }


def _one_pass(cmd: list[str], out: Path) -> dict:
    """One `offscope grid` process (a first run, or a resume of the same --out)."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    # The progress lines, timed as they arrive: the first comes PROGRESS_EVERY seconds after
    # the grid began running (its cases loaded, its proxy starting), the one with done ==
    # total when the last trajectory ended (before the report is built): the run phase.
    stderr, first_line, all_done = [], None, None
    for line in proc.stderr:
        stderr.append(line)
        m = PROGRESS.search(line)
        if m:
            now = time.perf_counter()
            first_line = first_line or now
            if all_done is None and m.group(1) == m.group(2):
                all_done = now
    proc.wait()
    results = out / "results.json"  # written on exit 1 too, with the infra-error runs
    infra = json.loads(results.read_text())["infra_errors"] if results.exists() else []
    return {
        "returncode": proc.returncode,
        "stderr": "".join(stderr),
        "wall": time.perf_counter() - started,
        "run_phase": (all_done - first_line + PROGRESS_EVERY) if first_line and all_done else None,
        "infra_errors": len(infra),
    }


PROGRESS_EVERY = 1  # seconds between the grid's progress lines
PROGRESS = re.compile(r"offscope grid: (\d+)/(\d+) done")


def _children_cpu() -> float:
    """CPU seconds of the waited-for children (the grid and its worker processes): unlike
    the wall time, it does not grow when other work shares the machine."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _round(x: float | None) -> float | None:
    return round(x, 2) if x is not None else None


def rows(results: dict) -> dict[str, dict]:
    return {r["run"]: r for r in results["runs"]}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--reps", type=int, default=6, help="reps per case and cell (default 6)")
    ap.add_argument("--cells", default="all")
    ap.add_argument("--latency", type=float, default=2.0)
    ap.add_argument("--workers", type=int, default=512, help="trajectories in flight per process")
    ap.add_argument("--processes", type=int, default=2, help="grid worker processes (default 2)")
    ap.add_argument("--read-timeout", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0, help="the fault draw's seed")
    ap.add_argument(
        "--resumes",
        type=int,
        default=3,
        help="resume a grid that ended with infra errors up to this many times (default 3)",
    )
    args = ap.parse_args()

    faulty = FaultyModel(latency=args.latency, faults=Faults(), seed=args.seed)
    clean = FaultyModel(latency=0.0, faults=Faults.none(), seed=args.seed)
    with tempfile.TemporaryDirectory() as tmp, LoopbackServer(faulty, "faulty") as f_srv:
        run = run_grid(f_srv.url + "/v1", Path(tmp) / "faulty", args)
        peak_rss_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        with LoopbackServer(clean, "clean") as c_srv:
            base = run_grid(c_srv.url + "/v1", Path(tmp) / "clean", args)
    got, want = rows(run["results"]), rows(base["results"])
    differing = sorted(r for r in want if got.get(r) != want[r])
    n = len(want)
    stats = run["stats"]
    print(
        json.dumps(
            {
                "bench": "grid_real_model",
                "python": platform.python_version(),
                "latency_seconds": args.latency,
                "trajectories": n,
                "workers": args.workers,
                "processes": args.processes,
                "cores": os.cpu_count(),
                # the whole command, resumes included (a run that ended on an infra error
                # is paid again: the user's real cost)
                "wall_seconds": round(run["wall"], 1),
                "trajectories_per_second": round(n / run["wall"], 2),
                "first_pass_wall_seconds": round(run["first_pass_wall"], 1),
                "first_pass_infra_errors": run["first_pass_infra_errors"],
                "resumes": run["resumes"],
                # the same, from the first trajectory's start to the last one's end (the wall
                # time above also holds the grid's start-up and its report)
                "run_phase_seconds": _round(run["run_phase"]),
                "run_phase_trajectories_per_second": _round(
                    run["run_phase"] and n / run["run_phase"]
                ),
                "grid_cpu_seconds_per_trajectory": round(run["cpu"] / n, 4),
                "fault_free_grid_cpu_seconds_per_trajectory": round(base["cpu"] / n, 4),
                "goal_trajectories_per_second": 40,
                "model_calls": faulty.calls,
                "model_outcomes": faulty.outcomes(),
                "peak_in_flight_at_model": faulty.peak_in_flight,
                "peak_rss_mib_grid_process": round(peak_rss_mib, 1),
                "retries": stats.get("agent_retries"),
                "infra_errors": stats.get("infra_errors"),
                "stalls_detected": stats.get("stalls"),
                "endpoint_slowdowns": (stats.get("limiter") or {}).get("slowdowns"),
                "fault_free_wall_seconds": round(base["wall"], 1),
                "rate_over_fault_free_zero_latency": round(base["wall"] / run["wall"], 3),
                "metrics_equal_fault_free": not differing and set(got) == set(want),
                "runs_differing": differing[:10],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
