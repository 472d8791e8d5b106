"""The 2026-07-28 revision's header mirrors, read without sockets."""

from __future__ import annotations

import base64

from offscope.proxy.extract.mcp_wire2026 import (
    decode_header_value,
    header_params,
    header_readings,
    is_modern,
)

META = {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}
CALL = {"name": "get_ticket", "arguments": {"ticket_id": "T-1", "where": {"queue": "ops"}}}
AGREE = {"mcp-method": "tools/call", "mcp-name": "get_ticket"}


def test_the_revision_is_read_from_the_envelope_then_the_header() -> None:
    assert is_modern(META, {})
    assert is_modern({}, {"mcp-protocol-version": "2027-01-01"})
    assert not is_modern({}, {"mcp-protocol-version": "2025-11-25"})
    assert not is_modern({"_meta": {}}, {})
    # The envelope wins over the header: the body is what the server runs.
    assert not is_modern(
        {"_meta": {"io.modelcontextprotocol/protocolVersion": "2025-06-18"}},
        {"mcp-protocol-version": "2026-07-28"},
    )


def test_headers_that_mirror_the_body_give_no_other_reading() -> None:
    assert header_readings("tools/call", CALL, AGREE) == []
    assert header_readings("tools/call", CALL, {}) == []  # a 2025 client sends none


def test_a_name_header_that_disagrees_is_read_as_that_tool() -> None:
    (reading,) = header_readings("tools/call", CALL, {**AGREE, "mcp-name": "delete_ticket"})
    assert reading.method == "tools/call" and reading.params["name"] == "delete_ticket"
    assert reading.params["arguments"] == CALL["arguments"]
    encoded = "=?base64?" + base64.b64encode(b"delete_ticket").decode() + "?="
    (reading,) = header_readings("tools/call", CALL, {**AGREE, "mcp-name": encoded})
    assert reading.params["name"] == "delete_ticket"


def test_a_method_header_that_disagrees_is_another_reading() -> None:
    readings = header_readings("tools/list", {}, {"mcp-method": "tools/call", "mcp-name": "x"})
    assert [r.method for r in readings] == ["tools/call", "tools/call"]
    assert readings[1].params == {"name": "x"}


def test_a_mirrored_argument_that_disagrees_is_read_with_the_headers_value() -> None:
    mirrored = {"mcp-param-ticket": ("ticket_id",), "mcp-param-queue": ("where", "queue")}
    agree = {**AGREE, "mcp-param-ticket": "T-1", "mcp-param-queue": "ops"}
    assert header_readings("tools/call", CALL, agree, mirrored) == []
    (reading,) = header_readings(
        "tools/call", CALL, {**agree, "mcp-param-queue": "billing"}, mirrored
    )
    assert reading.params["arguments"] == {"ticket_id": "T-1", "where": {"queue": "billing"}}
    # A header whose argument the body does not carry is a reading of its own.
    (reading,) = header_readings(
        "tools/call", {"name": "get_ticket", "arguments": {}}, {"mcp-param-ticket": "T-9"}, mirrored
    )
    assert reading.params["arguments"] == {"ticket_id": "T-9"}


def test_header_params_come_from_the_input_schema() -> None:
    schema = {
        "type": "object",
        "properties": {
            "ticket_id": {"type": "string", "x-mcp-header": "Ticket"},
            "where": {"type": "object", "properties": {"queue": {"x-mcp-header": "Queue"}}},
            "note": {"type": "string"},
        },
    }
    assert header_params(schema) == {
        "mcp-param-ticket": ("ticket_id",),
        "mcp-param-queue": ("where", "queue"),
    }
    assert header_params(None) == {} and header_params({"x-mcp-header": "Root"}) == {}


def test_a_malformed_base64_value_matches_nothing() -> None:
    assert decode_header_value("=?base64?!!!?=") is None
    assert decode_header_value("plain") == "plain"
