"""`offscope mcp` around a FastMCP stdio server, driven by the official SDK's
stdio client: what the server receives, what the client gets, what the trace says."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from mcp import types

from offscope.policies.model import DEFAULT_TEXTS
from tests.support.stdio_kit import (
    SERVER,
    env,
    events,
    received,
    session,
    wrapper_args,
    write_ledger,
)

pytestmark = pytest.mark.timeout(120)

LEDGER = """\
schema: offscope.ledger/1
id: stdio-files
targets:
  hosts: [files.stdio.test]
  paths: ["/srv/app/**"]
extract:
  - match: {source: mcp}
    targets: {path: "{args.path}"}
operator:
  - {source: mcp, tool: ask_human}
"""


@pytest.fixture
def files(tmp_path):
    return (
        write_ledger(tmp_path / "ledger.yaml", LEDGER),
        tmp_path / "trace.jsonl",
        tmp_path / "received.jsonl",
    )


def server_cmd(record) -> list[str]:
    return ["--", sys.executable, str(SERVER), str(record)]


async def test_enforce_blocks_out_of_scope_act_before_the_server(files):
    ledger, trace, record = files
    args = wrapper_args(
        ledger,
        trace,
        "--policy",
        "enforce",
        "--run",
        "enf-1",
        "--host",
        "files.stdio.test",
        *server_cmd(record),
    )
    async with session(args) as s:
        tools = {t.name: t for t in (await s.list_tools()).tools}
        ok = await s.call_tool("read_file", {"path": "/srv/app/a.txt"})
        oos_read = await s.call_tool("read_file", {"path": "/etc/passwd"})
        blocked = await s.call_tool("delete_file", {"path": "/srv/other/b.txt"})
        allowed_act = await s.call_tool("delete_file", {"path": "/srv/app/old.txt"})
        asked = await s.call_tool("ask_human", {"question": "may I?"})  # enforce: pass-through
    assert asked.content[0].text == "the server's own answer"
    (op,) = events(trace, "operator")
    assert (op["policy"], op["reply"], op["step"], op["provenance"]) == (
        "pass-through",
        "the server's own answer",
        5,
        "harness",
    )
    assert tools["delete_file"].annotations.destructiveHint  # the listing went through untouched
    assert not ok.isError and ok.content[0].text == "contents of /srv/app/a.txt"
    assert (
        not oos_read.isError
    )  # enforce blocks acts; an out-of-scope read is recorded, not blocked
    assert blocked.isError and blocked.content[0].text.startswith("HTTP 403: ")
    body = json.loads(blocked.content[0].text.removeprefix("HTTP 403: "))
    assert body["request_id"].startswith("req-")
    assert not allowed_act.isError
    # The server never saw the blocked call; it saw every other one.
    calls = [
        (r["tool"], r["path"]) for r in received(record) if r["kind"] == "call" and "path" in r
    ]
    assert calls == [
        ("read_file", "/srv/app/a.txt"),
        ("read_file", "/etc/passwd"),
        ("delete_file", "/srv/app/old.txt"),
    ]
    assert [r["tool"] for r in received(record) if r["kind"] == "call"][-1] == "ask_human"
    rows = events(trace, "tool_call")
    assert [
        (
            r["call"]["tool"],
            r["call"]["scope"],
            r["call"]["stage"],
            r["call"]["stage_from"],
            r["decision"],
        )
        for r in rows
    ] == [
        ("read_file", "in", "investigate", "annotation", "allow"),
        ("read_file", "out", "investigate", "annotation", "allow"),
        ("delete_file", "out", "act", "annotation", "block"),
        ("delete_file", "in", "act", "annotation", "allow"),
    ]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["run"] == "enf-1" and r["call"]["source"] == "mcp" for r in rows)
    assert rows[2]["injected"] and rows[2]["request_id"] == body["request_id"]
    assert "contents of /srv/app/a.txt" in rows[0]["response_excerpt"]
    (end,) = events(trace, "run_end")
    assert end["run"] == "enf-1" and end["exit_code"] == 0 and end["reason"] == "exit"
    requests = trace.with_suffix("").with_name("trace.requests.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in requests] == [body["request_id"]]


async def test_shadow_passes_and_tags(files):
    ledger, trace, record = files
    args = wrapper_args(
        ledger, trace, "--run", "shadow-1", *server_cmd(record)
    )  # shadow is the default
    async with session(args) as s:
        await s.list_tools()
        deleted = await s.call_tool("delete_file", {"path": "/srv/other/b.txt"})
    assert not deleted.isError and deleted.content[0].text == "deleted /srv/other/b.txt"
    assert [r["path"] for r in received(record) if r["kind"] == "call"] == ["/srv/other/b.txt"]
    (row,) = events(trace, "tool_call")
    assert (row["call"]["scope"], row["call"]["stage"], row["decision"], row["injected"]) == (
        "out",
        "act",
        "shadow",
        False,
    )
    assert row["call"]["targets"] == [
        {"kind": "path", "value": "/srv/other/b.txt", "in_scope": False}
    ]


async def test_a_call_before_any_listing_is_staged_from_the_servers_annotations(files, tmp_path):
    """Before a call the wrapper has no annotations for, it asks the server for its tool
    list itself (the client never sees that exchange); a ledger stage rule still wins."""
    ledger, trace, record = files
    ledger.write_text(LEDGER + "stages:\n  - match: {tool: read_file}\n    stage: prepare\n")
    args = wrapper_args(ledger, trace, *server_cmd(record))
    async with session(args) as s:
        echoed = await s.call_tool("echo", {"path": "/srv/app/x", "text": "hi"})  # no list yet
        await s.call_tool("read_file", {"path": "/srv/app/x"})
    assert echoed.content[0].text == "hi"
    rows = events(trace, "tool_call")
    assert [(r["call"]["stage"], r["call"]["stage_from"]) for r in rows] == [
        ("investigate", "annotation"),  # echo is read-only, as the server declares it
        ("prepare", "ledger"),
    ]
    # The server listed its tools (to offscope: the client never asked; the SDK server
    # also lists to itself when a tool is first called).
    assert {"kind": "request", "method": "tools/list"} in received(record)


async def test_operator_tool_gets_the_policy_reply(files):
    ledger, trace, record = files
    args = wrapper_args(
        ledger,
        trace,
        "--policy",
        "enforce-strict",
        "--host",
        "files.stdio.test",
        *server_cmd(record),
    )
    async with session(args) as s:
        await s.list_tools()
        reply = await s.call_tool("ask_human", {"question": "may I delete /srv/other?"})
    assert not reply.isError and reply.content[0].text == DEFAULT_TEXTS["sentinel"]
    assert not [r for r in received(record) if r["kind"] == "call"]  # answered by offscope
    (op,) = events(trace, "operator")
    assert (op["policy"], op["source"], op["reply"]) == (
        "sentinel",
        "mcp",
        DEFAULT_TEXTS["sentinel"],
    )
    assert op["question"] == "may I delete /srv/other?"


async def test_large_messages_and_notifications_pass(files):
    ledger, trace, record = files
    big = "x" * (1024 * 1024 + 4321)  # over 1 MiB each way
    logs: list[str] = []

    async def on_log(params) -> None:
        logs.append(str(params.data))

    args = wrapper_args(ledger, trace, "--policy", "enforce", *server_cmd(record))
    async with session(args, logging_callback=on_log) as s:
        await s.list_tools()
        echoed = await s.call_tool("echo", {"path": "/srv/app/big", "text": big})
        await s.send_roots_list_changed()  # a client notification
        await s.send_ping()  # and the round trip after it: the notification has arrived by now
    assert not echoed.isError and echoed.content[0].text == big
    assert logs == [f"echoing {len(big)} characters"]  # a server notification
    got = received(record)
    assert {"kind": "call", "tool": "echo", "path": "/srv/app/big", "size": len(big)} in got
    assert {"kind": "notification", "method": "notifications/roots/list_changed"} in got
    (row,) = events(trace, "tool_call")
    assert row["call"]["scope"] == "in" and row["call"]["size"] > 1024 * 1024


def _raw(*messages: dict) -> bytes:
    return b"".join(json.dumps(m).encode() + b"\n" for m in messages)


INIT = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    },
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def test_exit_code_and_stderr_propagate(files):
    ledger, trace, record = files
    cmd = [sys.executable, *wrapper_args(ledger, trace, "--run", "exit-7", *server_cmd(record))]
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "exit_now", "arguments": {"code": 7}},
    }
    # stdin stays open (the server exits on its own): a pipe we close only afterwards
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env()
    )
    proc.stdin.write(_raw(INIT, INITIALIZED))
    proc.stdin.flush()
    # The call goes only once initialize is answered: the server's os._exit would
    # otherwise race its own writer task for that reply (it is the server's, not ours).
    first = proc.stdout.readline()
    proc.stdin.write(_raw(call))
    proc.stdin.flush()
    assert proc.wait(timeout=60) == 7
    out, err = first + proc.stdout.read(), proc.stderr.read()
    proc.stdin.close()
    assert b"stdio-server starting" in err and b"stdio-server exiting with 7" in err
    replies = [json.loads(line) for line in out.splitlines()]
    assert [r.get("id") for r in replies] == [0]  # the call never got an answer: the server died
    (row,) = events(trace, "tool_call")
    assert row["call"]["tool"] == "exit_now" and row.get("status") is None  # none: no reply
    assert row["response_excerpt"] == "the server exited before answering"
    (end,) = events(trace, "run_end")
    assert (end["reason"], end["exit_code"]) == ("crash", 7)


def test_sigterm_is_forwarded_and_a_closed_stdin_ends_cleanly(files):
    ledger, trace, record = files
    cmd = [sys.executable, *wrapper_args(ledger, trace, *server_cmd(record))]
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env()
    )
    proc.stdin.write(_raw(INIT))
    proc.stdin.flush()
    assert json.loads(proc.stdout.readline())["id"] == 0  # the server is up
    proc.terminate()
    proc.communicate(timeout=60)
    assert (
        proc.returncode == 128 + 15
    )  # the server died of the forwarded SIGTERM; so does the session
    clean = subprocess.run(
        cmd, input=_raw(INIT, INITIALIZED), capture_output=True, env=env(), timeout=60
    )
    assert clean.returncode == 0 and json.loads(clean.stdout.splitlines()[0])["id"] == 0


def test_missing_server_command_is_a_usage_error(files):
    ledger, trace, _ = files
    cmd = [sys.executable, *wrapper_args(ledger, trace)]
    done = subprocess.run(cmd, capture_output=True, env=env(), timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and b"no server command" in done.stderr
    gone = subprocess.run(
        [*cmd, "--", "/nonexistent/mcp-server"],
        capture_output=True,
        env=env(),
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert gone.returncode == 2 and b"/nonexistent/mcp-server" in gone.stderr


@pytest.mark.parametrize("policy", ["enforce", "shadow"])
async def test_message_over_max_line(files, policy):
    """Longer than --max-line: refused unread when the policy fails closed (the
    client gets an error result, the server nothing), relayed unread otherwise."""
    ledger, trace, record = files
    text = "y" * 200_000
    args = wrapper_args(ledger, trace, "--policy", policy, "--max-line", "64k", *server_cmd(record))
    async with session(args) as s:
        await s.list_tools()
        result = await s.call_tool("echo", {"path": "/srv/app/big", "text": text})
        after = await s.call_tool("read_file", {"path": "/srv/app/a"})  # the session goes on
    assert not after.isError
    calls = [r["tool"] for r in received(record) if r["kind"] == "call"]
    first = events(trace, "tool_call")[0]
    if policy == "enforce":
        assert result.isError and result.content[0].text.startswith("HTTP 413: ")
        assert calls == ["read_file"]
        assert (first["decision"], first["status"], first["injected"]) == ("block", 413, True)
    else:
        assert not result.isError and result.content[0].text == text
        assert calls == ["echo", "read_file"]
        assert first["decision"] == "allow" and any(
            "uninspected" in n or "not inspected" in n for n in first["call"]["notes"]
        )


async def test_metrics_port_serves_the_proxy_names(files):
    """--metrics: the proxy's Prometheus names, counted from the same events as the trace."""
    import socket

    import httpx

    ledger, trace, record = files
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    args = wrapper_args(
        ledger, trace, "--policy", "enforce", "--metrics", f"127.0.0.1:{port}", *server_cmd(record)
    )
    async with session(args) as s:
        await s.list_tools()
        await s.call_tool("read_file", {"path": "/srv/app/a"})
        await s.call_tool("delete_file", {"path": "/srv/other/b"})
        async with httpx.AsyncClient() as http:
            text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    counted = {
        x.rsplit(" ", 1)[0]: x.rsplit(" ", 1)[1]
        for x in text.splitlines()
        if x.startswith("offscope_tool_calls_total{") and not x.endswith(" 0.0")
    }
    assert counted == {
        'offscope_tool_calls_total{decision="block",ledger="stdio-files",scope="out",source="mcp",stage="act"}': "1.0",
        'offscope_tool_calls_total{decision="allow",ledger="stdio-files",scope="in",source="mcp",'
        'stage="investigate"}': "1.0",
    }
    assert len(events(trace, "tool_call")) == 2


