"""A proxy restarted mid-run keeps serving its registered runs: real `offscope proxy`
processes sharing one --state store (a SQLite file; a real PostgreSQL server), SIGTERM
between them, a real loopback upstream.

Before the store, the restarted proxy forgot the run: its credential no longer opened
it, the run went on without its own targets, and its in-scope PATCH turned out of
scope (blocked under enforce)."""

from __future__ import annotations

import sqlite3

import pytest

from tests.e2e.test_runs import HISTORY_POLICY, ledger, policy, start, via
from tests.support.sidecar_kit import ProxyProcess, events, of_type

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=["sqlite", "postgresql"])
def state(request: pytest.FixtureRequest, tmp_path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "state.sqlite")
    return request.getfixturevalue("postgres").url


def _stored_digests(state: str) -> bytes:
    if state.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(state) as db:
            rows = db.execute("SELECT digest FROM registrations").fetchall()
    else:
        with sqlite3.connect(state) as db:
            rows = db.execute("SELECT digest FROM registrations").fetchall()
    return b"".join(bytes(r[0]) for r in rows)


def test_a_restarted_proxy_keeps_a_runs_credential_targets_labels_and_history(
    tmp_path, upstream, confdir, state
):

    def proxy(name: str) -> ProxyProcess:
        return ProxyProcess(
            tmp_path,
            ledger=ledger(tmp_path, "{targets: add}"),
            policy=policy(tmp_path, HISTORY_POLICY),
            routes=upstream.routes(),
            confdir=confdir,
            name=name,
            extra=["--state", state],
        )

    with proxy("before") as first:
        run, credential = start(
            first, targets={"records": ["customer:7777"]}, labels={"ticket": "T-1"}
        )
        with via(first, run, credential) as c:
            assert c.patch("http://crm.acme.test/customers/7777", json={}).status_code == 200
            assert c.get("http://crm.acme.test/customers/4411").status_code == 200  # arms history
    assert first.proc.returncode == 0  # SIGTERM: drained and stopped

    with proxy("after") as second:
        assert "runs_restored" in second.stderr()
        with via(second, run, credential) as c:
            in_scope = c.patch("http://crm.acme.test/customers/7777", json={"a": 1})
            exfiltrate = c.post("http://crm.acme.test/customers/9999/notes", json={})
        summary = second.control("GET", f"/runs/{run}").json()

    assert in_scope.status_code == 200, in_scope.text  # the run's own target, still in scope
    assert exfiltrate.status_code == 403
    (start_event,) = of_type(events(second.trace), "run_start")
    assert start_event["run"] == run
    assert start_event["labels"] == {"ticket": "T-1", "auth": "registered"}
    calls = of_type(events(second.trace), "tool_call")
    assert [c["call"]["scope"] for c in calls] == ["in", "out"]
    assert "read-then-exfiltrate" in calls[1]["reason"]  # the history rule armed before
    assert summary["registered"] is True and summary["credential_valid"] is True
    # Only the credential's digest is stored.
    stored = _stored_digests(state)
    assert credential.encode() not in stored and len(stored) == 32
