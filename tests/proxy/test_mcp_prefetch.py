"""When the proxy asks an MCP server for its tool list itself (offscope/proxy/mcp_prefetch.py),
without sockets: never for a known tool of a list still fresh; again once the list's own
ttl (2026-07-28 `ttlMs`) ran out; never for a host outside the ledger."""

from __future__ import annotations

import json
import time

from offscope.ledgers import CompiledLedger
from offscope.ledgers.model import Ledger
from offscope.proxy.extract.http import HttpRequest
from offscope.proxy.extract.mcp import ToolRegistry
from offscope.proxy.extract.mcp_wire2026 import fresh_until
from offscope.proxy.mcp_prefetch import ToolListPrefetch

LEDGER = CompiledLedger(
    Ledger.model_validate(
        {"schema": "offscope.ledger/1", "id": "t", "targets": {"hosts": ["tickets.acme.test"]}}
    )
)


def _call(host: str = "tickets.acme.test") -> HttpRequest:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "get_ticket"}}
    return HttpRequest(
        method="POST",
        host=host,
        path="/mcp",
        scheme="https",
        port=443,
        headers={"content-type": "application/json"},
        body=json.dumps(body).encode(),
    )


def _listing(ttl_ms: int | None) -> dict:
    result = {"tools": [{"name": "get_ticket", "annotations": {"readOnlyHint": True}}]}
    return {
        "jsonrpc": "2.0",
        "id": 2,
        "result": {**result, **({"ttlMs": ttl_ms} if ttl_ms else {})},
    }


def test_a_tool_of_a_fresh_list_is_not_fetched_again_a_stale_one_is() -> None:
    tools = ToolRegistry()
    prefetch = ToolListPrefetch(tools)
    server = ToolRegistry.key(_call())
    annotations = {"get_ticket": {"readOnlyHint": True}}
    assert prefetch.wanted(_call(), LEDGER) == (server, None)  # unknown tool: ask

    fresh = ToolListPrefetch(tools)
    tools.remember(server, annotations, fresh_until=fresh_until(_listing(60_000)))
    assert fresh.wanted(_call(), LEDGER) is None  # listed, and fresh for a minute
    tools.remember(server, annotations, fresh_until=time.monotonic() - 1)  # its ttl ran out
    assert fresh.wanted(_call(), LEDGER) == (server, None)
    assert fresh.wanted(_call(), LEDGER) is None  # once per server per RETRY_SECONDS
    tools.remember(server, annotations, fresh_until=fresh_until(_listing(None)))
    assert not tools.stale(server, None, time.monotonic() + 10**6)  # no ttl: kept until relisted
    assert ToolListPrefetch(tools).wanted(_call("elsewhere.test"), LEDGER) is None
