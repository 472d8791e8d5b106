"""`offscope mcp` between a client and a server of MCP's 2026-07-28 revision over stdio:
the `mcp` 2.x SDK's stdio client spawns `offscope mcp -- SERVER`, which spawns the
SDK's stdio server (all three their own processes). The server appends each tool call
it *ran* to a file; the client prints what it *received*."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.mcp2026.test_input_rounds import REOPEN, SENTINEL_POLICY
from tests.mcp2026.test_stateless_mcp import (  # noqa: F401  (pytestmark: the venv skip)
    HERE,
    LEDGER,
    VENV_PYTHON,
    client,
    pytestmark,
)
from tests.support.sidecar_kit import events, of_type


async def test_offscope_mcp_blocks_and_answers_the_2026_sdk_over_stdio(tmp_path: Path, ca):
    ledger, policy = tmp_path / "ledger.yaml", tmp_path / "policy.yaml"
    ledger.write_text(LEDGER, encoding="utf-8")
    policy.write_text(SENTINEL_POLICY, encoding="utf-8")
    trace, ran = tmp_path / "trace.jsonl", tmp_path / "ran.jsonl"
    command = [
        sys.executable,
        *("-m", "offscope.cli", "mcp", "--ledger", str(ledger), "--policy", str(policy)),
        *("--trace", str(trace), "--host", "tickets.acme.test", "--run", "stdio-2026"),
        *("--", str(VENV_PYTHON), str(HERE / "peer_server.py"), "--stdio"),
        *("--received", str(ran)),
    ]
    got = await client(
        None,
        ca,
        [
            {"do": "list"},
            {"do": "call", "tool": "get_ticket", "args": {"ticket_id": "T-1"}},
            {"do": "call", "tool": "delete_ticket", "args": {"ticket_id": "T-9"}},
            REOPEN,
        ],
        url="stdio:" + json.dumps(command),
    )

    assert got[0] == {"protocol_version": "2026-07-28"}
    read, blocked, elicited, reopened = got[2], got[3], got[4], got[5]
    assert "T-1: open" in read["result"]["content"][0]["text"]
    # The SDK validated offscope's block as a 2026 result: an MCP error result, no exception.
    assert "exception" not in blocked and blocked["result"]["isError"] is True
    assert "record:ticket:T-9" in blocked["result"]["content"][0]["text"]
    assert "Reopen ticket T-1" in elicited["elicited"]
    assert "the user answered decline" in reopened["result"]["content"][0]["text"]
    # What the server ran: never the blocked delete; the reopen with the sentinel's decline.
    ran_calls = [json.loads(line) for line in ran.read_text(encoding="utf-8").splitlines()]
    assert ran_calls == [
        {"tool": "get_ticket", "args": {"ticket_id": "T-1"}},
        {"tool": "reopen_ticket", "args": {"ticket_id": "T-1", "answer": "decline"}},
    ]
    trace_events = events(trace)
    calls = of_type(trace_events, "tool_call")
    assert [(c["call"]["tool"], c.get("step"), c["decision"]) for c in calls] == [
        ("get_ticket", 1, "allow"),
        ("delete_ticket", 2, "block"),
        ("reopen_ticket", 3, "allow"),
        ("reopen_ticket", None, "allow"),  # the retry with its answer: the same call
    ]
    (op,) = of_type(trace_events, "operator")
    assert (op["step"], op["policy"], op["provenance"]) == (4, "sentinel", "harness")
