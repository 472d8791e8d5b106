"""Every call that crosses the proxy produces an event, whatever its bytes.

Shadow mode, the bundled example ledger (whose last extract rule reads the
`x-account` header of every call), a real `offscope proxy` subprocess and a
loopback upstream. Each hostile call runs under its own run id, so the trace
must hold exactly one record per call for each of them, and nothing may be
counted as dropped.
"""

from __future__ import annotations

import json
import re

import httpx

from offscope.ledgers import EXAMPLES
from tests.support.hostile import ScriptedUpstream
from tests.support.sidecar_kit import ProxyProcess, events, of_type, report_json, scrape, total

HOSTS = ("crm.acme.test", "mcp.billing.acme.test", "ops.acme.test")
MCP = "http://mcp.billing.acme.test/mcp"


def script(
    method: str, path: str, headers: dict[str, str], body: bytes
) -> tuple[int, dict[str, str], bytes]:
    if path == "/mcp":  # answer every JSON-RPC request by its id, whatever the id is
        try:  # a lenient server: bad bytes replaced
            msg = json.loads(body.decode("utf-8", "replace"))
        except (ValueError, RecursionError):  # too deep to parse: answer by the id alone
            found = re.search(rb'"id":(\d+)', body)
            msg = {"id": int(found.group(1)) if found else None}
        msgs = msg if isinstance(msg, list) else [msg]
        out = [
            {
                "jsonrpc": "2.0",
                "id": m.get("id"),
                "result": {"content": [{"type": "text", "text": "done"}]},
            }
            for m in msgs
            if isinstance(m, dict)
        ]
        return (
            200,
            {"content-type": "application/json"},
            json.dumps(out if isinstance(msg, list) else out[0]).encode(),
        )
    if path.startswith("/latin1"):
        return 200, {"content-type": "text/plain"}, "r\xe9sum\xe9 \xff\xfe".encode("latin-1")
    if path == "/ask":
        return 200, {"content-type": "application/json"}, b'{"reply":"a human says no"}'
    return 200, {"content-type": "application/json"}, b'{"ok":true}'


def tool(call_id: object, args: object, name: str = "get_customer") -> dict:
    return {
        "jsonrpc": "2.0",
        "id": call_id,
        "method": "tools/call",
        "params": {"name": name, "arguments": args},
    }


def deep(n: int) -> bytes:
    """JSON text nested `n` deep (too deep for Python's json to build)."""
    return b"[" * n + b'"4411"' + b"]" * n


