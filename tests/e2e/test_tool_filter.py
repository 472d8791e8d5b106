"""Narrow what the agent is offered (policy `filter_tools`): through a real
`offscope proxy` subprocess, the official MCP SDK client lists only the tools
whose calls can be in scope (FastMCP over streamable HTTP, SSE and JSON
responses), and an LLM server behind the proxy receives, from the openai SDK,
only those tools; the trace names what was removed and why. The same filter
on the other dialects' request bodies (Responses, Anthropic, Gemini)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client
from mcp.server.fastmcp import FastMCP
from mcp.server.transport_security import TransportSecuritySettings
from openai import OpenAI

from offscope.ledgers.matcher import CompiledLedger
from offscope.ledgers.model import Ledger
from offscope.proxy.toolfilter import filter_request_tools, filter_tools_result
from offscope.yamlio import load_model
from tests.support.sidecar_kit import AsgiServer, ProxyProcess, chat_app, events, of_type, tls

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:Use `streamable_http_client`:DeprecationWarning"),
]

LEDGER = """\
# A support agent on ticket 4411: customers are read by id; invoices and
# exports are never part of its work; deleting is never offered.
schema: offscope.ledger/1
id: filter-test
targets:
  hosts: [tools.acme.test, llm.acme.test, crm.acme.test]
  records: ["customer:4411"]
extract:
  - match: {tool: [get_customer, http_request]}
    targets: {record: "customer:{args.customer_id}"}
  - match: {tool: get_invoice}
    targets: {record: "invoice:{args.invoice_id}"}
  - match: {tool: export_report}
    targets: {host: "{args.bucket}.exports.acme.test"}
denied_tools: ["delete_*"]
llm:
  hosts: [llm.acme.test]
