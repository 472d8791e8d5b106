"""Two proxy processes that share one request log (one host, one review queue): a call
held on proxy A is released by `offscope requests approve` run against the log, and a
denial made through proxy B's control API refuses a call held on A. Real processes, a
real loopback upstream that records what it received."""

from __future__ import annotations

import json

import pytest

from tests.e2e.test_hold import PATCH_OOS, Agent, _pending_request, _policy
from tests.support.sidecar_kit import ProxyProcess, cli, events, of_type

pytestmark = pytest.mark.timeout(120)


def pod(tmp_path, name, ledger_file, policy, upstream, confdir, *extra: str) -> ProxyProcess:
    """One proxy of a fleet, named (`--instance`) like the pod it would run in."""
    return ProxyProcess(
        tmp_path,
        ledger=ledger_file,
        policy=policy,
        routes=upstream.routes(),
        confdir=confdir,
        name=name,
        extra=[*extra, "--instance", name],
    )


def deny_through(proxy: ProxyProcess, request_id: str) -> dict:
    """Deny a request through a proxy's control API (bob, "no"); the API's answer."""
    r = proxy.control(
        "POST", f"/requests/{request_id}/deny", json={"approver": "bob", "reason": "no"}
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_one_request_log_two_proxies_decide_each_others_holds(
    tmp_path, upstream, ledger_file, confdir
):
    shared = tmp_path / "shared-requests.jsonl"
    policy = _policy(tmp_path, 60)

    def proxy(name: str) -> ProxyProcess:
        return pod(
            tmp_path, name, ledger_file, policy, upstream, confdir, "--requests", str(shared)
        )

    with proxy("proxy-a") as a, proxy("proxy-b") as b:
        a.requests = b.requests = shared  # both file into the shared log
        approved = Agent(a, "held-then-approved")
        request = _pending_request(a, "held-then-approved")
        assert not [s for s in upstream.seen if s["path"] == "/customers/9999"]  # held
        # The review queue says the call is held right now, and until when.
        listed = json.loads(cli("requests", "list", "--log", str(shared), "--json").stdout)
        (row,) = [r for r in listed if r["id"] == request["id"]]
        assert row["decision"].startswith("held until ") and row["sidecar"] == "proxy-a"
        assert row["held_until"] > row["ts"] and row["method"] == "PATCH"
        done = cli(
            "requests",
            "approve",
            request["id"],
            "--log",
            str(shared),
            "--ledger",
            ledger_file,
            "--approver",
            "alice",
            "--expires",
            "1h",
        )
        assert done.returncode == 0, done.stderr
        assert approved.join().status_code == 200

        denied = Agent(a, "held-then-denied")
        request = _pending_request(a, "held-then-denied")
        deny_through(b, request["id"])
        assert denied.join().status_code == 403

    # The upstream received the approved call once, and never the denied one.
    assert len([s for s in upstream.seen if s["path"] == "/customers/9999"]) == 1
    held = {e["run"]: e for e in of_type(events(a.trace), "tool_call")}
    assert held["held-then-approved"]["status"] == 200
    assert held["held-then-denied"]["decision"] == "block"
    assert PATCH_OOS.endswith("/customers/9999")
