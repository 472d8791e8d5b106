"""`offscope replay` and `offscope report --coverage` on a trace recorded by a
real `offscope proxy` subprocess in front of a real loopback upstream.

The recording ledger allows customers 4411 and 5500; the candidate ledger
narrows it to 4411. By hand, under the candidate and the enforce preset
(block out-of-scope calls at stage act):

  run r1: GET  /customers/4411            in, allow        -> in, allow
          PATCH /customers/5500           in, allow        -> OUT, BLOCK   (step 2)
          GET  git /repos/acme/billing/x  in, allow        -> in, allow
  run r2: GET  /customers/5500            in, allow        -> OUT, allow (a read: not blocked)
          POST /customers/5500/notes      in, allow        -> OUT, BLOCK   (step 2)
          GET  /customers/9999            out, allow       -> out, allow
  run r3: GET  /invoices?invoice_id=2026-7 in, allow       -> in, allow
          PATCH /customers/4411           in, allow        -> in, allow
          PATCH /customers/9999           out, shadow      -> out, BLOCK   (step 3)

So: 3 calls change scope (all newly out), 3 are newly blocked, 3 runs are
interrupted (r1 and r2 at step 2, r3 at step 3). The candidate's host
`old.acme.test`, repository `acme/legacy` and its extract rule for
ops.acme.test are never used.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.sidecar_kit import HTTPX_TLS

pytestmark = pytest.mark.timeout(120)

RECORDING = """\
schema: offscope.ledger/1
id: billing
targets:
  hosts: [crm.acme.test, git.acme.test]
  records: ["customer:4411", "customer:5500", "invoice:*"]
  repositories: [acme/billing]
extract:
  - match: {host: crm.acme.test, path: "/customers/{id}"}
    targets: {record: "customer:{id}"}
  - match: {host: crm.acme.test, path: "/customers/{id}/**"}
    targets: {record: "customer:{id}"}
  - match: {host: crm.acme.test, path: /invoices}
    targets: {record: "invoice:{query.invoice_id}"}
  - match: {host: git.acme.test, path: "/repos/{owner}/{repo}/**"}
    targets: {repository: "{owner}/{repo}"}
"""

CANDIDATE = """\
schema: offscope.ledger/1
id: billing
targets:
  hosts: [crm.acme.test, git.acme.test, old.acme.test]
  records: ["customer:4411", "invoice:*"]
  repositories: [acme/billing, acme/legacy]
extract:
  - match: {host: crm.acme.test, path: "/customers/{id}"}
    targets: {record: "customer:{id}"}
  - match: {host: crm.acme.test, path: "/customers/{id}/**"}
    targets: {record: "customer:{id}"}
  - match: {host: crm.acme.test, path: /invoices}
    targets: {record: "invoice:{query.invoice_id}"}
  - match: {host: git.acme.test, path: "/repos/{owner}/{repo}/**"}
    targets: {repository: "{owner}/{repo}"}
  - match: {host: ops.acme.test, path: "/tickets/{id}"}
    targets: {record: "ticket:{id}"}
  - match: {host: crm.acme.test, method: POST}
    targets: {account: "{args.account}"}
"""

CALLS = [
    ("r1", "GET", "http://crm.acme.test/customers/4411", None),
    ("r1", "PATCH", "http://crm.acme.test/customers/5500", {"plan": "gold"}),
    ("r1", "GET", "http://git.acme.test/repos/acme/billing/issues", None),
    ("r2", "GET", "http://crm.acme.test/customers/5500", None),
    (
        "r2",
        "POST",
        "http://crm.acme.test/customers/5500/notes",
        {"note": "hi", "account": "acme-main"},
    ),
    ("r2", "GET", "http://crm.acme.test/customers/9999", None),
    ("r3", "GET", "http://crm.acme.test/invoices?invoice_id=2026-7", None),
    ("r3", "PATCH", "http://crm.acme.test/customers/4411", {"plan": "gold"}),
    ("r3", "PATCH", "http://crm.acme.test/customers/9999", {"plan": "free"}),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _upstream() -> Iterator[int]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _any(self) -> None:
            size = int(self.headers.get("content-length") or 0)
            if size:
                self.rfile.read(size)
            out = b'{"ok": true}'
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        do_GET = do_POST = do_PATCH = _any

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["offscope", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The calls above through a real `offscope proxy` (shadow preset)."""
    tmp = tmp_path_factory.mktemp("replay")
    (tmp / "recording.yaml").write_text(RECORDING, encoding="utf-8")
    (tmp / "candidate.yaml").write_text(CANDIDATE, encoding="utf-8")
    trace = tmp / "trace.jsonl"
    port, metrics = _free_port(), _free_port()
    with _upstream() as up:
        routes = [
            a
            for h in ("crm.acme.test", "git.acme.test")
            for a in ("--route", f"{h}=127.0.0.1:{up}")
        ]
        proc = subprocess.Popen(
            [
                "offscope",
                "proxy",
                "--ledger",
                str(tmp / "recording.yaml"),
                "--policy",
                "shadow",
                "--listen",
                f"127.0.0.1:{port}",
                "--metrics",
                f"127.0.0.1:{metrics}",
                "--trace",
                str(trace),
                "--requests",
                str(tmp / "requests.jsonl"),
                "--confdir",
                str(tmp / "ca"),
                "--control-listen",
                "",  # no control API: the default port is shared by parallel test workers
                *routes,
            ],
            stdout=subprocess.DEVNULL,
            stderr=(tmp / "proxy.log").open("wb"),
            env={**os.environ},
        )
        try:
            _wait_ready(proc, metrics, tmp)
            for run, method, url, body in CALLS:
                with httpx.Client(proxy=f"http://{run}:x@127.0.0.1:{port}", timeout=20) as c:
                    assert c.request(method, url, json=body).status_code == 200
            coverage = httpx.get(f"http://127.0.0.1:{metrics}/metrics", timeout=10).text
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    (tmp / "metrics.txt").write_text(coverage, encoding="utf-8")
    return {
        "trace": trace,
        "candidate": tmp / "candidate.yaml",
        "recording": tmp / "recording.yaml",
        "dir": tmp,
    }


