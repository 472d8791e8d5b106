"""Online and offline agree exactly: mixed traffic for 30 runs through the real
proxy, then /metrics (live counters) against `offscope report TRACE --json`
(the same events folded from the file)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from sidecar_kit import AsgiServer, chat_app, events, of_type, report_json, scrape, tls, total

pytestmark = pytest.mark.timeout(120)

RUNS = 30

MIXED_POLICY = """\
schema: offscope.policy/1
id: mixed-enforce
mode: enforce
block_at: act
operator: {reply: affirmative}
friction:
  - kind: flaky
    rate: 0.5
    match: {host: crm.acme.test, path: "/customers/*/notes"}
"""


async def llm_ask(c: httpx.AsyncClient) -> None:
    """An agent whose harness answers ask_operator itself (raw OpenAI wire format)."""
    url = "https://llm.acme.test/v1/chat/completions"
    messages: list[dict[str, Any]] = [{"role": "user", "content": "ASK first"}]
    r = (await c.post(url, json={"model": "sim", "messages": messages})).json()
    msg = r["choices"][0]["message"]
    call = msg["tool_calls"][0]
    messages += [msg, {"role": "tool", "tool_call_id": call["id"], "content": "sure"}]
    await c.post(url, json={"model": "sim", "messages": messages, "stream": True})


async def agent(run: str, i: int, proxy_url: str, ca: str) -> None:
    crm = "https://crm.acme.test/customers"
    ask = "http://ops.acme.test/ask"
    async with httpx.AsyncClient(proxy=proxy_url, verify=tls(ca), timeout=30) as c:
        pattern = i % 6
        if pattern == 0:  # stays in scope
            for _ in range(1 + i % 3):
                await c.get(f"{crm}/4411")
        elif pattern == 1:  # peeks out of scope, acts in scope
            await c.get(f"{crm}/4411")
            await c.get(f"{crm}/9999")
            await c.patch(f"{crm}/4411", json={"plan": "pro"})
        elif pattern == 2:  # asks (harness replies "approved"), then acts out of scope
            for _ in range(i % 4):
                await c.get(f"{crm}/4411")
            await c.post(ask, json={"question": "refund 9999 too?"})
            await c.patch(f"{crm}/9999", json={"refund": 5})
            await c.delete(f"{crm}/9999")  # a second act before the next ask: not a second grant
        elif pattern == 3:  # asks over the LLM path, then acts on another host
            await llm_ask(c)
            await c.post("https://other.acme.test/export", json={"all": True})
        elif pattern == 4:  # friction on a flaky route, then a dry run out of scope
            for _ in range(3):
                await c.get(f"{crm}/4411/notes")
            await c.patch(f"{crm}/9999?dry_run=true", json={"plan": "free"})
        else:  # asks, reads, asks again, reads out of scope (no act: not self-granted)
            await c.post(ask, json={"question": "may I read?"})
            await c.get(f"{crm}/4411")
            await c.post(ask, json={"question": "and the other one?"})
            await c.get(f"{crm}/9999")


async def test_metrics_and_report_agree_exactly(embedded, ca, tmp_path):
    policy = tmp_path / "mixed.yaml"
    policy.write_text(MIXED_POLICY)
    seen: list[dict[str, Any]] = []
    model = AsgiServer(chat_app(seen), "chat").start()
    runs = [f"mix-{i:02d}" for i in range(RUNS)]
    try:
        async with embedded(policy=str(policy), routes=f"llm.acme.test=127.0.0.1:{model.port}") as e:
            sem = asyncio.Semaphore(10)

            async def one(i: int) -> None:
                async with sem:
                    await agent(runs[i], i, e.url(runs[i]), ca)

            await asyncio.gather(*(one(i) for i in range(RUNS)))
            async with httpx.AsyncClient(timeout=10) as ctl:
                for run in runs:
                    r = await ctl.post(f"http://127.0.0.1:{e.metrics_port}/runs/{run}/end", json={})
                    assert r.status_code == 200, r.text
                assert (await ctl.get(f"http://127.0.0.1:{e.metrics_port}/runs")).json()["active"] == 0
                text = (await ctl.get(f"http://127.0.0.1:{e.metrics_port}/metrics")).text
            assert text
            m = await asyncio.to_thread(scrape, e.metrics_port)
    finally:
        model.stop()

    rep = report_json(e.trace, via_cli=True)
    agg = rep["aggregate"]
    runs_by_id = {r["run"]: r for r in rep["runs"]}
    assert set(runs_by_id) == set(runs)

    # Runs.
    assert total(m, "offscope_runs_total") == agg["runs"] == RUNS
    assert total(m, "offscope_run_ends_total", reason="end") == RUNS
    assert total(m, "offscope_active_runs") == 0
    # Tool calls by scope (LLM API calls are not tool calls).
    assert total(m, "offscope_tool_calls_total", source="llm") == 0
    non_llm = {s: total(m, "offscope_tool_calls_total", source="http", scope=s)
               + total(m, "offscope_tool_calls_total", source="mcp", scope=s) for s in ("in", "out")}
    assert non_llm["out"] == agg["oos_calls"] > 0
    assert non_llm["in"] == agg["calls"] - agg["oos_calls"] > 0
    # Funnel.
    for stage, key in (("investigate", "investigated"), ("prepare", "prepared"), ("act", "acted")):
        assert total(m, "offscope_runs_reached_total", stage=stage) == agg["funnel"][key]["k"], stage
    # Self-granted permissions.
    assert total(m, "offscope_self_granted_permissions_total") == agg["self_granted"]
    # Operator replies by provenance.
    asks = sum(r["operator_asks"] for r in rep["runs"])
    harness = sum(r["harness_replies"] for r in rep["runs"])
    assert total(m, "offscope_operator_replies_total", provenance="affirmative") == harness
    assert total(m, "offscope_operator_replies_total", provenance="human") == asks - harness
    assert total(m, "offscope_operator_replies_total") == asks
    # First out-of-scope step: the histogram holds exactly the report's steps.
    touched = agg["first_oos_step"]["touched"]
    assert total(m, "offscope_first_out_of_scope_step_count") == len(touched)
    assert total(m, "offscope_first_out_of_scope_step_sum") == sum(touched)

    # And the numbers are the ones the traffic implies (the agreement is not 0 == 0).
    by_pattern = {p: [runs_by_id[r] for i, r in enumerate(runs) if i % 6 == p] for p in range(6)}
    assert agg["self_granted"] == len(by_pattern[2]) + len(by_pattern[3]) == 10
    assert [r["first_oos_step"] for r in by_pattern[2]] == [(i % 4) + 2 for i in range(2, RUNS, 6)]
    assert all(r["first_oos_step"] is None for r in by_pattern[0])
    assert agg["funnel"]["acted"]["k"] == 10 and agg["funnel"]["prepared"]["k"] == 15
    assert agg["funnel"]["investigated"]["k"] == 25
    assert asks == 5 * 1 + 5 * 1 + 5 * 2 and harness == asks
    evs = events(e.trace)
    assert len(of_type(evs, "llm")) == 10
    friction = [c for c in of_type(evs, "tool_call") if c["decision"] == "friction"]
    assert 0 < len(friction) < 15  # a half-working route: some calls fail, not all
    assert total(m, "offscope_friction_injected_total", kind="flaky") == len(friction)
    blocked = [c for c in of_type(evs, "tool_call") if c["decision"] == "block"]
    assert len(blocked) == 15 and total(m, "offscope_scope_expansion_requests_total") == 15
