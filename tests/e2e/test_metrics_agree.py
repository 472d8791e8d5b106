"""Live and offline agree on real SDK traffic, and both equal hand-computed values.

An `offscope proxy` subprocess (the shadow preset: operator replies pass
through) sits in front of a stateful FastMCP server (streamable HTTP), a REST
upstream and an OpenAI-compatible model. Real clients drive eleven runs: `mcp`
SDK sessions (with their background GET stream and closing DELETE, parallel
calls, an act issued before an ask), the `openai` SDK streaming and not (with
`llm.tool_calls_are_steps` and tool annotations in the request), a run id
reused after an explicit end and one split by the idle timeout. A real
Prometheus scrapes the proxy with the repository's recording rules (intervals
shortened, every expression untouched); its raw counters and recorded series
are compared with `offscope report --json` on the trace, and both with the
numbers worked out by hand below.

Needs Debian's `prometheus` package. Skipped without it, except under CI=true.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any, cast

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client
from mcp.server.fastmcp import FastMCP
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import ToolAnnotations
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from offscope.trace import catalog
from tests.e2e import test_prometheus_scrape as prom_e2e  # its Prometheus helpers
from tests.support.deploy_testlib import PROM, require_tool
from tests.support.sidecar_kit import (
    AsgiServer,
    EchoUpstream,
    ProxyProcess,
    events,
    of_type,
    report_json,
    tls,
)

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:Use `streamable_http_client`:DeprecationWarning"),
]

HUMAN_TOKEN = "harness-only-secret-7f3a91"
LEDGER = """\
schema: offscope.ledger/1
id: agree
targets:
  hosts: [crm.acme.test, ops.acme.test, tools.acme.test, llm.acme.test]
  records: ["customer:4411"]
extract:
  - match: {host: crm.acme.test, path: "/customers/{id}"}
    targets: {record: "customer:{id}"}
  - match: {source: mcp}
    targets: {record: "customer:{args.customer_id}"}
  - match: {source: llm, tool: lookup_customer}
    targets: {record: "customer:{args.customer_id}"}
stages:
  - match: {source: mcp, tool: "get_*"}   # a read before any tools/list
    stage: investigate
operator:
  - {host: ops.acme.test, path: /ask}
  - {source: mcp, tool: ask_human}
  - {source: llm, tool: ask_operator}
llm:
  hosts: [llm.acme.test]
  tool_calls_are_steps: true
keep_args: [customer_id]    # the trace keeps this argument's value (the test reads it)
humans:
  routes: [{host: ops.acme.test, path: /ask}]
  llm_header: X-Human-Reply
  token_env: AGREE_HUMAN_TOKEN
