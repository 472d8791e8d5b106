"""What offscope reads of one WebSocket message (offscope/proxy/extract/websocket.py).

These pin the rule the hostile end-to-end tests rely on
(tests/security/test_websocket_hostile.py): a message is read completely, or
`on_error` decides it; JSON-RPC is MCP only when it is nothing but MCP.
"""

from __future__ import annotations

import json

import pytest

from offscope.ledgers.matcher import default_stage
from offscope.proxy.extract.http import HttpRequest, extract_http
from offscope.proxy.extract.mcp import mcp_requests
from offscope.proxy.extract.websocket import read_json, read_message

OUT = json.dumps({"customer_id": 9999}).encode()


@pytest.mark.parametrize("is_text", [True, False])
def test_json_is_read_from_text_and_binary_alike(is_text: bool) -> None:
    reading = read_message(OUT, is_text)
    assert reading.is_json and reading.value == {"customer_id": 9999} and reading.error is None


def test_json_after_any_amount_of_whitespace_is_json() -> None:
    # A server's JSON.parse skips it all; a reader that looked only at the first bytes did not.
    reading = read_message(b" " * 5000 + OUT, True)
    assert reading.is_json and reading.value == {"customer_id": 9999}


def test_text_that_is_not_json_is_plain_text() -> None:
    reading = read_message(b"hello customer 9999", True)
    assert not reading.is_json and reading.error is None and reading.note


@pytest.mark.parametrize(
    ("content", "is_text", "why"),
    [
        (b"PK\x03\x04 not json", False, "not JSON"),
        (b'{"customer_id": 9999, "x": "\xff"}', False, "UTF-8"),
        (b"[" * 5000 + b"]" * 5000, True, "nested deeper"),
        (b'{"customer_id": 9999,', True, "not valid JSON"),
        (b'{"customer_id": 4411, "customer_id": 9999}', True, "ambiguous"),  # two readings
        (b"\x00\x01", False, "not JSON"),
    ],
)
def test_what_cannot_be_read_completely_is_an_error(
    content: bytes, is_text: bool, why: str
) -> None:
    reading = read_message(content, is_text)
    assert reading.error is not None and why in reading.error and reading.value is None


def test_a_byte_order_mark_is_read_as_every_transport_reads_it() -> None:
    """The strict reader HTTP and stdio use skips a BOM (JSON allows a parser to): the
    message is inspected, so a server that skips it too acts on what was tagged."""
    reading = read_message(b'\xef\xbb\xbf{"customer_id": 9999}', True)
    assert reading.is_json and reading.value == {"customer_id": 9999}


def test_read_json_refuses_a_lenient_reading() -> None:
    value, error = read_json(b'{"a": "\xff"}')
    assert value is None and error is not None


def test_mcp_requests_and_batches() -> None:
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "t"}}
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    answer = {"jsonrpc": "2.0", "id": "s1", "result": {}}
    assert [r.method for r in mcp_requests(call) or []] == ["tools/call"]
    assert [r.method for r in mcp_requests([call, note, answer]) or []] == [
        "tools/call",
        "notifications/initialized",
    ]
    assert mcp_requests(answer) == []  # a response to the server: protocol


@pytest.mark.parametrize(
    "value",
    [
        {"jsonrpc": "2.0", "method": "ping", "customer_id": 9999},  # a member JSON-RPC lacks
        {"jsonrpc": "2.0", "id": 1, "method": "delete_customer", "params": {"id": 9999}},
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": ["t", {}]},
        [{"jsonrpc": "2.0", "id": 1, "method": "ping"}, {"customer_id": 9999}],
        {"jsonrpc": "1.0", "id": 1, "method": "tools/call"},
        [],
        {"customer_id": 9999},
    ],
)
def test_anything_else_is_not_mcp(value: object) -> None:
    assert mcp_requests(value) is None


@pytest.mark.parametrize("value", ["websocket", "WebSocket", "h2c, WebSocket", " websocket "])
def test_an_upgrade_naming_websocket_among_others_is_a_websocket_upgrade(value: str) -> None:
    # mitmproxy relays messages whenever the server's 101 says websocket, whatever
    # the client's header said; the upgrade is tagged as what it may open.
    req = HttpRequest(method="GET", host="ws.acme.test", path="/ws", headers={"upgrade": value})
    call, _ = extract_http(req)
    assert call.tool == "websocket" and default_stage(call) == "act"


def test_an_upgrade_to_something_else_is_not() -> None:
    req = HttpRequest(method="GET", host="ws.acme.test", path="/", headers={"upgrade": "h2c"})
    assert extract_http(req)[0].tool == "http"


def test_every_request_an_mcp_sdk_client_sends_is_mcp() -> None:
    """The official SDK's client request types: none of them is taken for a
    websocket call (a client would get its protocol messages tagged)."""
    import typing

    import mcp.types

    from offscope.proxy.extract.mcp import MCP_CLIENT_METHODS

    union = mcp.types.ClientRequest.model_fields["root"].annotation
    sdk = {typing.get_args(m.model_fields["method"].annotation)[0] for m in typing.get_args(union)}
    assert sdk <= MCP_CLIENT_METHODS, sdk - MCP_CLIENT_METHODS
