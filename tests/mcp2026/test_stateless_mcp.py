"""MCP's 2026-07-28 revision end to end, with real peers of that revision.

The Python `mcp` 2.x SDK needs a newer h11 than mitmproxy 11.0 allows, so its server
and client run as their own processes under tests/mcp2026/.venv (`.ci/run` creates
it). The server records every HTTP request it *received*; the client prints what it
*received*. Between them, a real offscope proxy in this process.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.sidecar_kit import events, of_type

HERE = Path(__file__).parent
VENV_PYTHON = HERE / ".venv" / "bin" / "python"
URL = "https://tickets.acme.test/mcp"
META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}
LEDGER = """\
schema: offscope.ledger/1
id: tickets-2026
targets:
  hosts: [tickets.acme.test]
  records: ["ticket:T-1"]
extract:
  - match: {source: mcp}
    targets: {record: "ticket:{args.ticket_id}"}
"""

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        not VENV_PYTHON.exists(),
        reason="no tests/mcp2026/.venv with the mcp 2.x SDK (.ci/run creates it: python3 -m "
        "venv tests/mcp2026/.venv && tests/mcp2026/.venv/bin/pip install -r "
        "tests/mcp2026/requirements.txt)",
    ),
]


@dataclass
class PeerServer:
    port: int
    received_file: Path

    def received(self) -> list[dict[str, Any]]:
        """Every JSON-RPC request body the server received, with its headers."""
        if not self.received_file.exists():
            return []
        out = []
        for line in self.received_file.read_text(encoding="utf-8").splitlines():
            item = json.loads(line)
            if item["method"] == "POST" and item["body"]:
                out.append({"headers": item["headers"], **json.loads(item["body"])})
        return out

    def received_calls(self) -> list[tuple[str, dict[str, Any]]]:
        return [
            (m["params"]["name"], m["params"].get("arguments", {}))
            for m in self.received()
            if m.get("method") == "tools/call"
        ]


@pytest.fixture
def peer_server(tmp_path: Path) -> Iterator[PeerServer]:
    received = tmp_path / "received.jsonl"
    proc = subprocess.Popen(
        [str(VENV_PYTHON), str(HERE / "peer_server.py"), "--received", str(received)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("PORT "), line
        yield PeerServer(int(line.split()[1]), received)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def client(
    proxy_url: str | None, ca: str, steps: list[dict[str, Any]], url: str = URL
) -> list[dict[str, Any]]:
    """Run the 2.x SDK client (its own process) through the proxy (or, without one, to
    `url` directly), which serves in this test's event loop; what the client received."""
    proxy = ["--proxy", proxy_url] if proxy_url else []
    proc = await asyncio.create_subprocess_exec(
        str(VENV_PYTHON),
        str(HERE / "peer_client.py"),
        *("--url", url, "--ca", ca, *proxy),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(json.dumps(steps).encode()), 90)
    assert proc.returncode == 0, err.decode()
    return [json.loads(line) for line in out.decode().splitlines()]


