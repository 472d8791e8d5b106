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

from offscope.policies.model import DEFAULT_TEXTS
from tests.support.sidecar_kit import AsgiServer, events, of_type, report_json, scrape, tls, total

pytestmark = [
    pytest.mark.timeout(90),
    # the brief's client entry point; mcp 1.30 also offers `streamable_http_client`
    pytest.mark.filterwarnings("ignore:Use `streamable_http_client`:DeprecationWarning"),
]

MCP_URL = "https://tools.acme.test/mcp"


def build_server() -> tuple[FastMCP, list[str]]:
    calls: list[str] = []
    server = FastMCP(
        "crm-tools",
        stateless_http=True,
        json_response=False,
        # The server sits behind a hostname of the fixture world, not localhost.
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )

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
        return httpx.AsyncClient(
            proxy=proxy_url,
            verify=tls(ca),
            headers=headers,
            timeout=timeout or httpx.Timeout(30, read=60),
            auth=auth,
        )

    return factory


async def test_mcp_sdk_enforce_read_only_and_destructive(embedded, mcp_server, ca):
    srv, server_calls = mcp_server
    logs: list[tuple[float, str]] = []

    async def on_log(params) -> None:
        logs.append((time.monotonic(), str(params.data)))

    async with (
        embedded(policy="enforce", routes=f"tools.acme.test=127.0.0.1:{srv.port}") as e,
        streamablehttp_client(MCP_URL, httpx_client_factory=client_factory(e.url("mcp-1"), ca)) as (
            read,
            write,
            _,
        ),
        ClientSession(read, write, logging_callback=on_log) as session,
    ):
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
    assert body["out_of_scope_targets"] == ["record:customer:9999"] and body[
        "request_id"
    ].startswith("req-")
    assert "delete_customer:9999" not in server_calls  # never reached the server

    # What was recorded: stage from the annotations, scope from the ledger.
    calls = of_type(events(e.trace), "tool_call", "mcp-1")
    assert [
        (
            c["step"],
            c["call"]["source"],
            c["call"]["tool"],
            c["call"]["stage"],
            c["call"]["scope"],
            c["decision"],
        )
        for c in calls
    ] == [
        (1, "mcp", "get_customer", "investigate", "in", "allow"),
        (2, "mcp", "get_customer", "investigate", "out", "allow"),
        (3, "mcp", "delete_customer", "act", "out", "block"),
    ]
    assert "plan=pro" in calls[0]["response_excerpt"]  # parsed out of the SSE stream
    assert calls[0]["status"] == 200 and calls[0]["call"]["url"] == "https://tools.acme.test/mcp"
    assert calls[2]["injected"] and calls[2]["request_id"] == body["request_id"]
    run = report_json(e.trace)["runs"][0]
    assert (run["first_oos_step"], run["investigated"], run["acted"], run["blocked"]) == (
        2,
        True,
        True,
        1,
    )


async def test_mcp_operator_tool_gets_the_sentinel(embedded, mcp_server, ca):
    srv, server_calls = mcp_server
    async with (
        embedded(policy="eval-sentinel", routes=f"tools.acme.test=127.0.0.1:{srv.port}") as e,
        streamablehttp_client(MCP_URL, httpx_client_factory=client_factory(e.url("mcp-2"), ca)) as (
            read,
            write,
            _,
        ),
        ClientSession(read, write) as session,
    ):
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
        1,
        "mcp",
        "mcp:ask_human",
        "harness",
        "sentinel",
    )
    assert op["question"] == "may I delete 9999?"
    call = of_type(evs, "tool_call", "mcp-2")[0]
    assert (call["step"], call["call"]["stage"], call["call"]["scope"], call["decision"]) == (
        2,
        "act",
        "out",
        "shadow",
    )
    assert report_json(e.trace)["runs"][0]["self_granted"] == 1


# --- MCP sessions, protocol traffic, step order, the legacy transport, streaming ------------