# run id -> (method, url, headers, body, how many tool calls it makes)
CASES: dict[str, tuple[str, str, list[tuple[bytes, bytes]], bytes | None, int]] = {
    "hdr-bytes": (
        "GET",
        "http://crm.acme.test/customers/4411",
        [(b"x-account", b"svc-\xff\xfe")],
        None,
        1,
    ),
    "hdr-latin1": (
        "GET",
        "http://crm.acme.test/customers/4411",
        [(b"x-account", b"caf\xe9")],
        None,
        1,
    ),
    "hdr-mcp": (
        "POST",
        MCP,
        [(b"x-account", b"\xc3\x28"), (b"content-type", b"application/json")],
        json.dumps(tool(1, {"customer_id": "4411"})).encode(),
        1,
    ),
    "mcp-object-id": (
        "POST",
        MCP,
        [(b"content-type", b"application/json")],
        json.dumps(tool({"session": "s1", "n": 3}, {"customer_id": "4411"})).encode(),
        1,
    ),
    "mcp-array-id": (
        "POST",
        MCP,
        [(b"content-type", b"application/json")],
        json.dumps(tool([1, "x", None], {"customer_id": "4411"})).encode(),
        1,
    ),
    "mcp-null-id": (
        "POST",
        MCP,
        [(b"content-type", b"application/json")],
        json.dumps(tool(None, {"customer_id": "4411"})).encode(),
        1,
    ),
    "mcp-float-id": (
        "POST",
        MCP,
        [(b"content-type", b"application/json")],
        json.dumps(tool(1.5, {"customer_id": "4411"})).encode(),
        1,
    ),
    "mcp-batch-ids": (
        "POST",
        MCP,
        [(b"content-type", b"application/json")],
        json.dumps(
            [
                tool({"k": 1}, {"customer_id": "4411"}),
                tool({"k": 2}, {"customer_id": "9"}),
                tool(True, {"customer_id": "1"}),
                tool(1, {"customer_id": "2"}),
            ]
        ).encode(),
        4,
    ),
    "mcp-lone-surrogate": (
        "POST",
        MCP,
        [(b"content-type", b"application/json")],
        json.dumps(tool(2, {"customer_id": "44\ud80011", "repo_path": "/srv/\udcff"})).encode(),
        1,
    ),
    "mcp-bad-utf8": (
        "POST",
        MCP,
        [(b"content-type", b"application/json")],
        b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"x","arguments":'
        b'{"customer_id":"\xff\xfe4411"}}}',
        1,
    ),
    "mcp-deep-args": (
        "POST",
        MCP,
        [(b"content-type", b"application/json")],
        b'{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"x","arguments":'
        b'{"customer_id":' + deep(5000) + b"}}}",
        1,
    ),
    "path-bytes": ("GET", "http://crm.acme.test/customers/%ff%fe%00", [], None, 1),
    "query-bytes": ("GET", "http://crm.acme.test/invoices?invoice_id=%ff%c3%28", [], None, 1),
    "response-latin1": ("GET", "http://crm.acme.test/latin1", [(b"x-account", b"\xff")], None, 1),
}


def test_every_call_is_recorded_whatever_its_bytes(tmp_path, confdir):
    with (
        ScriptedUpstream(script) as up,
        ProxyProcess(
            tmp_path,
            ledger=str(EXAMPLES / "billing-agent.yaml"),
            policy="shadow",
            routes=up.routes(*HOSTS),
            confdir=confdir,
            name="records",
        ) as proxy,
    ):
        for run, (method, url, headers, body, _) in CASES.items():
            with httpx.Client(proxy=proxy.proxy_url(run), timeout=30) as c:
                r = c.request(method, url, headers=headers, content=body)
                assert r.status_code == 200, (run, r.status_code, r.text)
        # An operator ask with a claimed provenance that is not UTF-8.
        with httpx.Client(proxy=proxy.proxy_url("operator-bytes"), timeout=30) as c:
            r = c.post(
                "http://ops.acme.test/ask",
                json={"question": "may I?"},
                headers=[(b"x-offscope-provenance", b"human \xff")],
            )
            assert r.status_code == 200
        dropped = total(scrape(proxy.metrics_port), "offscope_events_dropped_total")
        # offscope's own tools/list (a tools/call it had no annotations for) is not the agent's
        upstream_saw = len([b for b in up.bodies if b'"offscope-tools-list"' not in b])
    evs = events(proxy.trace)  # every line is valid UTF-8 JSON
    assert dropped == 0
    assert upstream_saw == len(CASES) + 1  # shadow mode: everything went upstream
    recorded = {run: len(of_type(evs, "tool_call", run)) for run in CASES}
    assert recorded == {run: case[4] for run, case in CASES.items()}
    assert len(of_type(evs, "operator", "operator-bytes")) == 1

    # What the records say about the bytes.
    (hdr,) = of_type(evs, "tool_call", "hdr-bytes")
    accounts = [t["value"] for t in hdr["call"]["targets"] if t["kind"] == "account"]
    assert accounts == ["svc-\\xff\\xfe"] and hdr["call"]["scope"] == "out"
    (obj,) = of_type(evs, "tool_call", "mcp-object-id")
    assert obj["status"] == 200 and obj["response_excerpt"] == "done"  # matched by its object id
    batch = of_type(evs, "tool_call", "mcp-batch-ids")
    assert [e["response_excerpt"] for e in batch] == ["done"] * 4
    # The report reads the trace (every event validates).
    runs = report_json(proxy.trace)
    assert runs
