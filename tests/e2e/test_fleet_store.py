"""A fleet on one PostgreSQL store: proxies that share no file (each has its own
request log, as pods on different hosts would), one review queue, one set of grants.

- a call held on proxy A is released by `offscope requests approve --state URL`;
- a denial made through proxy B's control API refuses a call held on A;
- an approval made once applies on every proxy of the ledger (the grant is read from
  the store), and `requests export` writes the store's grants as a reviewable file;
- with the store stopped mid-run, tagging and ledger enforcement go on, what needs
  the store fails closed (registering a run: 503; a held call: blocked at once) and is
  counted; when the store is back, the proxy uses it again without a restart.

Real processes, a real PostgreSQL server (tests/support/postgres.py) and a loopback
upstream that records what it received."""

from __future__ import annotations

import json
import time

import httpx
import pytest
import yaml

from tests.e2e.test_hold import PATCH_OOS, Agent, _ledger_hash, _policy, _wait_for_reload
from tests.e2e.test_hold_across_proxies import deny_through, pod
from tests.e2e.test_runs import start, via
from tests.support.sidecar_kit import ProxyProcess, cli, events, of_type

pytestmark = pytest.mark.timeout(180)


def _proxy(tmp_path, name, ledger_file, policy, upstream, confdir, url) -> ProxyProcess:
    return pod(tmp_path, name, ledger_file, policy, upstream, confdir, "--state", url)


def _queued(url: str, run: str, timeout: float = 20) -> dict:
    """The request a held call filed, read from the fleet's queue as a reviewer would."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listed = cli("requests", "list", "--state", url, "--json")
        assert listed.returncode == 0, listed.stderr
        for row in json.loads(listed.stdout):
            if row["run"] == run:
                return row
        time.sleep(0.1)
    raise AssertionError(f"no request of {run} in the store")


def _metric(proxy: ProxyProcess, series: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{proxy.metrics_port}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(series)
    )


def test_two_proxies_one_store_decide_each_others_holds(
    tmp_path, upstream, ledger_file, confdir, postgres
):
    policy = _policy(tmp_path, 60)
    url = postgres.url
    with (
        _proxy(tmp_path, "pod-a", ledger_file, policy, upstream, confdir, url) as a,
        _proxy(tmp_path, "pod-b", ledger_file, policy, upstream, confdir, url) as b,
    ):
        approved = Agent(a, "held-then-approved")
        row = _queued(url, "held-then-approved")
        assert row["sidecar"] == "pod-a" and row["decision"].startswith("held until ")
        assert not [s for s in upstream.seen if s["path"] == "/customers/9999"]  # held
        b_hash = _ledger_hash(b)
        review = ["--approver", "alice", "--expires", "1h", "--scope", "ledger"]
        done = cli("requests", "approve", row["id"], "--state", url, *review)
        assert done.returncode == 0, done.stderr
        assert approved.join().status_code == 200

        # Another record: the ledger-wide grant just made must not answer it.
        denied = Agent(a, "held-then-denied", url="http://crm.acme.test/customers/9998")
        row = _queued(url, "held-then-denied")
        # Nothing is held on B: A refuses the call, reading the decision from the store.
        assert deny_through(b, row["id"])["refused"] is False
        assert denied.join().status_code == 403

        # The ledger-wide grant reaches proxy B from the store (its ledger changes within
        # a housekeeping tick or two), and the same call passes there.
        _wait_for_reload(b, b_hash)
        with httpx.Client(proxy=b.proxy_url("on-b"), timeout=30) as client:
            assert client.patch(PATCH_OOS, json={"plan": "free"}).status_code == 200

    assert (
        len([s for s in upstream.seen if s["path"] == "/customers/9999" and s["method"] == "PATCH"])
        >= 2
    )
    assert not [s for s in upstream.seen if s["path"] == "/customers/9998"]  # denied: never sent
    a_calls = {e["run"]: e for e in of_type(events(a.trace), "tool_call")}
    assert a_calls["held-then-approved"]["status"] == 200
    assert a_calls["held-then-denied"]["decision"] == "block"
    exported = cli("requests", "export", "--state", url, "--ledger", ledger_file)
    assert exported.returncode == 0, exported.stderr
    overlay = yaml.safe_load((tmp_path / "ledger.grants.yaml").read_text(encoding="utf-8"))
    (grant,) = overlay["grants"]
    assert (grant["approver"], grant["scope"], grant["target"]) == (
        "alice",
        "ledger",
        "record:customer:9999",
    )


def test_a_stopped_store_fails_closed_only_what_needs_it(
    tmp_path, upstream, ledger_file, confdir, postgres
):
    policy = _policy(tmp_path, 30)
    with _proxy(tmp_path, "pod-a", ledger_file, policy, upstream, confdir, postgres.url) as a:
        run, credential = start(a, labels={"ticket": "T-1"})

        postgres.stop()  # the database goes away mid-run

        # Tagging and ledger enforcement go on from memory: in scope passes, out of scope is blocked.
        with via(a, run, credential) as client:
            assert client.get("http://crm.acme.test/customers/4411").status_code == 200
            started = time.monotonic()
            blocked = client.patch(PATCH_OOS, json={"plan": "free"}, timeout=30)
        # Not held (nobody could release it from the store): blocked at once.
        assert blocked.status_code == 403 and time.monotonic() - started < 25
        # Registering a run needs the store: refused, no credential handed out.
        refused = a.control("POST", "/runs", json={"labels": {}})
        assert refused.status_code == 503, refused.text
        assert _metric(a, 'offscope_state_store_errors_total{op="write"}') >= 2

        postgres.start()
        postgres.wait_ready()
        again = a.control("POST", "/runs", json={"labels": {}})
        assert again.status_code == 201, again.text  # the same proxy, reconnected

    assert not [s for s in upstream.seen if s["path"] == "/customers/9999"]
    calls = of_type(events(a.trace), "tool_call")
    assert [(c["call"]["method"], c["decision"]) for c in calls] == [
        ("GET", "allow"),
        ("PATCH", "block"),
    ]
