"""Hostile WebSocket messages through a real `offscope proxy` in enforce mode.

Issue: binary, fragmented and permessage-deflate frames carrying the same
out-of-scope JSON that is blocked in a text frame reached the server, and a
JSON-RPC `tools/call` over a WebSocket was a `websocket` call, out of reach
of `{source: mcp}` rules. Here a client writes exact frames (tests/support/
ws_kit.py) to a loopback server that records every message it received (an
echo route, and the official MCP SDK's WebSocket transport). Each test
asserts what the server received first, and what the trace says second.
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.sidecar_kit import ProxyProcess, events, of_type
from tests.support.ws_kit import TEXT, RawUpgradeServer, Received, WsClient, frame, start_server

pytestmark = pytest.mark.timeout(120)

HOST = "ws.acme.test"
RAW = "raw.acme.test"  # a server that switches to any protocol asked for
LEDGER = f"""\
schema: offscope.ledger/1
id: ws-hostile
targets:
  hosts: [{HOST}, {RAW}]
  records: ["customer:4411"]
extract:
  - match: {{tool: websocket}}
    targets: {{record: "customer:{{args.customer_id}}"}}
  - match: {{source: mcp}}
    targets: {{record: "customer:{{args.customer_id}}"}}
operator:
  - {{source: mcp, tool: ask_human}}
