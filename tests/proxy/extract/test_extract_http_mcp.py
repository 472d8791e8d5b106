"""Plain HTTP, MCP streamable HTTP (JSON, batches, SSE) and the SSE parser."""

from __future__ import annotations

import base64
import json

import mcp.types as mt
import pytest

from offscope.ledgers import CallInput, CompiledLedger, Ledger
from offscope.proxy.extract.http import HttpRequest, extract_http, parse_json_body
from offscope.proxy.extract.mcp import (
    ToolRegistry,
    call_from_message,
    mcp_messages,
    response_messages,
    result_text,
    tool_annotations,
)
from offscope.proxy.extract.sse import SseEvent, SseParser, parse_sse
from offscope.yamlio import load_model
from tests.support import core_wire as w
from tests.support.narrow import present

# --- plain HTTP ---------------------------------------------------------------------


def test_rest_get_with_query_and_basic_auth() -> None:
    auth = "Basic " + base64.b64encode(b"svc-billing:hunter2").decode()
    req = HttpRequest(
        "get",
        "crm.acme.test",
        "/customers/4411?expand=notes&expand=tags&empty=",
        scheme="https",
        port=443,
        headers={"authorization": auth, "accept": "application/json"},
    )
    call, notes = extract_http(req)
    assert notes == []
    assert (call.source, call.tool, call.method, call.host, call.path) == (
        "http",
        "http",
        "GET",
        "crm.acme.test",
        "/customers/4411",
    )
    assert call.query == {"expand": ["notes", "tags"], "empty": [""]}
    assert call.basic_auth_user == "svc-billing"
    assert call.args is None
    assert req.url == "https://crm.acme.test/customers/4411?expand=notes&expand=tags&empty="


def test_rest_post_json_body() -> None:
    body = json.dumps({"customer_id": 4411, "amount": {"value": 12.5, "currency": "EUR"}}).encode()
    req = HttpRequest(
        "POST",
        "crm.acme.test",
        "/refunds",
        port=8080,
        headers={"content-type": "application/json; charset=utf-8"},
        body=body,
    )
    call, notes = extract_http(req)
    assert call.method == "POST" and call.args["amount"]["currency"] == "EUR" and notes == []
    assert req.url == "http://crm.acme.test:8080/refunds"


@pytest.mark.parametrize(
    ("body", "ctype", "args", "note"),
    [
        (b"customer_id=4411", "application/x-www-form-urlencoded", None, None),
        (b"{broken", "application/json", None, "not valid JSON"),
        (
            b"\xff\xfe{",
            "application/json",
            None,
            "not valid",
        ),  # a UTF-16 byte-order mark, then no JSON
        # Invalid UTF-8: an extraction error, and the lenient reading still feeds the tags.
        (b'{"a": "\xff"}', "application/json", {"a": "\ufffd"}, "not valid text"),
        (b"[1, 2]", "", [1, 2], None),  # sniffed without a content type
        (b"", "application/json", None, None),
    ],
)
def test_rest_odd_bodies(body: bytes, ctype: str, args, note: str | None) -> None:
    call, notes = extract_http(
        HttpRequest("POST", "h.test", "/", headers={"content-type": ctype}, body=body)
    )
    assert call.args == args
    assert notes == [] if note is None else any(note in n for n in notes)


def test_body_size_limit_noted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("offscope.proxy.extract.http.MAX_PARSE", 1024)
    data, notes = parse_json_body(b"[" + b"1," * 1024 + b"1]", "application/json")
    assert data is None and "limit" in notes[0]


@pytest.mark.parametrize(
    "auth",
    [
        "Bearer abc",
        "Basic !!!notbase64",
        "Basic " + base64.b64encode(b"\xff").decode(),
        "Basic " + base64.b64encode(b":pw").decode(),
        "",
    ],
)
def test_basic_auth_user_absent(auth: str) -> None:
    call, _ = extract_http(HttpRequest("GET", "h.test", "/", headers={"authorization": auth}))
    assert call.basic_auth_user is None


# --- MCP -------------------------------------------------------------------------------


def _mcp_post(payload, session: str = "s-1") -> HttpRequest:
    return HttpRequest(
        "POST",
        "mcp.acme.test",
        "/mcp",
        scheme="https",
        port=443,
        headers={
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            "mcp-session-id": session,
            "mcp-protocol-version": "2025-06-18",
        },
        body=json.dumps(payload).encode(),
    )