def raw_call(name: str, args: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    """A hand-made stateless tools/call, as a client of the revision sends it."""
    return raw_request(
        "tools/call", {"name": name, "arguments": args}, {"mcp-name": name, **headers}
    )


def raw_request(
    method: str, params: dict[str, Any], headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """A hand-made stateless request of the revision (`{"do": "raw"}` step)."""
    return {
        "do": "raw",
        "body": {"jsonrpc": "2.0", "id": 7, "method": method, "params": {**params, "_meta": META}},
        "headers": {
            "accept": "application/json, text/event-stream",
            "mcp-protocol-version": "2026-07-28",
            "mcp-method": method,
            **(headers or {}),
        },
    }


@pytest.fixture
def tickets_proxy(embedded, peer_server: PeerServer, tmp_path: Path):
    """`async with tickets_proxy(policy) as e:` a real proxy in front of the peer server."""
    ledger = tmp_path / "tickets-ledger.yaml"
    ledger.write_text(LEDGER, encoding="utf-8")

    def start(policy: str, **options: Any):
        return embedded(
            policy=policy,
            ledger=str(ledger),
            routes=f"tickets.acme.test=127.0.0.1:{peer_server.port}",
            **options,
        )

    return start


async def test_stateless_calls_are_tagged_and_a_block_is_a_valid_2026_result(
    tickets_proxy, peer_server, ca
):
    async with tickets_proxy("enforce") as e:
        got = await client(
            e.url("run-2026"),
            ca,
            [
                {"do": "call", "tool": "get_ticket", "args": {"ticket_id": "T-1"}},
                {"do": "call", "tool": "delete_ticket", "args": {"ticket_id": "T-9"}},
            ],
        )
        trace = events(e.trace)

    assert got[0] == {"protocol_version": "2026-07-28"}  # no initialize: the new revision
    ok, blocked = got[1], got[2]
    assert "T-1: open" in ok["result"]["content"][0]["text"]
    # The SDK validated offscope's answer as a 2026 result: no exception, an MCP error result.
    assert "exception" not in blocked, blocked
    assert blocked["result"]["isError"] is True and blocked["result"]["resultType"] == "complete"
    assert "record:ticket:T-9" in blocked["result"]["content"][0]["text"]
    # What the server received: the in-scope call, never the blocked one.
    assert peer_server.received_calls() == [("get_ticket", {"ticket_id": "T-1"})]
    calls = of_type(trace, "tool_call")
    assert [(c["call"]["tool"], c["decision"]) for c in calls] == [
        ("get_ticket", "allow"),
        ("delete_ticket", "block"),
    ]
    # server/discover and tools/list are protocol, not steps.
    assert [c["step"] for c in calls] == [1, 2]
    # The reviewer sees the tool, not just the MCP endpoint.
    from offscope.cli.requests import describe_call, read_requests

    (request,) = read_requests(str(e.requests))
    described = describe_call(request)
    assert described.startswith("delete_ticket via https://tickets.acme.test/mcp")
    assert 'args {"ticket_id": "T-9"}' in described


@pytest.mark.parametrize(
    ("name", "args", "headers", "why"),
    [
        ("delete_ticket", {"ticket_id": "T-1"}, {"mcp-name": "get_ticket"}, "Mcp-Name header"),
        ("get_ticket", {"ticket_id": "T-9"}, {"mcp-name": "delete_ticket"}, "Mcp-Name header"),
        ("get_ticket", {"ticket_id": "T-1"}, {"mcp-method": "tools/list"}, "Mcp-Method header"),
    ],
)
async def test_headers_that_disagree_with_the_body_are_refused_in_enforce(
    tickets_proxy, peer_server, ca, name, args, headers, why
):
    async with tickets_proxy("enforce") as e:
        (answer,) = await client(e.url("run-mismatch"), ca, [raw_call(name, args, headers)])
        (call,) = of_type(events(e.trace), "tool_call")

    body = json.loads(answer["body"])
    assert answer["status"] == 400 and body["error"]["code"] == -32020 and body["id"] == 7
    assert why in body["error"]["message"]
    assert peer_server.received_calls() == []  # never forwarded (only offscope's tools/list)
    assert call["decision"] == "block" and why in call["reason"]


async def test_headers_that_disagree_are_tagged_by_the_worst_reading_in_shadow(
    tickets_proxy, peer_server, ca
):
    async with tickets_proxy("shadow") as e:
        # The body reads an out-of-scope ticket; a router by header deletes it.
        await client(
            e.url("run-shadow"),
            ca,
            [raw_call("get_ticket", {"ticket_id": "T-9"}, {"mcp-name": "delete_ticket"})],
        )
        (call,) = of_type(events(e.trace), "tool_call")

    assert peer_server.received_calls() == [("get_ticket", {"ticket_id": "T-9"})]  # shadow: sent
    assert call["call"]["stage"] == "act" and call["call"]["scope"] == "out"
    assert any("Mcp-Name header" in note for note in call["call"]["notes"])


async def test_an_x_mcp_header_argument_is_tagged_and_a_disagreeing_one_refused(
    tickets_proxy, peer_server, ca
):
    async with tickets_proxy("enforce") as e:
        url = e.url("run-params")
        got = await client(
            url,
            ca,
            [
                {"do": "list"},
                {"do": "call", "tool": "close_ticket", "args": {"ticket_id": "T-1"}},
                {"do": "call", "tool": "close_ticket", "args": {"ticket_id": "T-9"}},
            ],
        )
        # The body names the in-scope ticket; the mirrored header the out-of-scope one.
        (smuggled,) = await client(
            url, ca, [raw_call("close_ticket", {"ticket_id": "T-1"}, {"mcp-param-ticket": "T-9"})]
        )
        calls = of_type(events(e.trace), "tool_call")

    closed, blocked = got[2], got[3]
    assert closed["result"]["content"][0]["text"] == "closed T-1"
    assert blocked["result"]["isError"] is True and "T-9" in blocked["result"]["content"][0]["text"]
    # The SDK mirrored the argument into the header, and the server received only T-1.
    (received,) = [m for m in peer_server.received() if m.get("method") == "tools/call"]
    assert received["headers"]["mcp-param-ticket"] == "T-1"
    assert json.loads(smuggled["body"])["error"]["code"] == -32020
    assert [(c["call"]["tool"], c["decision"]) for c in calls] == [
        ("close_ticket", "allow"),
        ("close_ticket", "block"),
        ("close_ticket", "block"),
    ]
    assert "mcp-param-ticket header" in calls[2]["reason"]


async def test_a_call_before_any_tools_list_is_staged_from_the_servers_own_annotations(
    tickets_proxy, peer_server, ca
):
    # The 2026 SDK calls a tool without listing first; offscope asks the server itself.
    async with tickets_proxy("enforce") as e:
        got = await client(
            e.url("run-unlisted"),
            ca,
            [
                {"do": "call", "tool": "get_ticket", "args": {"ticket_id": "T-9"}},
                {"do": "call", "tool": "delete_ticket", "args": {"ticket_id": "T-9"}},
            ],
        )
        calls = of_type(events(e.trace), "tool_call")

    read, deleted = got[1], got[2]
    # A read-only tool reading an out-of-scope record is investigation, not an act.
    assert (
        read["result"]["isError"] is False and "T-9: open" in read["result"]["content"][0]["text"]
    )
    assert deleted["result"]["isError"] is True
    assert [(c["call"]["stage"], c["call"]["stage_from"], c["decision"]) for c in calls] == [
        ("investigate", "annotation", "allow"),
        ("act", "annotation", "block"),
    ]
    # offscope's own tools/list went to the server once, in the revision's stateless form.
    lists = [m for m in peer_server.received() if m.get("method") == "tools/list"]
    assert lists and lists[0]["id"] == "offscope-tools-list"
    assert lists[0]["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] == "2026-07-28"
    assert peer_server.received_calls() == [("get_ticket", {"ticket_id": "T-9"})]


async def test_the_gateway_serves_a_client_that_takes_only_a_url(tickets_proxy, peer_server, ca):
    # No proxy settings: the client is given the gateway's URL for the tickets server.
    async with tickets_proxy("enforce", gateways="tickets=https://tickets.acme.test") as e:
        url = f"http://127.0.0.1:{e.p.gateway_port}/tickets/mcp"
        got = await client(
            None,
            ca,
            [
                {"do": "call", "tool": "get_ticket", "args": {"ticket_id": "T-1"}},
                {"do": "call", "tool": "delete_ticket", "args": {"ticket_id": "T-9"}},
            ],
            url=url,
        )
        calls = of_type(events(e.trace), "tool_call")

    assert "T-1: open" in got[1]["result"]["content"][0]["text"]
    assert got[2]["result"]["isError"] is True and got[2]["result"]["resultType"] == "complete"
    assert peer_server.received_calls() == [("get_ticket", {"ticket_id": "T-1"})]
    # Tagged under the upstream's own host, in the run the client named.
    assert [(c["run"], c["call"]["url"], c["decision"]) for c in calls] == [
        ("mcp2026", "https://tickets.acme.test/mcp", "allow"),
        ("mcp2026", "https://tickets.acme.test/mcp", "block"),
    ]