"""
POLICY = "schema: offscope.policy/1\nid: narrow\nmode: enforce\nfilter_tools: true\n"
KEPT = ["get_customer", "ask_human"]


@pytest.fixture
def files(tmp_path: Path) -> tuple[str, str]:
    (tmp_path / "ledger.yaml").write_text(LEDGER, encoding="utf-8")
    (tmp_path / "policy.yaml").write_text(POLICY, encoding="utf-8")
    return str(tmp_path / "ledger.yaml"), str(tmp_path / "policy.yaml")


def build_mcp(json_response: bool) -> FastMCP:
    server = FastMCP(
        "crm-tools",
        stateless_http=True,
        json_response=json_response,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )

    @server.tool()
    def get_customer(customer_id: str) -> str:
        """Read a customer record."""
        return f"customer {customer_id}"

    @server.tool()
    def get_invoice(invoice_id: str) -> str:
        """Read an invoice."""
        return f"invoice {invoice_id}"

    @server.tool()
    def delete_customer(customer_id: str) -> str:
        """Delete a customer record."""
        return "deleted"

    @server.tool()
    def ask_human(question: str) -> str:
        """Ask the on-call human."""
        return "ok"

    return server


async def _list_tools(proxy: ProxyProcess, run: str) -> list[str]:
    def factory(headers=None, timeout=None, auth=None) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            proxy=proxy.proxy_url(run),
            verify=tls(proxy.ca),
            headers=headers,
            timeout=timeout or httpx.Timeout(30, read=60),
            auth=auth,
        )

    async with (
        streamablehttp_client("https://tools.acme.test/mcp", httpx_client_factory=factory) as (
            read,
            write,
            _,
        ),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        return [t.name for t in (await session.list_tools()).tools]


@pytest.mark.parametrize("json_response", [False, True], ids=["sse", "json"])
def test_mcp_tools_list_offers_only_tools_that_can_be_in_scope(
    tmp_path, files, confdir, json_response
):
    ledger, policy = files
    srv = AsgiServer(build_mcp(json_response).streamable_http_app(), "fastmcp").start()
    try:
        route = f"tools.acme.test=127.0.0.1:{srv.port}"
        with ProxyProcess(
            tmp_path, ledger=ledger, policy=policy, routes=route, confdir=confdir
        ) as proxy:
            offered = asyncio.run(_list_tools(proxy, "run-m"))
        with ProxyProcess(
            tmp_path,
            ledger=ledger,
            policy="enforce",
            routes=route,
            confdir=confdir,
            name="unfiltered",
        ) as proxy:
            unfiltered = asyncio.run(_list_tools(proxy, "run-u"))
    finally:
        srv.stop()
    assert sorted(unfiltered) == sorted(
        ["get_customer", "get_invoice", "delete_customer", "ask_human"]
    )
    assert sorted(offered) == sorted(KEPT)
    (event,) = of_type(events(tmp_path / "proxy-trace.jsonl"), "tools_filtered", "run-m")
    assert (
        event["source"] == "mcp"
        and event["server"] == "https://tools.acme.test/mcp"
        and event["offered"] == 4
    )
    reasons = {r["name"]: r["reason"] for r in event["removed"]}
    assert set(reasons) == {"get_invoice", "delete_customer"}
    assert "invoice:*" in reasons["get_invoice"] and "denied_tools" in reasons["delete_customer"]
    assert of_type(events(tmp_path / "unfiltered-trace.jsonl"), "tools_filtered") == []


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "http_request",
            "parameters": {"type": "object", "properties": {"url": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_invoice",
            "parameters": {"type": "object", "properties": {"invoice_id": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "export_report",
            "parameters": {"type": "object", "properties": {"bucket": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "delete_customer",
            "parameters": {"type": "object", "properties": {"customer_id": {"type": "string"}}},
        },
    },
]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_openai_sdk_request_tools_are_narrowed_before_the_model_sees_them(
    tmp_path, files, confdir, stream
):
    ledger, policy = files
    seen: list[dict[str, Any]] = []
    srv = AsgiServer(chat_app(seen), "chat").start()
    try:
        with ProxyProcess(
            tmp_path,
            ledger=ledger,
            policy=policy,
            routes=f"llm.acme.test=127.0.0.1:{srv.port}",
            confdir=confdir,
        ) as proxy:
            http = httpx.Client(proxy=proxy.proxy_url("run-l"), verify=tls(proxy.ca), timeout=20)
            client = OpenAI(
                base_url="https://llm.acme.test/v1",
                api_key="sk-test-0000",
                http_client=http,
                max_retries=0,
            )
            result = client.chat.completions.create(
                model="sim-1",
                messages=[{"role": "user", "content": "look up customer 4411"}],
                tools=TOOLS,
                tool_choice={"type": "function", "function": {"name": "get_invoice"}},
                stream=stream,
            )
            if stream:
                result = list(result)
            http.close()
    finally:
        srv.stop()
    assert result  # the model answered the narrowed request
    (body,) = seen
    assert [t["function"]["name"] for t in body["tools"]] == ["http_request"]
    assert "tool_choice" not in body  # it named a removed tool: the API would refuse the request
    evs = events(tmp_path / "proxy-trace.jsonl")
    (event,) = of_type(evs, "tools_filtered", "run-l")
    assert event["source"] == "llm" and event["server"] == "openai-chat" and event["offered"] == 4
    assert [r["name"] for r in event["removed"]] == [
        "get_invoice",
        "export_report",
        "delete_customer",
    ]
    assert "host" in event["removed"][1]["reason"]
    assert len(of_type(evs, "llm", "run-l")) == 1


@pytest.fixture
def compiled() -> CompiledLedger:
    import yaml

    return CompiledLedger(Ledger.model_validate(yaml.safe_load(LEDGER)))


def test_the_other_dialects_tools_arrays(compiled):
    responses = {
        "model": "m",
        "input": "hi",
        "tools": [
            {"type": "function", "name": "http_request", "parameters": {}},
            {"type": "function", "name": "get_invoice", "parameters": {}},
            {"type": "web_search"},
        ],
        "tool_choice": {"type": "function", "name": "get_invoice"},
    }
    removed, offered = filter_request_tools(responses, compiled)
    assert [n for n, _ in removed] == ["get_invoice"] and offered == 2
    assert responses["tools"] == [
        {"type": "function", "name": "http_request", "parameters": {}},
        {"type": "web_search"},
    ]  # built-in tools have no name: kept
    assert "tool_choice" not in responses

    anthropic = {
        "model": "m",
        "messages": [],
        "tools": [
            {"name": "delete_customer", "input_schema": {}},
            {"name": "get_invoice", "input_schema": {}},
        ],
        "tool_choice": {"type": "any"},
    }
    removed, _ = filter_request_tools(anthropic, compiled)
    assert {n for n, _ in removed} == {"delete_customer", "get_invoice"}
    assert (
        "tools" not in anthropic and "tool_choice" not in anthropic
    )  # an empty array is refused by the API

    gemini = {
        "contents": [],
        "tools": [{"functionDeclarations": [{"name": "get_customer"}, {"name": "export_report"}]}],
        "toolConfig": {
            "functionCallingConfig": {
                "mode": "ANY",
                "allowedFunctionNames": ["get_customer", "export_report"],
            }
        },
    }
    removed, offered = filter_request_tools(gemini, compiled)
    assert [n for n, _ in removed] == ["export_report"] and offered == 2
    assert gemini["tools"] == [{"functionDeclarations": [{"name": "get_customer"}]}]
    assert gemini["toolConfig"]["functionCallingConfig"]["allowedFunctionNames"] == ["get_customer"]

    untouched = {"tools": [{"type": "function", "function": {"name": "http_request"}}]}
    before = json.dumps(untouched)
    assert filter_request_tools(untouched, compiled) == ([], 1) and json.dumps(untouched) == before


def test_what_can_be_in_scope(compiled, tmp_path):
    def why(name: str, host: str | None = None) -> str | None:
        message = {"jsonrpc": "2.0", "id": 1, "result": {"tools": [{"name": name}]}}
        removed = filter_tools_result(message, compiled, host, "/mcp")
        return removed[0][1] if removed else None

    assert why("get_customer", "tools.acme.test") is None  # customer:{id} can be customer:4411
    assert why("get_invoice", "tools.acme.test")  # invoice:{id} never is
    assert why("export_report", "tools.acme.test")  # *.exports.acme.test is not a host in scope
    assert why("anything", "tools.evil.test") == "host tools.evil.test is not in scope"
    assert why("no_rule_at_all", "tools.acme.test") is None  # nothing says it is out: kept

    # A grant for this run makes an invoice reachable; another run's does not.
    granted = tmp_path / "ledger.yaml"
    granted.write_text(
        LEDGER
        + """grants:
  - {id: grant-1, target: "record:invoice:77", approver: alice, expires: "2999-01-01T00:00:00Z",
     scope: run, run: run-a}
""",
        encoding="utf-8",
    )
    ledger = CompiledLedger(load_model(Ledger, granted))
    assert (
        filter_tools_result(
            {"id": 1, "result": {"tools": [{"name": "get_invoice"}]}},
            ledger.for_run("run-a"),
            "tools.acme.test",
            "/mcp",
        )
        == []
    )
    assert (
        filter_tools_result(
            {"id": 1, "result": {"tools": [{"name": "get_invoice"}]}},
            ledger.for_run("run-b"),
            "tools.acme.test",
            "/mcp",
        )
        != []
    )