TOOLS_CALL = {
    "jsonrpc": "2.0",
    "id": 7,
    "method": "tools/call",
    "params": {"name": "read_file", "arguments": {"path": "/srv/billing/a.csv"}},
}

TOOLS_LIST_RESULT = {
    "jsonrpc": "2.0",
    "id": 2,
    "result": {
        "tools": [
            {
                "name": "read_file",
                "description": "Read a file",
                "inputSchema": {"type": "object"},
                "annotations": {"title": "Read", "readOnlyHint": True, "openWorldHint": False},
            },
            {
                "name": "delete_file",
                "inputSchema": {"type": "object"},
                "annotations": {"readOnlyHint": False, "destructiveHint": True},
            },
            {
                "name": "append_note",
                "inputSchema": {"type": "object"},
                "annotations": {
                    "readOnlyHint": False,
                    "destructiveHint": False,
                    "idempotentHint": False,
                },
            },
            {"name": "bare", "inputSchema": {"type": "object"}},
        ]
    },
}


def test_fixture_shapes_are_mcp_sdk_shapes() -> None:
    mt.JSONRPCRequest.model_validate(TOOLS_CALL)
    mt.CallToolRequest.model_validate({"method": "tools/call", "params": TOOLS_CALL["params"]})
    tools = mt.ListToolsResult.model_validate(TOOLS_LIST_RESULT["result"])
    assert present(tools.tools[0].annotations).readOnlyHint is True


def test_mcp_single_tools_call() -> None:
    req = _mcp_post(TOOLS_CALL)
    found = mcp_messages(req)
    assert found is not None
    messages, notes = found
    assert notes == [] and [(m.id, m.method) for m in messages] == [(7, "tools/call")]
    call = call_from_message(req, messages[0], {"readOnlyHint": True})
    assert (call.source, call.tool, call.host, call.path) == (
        "mcp",
        "read_file",
        "mcp.acme.test",
        "/mcp",
    )
    assert call.args == {"path": "/srv/billing/a.csv"} and call.annotations == {
        "readOnlyHint": True
    }


def test_mcp_batch_and_notifications() -> None:
    batch = [
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": "a", "method": "tools/list", "params": {}},
        TOOLS_CALL,
        {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "delete_file"}},
        {"jsonrpc": "1.0", "id": 10, "method": "tools/call"},  # not JSON-RPC 2.0
        "junk",
    ]
    messages, _ = present(mcp_messages(_mcp_post(batch)))
    assert [(m.id, m.method) for m in messages] == [
        (None, "notifications/initialized"),
        ("a", "tools/list"),
        (7, "tools/call"),
        (9, "tools/call"),
    ]
    call = call_from_message(_mcp_post(batch), messages[3], None)
    assert call.tool == "delete_file" and call.args == {}


@pytest.mark.parametrize(
    "req",
    [
        HttpRequest("GET", "mcp.acme.test", "/mcp", headers={"accept": "text/event-stream"}),
        HttpRequest("DELETE", "mcp.acme.test", "/mcp"),
        HttpRequest(
            "POST",
            "api.acme.test",
            "/x",
            headers={"content-type": "application/json"},
            body=b'{"a": 1}',
        ),
        HttpRequest("POST", "api.acme.test", "/x", body=b"not json"),
    ],
)
def test_not_mcp(req: HttpRequest) -> None:
    assert mcp_messages(req) is None


def test_mcp_json_response_and_annotations() -> None:
    msgs = response_messages(json.dumps(TOOLS_LIST_RESULT).encode(), "application/json")
    assert len(msgs) == 1
    ann = tool_annotations(msgs[0])
    assert ann["read_file"]["readOnlyHint"] is True
    assert ann["bare"] == {}
    reg = ToolRegistry(max_servers=2)
    key = ToolRegistry.key(_mcp_post(TOOLS_CALL))
    assert key == "mcp.acme.test:443/mcp"
    reg.remember(key, ann)
    assert reg.annotations(key, "read_file") == ann["read_file"]
    assert reg.annotations(key, "nope") is None and reg.annotations("other", "read_file") is None
    # Bounded: the least recently used server is forgotten.
    reg.remember("b", {"t": {}})
    reg.remember("c", {"t": {}})
    assert reg.annotations(key, "read_file") is None and reg.annotations("c", "t") == {}


