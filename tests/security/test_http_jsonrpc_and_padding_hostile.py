"""Two HTTP ways around tagging, closed: a JSON-RPC body whose method is not MCP, and a
JSON body behind a long run of leading whitespace. Real proxy subprocess under the
enforce preset, a loopback upstream that records what it received."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from tests.support.sidecar_kit import LEDGER_YAML, EchoUpstream, ProxyProcess, events, of_type

RPC = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "delete_customer",
    "params": {"customer_id": "9999"},
    "customer_id": "9999",
}


def _run(tmp_path: Path, body: bytes, headers: dict[str, str]) -> tuple[httpx.Response, list, list]:
    (tmp_path / "ledger.yaml").write_text(
        LEDGER_YAML.replace(
            "  - match: {source: mcp}\n",
            '  - match: {host: crm.acme.test, path: "/rpc"}\n'
            '    targets: {record: "customer:{args.customer_id}"}\n'
            "  - match: {source: mcp}\n",
        )
    )
    echo = EchoUpstream().start()
    try:
        with ProxyProcess(
            tmp_path,
            ledger=str(tmp_path / "ledger.yaml"),
            policy="enforce",
            routes=echo.routes(),
            confdir=str(tmp_path / "ca"),
        ) as proxy:
            with httpx.Client(proxy=proxy.proxy_url("hostile"), timeout=30) as client:
                answer = client.post("http://crm.acme.test/rpc", content=body, headers=headers)
            received = [s for s in echo.seen if s["path"] == "/rpc"]
    finally:
        echo.stop()
    return answer, received, of_type(events(proxy.trace), "tool_call")


def test_json_rpc_with_a_method_that_is_not_mcp_is_tagged_as_http(tmp_path: Path) -> None:
    answer, received, calls = _run(
        tmp_path, json.dumps(RPC).encode(), {"content-type": "application/json"}
    )
    assert answer.status_code == 403 and received == []
    (call,) = calls
    assert call["decision"] == "block" and call["call"]["scope"] == "out"
    assert {"kind": "record", "value": "customer:9999", "in_scope": False} in [
        {k: t[k] for k in ("kind", "value", "in_scope")} for t in call["call"]["targets"]
    ]


def test_leading_whitespace_does_not_hide_a_json_body(tmp_path: Path) -> None:
    padded = b" " * 64 + b"\n" * 64 + json.dumps({"customer_id": "9999"}).encode()
    answer, received, calls = _run(tmp_path, padded, {"content-type": "text/plain"})
    assert answer.status_code == 403 and received == []
    (call,) = calls
    assert call["decision"] == "block" and call["call"]["scope"] == "out"
