"""Compression bombs from a hostile upstream: the proxy's memory stays bounded
and it keeps serving.

A gzip body of about 1 MiB on the wire decodes to 1 GiB. The proxy forwards
the compressed bytes untouched and decodes only what it records (the first
600 bytes of a plain HTTP response; an MCP or LLM response up to a cap, or
a note that it was too large), so its peak resident size (VmHWM, read from
/proc) stays under 300 MB.
"""

from __future__ import annotations

import functools
import json

import brotli
import httpx
import zstandard

from tests.support.hostile import ScriptedUpstream, gzip_bomb, memory_kb
from tests.support.sidecar_kit import LEDGER_YAML, ProxyProcess, events, of_type, scrape, total

RSS_BOUND_KB = 300 * 1024
GIB = 1024  # MiB


@functools.cache
def bombs() -> dict[str, bytes]:
    """The bombs by content-coding, made on first use: ~1 CPU-s, which every xdist
    worker would pay at collection (for the one that runs these tests)."""
    return {
        "gzip": gzip_bomb(GIB),  # ~1 MiB on the wire
        "br": brotli.compress(b"\0" * (256 << 20), quality=5),  # 256 MiB, ~0.5 KiB
        # 1 GiB, ~33 KiB
        "zstd": zstandard.ZstdCompressor(level=3).compress(b"\0" * (64 << 20)) * 16,
    }


def script(
    method: str, path: str, headers: dict[str, str], body: bytes
) -> tuple[int, dict[str, str], bytes]:
    if path.startswith("/bomb/"):
        coding = path.rsplit("/", 1)[1]
        body = bombs()[coding]
        return 200, {"content-type": "application/json", "content-encoding": coding}, body
    if path in ("/mcp", "/v1/chat/completions"):  # a parsed response, bombed
        body = bombs()["gzip"]
        return 200, {"content-type": "application/json", "content-encoding": "gzip"}, body
    return (
        200,
        {"content-type": "application/json"},
        json.dumps({"ok": True, "path": path}).encode(),
    )


def fetch_raw(client: httpx.Client, method: str, url: str, **kw) -> tuple[int, int]:
    """(status, bytes on the wire): the agent reads the body without decoding it."""
    with client.stream(method, url, **kw) as r:
        return r.status_code, sum(len(chunk) for chunk in r.iter_raw())


def test_bombs_keep_memory_bounded_and_the_proxy_serving(tmp_path, confdir):
    ledger = tmp_path / "ledger.yaml"
    ledger.write_text(LEDGER_YAML)
    with (
        ScriptedUpstream(script) as up,
        ProxyProcess(
            tmp_path,
            ledger=str(ledger),
            routes=up.routes("crm.acme.test", "tools.acme.test", "llm.acme.test"),
            confdir=confdir,
            name="bombs",
        ) as proxy,
    ):
        before = memory_kb(proxy.proc.pid)
        peaks, gzip_size = {}, len(bombs()["gzip"])
        for coding, bomb in bombs().items():
            with httpx.Client(proxy=proxy.proxy_url(f"plain-{coding}"), timeout=60) as c:
                # The agent gets the compressed bytes as sent: nothing is re-encoded.
                assert fetch_raw(c, "GET", f"http://crm.acme.test/bomb/{coding}") == (
                    200,
                    len(bomb),
                )
            peaks[coding] = memory_kb(proxy.proc.pid)["VmHWM"]
        call = {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "tools/call",
            "params": {"name": "get_customer", "arguments": {"customer_id": "4411"}},
        }
        with httpx.Client(proxy=proxy.proxy_url("mcp-bomb"), timeout=60) as c:
            assert fetch_raw(c, "POST", "http://tools.acme.test/mcp", json=call) == (200, gzip_size)
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        with httpx.Client(proxy=proxy.proxy_url("llm-bomb"), timeout=60) as c:
            assert fetch_raw(c, "POST", "http://llm.acme.test/v1/chat/completions", json=chat) == (
                200,
                gzip_size,
            )
        # Still serving, and still recording.
        with httpx.Client(proxy=proxy.proxy_url("after"), timeout=30) as c:
            assert c.get("http://crm.acme.test/customers/4411").json() == {
                "ok": True,
                "path": "/customers/4411",
            }
        assert proxy.control("GET", "/healthz").status_code == 200
        after = memory_kb(proxy.proc.pid)
        dropped = total(scrape(proxy.metrics_port), "offscope_events_dropped_total")
    print(f"proxy memory KiB: start {before}, peak after each bomb {peaks}, end {after}")
    assert after["VmHWM"] < RSS_BOUND_KB, (before, peaks, after)
    assert after["VmRSS"] < RSS_BOUND_KB
    assert dropped == 0

    evs = events(proxy.trace)
    for coding in bombs():
        (rec,) = of_type(evs, "tool_call", f"plain-{coding}")
        assert rec["status"] == 200 and rec["call"]["scope"] == "in"
    (mcp,) = of_type(evs, "tool_call", "mcp-bomb")
    assert mcp["status"] == 200
    assert any("response body not parsed" in n for n in mcp["call"]["notes"]), mcp["call"]["notes"]
    (llm,) = of_type(evs, "llm", "llm-bomb")
    assert any("response body not parsed" in n for n in llm["notes"]), llm["notes"]
    assert len(of_type(evs, "tool_call", "after")) == 1


# -- the bounded decoders themselves (offscope/proxy/bodies.py) --------------------------


def test_decoders_stop_at_the_limit_whatever_the_ratio():
    from offscope.proxy.bodies import decode_body

    for coding, bomb in bombs().items():
        decoded = decode_body(bomb, coding, 4096)
        assert (decoded.body, decoded.complete, decoded.note) == (b"\0" * 4096, False, None), coding


def test_decoders_read_what_servers_send():
    import gzip
    import zlib

    from offscope.proxy.bodies import decode_body

    text = json.dumps([{"id": i, "name": f"customer {i}"} for i in range(2000)]).encode()
    encoded = {
        "gzip": gzip.compress(text),
        "x-gzip": gzip.compress(text),
        "deflate": zlib.compress(text),
        "br": brotli.compress(text),
        "zstd": zstandard.ZstdCompressor().compress(text),
        "gzip, br": brotli.compress(gzip.compress(text)),
        "identity": text,
    }
    for coding, body in encoded.items():
        assert decode_body(body, coding, 1 << 20).body == text, coding
        head = decode_body(body, coding, 600)
        assert (head.body, head.complete) == (text[:600], False), coding
    raw_deflate = zlib.compressobj(wbits=-15)
    assert (
        decode_body(raw_deflate.compress(text) + raw_deflate.flush(), "deflate", 1 << 20).body
        == text
    )
    members = gzip.compress(text[:100]) + gzip.compress(text[100:])  # gzip may have several members
    assert decode_body(members, "gzip", 1 << 20).body == text
    truncated = gzip.compress(text)[:200]  # what there is, no error
    assert text.startswith(decode_body(truncated, "gzip", 1 << 20).body)
    # Unknown codings and corrupt data: the raw bytes, with a note saying why.
    assert decode_body(b"abc", "compress", 100).note == "content-encoding 'compress' not decoded"
    corrupt = decode_body(b"not gzip at all", "gzip", 100)
    assert corrupt.body == b"not gzip at all" and corrupt.note and "not decoded" in corrupt.note