def _wait_ready(proc: subprocess.Popen, metrics: int, tmp: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError((tmp / "proxy.log").read_text())
        with contextlib.suppress(httpx.HTTPError):
            url = f"http://127.0.0.1:{metrics}/readyz"
            if httpx.get(url, timeout=1, verify=HTTPX_TLS).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError("proxy not ready")


def _replay(
    recorded: dict[str, Path], *extra: str, trace: Path | None = None
) -> tuple[int, dict[str, Any]]:
    proc = _cli(
        "replay",
        str(trace or recorded["trace"]),
        "--ledger",
        str(recorded["candidate"]),
        "--json",
        *extra,
    )
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_trace_is_version_2_with_inputs(recorded):
    calls = [
        json.loads(x) for x in recorded["trace"].read_text().splitlines() if '"tool_call"' in x
    ]
    assert len(calls) == len(CALLS)
    assert {c["schema"] for c in calls} == {"offscope.trace/2"}
    invoice = next(c for c in calls if "invoices" in c["call"]["url"])
    assert invoice["call"]["input"]["host"] == "crm.acme.test"
    assert invoice["call"]["input"]["path"] == "/invoices"
    assert invoice["call"]["input"]["query"] == {"invoice_id": ["2026-7"]}


def test_narrowed_ledger_under_enforce_flips_exactly_the_hand_counted_calls(recorded):
    code, report = _replay(recorded, "--policy", "enforce")
    assert code == 0  # no --fail-on
    c = report["counts"]
    assert report["calls"] == 9
    assert (c["scope_changed"], c["newly_out_of_scope"], c["newly_in_scope"]) == (3, 3, 0)
    assert (c["newly_blocked"], c["newly_passed"]) == (3, 0)
    changes = {
        (g["target"], g["scope"], g["decision"]): (g["calls"], g["example_runs"])
        for g in report["changes"]
    }
    assert changes == {
        ("record:customer:5500", "in -> out", "allow -> block"): (2, ["r1", "r2"]),
        ("record:customer:5500", "in -> out", None): (1, ["r2"]),
        ("record:customer:9999", None, "shadow -> block"): (1, ["r3"]),
    }
    assert report["interrupted"]["runs"] == 3
    assert report["interrupted"]["at_step"] == {"2": 2, "3": 1}
    m = report["metrics"]
    assert (m["recorded"]["oos_calls"], m["candidate"]["oos_calls"]) == (2, 5)
    assert (
        m["recorded"]["funnel"]["acted"]["k"] == 1 and m["candidate"]["funnel"]["acted"]["k"] == 3
    )
    assert m["candidate"]["funnel"]["acted"]["ci95"][0] > 0  # an interval, not just a point
    assert m["candidate"]["blocked_calls"] == 3 and m["recorded"]["blocked_calls"] == 0


def test_unused_reach_and_incomplete_calls_are_named(recorded):
    _, report = _replay(recorded)
    unused = {(e["where"], e["entry"]) for e in report["unused_reach"]["unused"]}
    assert ("targets.hosts[2]", "old.acme.test") in unused
    assert ("targets.repositories[1]", "acme/legacy") in unused
    assert any(w == "extract[4]" for w, _ in unused)
    used = {e["where"] for e in report["unused_reach"]["unused"]}
    assert "targets.records[0]" not in used and "extract[2]" not in used
    # The candidate reads args.account, which the recording ledger did not keep: said, not guessed.
    assert report["counts"]["incomplete"] == 1
    why = report["not_fully_replayed"][0]
    assert "args.account is stored as a digest" in why["why"] and why["example_runs"] == ["r2"]


def test_fail_on_exit_codes(recorded, tmp_path):
    code, report = _replay(
        recorded,
        "--policy",
        "enforce",
        "--fail-on",
        "newly-blocked>0",
        "--out",
        str(tmp_path / "out"),
    )
    assert code == 1
    assert json.loads((tmp_path / "out" / "replay.json").read_text()) == report
    md = (tmp_path / "out" / "replay.md").read_text()
    assert "| record:customer:5500 | http | in -> out | allow -> block | 2 | r1, r2 |" in md
    assert _replay(recorded, "--policy", "shadow", "--fail-on", "newly-blocked>0")[0] == 0
    assert _replay(recorded, "--policy", "enforce", "--fail-on", "interrupted-runs>=4")[0] == 0
    bad = _cli(
        "replay",
        str(recorded["trace"]),
        "--ledger",
        str(recorded["candidate"]),
        "--fail-on",
        "blocked",
    )
    assert bad.returncode == 2 and "--fail-on" in bad.stderr


def test_bad_trace_line_names_file_and_line(recorded, tmp_path):
    broken = tmp_path / "broken.jsonl"
    lines = recorded["trace"].read_text().splitlines()
    broken.write_text(
        "\n".join([lines[0], '{"schema": "offscope.trace/2", "type": "tool_call"}', *lines[1:]])
        + "\n"
    )
    proc = _cli("replay", str(broken), "--ledger", str(recorded["candidate"]))
    assert proc.returncode == 2
    assert f"{broken}:2" in proc.stderr.replace("\n", "")


def test_version_1_trace_replays_from_recorded_targets_and_says_so(recorded, tmp_path):
    old = tmp_path / "v1.jsonl"
    out = []
    for line in recorded["trace"].read_text().splitlines():
        e = json.loads(line)
        e["schema"] = "offscope.trace/1"
        if e["type"] == "tool_call":
            e["call"].pop("input", None)
        out.append(json.dumps(e))
    old.write_text("\n".join(out) + "\n")
    _, report = _replay(recorded, "--policy", "enforce", trace=old)
    c = report["counts"]
    assert c["fallback"] == 9 and c["incomplete"] == 0
    assert (c["newly_out_of_scope"], c["newly_blocked"]) == (
        3,
        3,
    )  # the recorded targets suffice here
    assert report["not_fully_replayed"][0]["calls"] == 9
    assert "offscope.trace/1 record" in report["not_fully_replayed"][0]["why"]


def test_report_coverage_matches_the_live_gauges(recorded):
    proc = _cli(
        "report",
        str(recorded["trace"]),
        "--coverage",
        "--ledger",
        str(recorded["recording"]),
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    cov = json.loads(proc.stdout)
    assert cov["by_kind"]["record"] == {"declared": 3, "used": 3}
    assert cov["by_kind"]["extract"] == {"declared": 4, "used": 4}
    assert cov["unused"] == []
    live = _gauges((recorded["dir"] / "metrics.txt").read_text())
    for kind, counts in cov["by_kind"].items():
        assert live[("offscope_ledger_entries_declared", kind)] == counts["declared"]
        assert live[("offscope_ledger_entries_used", kind)] == counts["used"]
    # The proxy's periodic summary, written again when it stops.
    summaries = [
        json.loads(line)
        for line in (recorded["dir"] / "proxy.log").read_text().splitlines()
        if '"ledger_coverage"' in line
    ]
    assert (
        summaries and summaries[-1]["used"] == "host 2/2, repository 1/1, record 3/3, extract 4/4"
    )
    assert summaries[-1]["unused"] == 0 and summaries[-1]["calls"] == len(CALLS)
    missing = _cli("report", str(recorded["trace"]), "--coverage")
    assert missing.returncode == 2 and "--ledger" in missing.stderr


def _gauges(text: str) -> dict[tuple[str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if (
                s.name.startswith("offscope_ledger_entries_")
                and s.labels.get("ledger") == "billing"
            ):
                out[(s.name, s.labels["entry"])] = s.value
    return out


def test_first_touch_when_every_run_touches_at_step_one():
    """Kaplan-Meier's horizon is the last observed step (a touched run's first
    touch), not the run's length: every run touching at step 1 gives median 1."""
    from offscope.rollout.replay import side_by_side

    runs = _runs_touching([1, 1, 1], steps=3)
    summary = side_by_side(runs, runs)["recorded"]["first_oos_step"]
    assert (summary["touched"], summary["median"], summary["tau"]) == (3, 1, 1)


def test_both_sides_restricted_means_share_one_horizon():
    """An RMST is only comparable at the same tau: when the candidate ledger no longer
    tags the step-1 touches, both sides are still cut at one horizon (the last step
    observed on both), not each at its own."""
    from offscope.rollout.replay import side_by_side

    recorded, candidate = _runs_touching([1, 1, 1], steps=3), _runs_touching([None] * 3, steps=3)
    sides = side_by_side(recorded, candidate)
    taus = {name: sides[name]["first_oos_step"]["tau"] for name in ("recorded", "candidate")}
    assert taus == {"recorded": 1, "candidate": 1}
    assert sides["candidate"]["first_oos_step"]["rmst"] == 1.0  # untouched through step 1


def _runs_touching(first_steps: list[int | None], steps: int) -> list:
    from offscope.trace.metrics import RunState

    runs = []
    for i, first in enumerate(first_steps):
        run = RunState(f"r{i}", "l")
        run.steps, run.first_oos_step = steps, first
        runs.append(run)
    return runs