def test_mcp_annotations_drive_stage() -> None:
    led = CompiledLedger(load_model(Ledger, "l.yaml", "schema: offscope.ledger/1\nid: m\n"))
    ann = tool_annotations(TOOLS_LIST_RESULT)
    req = _mcp_post(TOOLS_CALL)
    (msg,), _ = present(mcp_messages(req))
    stages = {}
    for name in ("read_file", "delete_file", "append_note", "bare", "unknown"):
        msg.params["name"] = name
        stages[name] = led.tag(call_from_message(req, msg, ann.get(name))).stage
    assert stages == {
        "read_file": "investigate",
        "delete_file": "act",
        "append_note": "act",
        "bare": "act",
        "unknown": "act",
    }


def test_mcp_sse_response() -> None:
    call_result = {
        "jsonrpc": "2.0",
        "id": 7,
        "result": {
            "content": [{"type": "text", "text": "a,b\n1,2"}, {"type": "image", "data": "..."}],
            "isError": False,
        },
    }
    progress = {
        "jsonrpc": "2.0",
        "method": "notifications/progress",
        "params": {"progressToken": "t", "progress": 1},
    }
    body = w.sse([("message", progress), ("message", call_result), (None, "not json")], crlf=True)
    msgs = response_messages(body, "text/event-stream")
    assert [m.get("id") for m in msgs] == [None, 7]
    assert result_text(msgs[1]) == (False, "a,b\n1,2")


def test_mcp_sse_batch_in_one_event_and_split_feed() -> None:
    batch = [
        TOOLS_LIST_RESULT,
        {"jsonrpc": "2.0", "id": 7, "error": {"code": -32602, "message": "bad path"}},
    ]
    body = w.sse([("message", batch)])
    msgs = response_messages(body, "text/event-stream")
    assert [m["id"] for m in msgs] == [2, 7]
    assert result_text(msgs[1]) == (True, "bad path")
    # The proxy feeds the stream chunk by chunk through SseParser; same messages.
    parser = SseParser()
    events = [e for i in range(len(body)) for e in parser.feed(body[i : i + 1])] + parser.close()
    again = [
        m
        for e in events
        for m in response_messages(f"data: {e.data}\n\n".encode(), "text/event-stream")
    ]
    assert again == msgs


@pytest.mark.parametrize(
    ("message", "expect"),
    [
        (
            {
                "jsonrpc": "2.0",
                "id": 1,
                "result": {"content": [{"type": "text", "text": "x"}], "isError": True},
            },
            (True, "x"),
        ),
        ({"jsonrpc": "2.0", "id": 1, "error": "plain"}, (True, "plain")),
        ({"jsonrpc": "2.0", "id": 1, "result": {"content": None}}, (False, "")),
        ({"jsonrpc": "2.0", "id": 1, "result": {"content": 5}}, (False, "")),
        ({"jsonrpc": "2.0", "id": 1, "result": "str"}, (False, "")),
    ],
)
def test_result_text_shapes(message, expect) -> None:
    assert result_text(message) == expect


def test_response_messages_deep_nesting_does_not_raise() -> None:
    deep = b"data: " + b"[" * 100_000 + b"\n\n"
    assert response_messages(deep, "text/event-stream") == []
    assert response_messages(b"[" * 100_000, "application/json") == []


# --- SSE parser ----------------------------------------------------------------------------

SSE_BODY = (
    b": comment\n"
    b"event: update\ndata: line one\ndata: line two\nid: 3\nretry: 10\n\n"
    b"data:no-space\n\n"
    b"event: empty-no-data\n\n"
    b"data: last"
)


def test_sse_parse_fields() -> None:
    assert parse_sse(SSE_BODY) == [
        SseEvent("update", "line one\nline two"),
        SseEvent("message", "no-space"),
        SseEvent("message", "last"),
    ]


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_sse_one_byte_at_a_time_any_newline(newline: bytes) -> None:
    body = SSE_BODY.replace(b"\n", newline)
    parser = SseParser()
    events = [e for i in range(len(body)) for e in parser.feed(body[i : i + 1])]
    events += parser.close()
    assert events == parse_sse(SSE_BODY)


def test_sse_crlf_split_between_cr_and_lf_keeps_the_event_whole() -> None:
    parser = SseParser()
    assert parser.feed(b"event: a\r") == []
    assert parser.feed(b"\ndata: x\r") == []
    assert parser.feed(b"") == []
    assert parser.feed(b"\ndata: y\r\n\r") == [SseEvent("a", "x\ny")]
    assert parser.feed(b"\n") == []


def test_call_input_is_transport_free() -> None:
    # The same CallInput from any source tags the same way.
    c = CallInput(source="http", method="GET", host="a.test", path="/")
    assert c.query == {} and c.headers == {} and c.annotations is None
