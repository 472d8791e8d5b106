"""The hold registry on its own (offscope/proxy/holds.py): decisions read from
a real request log as `offscope requests` writes it (half-written lines,
a rotated log), the API's resolution, timeouts, and a webhook that is down."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest

from offscope.policies import requests as reqs
from offscope.policies.model import Webhook
from offscope.policies.requests import DECISION_SCHEMA
from offscope.proxy.holds import HoldRegistry, Resolution, slack_notice

pytestmark = pytest.mark.timeout(60)


def _request(log: Path, rid: str, run: str = "r1") -> dict:
    item = {
        "schema": "offscope.request/1",
        "id": rid,
        "run": run,
        "ledger": "l",
        "tool": "http",
        "method": "PATCH",
        "url": "http://crm.acme.test/x",
        "targets": ["host:crm.acme.test"],
        "step": 1,
    }
    with log.open("a") as f:
        f.write(json.dumps(item) + "\n")
    return item


async def test_a_denial_in_the_log_resolves_the_held_call(tmp_path):
    log = tmp_path / "requests.jsonl"
    old = _request(log, "req-old")
    reqs.deny(log, "req-old", "someone")  # decided before the proxy started: answers nothing here
    holds = HoldRegistry(log)
    request = _request(log, "req-1")
    holds.park(request)
    holds.park(old)
    waiting = asyncio.ensure_future(holds.wait("req-1", 30))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    reqs.deny(log, "req-1", "carol", "no")
    result = await waiting
    assert (result.outcome, result.approver, result.reason) == ("denied", "carol", "no")
    assert holds.request("req-old") is not None  # the old decision was not re-read
    assert (await holds.wait("req-old", 0.1)).outcome == "timeout"
    assert len(holds) == 0


async def test_half_written_lines_and_a_rotated_log(tmp_path):
    log = tmp_path / "requests.jsonl"
    holds = HoldRegistry(log)
    for rid in ("req-a", "req-b"):
        holds.park(_request(log, rid))
    line = (
        json.dumps(
            {
                "schema": DECISION_SCHEMA,
                "request": "req-a",
                "decision": "approved",
                "approver": "al",
                "ts": 5.0,
                "grants": ["grant-1"],
                "targets": ["host:crm.acme.test"],
                "scope": "run",
            }
        )
        + "\n"
    )
    with log.open("a") as f:
        f.write(line[:20])  # a writer mid-line
    assert holds.poll() == 0
    with log.open("a") as f:
        f.write(line[20:])
    assert holds.poll() == 1
    rotated = tmp_path / "requests.jsonl.1"
    log.rename(rotated)  # a new file under the same name: read from its start
    log.write_text(
        json.dumps(
            {
                "schema": DECISION_SCHEMA,
                "request": "req-b",
                "decision": "denied",
                "approver": "bo",
                "ts": 6.0,
                "grants": [],
            }
        )
        + "\n"
    )
    assert holds.poll() == 1
    a, b = await holds.wait("req-a", 1), await holds.wait("req-b", 1)
    assert (
        a.outcome == "approved"
        and a.grant_for("host:crm.acme.test") == "grant-1"
        and a.scope == "run"
    )
    assert b.outcome == "denied" and b.approver == "bo"


async def test_resolve_once_and_close(tmp_path):
    holds = HoldRegistry(None)
    holds.park({"id": "req-1"})
    holds.park({"id": "req-2"})
    assert holds.resolve("req-1", Resolution("approved", 1.0, "al")) is True
    assert (
        holds.resolve("req-1", Resolution("denied", 2.0, "bo")) is False
    )  # the first decision stands
    assert holds.resolve("req-nope", Resolution("denied", 2.0, "bo")) is False
    assert (await holds.wait("req-1", 1)).approver == "al"
    waiting = asyncio.ensure_future(holds.wait("req-2", 30))
    await asyncio.sleep(0)
    holds.close()  # the proxy stops: held calls are refused now
    assert (await waiting).reason == "proxy stopped"


async def test_a_webhook_that_is_down_is_counted(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    failures: list[int] = []
    holds = HoldRegistry(None, on_webhook_failure=lambda: failures.append(1))
    holds.notify(
        Webhook(url=f"http://127.0.0.1:{port}/hook", timeout_seconds=1),
        {"id": "req-1", "run": "r"},
        5,
    )
    for _ in range(100):
        if failures:
            break
        await asyncio.sleep(0.05)
    assert failures == [1] and holds.webhook_failures == 1


def test_slack_notice_is_slack_shaped():
    body = slack_notice(
        {
            "id": "req-1",
            "run": "r1",
            "ledger": "l",
            "method": "PATCH",
            "url": "http://x/y",
            "targets": ["host:x"],
            "stage": "act",
        },
        300,
    )
    assert (
        set(body) == {"text", "blocks"}
        and "req-1" in body["text"]
        and "PATCH http://x/y" in body["text"]
    )
    assert [b["type"] for b in body["blocks"]] == ["section", "context"]
    assert body["blocks"][0]["text"]["type"] == "mrkdwn"