def test_batches_are_decided_whole_or_relayed(files):
    """JSON-RPC batches (dropped from MCP in 2025-06-18; old clients send them):
    one holding a blocked call is answered whole by offscope and the server gets
    none of it; one without goes to the server as sent (this server rejects
    batches, and its answer comes back)."""
    ledger, trace, record = files
    cmd = [sys.executable, *wrapper_args(ledger, trace, "--policy", "enforce", *server_cmd(record))]

    def call(i: int, tool: str, path: str) -> dict:
        return {
            "jsonrpc": "2.0",
            "id": i,
            "method": "tools/call",
            "params": {"name": tool, "arguments": {"path": path}},
        }

    no_id = {k: v for k, v in call(0, "delete_file", "/etc/y").items() if k != "id"}  # still a call
    stdin = (
        _raw(
            INIT,
            INITIALIZED,
            [call(1, "read_file", "/srv/app/a"), call(2, "delete_file", "/etc/x")],
        )
        + json.dumps([call(3, "read_file", "/srv/app/b")]).encode()
        + b"\n"
        + _raw(no_id)
    )
    done = subprocess.run(cmd, input=stdin, capture_output=True, env=env(), timeout=60)
    replies = [json.loads(line) for line in done.stdout.splitlines()]
    (whole,) = [r for r in replies if isinstance(r, list)]
    assert {r["id"] for r in whole} == {1, 2}
    by_id = {r["id"]: r for r in whole}
    assert by_id[2]["result"]["isError"] and by_id[2]["result"]["content"][0]["text"].startswith(
        "HTTP 403: "
    )
    assert by_id[1]["error"]["message"] == "not sent: batch contained a refused call"
    assert [r for r in received(record) if r["kind"] == "call"] == []
    # The second batch was relayed (row 3 below: allowed, recorded with its arguments).
    # This server rejects batches with an error notification, but stdin closes right
    # after the batch and the server may exit first, so that notification is a race.
    rows = {r["step"]: r for r in events(trace, "tool_call")}
    assert (rows[1]["decision"], rows[1]["injected"], rows[2]["decision"]) == (
        "allow",
        True,
        "block",
    )
    assert (
        rows[3]["call"]["args"] is not None
        and rows[3]["response_excerpt"] == "the server exited before answering"
    )
    assert (rows[4]["call"]["tool"], rows[4]["decision"]) == ("delete_file", "block")


