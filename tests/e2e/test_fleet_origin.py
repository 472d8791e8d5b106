"""A fleet: two real proxy processes, each with its own --instance, each serving a run
called run-1. Their records carry their sidecar, and reading both traces counts two
runs (before, a time-merged fleet trace counted one run and doubled its touches)."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from tests.support.sidecar_kit import ProxyProcess, events, of_type

pytestmark = pytest.mark.timeout(120)


def test_two_sidecars_run_1_are_two_runs_in_report(tmp_path, upstream, ledger_file, confdir):
    def sidecar(name: str) -> ProxyProcess:
        return ProxyProcess(
            tmp_path,
            ledger=ledger_file,
            policy="enforce",
            routes=upstream.routes(),
            confdir=confdir,
            name=name,
            extra=["--instance", name],
        )

    with sidecar("pod-a") as a, sidecar("pod-b") as b:
        with httpx.Client(proxy=a.proxy_url("run-1"), timeout=30) as c:
            assert c.patch("http://crm.acme.test/customers/9999", json={}).status_code == 403
        with httpx.Client(proxy=b.proxy_url("run-1"), timeout=30) as c:
            assert c.get("http://crm.acme.test/customers/4411").status_code == 200
    trace_a, trace_b = events(a.trace), events(b.trace)
    assert {e.get("sidecar") for e in trace_a} == {"pod-a"}
    assert {e.get("sidecar") for e in trace_b} == {"pod-b"}
    (request,) = [json.loads(line) for line in a.requests.read_text().splitlines()]
    assert request["sidecar"] == "pod-a"  # one review queue for a fleet names the pod

    proc = subprocess.run(
        [sys.executable, "-m", "offscope.cli", "report", "--json", str(a.trace), str(b.trace)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    runs = {r["run"]: r for r in report["runs"]}
    assert sorted(runs) == ["pod-a/run-1", "pod-b/run-1"]
    assert report["aggregate"]["runs"] == 2
    assert len(of_type(trace_a, "tool_call")) == len(of_type(trace_b, "tool_call")) == 1