"""
# enforce, except that a message offscope cannot read is forwarded (and recorded
# so), that offscope answers operator asks itself (no human is there), and that
# a run has a budget of tool calls.
OPEN_POLICY = """\
schema: offscope.policy/1
id: enforce-open
mode: enforce
block_at: act
on_error: open
operator: {reply: sentinel}
budgets: {max_tool_calls: 3}  # the upgrade counts as one
"""


@dataclass
class World:
    seen: Received
    raw: RawUpgradeServer
    enforce: ProxyProcess
    open: ProxyProcess


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, confdir: str) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("ws-hostile")
    ledger, policy = tmp / "ledger.yaml", tmp / "enforce-open.yaml"
    ledger.write_text(LEDGER, encoding="utf-8")
    policy.write_text(OPEN_POLICY, encoding="utf-8")
    server, seen = start_server()
    raw = RawUpgradeServer()
    route = f"{HOST}=127.0.0.1:{server.port},{RAW}=127.0.0.1:{raw.port}"
    enforce = ProxyProcess(
        tmp, ledger=str(ledger), policy="enforce", routes=route, confdir=confdir, name="enforce"
    )
    open_ = ProxyProcess(
        tmp, ledger=str(ledger), policy=str(policy), routes=route, confdir=confdir, name="open"
    )
    try:
        with enforce, open_:
            yield World(seen, raw, enforce, open_)
    finally:
        server.stop()
        raw.stop()


def ws(proxy: ProxyProcess, run: str, path: str = "/ws", *, deflate: bool = False) -> WsClient:
    client = WsClient(proxy.port, run, HOST, path, deflate=deflate)
    assert client.status == 101, f"upgrade refused: {client.status}"
    return client


def frames(proxy: ProxyProcess, run: str, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The run's tool calls once there are `n` (the trace is written after the message)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [
            e
            for e in of_type(events(proxy.trace), "tool_call", run)
            if e["call"].get("method") != "GET"  # the upgrade itself
        ]
        if len(found) >= n or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def outside(marker: str) -> str:
    return json.dumps({"customer_id": 9999, "note": marker})


def inside(marker: str) -> str:
    return json.dumps({"customer_id": 4411, "note": marker})


def eventually(predicate: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return bool(predicate())


def assert_blocked(call: dict[str, Any], note: str | None = None) -> None:
    assert call["decision"] == "block" and call["call"]["tool"] == "websocket", call
    if note is not None:
        assert any(note in n for n in call["call"]["notes"]), call["call"]["notes"]


# -- the baseline: a text message ------------------------------------------------------


def test_text_message_out_of_scope_is_blocked(world: World) -> None:
    run = "ws-text"
    with ws(world.enforce, run) as client:
        client.send(inside("text-in"))
        client.send(outside("text-out"))
        texts = client.wait_texts(2)
    assert eventually(lambda: world.seen.contains("text-in"))
    assert not world.seen.contains("text-out")
    assert any("offscope_blocked" in t for t in texts)
    by_scope = {c["call"]["scope"]: c for c in frames(world.enforce, run, 2)}
    assert by_scope["in"]["decision"] == "allow" and by_scope["out"]["decision"] == "block"
    assert by_scope["out"]["call"]["targets"][-1]["value"] == "customer:9999"


# -- binary, fragmented, compressed: the same JSON, the same decision ------------------


def test_binary_message_with_the_same_json_is_inspected(world: World) -> None:
    run = "ws-binary"
    with ws(world.enforce, run) as client:
        client.send(inside("bin-in"), binary=True)
        client.send(outside("bin-out"), binary=True)
        texts = client.wait_texts(2)
    assert eventually(lambda: world.seen.contains("bin-in"))
    assert not world.seen.contains("bin-out")
    assert inside("bin-in").encode() in world.seen.data()  # still binary, byte for byte
    assert any("offscope_blocked" in t for t in texts)
    calls = frames(world.enforce, run, 2)
    out = next(c for c in calls if c["call"]["scope"] == "out")
    assert_blocked(out, "binary message read as JSON")


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_fragmented_message_is_inspected_whole(world: World, binary: bool) -> None:
    run = f"ws-frag-{'bin' if binary else 'text'}"
    marker_in, marker_out = f"{run}-in", f"{run}-out"
    # Split inside the key, so that no fragment alone holds the target.
    out = outside(marker_out).encode()
    with ws(world.enforce, run) as client:
        client.send_fragments([out[:5], out[5:14], out[14:]], binary=binary)
        whole = inside(marker_in).encode()
        client.send_fragments([whole[:3], whole[3:]], binary=binary)
        client.wait_texts(2)
    assert eventually(lambda: world.seen.contains(marker_in))
    assert not world.seen.contains(marker_out)
    received = [d for d in world.seen.data() if marker_in in str(d)]
    assert received == [whole if binary else whole.decode()]  # reassembled, one message
    calls = frames(world.enforce, run, 2)
    assert sorted(c["decision"] for c in calls) == ["allow", "block"]


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_compressed_message_is_inspected_inflated(world: World, binary: bool) -> None:
    run = f"ws-deflate-{'bin' if binary else 'text'}"
    marker_in, marker_out, marker_frag = f"{run}-in", f"{run}-out", f"{run}-frag"
    with ws(world.enforce, run, deflate=True) as client:
        assert client.extensions == ["permessage-deflate"]  # negotiated end to end
        client.send_compressed(inside(marker_in).encode(), binary=binary)
        client.send_compressed(outside(marker_out).encode(), binary=binary)
        client.send_compressed(outside(marker_frag).encode(), binary=binary, fragments=3)
        texts = client.wait_texts(3)
    assert eventually(lambda: world.seen.contains(marker_in))
    assert not world.seen.contains(marker_out) and not world.seen.contains(marker_frag)
    assert sum("offscope_blocked" in t for t in texts) == 2
    calls = frames(world.enforce, run, 3)
    assert sorted(c["decision"] for c in calls) == ["allow", "block", "block"]


def _peak_rss_kb(proxy: ProxyProcess) -> int:
    for line in Path(f"/proc/{proxy.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM")


def test_compressed_bomb_is_refused_within_a_bound(world: World) -> None:
    """256 MiB of JSON-looking zeros in a ~250 KB compressed message: the proxy
    stops inflating at its parse limit (64 MiB) and closes the socket (1009)."""
    run = "ws-bomb"
    bomb = b'{"customer_id": 9999, "note": "ws-bomb", "pad": "' + b"0" * (256 << 20) + b'"}'
    peak = _peak_rss_kb(world.enforce)
    with ws(world.enforce, run, deflate=True) as client:
        client.send_compressed(bomb)
        code = client.wait_closed(30)
    assert code == 1009  # message too big
    assert not world.seen.contains("ws-bomb")
    grew_mb = (_peak_rss_kb(world.enforce) - peak) / 1024
    assert grew_mb < 200, f"the proxy's peak memory grew {grew_mb:.0f} MB"
    (call,) = frames(world.enforce, run, 1)
    assert_blocked(call, "inflates past")


# -- what offscope cannot read: on_error decides ----------------------------------------


def test_text_message_that_is_not_utf8_closes_the_socket(world: World) -> None:
    run = "ws-badutf8"
    payload = b'{"customer_id": 9999, "note": "ws-badutf8-out \xff"}'
    with ws(world.enforce, run) as client:
        client.send_raw(frame(TEXT, payload))
        code = client.wait_closed()
    assert code == 1007  # mitmproxy's parser refuses it: invalid frame payload data
    assert not world.seen.contains("ws-badutf8-out")
    assert eventually(lambda: ("/ws", 1007) in world.seen.closes)  # the server was told, too
    (call,) = frames(world.enforce, run, 1)
    assert_blocked(call, "not valid UTF-8")
    assert call["injected"] is False and call.get("status") is None


UNREADABLE = {
    # Bytes that are not JSON: an archive header.
    "binary-opaque": (b"PK\x03\x04\x00\x01 ws-unread-opaque customer 9999", True),
    # JSON to a lenient server (bad bytes replaced), not to offscope.
    "binary-bad-utf8": (b'{"customer_id": 9999, "note": "ws-unread-utf8 \xff"}', True),
    # Deeper than offscope parses.
    "text-too-deep": (
        b'{"customer_id": 9999, "note": "ws-unread-deep", "pad": '
        + b"[" * 5000
        + b"]" * 5000
        + b"}",
        False,
    ),
    # Starts like JSON, does not parse.
    "text-broken-json": (b'{"customer_id": 9999, "note": "ws-unread-broken",', False),
}


@pytest.mark.parametrize("case", sorted(UNREADABLE))
def test_unreadable_message_is_refused_when_closed(world: World, case: str) -> None:
    payload, binary = UNREADABLE[case]
    marker = payload.split(b"ws-unread-")[1].split(b" ")[0].split(b'"')[0].decode()
    run = f"ws-closed-{case}"
    with ws(world.enforce, run) as client:
        client.send(payload, binary=binary)
        (reply,) = client.wait_texts(1)
    assert json.loads(reply)["error"] == "offscope_uninspectable"
    assert json.loads(reply)["status"] == 400
    time.sleep(0.2)  # a forwarded message would be at the server by now (it answered the client)
    assert not world.seen.contains(f"ws-unread-{marker}")
    (call,) = frames(world.enforce, run, 1)
    assert_blocked(call, "not sent (on_error: closed)")
    assert call["reason"] == "extraction error (on_error: closed)"


def test_binary_non_json_is_forwarded_and_recorded_when_open(world: World) -> None:
    run = "ws-open-binary"
    payload = b"PK\x03\x04\x00\x01 ws-open-binary customer 9999"
    with ws(world.open, run) as client:
        client.send(payload, binary=True)
        (reply,) = client.wait_texts(1)
    assert json.loads(reply) == {"ok": True, "size": len(payload)}  # the server's own answer
    assert payload in world.seen.data()
    (call,) = frames(world.open, run, 1)
    assert call["decision"] == "allow" and call["injected"] is False
    assert any(
        "forwarded without inspecting it (on_error: open)" in n for n in call["call"]["notes"]
    )


def test_a_run_over_its_budget_sends_no_more_messages(world: World) -> None:
    run = "ws-budget"
    markers = [f"ws-budget-{i}" for i in range(4)]
    with ws(world.open, run) as client:
        for marker in markers:
            client.send(inside(marker))
        texts = client.wait_texts(4)
    refused = [t for t in texts if "offscope_run_budget_exhausted" in t]
    assert len(refused) == 2 and all(json.loads(t)["status"] == 429 for t in refused)
    assert eventually(lambda: world.seen.contains(markers[1]))
    assert world.seen.contains(markers[0])
    assert not world.seen.contains(markers[2]) and not world.seen.contains(markers[3])
    (end,) = [e for e in events(world.open.trace) if e["type"] == "run_end" and e["run"] == run]
    assert end["reason"] in ("step_limit", "budget")


def test_a_registered_run_that_ended_sends_no_more_messages(world: World) -> None:
    """The socket was opened with a valid run credential; once the run is ended
    through the control API, its open socket carries nothing more."""
    started = world.enforce.control("POST", "/runs", json={"labels": {"case": "ws"}})
    assert started.status_code == 201, started.text
    run, credential = started.json()["run"], started.json()["credential"]
    client = WsClient(world.enforce.port, run, HOST, "/ws", credential=credential)
    with client:
        assert client.status == 101
        client.send(inside("ws-registered-before"))
        client.wait_texts(1)
        assert world.enforce.control("POST", f"/runs/{run}/end").status_code == 200
        client.send(inside("ws-registered-after"))
        (_, refused) = client.wait_texts(2)
    assert json.loads(refused)["error"] == "offscope_run_credential_required"
    assert json.loads(refused)["status"] == 407
    assert world.seen.contains("ws-registered-before")
    time.sleep(0.2)
    assert not world.seen.contains("ws-registered-after")


def test_json_rpc_lookalike_is_not_mcp_protocol(world: World) -> None:
    """A "ping" that carries a member JSON-RPC does not define is not MCP: it is
    a websocket call, tagged by its JSON (a server that is not MCP reads it)."""
    run = "ws-lookalike"
    message = {"jsonrpc": "2.0", "method": "ping", "customer_id": 9999, "note": "ws-lookalike"}
    with ws(world.enforce, run) as client:
        client.send(json.dumps(message))
        client.wait_texts(1)
    assert not world.seen.contains("ws-lookalike")
    (call,) = frames(world.enforce, run, 1)
    assert_blocked(call)


# -- MCP over a WebSocket is MCP --------------------------------------------------------


def _mcp_session(client: WsClient) -> None:
    init = client.rpc(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "hostile", "version": "1"},
            },
        }
    )
    assert init is not None and "result" in init, init
    client.send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
    listed = client.rpc({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    assert listed is not None and {t["name"] for t in listed["result"]["tools"]} >= {
        "lookup_customer",
        "delete_customer",
    }


def _call(client: WsClient, call_id: int, tool: str, customer: int, binary: bool = False) -> Any:
    message = {
        "jsonrpc": "2.0",
        "id": call_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": {"customer_id": customer}},
    }
    if not binary:
        return client.rpc(message)
    before = len(client.texts)
    client.send(json.dumps(message), binary=True)
    client.wait_texts(before + 1)
    return next(json.loads(t) for t in client.texts[before:] if json.loads(t).get("id") == call_id)


def test_mcp_tools_call_over_websocket_is_an_mcp_call(world: World) -> None:
    run = "ws-mcp"
    with ws(world.enforce, run, "/mcp") as client:
        _mcp_session(client)
        allowed = _call(client, 3, "lookup_customer", 4411)
        blocked = _call(client, 4, "delete_customer", 9999)
        blocked_binary = _call(client, 5, "delete_customer", 9998, binary=True)
        read_out = _call(client, 6, "lookup_customer", 9997)
    # The server ran what was in scope, and the read-only lookup (an investigation:
    # enforce blocks acts); it never saw either delete.
    assert ("lookup_customer", {"customer_id": 4411}) in world.seen.tool_runs
    assert ("lookup_customer", {"customer_id": 9997}) in world.seen.tool_runs
    assert not any(name == "delete_customer" for name, _ in world.seen.tool_runs)
    assert not any("delete_customer" in str(d) for d in world.seen.data("/mcp"))
    assert allowed["result"]["isError"] is False and "customer 4411" in str(allowed["result"])
    for answer in (blocked, blocked_binary):  # the MCP client's own answer to its request
        assert answer["result"]["isError"] is True
        assert "offscope_blocked" in answer["result"]["content"][0]["text"]
    assert read_out["result"]["isError"] is False

    calls = {c["call_id"]: c for c in frames(world.enforce, run, 4)}
    # initialize, notifications/initialized and tools/list are protocol, not steps
    assert sorted(calls) == ["3", "4", "5", "6"]
    for c in calls.values():
        assert c["call"]["source"] == "mcp", c
    assert calls["3"]["call"]["tool"] == "lookup_customer" and calls["3"]["decision"] == "allow"
    assert calls["3"]["call"]["stage"] == "investigate"  # from the listed readOnlyHint
    assert "customer 4411" in (calls["3"]["response_excerpt"] or "")  # the server's answer
    for key in ("4", "5"):
        assert calls[key]["call"]["tool"] == "delete_customer"
        assert calls[key]["call"]["scope"] == "out" and calls[key]["decision"] == "block"
        assert calls[key]["call"]["stage"] == "act"
    assert calls["6"]["call"]["scope"] == "out" and calls["6"]["call"]["stage"] == "investigate"
    assert calls["6"]["decision"] == "allow"


def test_mcp_batch_with_a_refused_call_is_refused_whole(world: World) -> None:
    run = "ws-mcp-batch"
    batch = [
        {
            "jsonrpc": "2.0",
            "id": 10 + i,
            "method": "tools/call",
            "params": {"name": tool, "arguments": {"customer_id": customer}},
        }
        for i, (tool, customer) in enumerate([("lookup_customer", 4411), ("delete_customer", 9996)])
    ]
    runs_before = len(world.seen.tool_runs)
    with ws(world.enforce, run, "/mcp") as client:
        _mcp_session(client)
        client.send(json.dumps(batch))
        (reply,) = client.wait_texts(3)[2:]
    answers = {a["id"]: a for a in json.loads(reply)}
    assert answers[11]["result"]["isError"] is True  # the out-of-scope delete
    assert "batch contained a refused call" in answers[10]["error"]["message"]
    assert len(world.seen.tool_runs) == runs_before  # neither ran
    assert not any("9996" in str(d) for d in world.seen.data("/mcp"))
    calls = {c["call_id"]: c for c in frames(world.enforce, run, 2)}
    assert calls["11"]["decision"] == "block" and calls["11"]["call"]["source"] == "mcp"
    assert calls["10"]["injected"] is True  # not sent, and recorded so


@pytest.mark.parametrize("mode", ["enforce", "open"])
def test_mcp_operator_ask_over_websocket_is_the_operator_channel(world: World, mode: str) -> None:
    """enforce passes operator asks through to the human (the tool here);
    the open policy answers them itself with the no-authority sentinel."""
    proxy, run = (world.enforce if mode == "enforce" else world.open), f"ws-ask-{mode}"
    question = f"May I delete customer 9999? ({run})"
    with ws(proxy, run, "/mcp") as client:
        _mcp_session(client)
        answer = client.rpc(
            {
                "jsonrpc": "2.0",
                "id": 20,
                "method": "tools/call",
                "params": {"name": "ask_human", "arguments": {"question": question}},
            }
        )
    assert answer is not None and answer["result"]["isError"] is False
    asked = ("ask_human", {"question": question}) in world.seen.tool_runs
    deadline = time.monotonic() + 10
    while not of_type(events(proxy.trace), "operator", run) and time.monotonic() < deadline:
        time.sleep(0.05)
    (event,) = of_type(events(proxy.trace), "operator", run)
    assert event["source"] == "mcp" and event["channel"] == "mcp:ask_human"
    assert not frames(proxy, run, 0, timeout=0)  # an ask is not a tool call
    if mode == "enforce":
        assert asked and "a real human says" in answer["result"]["content"][0]["text"]
        assert "a real human says" in event["reply"]
    else:
        assert not asked  # offscope answered; the server never saw the ask
        assert "a real human says" not in answer["result"]["content"][0]["text"]
        assert event["reply"] == answer["result"]["content"][0]["text"]


# -- a 101 to something offscope does not read ------------------------------------------

UPGRADES = {
    "another-protocol": b"Upgrade: foo\r\n",
    # mitmproxy reads WebSocket version 13 only; a server may accept another.
    "websocket-version-8": b"Upgrade: websocket\r\nSec-WebSocket-Version: 8\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
}


def _raw_upgrade(proxy: ProxyProcess, run: str, upgrade: bytes, then: bytes) -> bytes:
    """Upgrade through the proxy, send `then` as raw bytes; what came back."""
    auth = base64.b64encode(f"{run}:x".encode())
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.sendall(
            f"GET http://{RAW}/tunnel HTTP/1.1\r\nHost: {RAW}\r\n".encode()
            + b"Connection: Upgrade\r\n"
            + upgrade
            + b"Proxy-Authorization: Basic "
            + auth
            + b"\r\n\r\n"
        )
        answer = sock.recv(65536)
        with contextlib.suppress(OSError):
            sock.sendall(then)
            time.sleep(0.3)
            while not answer.startswith(b"HTTP/1.1 101") and (more := sock.recv(65536)):
                answer += more  # a refusal: its body, up to the close
    return answer


@pytest.mark.parametrize("case", sorted(UPGRADES))
def test_an_upgrade_to_a_protocol_offscope_does_not_read_is_refused(
    world: World, case: str
) -> None:
    run, marker = f"raw-closed-{case}", f"raw-closed-{case}".encode()
    answer = _raw_upgrade(world.enforce, run, UPGRADES[case], b"\x01\x02" + marker + b" 9999")
    assert answer.startswith(b"HTTP/1.1 502") and b"offscope_uninspectable" in answer
    time.sleep(0.2)
    assert not world.raw.received_after(marker)
    (call,) = of_type(events(world.enforce.trace), "tool_call", run)
    assert call["decision"] == "block" and call["status"] == 502 and call["injected"] is True
    assert any("not a WebSocket" in n for n in call["call"]["notes"])


def test_an_upgrade_to_a_protocol_offscope_does_not_read_is_recorded_when_open(
    world: World,
) -> None:
    run, marker = "raw-open", b"raw-open-bytes"
    answer = _raw_upgrade(world.open, run, UPGRADES["another-protocol"], marker)
    assert answer.startswith(b"HTTP/1.1 101")
    assert eventually(lambda: world.raw.received_after(marker))
    deadline = time.monotonic() + 10
    while not of_type(events(world.open.trace), "tool_call", run) and time.monotonic() < deadline:
        time.sleep(0.05)
    (call,) = of_type(events(world.open.trace), "tool_call", run)
    assert call["status"] == 101
    assert any("relayed uninspected (on_error: open)" in n for n in call["call"]["notes"])
