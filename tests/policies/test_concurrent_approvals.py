"""Many reviewers at once, as real processes: no grant and no decision is lost.

Before the lock, 40 approvals from 8 processes kept 7 to 10 grants: each approval
rewrote the grants overlay from what it had read, dropping the others'."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from offscope.policies import requests as reqs

LEDGER = """\
schema: offscope.ledger/1
id: billing
targets:
  hosts: [crm.acme.test]
extract:
  - match: {path: "/customers/{id}"}
    targets: {record: "customer:{id}"}
"""
PROCESSES = 8
PER_PROCESS = 40

# One reviewer: approves its share of the requests, one `approve` call each.
REVIEWER = """
import sys
from offscope.policies import requests as reqs
log, ledger, first, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
for i in range(first, first + count):
    reqs.approve(log, f"req-{i}", ledger, f"reviewer-{first}", "1h")
"""

RACER = """
import sys
from offscope.errors import InputError
from offscope.policies import requests as reqs
try:
    reqs.approve(sys.argv[1], "req-0", sys.argv[2], sys.argv[3], "1h")
    print("approved")
except InputError as exc:
    print("refused:", exc)
"""


def _request_log(path: Path, n: int) -> None:
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            request = {
                "schema": "offscope.request/1",
                "id": f"req-{i}",
                "run": f"run-{i}",
                "ledger": "billing",
                "method": "PATCH",
                "host": "crm.acme.test",
                "path": f"/customers/{9000 + i}",
                "targets": [f"record:customer:{9000 + i}"],
                "step": 1,
            }
            f.write(json.dumps(request) + "\n")


def _spawn(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_eight_processes_of_forty_approvals_keep_all_320_grants(tmp_path: Path) -> None:
    ledger, log = tmp_path / "ledger.yaml", tmp_path / "requests.jsonl"
    ledger.write_text(LEDGER, encoding="utf-8")
    _request_log(log, PROCESSES * PER_PROCESS)
    procs = [
        _spawn(REVIEWER, str(log), str(ledger), str(k * PER_PROCESS), str(PER_PROCESS))
        for k in range(PROCESSES)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err

    overlay = yaml.safe_load((tmp_path / "ledger.grants.yaml").read_text(encoding="utf-8"))
    granted = sorted(g["request_id"] for g in overlay["grants"])
    assert len(granted) == PROCESSES * PER_PROCESS
    assert granted == sorted(f"req-{i}" for i in range(PROCESSES * PER_PROCESS))
    _, decisions = reqs.read_log(log)
    assert len(decisions) == PROCESSES * PER_PROCESS
    assert {d["decision"] for d in decisions.values()} == {"approved"}


def test_two_reviewers_of_one_request_decide_it_once(tmp_path: Path) -> None:
    ledger, log = tmp_path / "ledger.yaml", tmp_path / "requests.jsonl"
    ledger.write_text(LEDGER, encoding="utf-8")
    _request_log(log, 1)
    procs = [_spawn(RACER, str(log), str(ledger), f"reviewer-{k}") for k in range(6)]
    outcomes = [proc.communicate(timeout=120)[0].strip() for proc in procs]

    assert sum(o == "approved" for o in outcomes) == 1, outcomes
    assert all(o == "approved" or "already approved" in o for o in outcomes), outcomes
    overlay = yaml.safe_load((tmp_path / "ledger.grants.yaml").read_text(encoding="utf-8"))
    assert len(overlay["grants"]) == 1
    decision_lines = [
        line for line in log.read_text(encoding="utf-8").splitlines() if "request-decision" in line
    ]
    assert len(decision_lines) == 1
