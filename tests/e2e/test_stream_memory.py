"""Long event streams through an `offscope proxy` subprocess keep its memory flat.

The proxy parses LLM and MCP event streams as they pass (tool calls, results,
tools/list); it keeps only what the record needs, with caps. Here an LLM answer
streams ~96 MiB of text deltas and an MCP tools/call streams ~96 MiB of progress
notifications before its result; the proxy's RSS may not grow by more than a
small fraction of that, and the records still come out right.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support.sidecar_kit import AsgiServer, ProxyProcess, events, of_type, tls

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

CHUNK_EVENTS = 64  # events per chunk the upstream writes
EVENTS = 24_000  # x ~4 KiB each: ~96 MiB per stream
PAD = "x" * 4000
GROWTH_LIMIT_KB = 48 * 1024  # half of one stream; the old parser kept 1.7x the stream


def stream_app() -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    async def chat(request: Request) -> Any:
        await request.body()

        async def gen():
            delta = {
                "id": "c",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "sim",
                "choices": [{"index": 0, "delta": {"content": PAD}, "finish_reason": None}],
            }
            event = f"data: {json.dumps(delta)}\n\n".encode()
            for _ in range(EVENTS // CHUNK_EVENTS):
                yield event * CHUNK_EVENTS
            call = {
                "id": "c",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "sim",
                "choices": [
                    {
                        "index": 0,
                        "delta": {
                            "tool_calls": [
                                {
                                    "index": 0,
                                    "id": "call_1",
                                    "type": "function",
                                    "function": {
                                        "name": "lookup",
                                        "arguments": '{"customer_id": "9999"}',
                                    },
                                }
                            ]
                        },
                        "finish_reason": "tool_calls",
                    }
                ],
            }
            yield f"data: {json.dumps(call)}\n\ndata: [DONE]\n\n".encode()

        return StreamingResponse(gen(), media_type="text/event-stream")

    async def mcp(request: Request) -> Any:
        body = json.loads(await request.body())

        async def gen():
            note = {
                "jsonrpc": "2.0",
                "method": "notifications/progress",
                "params": {"progressToken": 1, "progress": 1, "message": PAD},
            }
            event = f"event: message\ndata: {json.dumps(note)}\n\n".encode()
            for _ in range(EVENTS // CHUNK_EVENTS):
                yield event * CHUNK_EVENTS
            result = {
                "jsonrpc": "2.0",
                "id": body["id"],
                "result": {
                    "content": [{"type": "text", "text": "customer 9999: ok"}],
                    "isError": False,
                },
            }
            yield f"event: message\ndata: {json.dumps(result)}\n\n".encode()

        return StreamingResponse(gen(), media_type="text/event-stream")

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/mcp", mcp, methods=["POST"]),
        ]
    )


def drain(client: httpx.Client, url: str, body: dict[str, Any]) -> int:
    size = 0
    with client.stream(
        "POST", url, json=body, headers={"accept": "application/json, text/event-stream"}
    ) as r:
        assert r.status_code == 200
        for chunk in r.iter_raw():
            size += len(chunk)
    return size


def test_long_streams_keep_the_proxy_memory_flat(tmp_path, confdir, ledger_file):
    srv = AsgiServer(stream_app(), "streams").start()
    routes = f"llm.acme.test=127.0.0.1:{srv.port},tools.acme.test=127.0.0.1:{srv.port}"
    try:
        with (
            ProxyProcess(
                tmp_path,
                ledger=ledger_file,
                policy="shadow",
                routes=routes,
                confdir=confdir,
                name="streams",
            ) as proxy,
            httpx.Client(proxy=proxy.proxy_url("stream-1"), verify=tls(proxy.ca), timeout=120) as c,
        ):
            # Warm up (first TLS interception, imports) before the baseline.
            c.get("https://tools.acme.test/nothing")
            before = proxy.rss_kb()
            llm_bytes = drain(
                c,
                "https://llm.acme.test/v1/chat/completions",
                {"model": "sim", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
            )
            mcp_bytes = drain(
                c,
                "https://tools.acme.test/mcp",
                {
                    "jsonrpc": "2.0",
                    "id": 7,
                    "method": "tools/call",
                    "params": {"name": "get_customer", "arguments": {"customer_id": "9999"}},
                },
            )
            growth = proxy.rss_kb() - before
            proxy.control("POST", "/runs/stream-1/end", json={})
    finally:
        srv.stop()

    assert llm_bytes > 90 * 1024 * 1024 and mcp_bytes > 90 * 1024 * 1024
    assert growth < GROWTH_LIMIT_KB, (
        f"RSS grew {growth} KiB over {(llm_bytes + mcp_bytes) >> 20} MiB streamed"
    )
    evs = events(proxy.trace)
    (llm,) = of_type(evs, "llm", "stream-1")
    assert [tc["tool"] for tc in llm["tool_calls"]] == ["lookup"]  # found after ~96 MiB of text
    assert any("not kept" in n for n in llm["notes"])
    (call,) = [e for e in of_type(evs, "tool_call", "stream-1") if e["call"]["source"] == "mcp"]
    assert call["response_excerpt"] == "customer 9999: ok" and call["call"]["scope"] == "out"
