"""Exchange handlers: one registered class per kind, picked once per request;
and `Engine.decide_mcp`, the entry point that decides one MCP JSON-RPC message
from any transport (driven here as a stdio wrapper would, without a proxy)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offscope.ledgers import Ledger, compile_ledger
from offscope.policies import load_policy
from offscope.proxy.engine import Engine
from offscope.proxy.exchange import HANDLERS, Handler, register_handler
from offscope.proxy.extract.http import HttpRequest, HttpResponse
from offscope.proxy.sinks import TraceSink

LEDGER = {
    "schema": "offscope.ledger/1",
    "id": "handlers",
    "targets": {
        "hosts": ["crm.acme.test", "llm.acme.test", "stdio.local"],
        "records": ["customer:4411"],
    },
    "extract": [{"match": {"source": "mcp"}, "targets": {"record": "customer:{args.customer_id}"}}],
    "operator": [{"source": "mcp", "tool": "ask_human"}],
    "llm": {"hosts": ["llm.acme.test"], "builtin_hosts": False},
}


def engine(tmp_path: Path, policy: str = "enforce") -> tuple[Engine, Path]:
    trace = tmp_path / "trace.jsonl"
    led = compile_ledger(Ledger.model_validate(LEDGER), "ledger.yaml")
    return Engine(led, load_policy(policy), trace=TraceSink(trace)), trace


def records(trace: Path, kind: str) -> list[dict]:
    return [e for e in map(json.loads, trace.read_text().splitlines()) if e["type"] == kind]


def rpc(msg_id: int, method: str, **params: object) -> dict:
    return {"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}


def stdio(message: object) -> HttpRequest:
    """How a stdio wrapper names its server: a pseudo-URL per command."""
    return HttpRequest(
        "POST",
        "stdio.local",
        "/crm-server",
        body=json.dumps(message).encode(),
        headers={"content-type": "application/json"},
    )


def test_handlers_are_registered_once_in_claim_order() -> None:
    assert [h.kind for h in HANDLERS] == ["llm", "mcp", "http"]
    with pytest.raises(ValueError, match="registered twice"):
        register_handler(type("Again", (Handler,), {"kind": "mcp"}))


@pytest.mark.parametrize(
    ("req", "kind"),
    [
        (
            HttpRequest("POST", "llm.acme.test", "/v1/chat/completions", body=b'{"messages": []}'),
            "llm",
        ),
        (
            HttpRequest(
                "POST",
                "crm.acme.test",
                "/mcp",
                body=json.dumps(rpc(1, "ping")).encode(),
                headers={"content-type": "application/json"},
            ),
            "mcp",
        ),
        (HttpRequest("GET", "crm.acme.test", "/customers/4411"), "http"),
        (HttpRequest("POST", "llm.acme.test", "/v1/embeddings", body=b'{"input": "x"}'), "http"),
    ],
)
def test_each_request_is_claimed_by_one_handler(
    tmp_path: Path, req: HttpRequest, kind: str
) -> None:
    eng, _ = engine(tmp_path)
    ex, _ = eng.begin(req, "r1")
    assert ex.kind == kind and ex.may_stream == (kind != "http")


def test_decide_mcp_answers_an_out_of_scope_call_with_an_mcp_error(tmp_path: Path) -> None:
    eng, trace = engine(tmp_path)
    ex, delay = eng.decide_mcp(
        stdio(rpc(7, "tools/call", name="refund", arguments={"customer_id": "9999"})), "r1"
    )
    assert delay == 0 and ex.done and ex.synthetic is not None
    answer = json.loads(ex.synthetic.body)
    assert (
        answer["id"] == 7
        and answer["result"]["isError"] is True
        and "403" in answer["result"]["content"][0]["text"]
    )
    eng.close()
    (call,) = records(trace, "tool_call")
    assert (call["call"]["source"], call["call"]["tool"], call["decision"], call["injected"]) == (
        "mcp",
        "refund",
        "block",
        True,
    )


def test_decide_mcp_forwards_an_in_scope_call_and_records_the_servers_answer(
    tmp_path: Path,
) -> None:
    eng, trace = engine(tmp_path)
    # tools/list first: its annotations stage the later call (read-only -> not a commit).
    ex, _ = eng.decide_mcp(stdio(rpc(1, "tools/list")), "r1")
    assert ex.synthetic is None
    tools = {
        "jsonrpc": "2.0",
        "id": 1,
        "result": {
            "tools": [
                {
                    "name": "get_customer",
                    "inputSchema": {"type": "object"},
                    "annotations": {"readOnlyHint": True},
                }
            ]
        },
    }
    eng.response(
        ex, HttpResponse(200, {"content-type": "application/json"}, json.dumps(tools).encode())
    )
    msg = rpc(2, "tools/call", name="get_customer", arguments={"customer_id": "4411"})
    ex, _ = eng.decide_mcp(stdio(msg), "r1")
    assert ex.synthetic is None and ex.new_body is None
    result = {
        "jsonrpc": "2.0",
        "id": 2,
        "result": {"content": [{"type": "text", "text": "Ada, 4411"}]},
    }
    eng.response(
        ex, HttpResponse(200, {"content-type": "application/json"}, json.dumps(result).encode())
    )
    eng.close()
    (call,) = records(trace, "tool_call")
    assert (call["decision"], call["call"]["scope"], call["call"]["stage_from"]) == (
        "allow",
        "in",
        "annotation",
    )
    assert call["response_excerpt"] == "Ada, 4411"


def test_decide_mcp_applies_the_operator_reply_policy(tmp_path: Path) -> None:
    eng, trace = engine(tmp_path, "eval-sentinel")
    ex, _ = eng.decide_mcp(
        stdio(rpc(3, "tools/call", name="ask_human", arguments={"question": "refund 9999?"})), "r1"
    )
    assert ex.synthetic is not None
    assert "NO HUMAN" in json.loads(ex.synthetic.body)["result"]["content"][0]["text"]
    eng.close()
    (op,) = records(trace, "operator")
    assert (op["source"], op["policy"], op["question"]) == ("mcp", "sentinel", "refund 9999?")
