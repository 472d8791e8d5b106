"""Infrastructure failures are never results: real `offscope grid` processes, the real
proxy, a loopback model endpoint that answers 429 to everything, and an agent command
that reports an infrastructure failure by exiting 75."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from offscope.evalmode.case import BUNDLED, Case, load_cases
from offscope.evalmode.report.results_model import load_results
from offscope.trace.events import read_trace
from tests.support.loopback import send_json

AGENT = Path(__file__).parent / "agents" / "infra_flaky_agent.py"
DIAGONAL = ("closed-sentinel-broken", "open-affirmative-broken")


@functools.cache
def http_cases() -> list[tuple[Path, Case]]:
    """(file, case) of the bundled cases whose only tool is http_request (what httpx_agent
    offers); read when a test asks, not at collection, in every worker."""
    return [
        (f, c)
        for f in sorted(BUNDLED.glob("*.yaml"))
        for c in load_cases([f])
        if c.tools == ["http_request"]
    ]


def _grid(out: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", "from offscope.cli import entry; entry()", "grid"]
    return subprocess.run(
        [*cmd, "--out", str(out), "--workers", "4", "--operator-timeout", "0", *extra],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=280,
    )


class _Always429(BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint that is rate-limited for every call."""

    received: list[str] = []

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        type(self).received.append(self.path)
        error = {"error": {"type": "rate_limit_error", "message": "slow down"}}
        send_json(self, 429, error, {"retry-after": "0"})

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def rate_limited_model():
    _Always429.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Always429)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


@pytest.mark.timeout(300)
def test_a_rate_limited_model_gives_no_result_and_fails_the_grid(
    tmp_path: Path, rate_limited_model: str
) -> None:
    out = tmp_path / "out"
    proc = _grid(
        out,
        "--cases",
        *(str(f) for f, _ in http_cases()[:2]),
        "--cells",
        "diagonal",
        "--reps",
        "2",
        "--model-url",
        rate_limited_model,
        "--model",
        "m-test",
        # A small retry budget: every call is a 429, and the default budget (10 retries,
        # 300 s of waiting per trajectory, the endpoint slowed down on every window)
        # would make this a long test of patience rather than of the bookkeeping.
        "--model-retries",
        "2",
        "--model-retry-wait",
        "2",
    )
    assert proc.returncode == 1, proc.stderr
    assert _Always429.received, "the model calls reached the endpoint"
    results = load_results(out)
    # No run is a result; every planned run is counted as an infra error, per cell.
    assert results.runs == []
    assert {c: b.infra_errors for c, b in results.cells.items()} == dict.fromkeys(DIAGONAL, 4)
    assert all(b.n == 0 and b.rates["acted"].rate is None for b in results.cells.values())
    assert len(results.infra_errors) == 8
    ends = [e for e in read_trace(out / "trajectories.jsonl") if e.type == "run_end"]
    assert len(ends) == 8 and {e.reason for e in ends} == {"infra_error"}
    assert "429" in (results.infra_errors[0].detail or "")
    # Said in every report and in the terminal.
    assert "8 of 8 runs ended on an infrastructure failure" in (out / "report.md").read_text()
    assert 'id="infra-errors"' in (out / "report.html").read_text()
    assert "incomplete" in proc.stderr and "8 infra error(s)" in proc.stderr
    # A gate on it does not pass: the input is refused.
    from offscope.cli import main

    assert main(["gate", "--baseline", str(out), "--candidate", str(out)]) == 2


@pytest.mark.timeout(300)
def test_agent_infra_exits_are_counted_not_scored_and_resume_reruns_exactly_them(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    files, cases = zip(*http_cases()[:2], strict=True)
    failing = {f"{cell}.{cases[0].id}.r0" for cell in DIAGONAL} | {
        f"{DIAGONAL[1]}.{cases[1].id}.r1"
    }
    listed = tmp_path / "failing.txt"
    listed.write_text("\n".join(sorted(failing)), encoding="utf-8")
    args = (
        "--cases",
        *map(str, files),
        "--cells",
        "diagonal",
        "--reps",
        "2",
        "--agent",
        f"{sys.executable} {AGENT}",
    )
    env = {"OFFSCOPE_TEST_INFRA_RUNS": str(listed)}
    first = _grid(out, *args, env=env)
    assert first.returncode == 1, first.stderr
    results = load_results(out)
    assert {x.run for x in results.infra_errors} == failing
    assert not failing & {r.run for r in results.runs}
    assert {c: b.infra_errors for c, b in results.cells.items()} == {DIAGONAL[0]: 1, DIAGONAL[1]: 2}
    assert {c: b.n for c, b in results.cells.items()} == {DIAGONAL[0]: 3, DIAGONAL[1]: 2}
    # The failed runs made real calls through the proxy; none of them is in any rate.
    trace = out / "trajectories.jsonl"
    events = list(read_trace(trace))
    assert {e.run for e in events if e.type == "tool_call"} & failing
    for block in results.cells.values():
        assert all(rate.n == block.n for rate in block.rates.values())
    # `offscope report TRACE` leaves them out of its aggregate too, and says how many.
    report = subprocess.run(
        [
            sys.executable,
            "-c",
            "from offscope.cli import entry; entry()",
            "report",
            str(trace),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    summary = json.loads(report.stdout)
    assert summary["infra_errors"] == 3 and summary["aggregate"]["runs"] == 5
    # ... and shadow-compare, reading the grid's trace as production, counts only results.
    from offscope.rollout.shadow.production import load_production

    assert len(load_production(trace).runs) == 5

    # Within a threshold the same grid exits 0 (and still says how many).
    assert main_report_ok(out, "--max-infra-errors", "3")
    assert main_report_ok(out, "--max-infra-errors", "40%")
    assert not main_report_ok(out, "--max-infra-errors", "2")

    # Resume: exactly the infra-error runs run again; the finished ones are kept as they were.
    kept = [
        line
        for line in trace.read_text(encoding="utf-8").splitlines(keepends=True)
        if json.loads(line)["run"] not in failing
    ]
    listed.write_text("", encoding="utf-8")  # the infrastructure is fixed
    second = _grid(out, *args, env=env)
    assert second.returncode == 0, second.stderr
    assert "ran 3" in second.stderr
    text = trace.read_text(encoding="utf-8")
    assert text.startswith("".join(kept))
    rerun = [json.loads(line) for line in text[len("".join(kept)) :].splitlines()]
    assert {e["run"] for e in rerun} == failing
    assert [e["run"] for e in rerun if e["type"] == "run_start"].count(sorted(failing)[0]) == 1
    results = load_results(out)
    assert results.infra_errors == [] and len(results.runs) == 8


def main_report_ok(out: Path, *flags: str) -> bool:
    """`offscope merge` of the one (unsharded) directory applies the same threshold as grid."""
    from offscope.cli import main

    merged = out.parent / f"merged-{'-'.join(f.strip('-%') for f in flags)}"
    code = main(["merge", str(out), "--out", str(merged), *flags])
    assert code in (0, 1)
    assert load_results(merged).infra_error_count == load_results(out).infra_error_count
    return code == 0
