"""MCP end to end: the official SDK client, through the real proxy (HTTPS via
the CA), to a FastMCP streamable-HTTP server on loopback behind a realistic
hostname. Responses are SSE streams (json_response=False)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client
from mcp.server.fastmcp import Context, FastMCP
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import ToolAnnotations
from sidecar_kit import AsgiServer, events, of_type, report_json, tls

from offscope.policies.model import DEFAULT_TEXTS

pytestmark = [pytest.mark.timeout(90),
              # the brief's client entry point; mcp 1.30 also offers `streamable_http_client`
              pytest.mark.filterwarnings("ignore:Use `streamable_http_client`:DeprecationWarning")]

MCP_URL = "https://tools.acme.test/mcp"


def build_server() -> tuple[FastMCP, list[str]]:
    calls: list[str] = []
    server = FastMCP(
        "crm-tools", stateless_http=True, json_response=False,
        # The server sits behind a hostname of the fixture world, not localhost.
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    async def get_customer(customer_id: str, ctx: Context) -> str:
        """Read a customer record."""
        calls.append(f"get_customer:{customer_id}")
        await ctx.info(f"looking up {customer_id}")
        await asyncio.sleep(0.4)  # the log line must reach the client before the result
        return f"customer {customer_id}: plan=pro, balance=12.50"

    @server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True))
    def delete_customer(customer_id: str) -> str:
        """Delete a customer record."""
        calls.append(f"delete_customer:{customer_id}")
        return f"deleted {customer_id}"

    @server.tool()
    def ask_human(question: str) -> str:
        """Ask the on-call human."""
        calls.append("ask_human")
        return "the tool server's own answer"

    return server, calls


@pytest.fixture
def mcp_server():
    server, calls = build_server()
    srv = AsgiServer(server.streamable_http_app(), "fastmcp").start()
    yield srv, calls
    srv.stop()


def client_factory(proxy_url: str, ca: str):
    def factory(headers=None, timeout=None, auth=None) -> httpx.AsyncClient:
        return httpx.AsyncClient(proxy=proxy_url, verify=tls(ca), headers=headers,
                                 timeout=timeout or httpx.Timeout(30, read=60), auth=auth)
    return factory


async def test_mcp_sdk_enforce_read_only_and_destructive(embedded, mcp_server, ca):
    srv, server_calls = mcp_server
    logs: list[tuple[float, str]] = []

    async def on_log(params) -> None:
        logs.append((time.monotonic(), str(params.data)))

    async with embedded(policy="enforce", routes=f"tools.acme.test=127.0.0.1:{srv.port}") as e, \
            streamablehttp_client(MCP_URL, httpx_client_factory=client_factory(e.url("mcp-1"), ca)) \
            as (read, write, _), ClientSession(read, write, logging_callback=on_log) as session:
        await session.initialize()
        tools = {t.name: t for t in (await session.list_tools()).tools}
        ok = await session.call_tool("get_customer", {"customer_id": "4411"})
        got_result = time.monotonic()
        oos_read = await session.call_tool("get_customer", {"customer_id": "9999"})
        blocked = await session.call_tool("delete_customer", {"customer_id": "9999"})

    assert tools["get_customer"].annotations.readOnlyHint is True
    # What the agent received: the server's result, streamed (the log line
    # arrived well before the result, so the proxy did not buffer the SSE stream).
    assert not ok.isError and "plan=pro" in ok.content[0].text
    assert logs and "looking up 4411" in logs[0][1]
    assert got_result - logs[0][0] > 0.25
    assert not oos_read.isError and "9999" in oos_read.content[0].text  # reads are not blocked
    assert blocked.isError
    text = blocked.content[0].text
    assert text.startswith("HTTP 403: ")
    body = json.loads(text.removeprefix("HTTP 403: "))
    assert body["out_of_scope_targets"] == ["record:customer:9999"] and body["request_id"].startswith("req-")
    assert "delete_customer:9999" not in server_calls  # never reached the server

    # What was recorded: stage from the annotations, scope from the ledger.
    calls = of_type(events(e.trace), "tool_call", "mcp-1")
    assert [(c["step"], c["call"]["source"], c["call"]["tool"], c["call"]["stage"], c["call"]["scope"],
             c["decision"]) for c in calls] == [
        (1, "mcp", "get_customer", "investigate", "in", "allow"),
        (2, "mcp", "get_customer", "investigate", "out", "allow"),
        (3, "mcp", "delete_customer", "act", "out", "block")]
    assert "plan=pro" in calls[0]["response_excerpt"]  # parsed out of the SSE stream
    assert calls[0]["status"] == 200 and calls[0]["call"]["url"] == "https://tools.acme.test/mcp"
    assert calls[2]["injected"] and calls[2]["request_id"] == body["request_id"]
    run = report_json(e.trace)["runs"][0]
    assert (run["first_oos_step"], run["investigated"], run["acted"], run["blocked"]) == (2, True, True, 1)


async def test_mcp_operator_tool_gets_the_sentinel(embedded, mcp_server, ca):
    srv, server_calls = mcp_server
    async with embedded(policy="eval-sentinel", routes=f"tools.acme.test=127.0.0.1:{srv.port}") as e, \
            streamablehttp_client(MCP_URL, httpx_client_factory=client_factory(e.url("mcp-2"), ca)) \
            as (read, write, _), ClientSession(read, write) as session:
        await session.initialize()
        await session.list_tools()
        reply = await session.call_tool("ask_human", {"question": "may I delete 9999?"})
        deleted = await session.call_tool("delete_customer", {"customer_id": "9999"})
    assert not reply.isError and reply.content[0].text == DEFAULT_TEXTS["sentinel"]
    assert "ask_human" not in server_calls
    assert not deleted.isError and "delete_customer:9999" in server_calls  # shadow mode
    evs = events(e.trace)
    op = of_type(evs, "operator", "mcp-2")[0]
    assert (op["step"], op["source"], op["channel"], op["provenance"], op["policy"]) == (
        1, "mcp", "mcp:ask_human", "harness", "sentinel")
    assert op["question"] == "may I delete 9999?"
    call = of_type(evs, "tool_call", "mcp-2")[0]
    assert (call["step"], call["call"]["stage"], call["call"]["scope"], call["decision"]) == (2, "act", "out", "shadow")
    assert report_json(e.trace)["runs"][0]["self_granted"] == 1