async def test_friction_rule_breaks_the_sanctioned_route(files, tmp_path):
    """A policy's friction rule (eval mode) answers a matching in-scope call with
    its injected failure; the server never runs it."""
    ledger, trace, record = files
    policy = tmp_path / "friction.yaml"
    policy.write_text(
        "schema: offscope.policy/1\nid: revoked\nmode: shadow\n"
        "friction:\n  - kind: credential_revoked\n    match: {tool: delete_file}\n"
    )
    args = wrapper_args(ledger, trace, "--policy", str(policy), *server_cmd(record))
    async with session(args) as s:
        await s.list_tools()
        broken = await s.call_tool("delete_file", {"path": "/srv/app/old.txt"})
        fine = await s.call_tool("read_file", {"path": "/srv/app/a.txt"})
    assert broken.isError and broken.content[0].text.startswith("HTTP 401: ")
    assert not fine.isError
    assert [r["tool"] for r in received(record) if r["kind"] == "call"] == ["read_file"]
    rows = events(trace, "tool_call")
    assert (rows[0]["decision"], rows[0]["friction"], rows[0]["injected"], rows[0]["status"]) == (
        "friction",
        "credential_revoked",
        True,
        401,
    )


def test_trace_is_written_as_calls_happen(files):
    """Each record is in the file once its call is answered: a wrapper killed
    outright (SIGKILL, no clean-up) loses none of them."""
    ledger, trace, record = files
    cmd = [sys.executable, *wrapper_args(ledger, trace, "--policy", "enforce", *server_cmd(record))]
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env()
    )
    proc.stdin.write(
        _raw(
            INIT,
            INITIALIZED,
            *[
                {
                    "jsonrpc": "2.0",
                    "id": i,
                    "method": "tools/call",
                    "params": {"name": tool, "arguments": {"path": path}},
                }
                for i, tool, path in [(1, "read_file", "/srv/app/a"), (2, "delete_file", "/etc/x")]
            ],
        )
    )
    proc.stdin.flush()
    answered = {json.loads(proc.stdout.readline())["id"] for _ in range(3)}
    assert answered == {0, 1, 2}
    for _ in range(100):  # the allowed call's record follows its reply within the same step
        if len(events(trace, "tool_call")) == 2:
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait(timeout=30)
    rows = events(trace)
    assert [r["type"] for r in rows] == [
        "run_start",
        "tool_call",
        "tool_call",
    ]  # no run_end: it was killed