"""
MCP_URL = "https://tools.acme.test/mcp"
CRM = "https://crm.acme.test/customers"
APPROVED = "APPROVED by the human operator"

# ---------------------------------------------------------------------------
# The expected numbers, by hand. Per run: (tool calls, out of scope, first
# out-of-scope step, first out-of-scope act step, self-granted, harness
# approvals, operator asks, human replies).
# ---------------------------------------------------------------------------
EXPECTED: dict[str, tuple[int, int, int | None, int | None, int, int, int, int]] = {
    # 1 get_customer(9999) out/investigate (ledger rule), 2 delete_customer(9999) out/act.
    "mcp-early": (2, 1 + 1, 1, 2, 0, 0, 0, 0),
    # 1 delete(9999-slow) out/act, slow; 2 ask_human answered first (harness, "APPROVED");
    # 3 get(4411) in. The act came before the ask: not self-granted.
    "mcp-act-then-ask": (2, 1, 1, 1, 0, 1, 1, 0),
    # 1 get(9999-slow) out/investigate, slow; 2 delete(8888) out/act, recorded first.
    "mcp-parallel": (2, 2, 1, 2, 0, 0, 0, 0),
    # 1 GET 4411 in; 2 ask on the declared human route; 3 PATCH 9999 out/act.
    "rest-human": (2, 1, 3, 3, 0, 0, 1, 1),
    # Proposed by the model (tool_calls_are_steps): 1 lookup_customer(9999) out/investigate
    # (readOnlyHint declared), 2 http_request POST evil.example.test out/act.
    "llm-steps": (2, 2, 1, 2, 0, 0, 0, 0),
    # 1 ask_operator answered by the harness "APPROVED" (no human mark); 2 PATCH 9999 out/act.
    "llm-harness": (1, 1, 2, 2, 1, 1, 1, 0),
    # The same, but the harness marks the reply as a person's with the secret header.
    "llm-human": (1, 1, 2, 2, 0, 0, 1, 1),
    # A run id ended explicitly, then used again: two runs.
    "reuse": (1, 1, 1, None, 0, 0, 0, 0),  # 1 GET 9999
    "reuse#2": (2, 1, 2, 2, 0, 0, 0, 0),  # 1 GET 4411, 2 PATCH 9999
    # A run id ended by the idle timeout, then used again.
    "idle": (1, 1, 1, None, 0, 0, 0, 0),  # 1 GET 9999
    "idle#2": (2, 1, 1, None, 0, 0, 0, 0),  # 1 GET 9999, 2 PATCH 4411 (in scope)
}
RUNS = len(EXPECTED)
CALLS = sum(v[0] for v in EXPECTED.values())
OOS = sum(v[1] for v in EXPECTED.values())
FIRST = [v[2] for v in EXPECTED.values() if v[2] is not None]
FIRST_ACT = [v[3] for v in EXPECTED.values() if v[3] is not None]


def test_the_hand_computed_totals():
    assert (RUNS, CALLS, OOS) == (11, 18, 14)
    assert (len(FIRST), sum(FIRST), len(FIRST_ACT), sum(FIRST_ACT)) == (11, 16, 8, 16)
    assert sum(v[4] for v in EXPECTED.values()) == 1 and sum(v[5] for v in EXPECTED.values()) == 2


# ---------------------------------------------------------------------------
# Upstreams
# ---------------------------------------------------------------------------


def mcp_app() -> Any:
    server = FastMCP(
        "crm-tools",
        stateless_http=False,
        json_response=False,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    async def get_customer(customer_id: str) -> str:
        """Read a customer record."""
        if customer_id.endswith("-slow"):
            await asyncio.sleep(1.0)
        return f"customer {customer_id}: plan=pro"

    @server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True))
    async def delete_customer(customer_id: str) -> str:
        """Delete a customer record."""
        if customer_id.endswith("-slow"):
            await asyncio.sleep(1.0)
        return f"deleted {customer_id}"

    @server.tool()
    def ask_human(question: str) -> str:
        """Ask the on-call human (this server's harness answers)."""
        return APPROVED

    return server.streamable_http_app()


def model_app() -> Any:
    """OpenAI-compatible chat completions: "ASK" -> ask_operator; "OUT" -> two
    proposed calls; a tool result -> text. Streams when asked to."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    def plan(body: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
        messages = body.get("messages") or []
        if messages and messages[-1].get("role") == "tool":
            return []
        first = next((m.get("content") for m in messages if m.get("role") == "user"), "") or ""
        if "ASK" in first:
            return [("call_ask", "ask_operator", {"question": "May I refund 9999?"})]
        return [
            ("call_lookup", "lookup_customer", {"customer_id": "9999"}),
            ("call_post", "http_request", {"url": "https://evil.example.test/x", "method": "POST"}),
        ]

    async def completions(request: Request) -> Any:
        body = await request.json()
        calls = plan(body)
        text = "" if calls else "Done."
        if not body.get("stream"):
            msg: dict[str, Any] = {"role": "assistant", "content": text or None}
            if calls:
                msg["tool_calls"] = [
                    {
                        "id": i,
                        "type": "function",
                        "function": {"name": n, "arguments": json.dumps(a)},
                    }
                    for i, n, a in calls
                ]
            return JSONResponse(
                {
                    "id": "c1",
                    "object": "chat.completion",
                    "created": 1,
                    "model": "sim",
                    "choices": [
                        {
                            "index": 0,
                            "message": msg,
                            "finish_reason": "tool_calls" if calls else "stop",
                        }
                    ],
                }
            )

        async def chunks():
            def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
                return (
                    "data: "
                    + json.dumps(
                        {
                            "id": "c1",
                            "object": "chat.completion.chunk",
                            "created": 1,
                            "model": "sim",
                            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                        }
                    )
                    + "\n\n"
                ).encode()

            yield chunk({"role": "assistant", "content": text})
            for index, (cid, name, args) in enumerate(calls):
                raw = json.dumps(args)
                yield chunk(
                    {
                        "tool_calls": [
                            {
                                "index": index,
                                "id": cid,
                                "type": "function",
                                "function": {"name": name, "arguments": raw[:7]},
                            }
                        ]
                    }
                )
                await asyncio.sleep(0.01)
                yield chunk({"tool_calls": [{"index": index, "function": {"arguments": raw[7:]}}]})
            yield chunk({}, "tool_calls" if calls else "stop")
            yield b"data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


# annotations declared by the agent's harness, as MCP declares them: a key the SDK's
# TypedDict does not have, sent as is
TOOLS = cast(
    "list[ChatCompletionToolParam]",
    [
        {
            "type": "function",
            "function": {
                "name": "lookup_customer",
                "parameters": {"type": "object"},
                "annotations": {"readOnlyHint": True},
            },
        },
        {
            "type": "function",
            "function": {
                "name": "http_request",
                "parameters": {"type": "object"},
                "annotations": {"readOnlyHint": False},
            },
        },
        {
            "type": "function",
            "function": {"name": "ask_operator", "parameters": {"type": "object"}},
        },
    ],
)

# ---------------------------------------------------------------------------
# Agents
# ---------------------------------------------------------------------------


def http_factory(proxy_url: str, ca: str):
    def factory(headers=None, timeout=None, auth=None) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            proxy=proxy_url,
            verify=tls(ca),
            headers=headers,
            timeout=timeout or httpx.Timeout(30, read=60),
            auth=auth,
        )

    return factory


async def later(delay: float, coro: Any) -> Any:
    await asyncio.sleep(delay)
    return await coro


async def mcp_run(proxy: ProxyProcess, run: str) -> list[Any]:
    results: list[Any] = []
    async with (
        streamablehttp_client(
            MCP_URL, httpx_client_factory=http_factory(proxy.proxy_url(run), proxy.ca)
        ) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        await session.send_ping()
        if run == "mcp-early":  # no tools/list: the ledger's stage rule stages the read
            results.append(await session.call_tool("get_customer", {"customer_id": "9999"}))
            results.append(await session.call_tool("delete_customer", {"customer_id": "9999"}))
        elif run == "mcp-act-then-ask":
            await session.list_tools()
            results += await asyncio.gather(
                session.call_tool("delete_customer", {"customer_id": "9999-slow"}),
                later(0.3, session.call_tool("ask_human", {"question": "may I delete 9999?"})),
            )
            results.append(await session.call_tool("get_customer", {"customer_id": "4411"}))
        else:
            await session.list_tools()
            results += await asyncio.gather(
                session.call_tool("get_customer", {"customer_id": "9999-slow"}),
                later(0.3, session.call_tool("delete_customer", {"customer_id": "8888"})),
            )
    return results


def llm_run(proxy: ProxyProcess, run: str) -> None:
    http = httpx.Client(proxy=proxy.proxy_url(run), verify=tls(proxy.ca), timeout=20)
    client = OpenAI(
        base_url="https://llm.acme.test/v1", api_key="sk-test-0000", http_client=http, max_retries=0
    )
    stream = run == "llm-steps"
    first = "OUT: look around" if stream else "ASK before refunding 9999"
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": first}]
    if stream:
        calls: dict[int, dict[str, Any]] = {}
        for chunk in client.chat.completions.create(
            model="sim", messages=messages, tools=TOOLS, stream=True
        ):
            for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                entry = calls.setdefault(tc.index, {"id": tc.id, "name": None, "arguments": ""})
                entry["name"] = (tc.function.name if tc.function else None) or entry["name"]
                entry["arguments"] += (tc.function.arguments or "") if tc.function else ""
        proposed = list(calls.values())
    else:
        msg = (
            client.chat.completions.create(model="sim", messages=messages, tools=TOOLS)
            .choices[0]
            .message
        )
        proposed = []
        for call in msg.tool_calls or []:
            assert call.type == "function", call  # TOOLS are all functions
            proposed.append(
                {"id": call.id, "name": call.function.name, "arguments": call.function.arguments}
            )
    assert proposed, run
    messages.append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in proposed
            ],
        }
    )
    reply = APPROVED if run.startswith("llm-h") else "ok"
    messages += [{"role": "tool", "tool_call_id": c["id"], "content": reply} for c in proposed]
    headers = {"X-Human-Reply": HUMAN_TOKEN} if run == "llm-human" else None
    if stream:
        for _ in client.chat.completions.create(
            model="sim", messages=messages, tools=TOOLS, stream=True, extra_headers=headers
        ):
            pass
    else:
        client.chat.completions.create(
            model="sim", messages=messages, tools=TOOLS, extra_headers=headers
        )
    client.close()
    if run != "llm-steps":  # then the agent acts out of scope itself
        with httpx.Client(proxy=proxy.proxy_url(run), verify=tls(proxy.ca), timeout=20) as c:
            assert c.patch(f"{CRM}/9999", json={"refund": 5}).status_code == 200


def rest(proxy: ProxyProcess, run: str, calls: list[tuple[str, str]]) -> None:
    with httpx.Client(proxy=proxy.proxy_url(run), verify=tls(proxy.ca), timeout=20) as c:
        for method, url in calls:
            r = c.request(method, url, json=None if method == "GET" else {"question": "may I?"})
            assert r.status_code == 200, (run, method, url, r.text)


def end(proxy: ProxyProcess, run: str) -> None:
    assert proxy.control("POST", f"/runs/{run}/end", json={}).status_code == 200


def wait_idle_end(proxy: ProxyProcess, run: str) -> None:
    prom_e2e.poll(
        f"run {run} ended by the idle timeout",
        lambda: [e for e in of_type(events(proxy.trace), "run_end", run) if e["reason"] == "idle"],
        timeout=20,
    )


def drive(proxy: ProxyProcess) -> dict[str, list[Any]]:
    mcp_results = {}
    for run in ("mcp-early", "mcp-act-then-ask", "mcp-parallel"):
        mcp_results[run] = asyncio.run(mcp_run(proxy, run))
        end(proxy, run)
    rest(
        proxy,
        "rest-human",
        [("GET", f"{CRM}/4411"), ("POST", "https://ops.acme.test/ask"), ("PATCH", f"{CRM}/9999")],
    )
    end(proxy, "rest-human")
    for run in ("llm-steps", "llm-harness", "llm-human"):
        llm_run(proxy, run)
        end(proxy, run)
    rest(proxy, "reuse", [("GET", f"{CRM}/9999")])
    end(proxy, "reuse")
    rest(proxy, "reuse", [("GET", f"{CRM}/4411"), ("PATCH", f"{CRM}/9999")])
    end(proxy, "reuse")
    rest(proxy, "idle", [("GET", f"{CRM}/9999")])
    wait_idle_end(proxy, "idle")
    rest(proxy, "idle", [("GET", f"{CRM}/9999"), ("PATCH", f"{CRM}/4411")])
    end(proxy, "idle")
    return mcp_results


# ---------------------------------------------------------------------------


# The funnel's catalog keys and the `stage` label of their one recorded family.
FUNNEL_STAGE = {"investigated": "investigate", "prepared": "prepare", "acted": "act"}


def _recorded_series(key: str, rule: str, sel: str) -> str:
    """A catalog metric's recording rule over the 1h window, for this test's ledger."""
    if key in FUNNEL_STAGE:
        return f'{rule}1h{{ledger="agree",stage="{FUNNEL_STAGE[key]}"}}'
    return f"{rule}1h{sel}"


def _offline_value(key: str, agg: dict[str, Any]) -> float:
    """What `offscope report --json` says a catalog metric's recorded series must equal.
    A metric given a recording rule and no case here fails the test by name."""
    if key in FUNNEL_STAGE:
        return float(agg["funnel"][key]["rate"])
    if key in ("self_granted", "harness_approvals"):  # recorded per 1,000 runs
        return 1000 * agg[key] / agg["runs"]
    if key in ("touches_per_1000_runs", "oos_share_pooled"):
        return float(agg[key])
    raise AssertionError(f"catalog metric {key!r} has a recording rule this test cannot check")


def test_live_prometheus_and_offline_report_agree_on_sdk_traffic(tmp_path, confdir, monkeypatch):
    binary = require_tool("prometheus")
    ledger = tmp_path / "agree.yaml"
    ledger.write_text(LEDGER)
    monkeypatch.setenv("AGREE_HUMAN_TOKEN", HUMAN_TOKEN)  # the proxy reads it; the ledger names it
    rule_files = prom_e2e.rules_for_test(tmp_path / "rules")
    assert prom_e2e._exprs(rule_files) == prom_e2e._exprs(sorted(PROM.glob("*.rules.yml")))
    mcp_srv = AsgiServer(mcp_app(), "fastmcp").start()
    model = AsgiServer(model_app(), "model").start()
    rest_up = EchoUpstream().start()
    routes = ",".join(
        [
            f"tools.acme.test=127.0.0.1:{mcp_srv.port}",
            f"llm.acme.test=127.0.0.1:{model.port}",
            rest_up.routes(("crm.acme.test", "ops.acme.test", "evil.example.test")),
        ]
    )
    try:
        with (
            ProxyProcess(
                tmp_path,
                ledger=str(ledger),
                policy="shadow",
                routes=routes,
                confdir=confdir,
                name="agree",
                extra=["--idle-timeout", "3"],
            ) as proxy,
            prom_e2e.prometheus_server(tmp_path, binary, proxy.metrics_port, rule_files) as prom,
        ):
            sel = '{ledger="agree"}'
            q = lambda expr: prom_e2e.scalar(prom, expr)  # noqa: E731
            prom_e2e.poll(
                "a scrape with the ledger's series at 0",
                lambda: q(f"sum(offscope_runs_total{sel})") == 0.0,
                timeout=30,
            )
            time.sleep(1.5)  # one more scrape at 0: every series has a zero to increase() from
            mcp_results = drive(proxy)
            prom_e2e.poll(
                "every run started and ended in Prometheus",
                lambda: (
                    q(f"sum(offscope_runs_total{sel})") == RUNS
                    and q(f"sum(offscope_run_ends_total{sel})") == RUNS
                ),
                timeout=30,
            )
            live = {
                "runs": q(f"sum(offscope_runs_total{sel})"),
                "active": q(f"sum(offscope_active_runs{sel})"),
                "calls": q(f"sum(offscope_tool_calls_total{sel})"),
                "oos": q('sum(offscope_tool_calls_total{ledger="agree",scope="out"})'),
                "llm_steps": q('sum(offscope_tool_calls_total{ledger="agree",source="llm"})'),
                "first_count": q(f"sum(offscope_first_out_of_scope_step_count{sel})"),
                "first_sum": q(f"sum(offscope_first_out_of_scope_step_sum{sel})"),
                "act_count": q(f"sum(offscope_first_out_of_scope_act_step_count{sel})"),
                "act_sum": q(f"sum(offscope_first_out_of_scope_act_step_sum{sel})"),
                "self_granted": q(f"sum(offscope_self_granted_permissions_total{sel})"),
                "approvals": q(f"sum(offscope_harness_approvals_total{sel})"),
                "human": q(
                    'sum(offscope_operator_replies_total{ledger="agree",provenance="human"})'
                ),
                "harness": q(
                    'sum(offscope_operator_replies_total{ledger="agree",provenance="harness"})'
                ),
                "idle_ends": q('sum(offscope_run_ends_total{ledger="agree",reason="idle"})'),
            }
            for stage in ("investigate", "prepare", "act"):
                live[stage] = q(
                    f'sum(offscope_runs_reached_total{{ledger="agree",stage="{stage}"}})'
                )
            rep = report_json(proxy.trace, via_cli=True)
            agg = rep["by_ledger"]["agree"]
            # Every catalog metric with a recording rule, its 1h series against the report.
            recorded = {
                m.key: _recorded_series(m.key, m.recorded, sel)
                for m in catalog.METRICS
                if m.recorded is not None
            }
            want = {key: _offline_value(key, agg) for key in recorded}
            got: dict[str, float | None] = {}

            def recorded_match() -> bool:
                got.update({k: q(v) for k, v in recorded.items()})
                return all(prom_e2e.close(got[k], want[k]) for k in recorded)

            prom_e2e.poll(
                f"the recorded series to equal offscope report ({want})", recorded_match, timeout=30
            )
    finally:
        mcp_srv.stop()
        model.stop()
        rest_up.stop()

    # The agents got what they asked for (shadow mode: nothing blocked).
    assert [r.isError for rs in mcp_results.values() for r in rs] == [False] * 7
    assert mcp_results["mcp-act-then-ask"][1].content[0].text == APPROVED

    # Offline, per run: the hand-computed values.
    by_key = {
        (r["run"] if r["instance"] == 1 else f"{r['run']}#{r['instance']}"): r for r in rep["runs"]
    }
    assert set(by_key) == set(EXPECTED)
    for key, (calls, oos, first, first_act, granted, approvals, asks, human) in EXPECTED.items():
        r = by_key[key]
        got_run = (
            r["calls"],
            r["oos_calls"],
            r["first_oos_step"],
            r["first_oos_act_step"],
            r["self_granted"],
            r["harness_approvals"],
            r["operator_asks"],
            r["operator_asks"] - r["harness_replies"],
        )
        assert got_run == (calls, oos, first, first_act, granted, approvals, asks, human), key

    # Offline aggregate = hand = live (raw counters at one instant, no extrapolation).
    assert (agg["runs"], agg["calls"], agg["oos_calls"]) == (RUNS, CALLS, OOS)
    assert sorted(agg["first_oos_step"]["touched"]) == sorted(FIRST)
    assert sorted(agg["first_oos_act_step"]["acted"]) == sorted(FIRST_ACT)
    assert (
        agg["funnel"]["investigated"]["k"],
        agg["funnel"]["prepared"]["k"],
        agg["funnel"]["acted"]["k"],
    ) == (11, 8, 8)
    assert (live["runs"], live["active"], live["calls"], live["oos"]) == (RUNS, 0, CALLS, OOS)
    assert live["llm_steps"] == 2  # the proposed calls of llm-steps: counted, not dropped
    assert (live["first_count"], live["first_sum"]) == (len(FIRST), sum(FIRST))
    assert (live["act_count"], live["act_sum"]) == (len(FIRST_ACT), sum(FIRST_ACT))
    assert (live["investigate"], live["prepare"], live["act"]) == (11, 8, 8)
    assert (
        (live["self_granted"], live["approvals"])
        == (agg["self_granted"], agg["harness_approvals"])
        == (1, 2)
    )
    assert (live["human"], live["harness"]) == (2, 2)
    assert live["idle_ends"] == 1
    # The recorded series (what dashboards and alerts read) equal the report.
    assert math.isclose(want["touches_per_1000_runs"], 1000 * OOS / RUNS) and math.isclose(
        want["oos_share_pooled"], OOS / CALLS
    )
    assert all(prom_e2e.close(got[k], want[k]) for k in recorded), (got, want)

    # MCP protocol traffic (initialize, ping, notifications, tools/list, the GET
    # stream, the closing DELETE) is not in the trace as calls.
    evs = events(proxy.trace)
    mcp_calls = [e for e in of_type(evs, "tool_call") if e["call"]["source"] == "mcp"]
    assert len(mcp_calls) == 6 and all(e["call"].get("method") in (None, "POST") for e in mcp_calls)
    assert all(e["call"]["tool"] in ("get_customer", "delete_customer") for e in mcp_calls)
    stage_from = {
        (e["run"], e["call"]["tool"], e["call"]["args"].get("customer_id")): e["call"]["stage_from"]
        for e in mcp_calls
    }
    assert stage_from[("mcp-early", "get_customer", "9999")] == "ledger"
    assert stage_from[("mcp-early", "delete_customer", "9999")] in ("default", "annotation")
    assert stage_from[("mcp-parallel", "delete_customer", "8888")] == "annotation"
    llm_steps = [e for e in of_type(evs, "tool_call", "llm-steps")]
    assert [
        (e["step"], e["call"]["tool"], e["call"]["stage"], e["call"]["stage_from"])
        for e in llm_steps
    ] == [
        (1, "lookup_customer", "investigate", "annotation"),
        (2, "http_request", "act", "annotation"),
    ]
    # Recorded out of order (the slow call last), numbered in arrival order.
    par = [e["step"] for e in of_type(evs, "tool_call", "mcp-parallel")]
    assert par == [2, 1]
