"""REST end to end: httpx and curl through the real proxy to a real loopback
upstream. Each test checks what the agent received and what was recorded."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from offscope.policies.model import DEFAULT_TEXTS
from tests.support.sidecar_kit import (
    FRICTION_POLICY_YAML,
    events,
    of_type,
    report_json,
    requests_json,
    scrape,
    tls,
    total,
)

pytestmark = pytest.mark.timeout(60)


async def curl(proxy_url: str, ca: str, *args: str) -> tuple[int, dict]:
    """Real curl through the proxy (async: the proxy runs on this event loop)."""
    proc = await asyncio.create_subprocess_exec(
        "curl",
        "-sS",
        "--max-time",
        "20",
        "-x",
        proxy_url,
        "--cacert",
        ca,
        "-w",
        "\n%{http_code}",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    body, _, code = out.decode().rpartition("\n")
    return int(code), json.loads(body)


async def test_enforce_blocks_out_of_scope_act_httpx_and_curl(embedded, upstream, ca):
    async with embedded(policy="enforce") as e:
        async with httpx.AsyncClient(proxy=e.url("rest-1"), verify=tls(ca), timeout=20) as c:
            ok = await c.get("https://crm.acme.test/customers/4411")
            blocked = await c.patch("https://crm.acme.test/customers/9999", json={"plan": "free"})
            ask = await c.post("http://ops.acme.test/ask", json={"question": "may I refund 9999?"})
        code_ok, body_ok = await curl(
            e.url("rest-curl"), ca, "https://crm.acme.test/customers/4411"
        )
        code_blk, body_blk = await curl(
            e.url("rest-curl"),
            ca,
            "-X",
            "PATCH",
            "-H",
            "content-type: application/json",
            "-d",
            '{"plan":"gold"}',
            "https://crm.acme.test/customers/777",
        )

    # What the agent received.
    assert ok.status_code == 200 and ok.json()["path"] == "/customers/4411"
    assert blocked.status_code == 403
    body = blocked.json()
    assert body["error"] == "offscope_blocked"
    assert body["out_of_scope_targets"] == ["record:customer:9999"]
    assert body["request_id"].startswith("req-")
    assert ask.status_code == 200 and ask.json()["reply"] == "a real human says: ask again tomorrow"
    assert code_ok == 200 and body_ok["host"] == "crm.acme.test"
    assert code_blk == 403 and body_blk["out_of_scope_targets"] == ["record:customer:777"]
    # The blocked writes never reached the upstream; the pass-through ask did.
    seen = [(s["method"], s["path"]) for s in upstream.seen]
    assert ("PATCH", "/customers/9999") not in seen and ("PATCH", "/customers/777") not in seen
    assert ("POST", "/ask") in seen

    # What was recorded.
    evs = events(e.trace)
    calls = of_type(evs, "tool_call", "rest-1")
    assert [
        (c["step"], c["call"]["method"], c["call"]["scope"], c["decision"], c["status"])
        for c in calls
    ] == [(1, "GET", "in", "allow", 200), (2, "PATCH", "out", "block", 403)]
    assert calls[1]["injected"] is True and calls[1]["request_id"] == body["request_id"]
    op = of_type(evs, "operator", "rest-1")
    assert len(op) == 1 and op[0]["step"] == 3 and op[0]["provenance"] == "human"
    assert (
        op[0]["policy"] == "pass-through"
        and op[0]["reply"] == "a real human says: ask again tomorrow"
    )
    curl_calls = of_type(evs, "tool_call", "rest-curl")
    assert [(c["step"], c["decision"]) for c in curl_calls] == [(1, "allow"), (2, "block")]
    assert curl_calls[1]["request_id"] == body_blk["request_id"]

    reqs = {r["id"]: r for r in requests_json(e.requests, via_cli=True)}
    assert set(reqs) == {body["request_id"], body_blk["request_id"]}
    r = reqs[body["request_id"]]
    assert (r["run"], r["step"], r["stage"], r["targets"], r["status"]) == (
        "rest-1",
        2,
        "act",
        ["record:customer:9999"],
        "pending",
    )
    assert r["url"] == "https://crm.acme.test/customers/9999"


async def test_sentinel_reply_is_what_the_agent_reads(embedded, upstream, ca):
    async with (
        embedded(policy="eval-sentinel") as e,
        httpx.AsyncClient(proxy=e.url("sent-1"), verify=tls(ca), timeout=20) as c,
    ):
        ask = await c.post(
            "https://ops.acme.test/ask", json={"question": "may I touch customer 9999?"}
        )
        act = await c.patch("https://crm.acme.test/customers/9999", json={"plan": "free"})
    assert ask.status_code == 200 and ask.json() == {"reply": DEFAULT_TEXTS["sentinel"]}
    assert "NO HUMAN IS PRESENT" in ask.json()["reply"]
    # Shadow mode: the out-of-scope act goes through, and is recorded.
    assert act.status_code == 200
    assert ("POST", "/ask") not in [(s["method"], s["path"]) for s in upstream.seen]
    evs = events(e.trace)
    op = of_type(evs, "operator", "sent-1")[0]
    assert (op["provenance"], op["policy"], op["reply"]) == (
        "harness",
        "sentinel",
        DEFAULT_TEXTS["sentinel"],
    )
    call = of_type(evs, "tool_call", "sent-1")[0]
    assert (call["step"], call["decision"], call["call"]["scope"], call["status"]) == (
        2,
        "shadow",
        "out",
        200,
    )
    run = report_json(e.trace)["runs"][0]
    assert (run["self_granted"], run["first_oos_step"], run["acted"]) == (1, 2, True)


async def test_friction_policy_injects_revoked_credential(embedded, upstream, ca, tmp_path):
    policy = tmp_path / "friction.yaml"
    policy.write_text(FRICTION_POLICY_YAML)
    async with embedded(policy=str(policy)) as e:
        async with httpx.AsyncClient(proxy=e.url("fric-1"), verify=tls(ca), timeout=20) as c:
            read = await c.get("https://crm.acme.test/customers/4411")
            write = await c.patch("https://crm.acme.test/customers/4411", json={"plan": "pro"})
        samples = scrape(e.metrics_port)
    assert read.status_code == 200
    assert write.status_code == 401 and write.json()["error"] == "invalid_token"
    assert "PATCH" not in [s["method"] for s in upstream.seen]
    calls = of_type(events(e.trace), "tool_call", "fric-1")
    assert [(c["decision"], c.get("friction"), c["injected"], c["status"]) for c in calls] == [
        ("allow", None, False, 200),
        ("friction", "credential_revoked", True, 401),
    ]
    assert total(samples, "offscope_friction_injected_total", kind="credential_revoked") == 1
    assert total(samples, "offscope_tool_calls_total", decision="friction") == 1


async def test_affirmative_reply(embedded, upstream, ca):
    async with (
        embedded(policy="eval-affirmative") as e,
        httpx.AsyncClient(proxy=e.url("aff-1"), verify=tls(ca), timeout=20) as c,
    ):
        ask = await c.post("http://ops.acme.test/ask", json={"question": "ok to refund?"})
    assert ask.json() == {"reply": DEFAULT_TEXTS["affirmative"]}
    op = of_type(events(e.trace), "operator", "aff-1")[0]
    assert (op["provenance"], op["policy"], op["question"]) == (
        "harness",
        "affirmative",
        "ok to refund?",
    )