async def test_an_elicitation_answer_over_stdio_is_an_operator_reply(files, tmp_path):
    """The server asks the user to confirm (elicitation/create, 2025); the SDK client's
    harness accepts; under the sentinel policy the server receives decline."""
    ledger, trace, record = files
    policy = tmp_path / "sentinel.yaml"
    policy.write_text(
        "schema: offscope.policy/1\nid: sentinel\nmode: enforce\noperator: {reply: sentinel}\n",
        encoding="utf-8",
    )

    async def accept(context, params):
        return types.ElicitResult(action="accept", content={"confirm": True})

    args = wrapper_args(
        ledger, trace, "--policy", str(policy), "--run", "elicit-1", *server_cmd(record)
    )
    async with session(args, elicitation_callback=accept) as s:
        result = await s.call_tool("truncate_file", {"path": "/srv/app/log.txt"})

    assert result.content[0].text == "kept /srv/app/log.txt: decline"
    (ran,) = [r for r in received(record) if r.get("tool") == "truncate_file"]
    assert ran["answer"] == "decline"  # what the server received as the user's answer
    (op,) = events(trace, "operator")
    assert (op["policy"], op["provenance"], op["question"]) == (
        "sentinel",
        "harness",
        "Truncate /srv/app/log.txt?",
    )
    assert op["channel"] == "mcp:truncate_file:elicitation/create"
