"""An MCP tool call that becomes a task, with real TypeScript SDK peers (its own server
and client processes, tests/node): the call is tagged and decided when it is made, and
its result, fetched later with tasks/result, is joined to it in the trace (same call,
no new step, counted once)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.mcp2026.test_stateless_mcp import LEDGER  # the tickets world: T-1 in scope
from tests.support.sidecar_kit import events, of_type, report_json

REPO = Path(__file__).resolve().parents[2]
NODE_DIR = REPO / "tests" / "node"

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        not shutil.which("node") or not (NODE_DIR / "node_modules" / "undici").is_dir(),
        reason="node peers not installed (npm ci --prefix tests/node; .ci/run does)",
    ),
]


@pytest.fixture
def task_server(tmp_path: Path):
    received = tmp_path / "received.jsonl"
    proc = subprocess.Popen(
        ["node", "task_server.mjs", str(received)],
        cwd=NODE_DIR,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("PORT "), line
        yield int(line.split()[1]), received
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def _call_as_task(proxy_url: str, ticket: str) -> list[dict]:
    import asyncio

    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env["HTTP_PROXY"] = env["http_proxy"] = proxy_url
    proc = await asyncio.create_subprocess_exec(
        "node",
        "task_client.mjs",
        "http://tickets.acme.test/mcp",
        ticket,
        cwd=NODE_DIR,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return [json.loads(line) for line in out.decode().splitlines()]


async def test_a_task_is_one_call_decided_when_made_and_joined_to_its_result(
    embedded, task_server, tmp_path: Path
):
    port, received = task_server
    ledger = tmp_path / "tasks-ledger.yaml"
    ledger.write_text(LEDGER, encoding="utf-8")
    async with embedded(
        policy="enforce", ledger=str(ledger), routes=f"tickets.acme.test=127.0.0.1:{port}"
    ) as e:
        made = await _call_as_task(e.url("run-task"), "T-1")
        other = await _call_as_task(e.url("run-task-oos"), "T-9")
        trace = events(e.trace)

    assert made[0]["type"] == "taskCreated" and made[-1]["type"] == "result"
    assert made[-1]["result"]["content"][0]["text"] == "exported T-1: 3 events"
    task_id = made[0]["task"]
    # An export of an out-of-scope ticket is investigation: allowed under enforce
    # (block_at: act), tagged out of scope when made, and its result joined to it.
    assert other[-1]["result"]["content"][0]["text"] == "exported T-9: 3 events"
    bodies = [
        json.loads(r["body"])
        for r in map(json.loads, received.read_text().splitlines())
        if r["body"]
    ]
    calls = [
        b["params"]["arguments"]["ticket_id"] for b in bodies if b.get("method") == "tools/call"
    ]
    assert calls == ["T-1", "T-9"]
    # In the trace: the call when made (a step), its result joined to it (no step).
    task_calls = [c for c in of_type(trace, "tool_call") if c["run"] == "run-task"]
    made_record, result_record = task_calls
    assert (made_record["step"], made_record["decision"]) == (1, "allow")
    assert any(f"became task {task_id}" in note for note in made_record["call"]["notes"])
    assert result_record.get("step") is None and result_record["continues"] == 1
    assert "exported T-1: 3 events" in result_record["response_excerpt"]
    assert any(task_id in note for note in result_record["call"]["notes"])
    runs = {r["run"]: r for r in report_json(e.trace)["runs"]}
    assert runs["run-task"]["calls"] == 1  # one logical call
    oos = [c for c in of_type(trace, "tool_call") if c["run"] == "run-task-oos"]
    assert [(c.get("step"), c["call"]["scope"], c["call"]["stage"]) for c in oos] == [
        (1, "out", "investigate"),
        (None, "out", "investigate"),
    ]
    assert (runs["run-task-oos"]["calls"], runs["run-task-oos"]["oos_calls"]) == (1, 1)