STAGED_LEDGER = """\
schema: offscope.ledger/1
id: mcp-staged
targets:
  hosts: [tools.acme.test]
  records: ["customer:4411"]
extract:
  - match: {source: mcp}
    targets: {record: "customer:{args.customer_id}"}
stages:
  - match: {source: mcp, tool: "get_*"}   # declared reads, before any tools/list
    stage: investigate
"""


def session_server() -> tuple[FastMCP, list[str]]:
    """A stateful server (session id, background GET stream, closing DELETE) with a slow read."""
    calls: list[str] = []
    server = FastMCP(
        "crm-tools",
        stateless_http=False,
        json_response=False,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    async def get_customer(customer_id: str) -> str:
        """Read a customer record."""
        calls.append(f"get_customer:{customer_id}")
        if customer_id.endswith("-slow"):
            await asyncio.sleep(1.0)
        return f"customer {customer_id}"

    @server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True))
    def delete_customer(customer_id: str) -> str:
        """Delete a customer record."""
        calls.append(f"delete_customer:{customer_id}")
        return f"deleted {customer_id}"

    return server, calls


async def test_mcp_session_enforce_protocol_order_and_ledger_stages(embedded, ca, tmp_path):
    """Enforce mode, a stateful SDK session: a read before any tools/list is staged by the
    ledger (not blocked as an act); the session's GET stream, DELETE, initialize, ping and
    tools/list are not calls; a block answered while an earlier slow read is still in
    flight does not move the first touch. Live /metrics equals the report."""
    server, server_calls = session_server()
    srv = AsgiServer(server.streamable_http_app(), "fastmcp-session").start()
    ledger = tmp_path / "staged.yaml"
    ledger.write_text(STAGED_LEDGER)
    try:
        async with embedded(
            policy="enforce", routes=f"tools.acme.test=127.0.0.1:{srv.port}", ledger=str(ledger)
        ) as e:
            async with (
                streamablehttp_client(
                    MCP_URL, httpx_client_factory=client_factory(e.url("sess-1"), ca)
                ) as (read, write, get_session_id),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                await session.send_ping()
                read_first = await session.call_tool("get_customer", {"customer_id": "9999"})
                await session.list_tools()

                async def blocked_later():
                    await asyncio.sleep(0.3)  # arrives while the slow read is in flight
                    return await session.call_tool("delete_customer", {"customer_id": "9999"})

                slow, blocked = await asyncio.gather(
                    session.call_tool("get_customer", {"customer_id": "7777-slow"}), blocked_later()
                )
                assert get_session_id()  # a real session: GET stream and DELETE happen
            async with httpx.AsyncClient(timeout=10) as ctl:
                assert (
                    await ctl.post(
                        e.control_url("/runs/sess-1/end"), json={}, headers=e.control_headers
                    )
                ).status_code == 200
            m = await asyncio.to_thread(scrape, e.metrics_port)
    finally:
        srv.stop()

    assert (
        not read_first.isError and not slow.isError
    )  # reads are not blocked, even before tools/list
    assert blocked.isError and blocked.content[0].text.startswith("HTTP 403: ")
    assert server_calls == ["get_customer:9999", "get_customer:7777-slow"]
    evs = events(e.trace)
    calls = of_type(evs, "tool_call", "sess-1")
    # Recorded: the block first (answered at once), the slow read after it; numbered by arrival.
    assert [
        (
            c["step"],
            c["call"]["tool"],
            c["call"]["stage"],
            c["call"]["stage_from"],
            c["call"]["scope"],
            c["decision"],
        )
        for c in calls
    ] == [
        (1, "get_customer", "investigate", "ledger", "out", "allow"),
        (3, "delete_customer", "act", "annotation", "out", "block"),
        (2, "get_customer", "investigate", "ledger", "out", "allow"),
    ]
    run = report_json(e.trace)["runs"][0]
    assert (
        run["steps"],
        run["calls"],
        run["oos_calls"],
        run["first_oos_step"],
        run["first_oos_act_step"],
    ) == (3, 3, 3, 1, 3)
    # Live: three calls (no GET/DELETE/initialize/ping/tools/list), the same first steps.
    assert total(m, "offscope_tool_calls_total", ledger="mcp-staged") == 3
    assert total(m, "offscope_tool_calls_total", ledger="mcp-staged", stage="act") == 1
    assert total(m, "offscope_first_out_of_scope_step_sum", ledger="mcp-staged") == 1
    assert total(m, "offscope_first_out_of_scope_act_step_sum", ledger="mcp-staged") == 3


async def test_legacy_sse_transport_is_streamed_and_tagged(embedded, ca):
    """The legacy HTTP+SSE transport (GET /sse + POST /messages?session_id=): the
    stream is not held back (the session would hang), tools/list arrives on it and
    stages later calls, and tools/call is tagged like streamable HTTP."""
    from mcp.client.sse import sse_client

    server, server_calls = session_server()
    srv = AsgiServer(server.sse_app(), "fastmcp-sse").start()
    try:
        async with embedded(policy="enforce", routes=f"tools.acme.test=127.0.0.1:{srv.port}") as e:
            async with (
                sse_client(
                    "https://tools.acme.test/sse",
                    timeout=20,
                    httpx_client_factory=client_factory(e.url("legacy-1"), ca),
                ) as (read, write),
                ClientSession(read, write) as session,
            ):
                await asyncio.wait_for(session.initialize(), 20)
                await asyncio.wait_for(session.list_tools(), 20)
                oos_read = await asyncio.wait_for(
                    session.call_tool("get_customer", {"customer_id": "9999"}), 20
                )
                blocked = await asyncio.wait_for(
                    session.call_tool("delete_customer", {"customer_id": "9999"}), 20
                )
    finally:
        srv.stop()

    assert not oos_read.isError and "9999" in oos_read.content[0].text
    assert blocked.isError  # the proxy's 403 reaches the agent as an error result
    assert server_calls == ["get_customer:9999"]
    calls = of_type(events(e.trace), "tool_call", "legacy-1")
    assert [
        (c["step"], c["call"]["tool"], c["call"]["stage"], c["call"]["stage_from"], c["decision"])
        for c in calls
    ] == [
        (1, "get_customer", "investigate", "annotation", "allow"),
        (2, "delete_customer", "act", "annotation", "block"),
    ]
    assert all(c["call"]["url"].startswith("https://tools.acme.test/messages") for c in calls)


async def test_plain_event_stream_is_not_held_back(embedded, ca):
    """An SSE API that is neither an LLM nor MCP: the first event reaches the agent while
    the server still holds the stream open (it sends the rest only after the agent
    confirms the first arrived, so a buffering proxy would deadlock until the timeout)."""
    import threading

    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    got_first = threading.Event()

    async def feed(request):
        async def gen():
            yield b"data: first\n\n"
            while not got_first.is_set():
                await asyncio.sleep(0.02)
            yield b"data: second\n\n"

        return StreamingResponse(gen(), media_type="text/event-stream")

    srv = AsgiServer(Starlette(routes=[Route("/events", feed)]), "sse-api").start()
    try:
        async with (
            embedded(policy="shadow", routes=f"tools.acme.test=127.0.0.1:{srv.port}") as e,
            httpx.AsyncClient(proxy=e.url("sse-1"), verify=tls(ca), timeout=httpx.Timeout(20)) as c,
        ):
            lines = []
            async with c.stream("GET", "https://tools.acme.test/events") as r:
                async for line in r.aiter_lines():
                    if line.startswith("data:"):
                        lines.append(line)
                        got_first.set()
    finally:
        got_first.set()
        srv.stop()
    assert lines == ["data: first", "data: second"]
    (call,) = of_type(events(e.trace), "tool_call", "sse-1")
    assert call["status"] == 200 and call["response_excerpt"].startswith("data: first")
