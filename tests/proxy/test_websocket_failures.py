"""A WebSocket message whose handling raises is still decided by on_error and
recorded (the addon in-process, with mitmproxy's own test harness): an
exception out of the hook would let mitmproxy forward the message unchecked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.test import taddons, tflow
from mitmproxy.websocket import WebSocketMessage
from wsproto.frame_protocol import Opcode

from offscope.proxy.mitm.addon import OffscopeAddon

LEDGER = """\
schema: offscope.ledger/1
id: ws-failures
targets:
  hosts: [example.com]
  records: ["customer:4411"]
extract:
  - match: {tool: websocket}
    targets: {record: "customer:{args.customer_id}"}
"""


def _boom(*args, **kwargs):
    raise RuntimeError("frame reader exploded")


@pytest.mark.parametrize(("policy", "sent"), [("shadow", True), ("enforce", False)])
def test_a_failing_message_is_recorded_and_decided_by_on_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str, sent: bool
) -> None:
    ledger = tmp_path / "ledger.yaml"
    ledger.write_text(LEDGER, encoding="utf-8")
    trace = tmp_path / "trace.jsonl"
    addon = OffscopeAddon()
    with taddons.context(addon, Proxyserver()) as tctx:
        tctx.configure(
            addon, offscope_ledger=str(ledger), offscope_policy=policy, offscope_trace=str(trace)
        )
        assert addon.engine is not None
        flow = tflow.twebsocketflow(messages=False)
        response, flow.response = flow.response, None
        flow.request.headers["x-offscope-run"] = "r1"
        addon.request(flow)  # the upgrade: in scope, allowed
        flow.response = response
        monkeypatch.setattr(addon.engine, "frame", _boom)
        assert flow.websocket is not None
        message = WebSocketMessage(Opcode.TEXT, True, json.dumps({"customer_id": 4411}).encode())
        flow.websocket.messages.append(message)
        addon.websocket_message(flow)
        addon.engine.close()
    assert message.dropped is not sent
    calls = [e for e in map(json.loads, trace.read_text().splitlines()) if e["type"] == "tool_call"]
    failed = [c for c in calls if c["call"]["method"] == "WS"]
    assert len(failed) == 1, calls
    note = " ".join(failed[0]["call"]["notes"])
    assert "frame reader exploded" in note
    assert ("forwarded unchecked" in note) is sent
    assert (failed[0]["decision"] == "block") is (not sent)


def test_a_socket_whose_upgrade_offscope_did_not_see_fails_closed(tmp_path: Path) -> None:
    """No session for the socket (its upgrade was not seen through the request
    hook): nothing can be inspected, so enforce drops what the agent sends."""
    ledger = tmp_path / "ledger.yaml"
    ledger.write_text(LEDGER, encoding="utf-8")
    addon = OffscopeAddon()
    with taddons.context(addon, Proxyserver()) as tctx:
        tctx.configure(addon, offscope_ledger=str(ledger), offscope_policy="enforce")
        flow = tflow.twebsocketflow(messages=False)
        assert flow.websocket is not None
        message = WebSocketMessage(Opcode.BINARY, True, b"anything")
        flow.websocket.messages.append(message)
        addon.websocket_message(flow)
    assert message.dropped
