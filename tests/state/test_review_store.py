"""The review queue in the state store (offscope/state/review.py), on a real SQLite
file and a real PostgreSQL server: many reviewers at once, as separate processes,
lose no grant and decide each request once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from offscope.errors import InputError
from offscope.state.db import Database
from offscope.state.review import ReviewStore

PROCESSES = 8
PER_PROCESS = 40

REVIEWER = """
import sys
from offscope.state.db import Database
from offscope.state.review import ReviewStore
store = ReviewStore(Database(sys.argv[1]))
first, count = int(sys.argv[2]), int(sys.argv[3])
for i in range(first, first + count):
    store.approve(f"req-{i}", f"reviewer-{first}", "1h")
"""

RACER = """
import sys
from offscope.errors import InputError
from offscope.state.db import Database
from offscope.state.review import ReviewStore
store = ReviewStore(Database(sys.argv[1]))
try:
    store.approve("req-0", sys.argv[2], "1h") if sys.argv[3] == "approve" else store.deny("req-0", sys.argv[2])
    print("decided")
except InputError as exc:
    print("refused:", exc)
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def store_spec(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "state.sqlite")
    return request.getfixturevalue("postgres").url


def _file_requests(store: ReviewStore, n: int, ledger: str = "billing") -> None:
    for i in range(n):
        store.file(
            {
                "schema": "offscope.request/1",
                "id": f"req-{i}",
                "run": f"run-{i}",
                "ledger": ledger,
                "ts": 1000.0 + i,
                "tool": "update_customer",
                "method": "PATCH",
                "host": "crm.acme.test",
                "path": f"/customers/{9000 + i}",
                "targets": [f"record:customer:{9000 + i}"],
                "args_digest": f"sha256:{i:04d}",
                "step": 1,
            }
        )


def _spawn(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.timeout(300)
def test_eight_processes_of_forty_approvals_keep_all_320_grants(store_spec: str) -> None:
    store = ReviewStore(Database(store_spec))
    _file_requests(store, PROCESSES * PER_PROCESS)
    procs = [
        _spawn(REVIEWER, store_spec, str(k * PER_PROCESS), str(PER_PROCESS))
        for k in range(PROCESSES)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err

    grants = store.grants("billing")
    assert sorted(str(g.request_id) for g in grants) == sorted(
        f"req-{i}" for i in range(PROCESSES * PER_PROCESS)
    )
    assert len({g.id for g in grants}) == PROCESSES * PER_PROCESS
    requests, decisions = store.read()
    assert [r["id"] for r in requests] == [f"req-{i}" for i in range(PROCESSES * PER_PROCESS)]
    assert {d["decision"] for d in decisions.values()} == {"approved"}
    assert len(decisions) == PROCESSES * PER_PROCESS


def test_reviewers_racing_on_one_request_decide_it_once(store_spec: str) -> None:
    store = ReviewStore(Database(store_spec))
    _file_requests(store, 1)
    procs = [
        _spawn(RACER, store_spec, f"reviewer-{k}", "approve" if k % 2 else "deny") for k in range(6)
    ]
    outcomes = [proc.communicate(timeout=120)[0].strip() for proc in procs]

    assert sum(o == "decided" for o in outcomes) == 1, outcomes
    assert all(o == "decided" or "was already" in o for o in outcomes), outcomes
    (decision,) = store.decisions_for(["req-0"])
    expected_grants = 1 if decision["decision"] == "approved" else 0
    assert len(store.grants("billing")) == expected_grants


def test_an_approval_is_bound_to_the_request_and_its_ledger(store_spec: str) -> None:
    store = ReviewStore(Database(store_spec))
    _file_requests(store, 2)
    before = store.grants_version("billing")
    (grant,) = store.approve("req-1", "alice@acme.test", "8h", "OPS-42")
    assert (grant.target, grant.tool, grant.method, grant.args_digest, grant.run) == (
        "record:customer:9001",
        "update_customer",
        "PATCH",
        "sha256:0001",
        "run-1",
    )
    assert store.grants_version("billing") != before
    assert store.grants("other-ledger") == []
    (decision,) = store.decisions_for(["req-1", "req-0"])
    assert (decision["approver"], decision["grants"], decision["targets"]) == (
        "alice@acme.test",
        [grant.id],
        ["record:customer:9001"],
    )
    with pytest.raises(InputError, match="already approved"):
        store.deny("req-1", "bob@acme.test")
    with pytest.raises(InputError, match="no request 'req-7'"):
        store.approve("req-7", "alice@acme.test", "8h")
    with pytest.raises(InputError, match="approver is required"):
        store.approve("req-0", " ", "8h")
    # A hold that timed out is recorded by the proxy, unless a human was first.
    assert store.record({"request": "req-0", "decision": "timed_out", "ts": 5.0}) is True
    assert store.record({"request": "req-1", "decision": "timed_out", "ts": 5.0}) is False
