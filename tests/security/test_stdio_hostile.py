"""`offscope mcp` against a hostile client: lines offscope cannot read
completely, or that parsers read two ways, never reach the server in enforce.

The wrapper runs as a subprocess in front of the reference git server
(`mcp-server-git`, the Python SDK: it decodes stdin with replacement and
would run the call), through `stdio_tee.py`, which records every raw line the
server was sent. A raw client writes the bytes no SDK would. Each test
asserts on what the server received, on the repository outside the ledger
(nothing staged), on the client's JSON-RPC answer and on the trace. The same
bytes through `offscope proxy` to an HTTP MCP upstream get the same decision.
The last test is the SDK's own shutdown (stdin closed, then SIGTERM): an end,
not a crash.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.sidecar_kit import EchoUpstream, ProxyProcess
from tests.support.sidecar_kit import events as proxy_events
from tests.support.stdio_kit import SERVER, env, events, session, wrapper_args, write_ledger

pytest.importorskip("mcp_server_git", reason="the test extra installs mcp-server-git")
pytestmark = pytest.mark.timeout(180)

TEE = Path(__file__).with_name("stdio_tee.py")
DEEP = b"[" * 5000 + b"]" * 5000
INIT = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "hostile", "version": "1"},
    },
}


def _repo(path: Path) -> str:
    path.mkdir()
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    (path / "new.txt").write_text("hello\n")
    return str(path)


def _staged(repo: str) -> list[str]:
    out = subprocess.run(
        ["git", "-C", repo, "diff", "--cached", "--name-only"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.split()


class Repos:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.mine, self.other = _repo(tmp / "mine"), _repo(tmp / "other")
        self.ledger = write_ledger(
            tmp / "ledger.yaml",
            f"""\
schema: offscope.ledger/1
id: git-agent
targets:
  hosts: [git.mcp.test]
  paths: [{json.dumps(self.mine)}, {json.dumps(self.mine + "/**")}]
extract:
  - match: {{source: mcp}}
    targets: {{path: "{{args.repo_path}}"}}
""",
        )

    def add_other(self, msg_id: int, meta: bytes | None = None, tail: bytes = b"") -> bytes:
        """A git_add on the repository outside the ledger, as raw bytes: `meta`
        is spliced in as params._meta, `tail` as more members of params."""
        head = (
            b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"git_add",'
            b'"arguments":{"repo_path":%s,"files":["new.txt"]}'
            % (msg_id, json.dumps(self.other).encode())
        )
        return head + (b',"_meta":' + meta if meta else b"") + tail + b"}}\n"

    def status_mine(self, msg_id: int) -> bytes:
        return _line(
            {
                "jsonrpc": "2.0",
                "id": msg_id,
                "method": "tools/call",
                "params": {"name": "git_status", "arguments": {"repo_path": self.mine}},
            }
        )


def _line(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


@pytest.fixture
def repos(tmp_path: Path) -> Repos:
    return Repos(tmp_path)


class Wrapper:
    """`offscope mcp` as a subprocess in front of the tee'd git server, spoken
    to line by line."""

    def __init__(self, repos: Repos, policy: str, *extra: str, name: str = "stdio") -> None:
        self.trace = repos.tmp / f"{name}-trace.jsonl"
        self.record = repos.tmp / f"{name}-received.jsonl"
        self.stderr = (repos.tmp / f"{name}-stderr.log").open("wb")
        args = wrapper_args(repos.ledger, self.trace, "--policy", policy, "--run", name, *extra)
        server = [
            sys.executable,
            str(TEE),
            str(self.record),
            "--",
            sys.executable,
            "-m",
            "mcp_server_git",
        ]
        self.proc = subprocess.Popen(
            [sys.executable, *args, "--", *server],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=env(),
        )
        self.send(_line(INIT))
        assert self.answer()["id"] == 0
        self.send(_line({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        self.send(_line({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        assert "tools" in self.answer()["result"]  # annotations known: git_add is an act

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        return json.loads(self.proc.stdout.readline())

    def exchange(self, data: bytes) -> dict[str, Any]:
        self.send(data)
        return self.answer()

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        code = self.proc.wait(timeout=60)
        self.stderr.close()
        return code

    def received(self) -> list[bytes]:
        """Every raw line the server was sent, in order."""
        rows = self.record.read_text(encoding="utf-8").splitlines()
        return [base64.b64decode(json.loads(r)["raw"]) for r in rows if r]

    def calls(self) -> list[dict[str, Any]]:
        return events(self.trace, "tool_call")


def _error_code(row: dict[str, Any]) -> str:
    return json.loads(row["response_excerpt"])["error"]


# -- enforce: what offscope cannot read is refused, answered and recorded --------------


def test_invalid_utf8_in_another_field_is_refused_answered_and_recorded(repos):
    wrapper = Wrapper(repos, "enforce")
    bad = repos.add_other(2, b'{"note":"caf\xe9"}')
    answer = wrapper.exchange(bad)
    after = wrapper.exchange(repos.status_mine(3))  # the session goes on
    assert wrapper.close() == 0
    assert answer["id"] == 2 and answer["error"]["code"] == -32700
    assert answer["error"]["data"]["error"] == "offscope_uninspectable"
    assert "result" in after and after["id"] == 3
    assert bad not in wrapper.received()  # never relayed
    assert _staged(repos.other) == []
    row = wrapper.calls()[0]
    # Recorded as the call a lenient server would have run, blocked.
    assert (row["call"]["tool"], row["call"]["scope"]) == ("git_add", "out")
    assert (row["decision"], row["status"], row["injected"]) == ("block", 400, True)
    assert _error_code(row) == "offscope_uninspectable"
    assert any("not valid text (UTF-8)" in n for n in row["call"]["notes"])


def test_a_5000_deep_array_in_another_field_is_refused_with_the_id_read_from_its_head(repos):
    wrapper = Wrapper(repos, "enforce")
    bad = repos.add_other(4, b'{"deep":' + DEEP + b"}")
    answer = wrapper.exchange(bad)
    wrapper.exchange(repos.status_mine(5))
    wrapper.close()
    assert answer["id"] == 4 and answer["error"]["code"] == -32700
    assert "nested deeper" in answer["error"]["message"]
    assert bad not in wrapper.received()
    assert _staged(repos.other) == []
    row = wrapper.calls()[0]
    assert (row["decision"], row["status"], _error_code(row)) == (
        "block",
        400,
        "offscope_uninspectable",
    )


@pytest.mark.parametrize("first", ["git_add", "git_status"])
def test_a_repeated_name_is_ambiguous_and_refused(repos, first):
    """`{"name": A, ..., "name": B}`: Python keeps B, a first-wins parser A.
    Whichever order hides the write, the line is refused (`ambiguous: refuse`,
    the enforce default) and recorded by its most out-of-scope reading."""
    wrapper = Wrapper(repos, "enforce")
    last = "git_status" if first == "git_add" else "git_add"
    bad = (
        b'{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"%s",'
        b'"arguments":{"repo_path":%s,"files":["new.txt"]},"name":"%s"}}\n'
        % (first.encode(), json.dumps(repos.other).encode(), last.encode())
    )
    answer = wrapper.exchange(bad)
    wrapper.close()
    assert answer["id"] == 6 and answer["error"]["code"] == -32600
    assert answer["error"]["data"]["error"] == "offscope_ambiguous"
    assert bad not in wrapper.received()
    assert _staged(repos.other) == []
    (row,) = wrapper.calls()
    assert (row["call"]["tool"], row["decision"], row["status"]) == ("git_add", "block", 400)
    assert "repeated object key ('name')" in row["reason"]


def test_an_oversized_line_without_a_readable_id_gets_an_id_null_error(repos):
    wrapper = Wrapper(repos, "enforce", "--max-line", "64k")
    # The id sits in the middle, where neither its first nor its last bytes show it.
    pad = b'"' + b"p" * 100_000 + b'"'
    bad = (
        b'{"method":"tools/call","jsonrpc":"2.0","params":{"name":"git_add","arguments":'
        b'{"repo_path":%s,"files":["new.txt"]},"_meta":{"a":%s}},"id":8,"x":%s}\n'
        % (json.dumps(repos.other).encode(), pad, pad)
    )
    answer = wrapper.exchange(bad)
    wrapper.exchange(repos.status_mine(9))
    wrapper.close()
    assert answer["id"] is None and answer["error"]["data"]["error"] == "offscope_body_too_large"
    assert not any(b"p" * 1000 in line for line in wrapper.received())
    assert _staged(repos.other) == []
    row = wrapper.calls()[0]
    assert (row["decision"], row["status"], row["injected"]) == ("block", 413, True)


def test_a_line_with_no_id_to_recover_is_answered_with_id_null(repos):
    wrapper = Wrapper(repos, "enforce")
    bad = b'{"method":"tools/call","params":{"deep":' + DEEP + b'},"id":10}\n'
    answer = wrapper.exchange(bad)
    wrapper.close()
    # The id is last before the closing brace: read from the tail.
    assert answer["id"] == 10 and answer["error"]["code"] == -32700
    garbage = b'{"jsonrpc":"2.0","method":"tools/call","params":{"deep":' + DEEP + b"}}\n"
    wrapper = Wrapper(repos, "enforce", name="stdio-2")
    answer = wrapper.exchange(garbage)
    wrapper.close()
    assert answer["id"] is None and answer["error"]["code"] == -32700
    assert garbage not in wrapper.received()
    assert [r["status"] for r in wrapper.calls()] == [400]


# -- on_error: open: forwarded, recorded as uninspected -------------------------------


def test_open_forwards_what_it_cannot_read_and_records_it_uninspected(repos):
    """shadow (on_error: open): the lines reach the server byte for byte, and
    the trace says offscope did not inspect them. The Python SDK server runs
    the git_add it decoded with replacement: what enforce prevents."""
    wrapper = Wrapper(repos, "shadow")
    deep = repos.add_other(11, b'{"deep":' + DEEP + b"}")
    wrapper.send(deep)
    bad = repos.add_other(12, b'{"note":"caf\xe9"}')
    wrapper.send(bad)
    wrapper.send(repos.status_mine(13))
    answers = {}
    while 13 not in answers:  # the server's answers, up to the last call's
        answer = wrapper.answer()
        answers[answer.get("id")] = answer
    wrapper.close()
    received = wrapper.received()
    assert deep in received and bad in received
    # The SDK server ran the call it decoded with replacement (its parser gave
    # up on the deep one: its own limit is lower).
    assert answers[12]["result"]["content"][0]["text"] == "Files staged successfully"
    assert _staged(repos.other) == ["new.txt"]
    rows = wrapper.calls()[:2]
    assert all(r["decision"] != "block" and not r["injected"] for r in rows)
    assert all(
        any(
            "forwarded without inspecting the body (on_error: open)" in n
            for n in r["call"]["notes"]
        )
        for r in rows
    )


def test_enforce_open_still_decides_the_lenient_reading_of_a_line_with_bad_bytes(repos):
    """enforce with on_error: open: a line with a bad byte is decided by what a
    lenient server reads (an out-of-scope git_add: blocked); a line offscope
    cannot parse at all goes through, recorded as uninspected."""
    policy = repos.tmp / "enforce-open.yaml"
    policy.write_text(
        "schema: offscope.policy/1\nid: enforce-open\nmode: enforce\non_error: open\n",
        encoding="utf-8",
    )
    wrapper = Wrapper(repos, str(policy))
    bad = repos.add_other(15, b'{"note":"caf\xe9"}')
    answer = wrapper.exchange(bad)
    deep = repos.add_other(16, b'{"deep":' + DEEP + b"}")
    wrapper.send(deep)
    wrapper.exchange(repos.status_mine(17))
    wrapper.close()
    assert answer["result"]["isError"] and answer["result"]["content"][0]["text"].startswith(
        "HTTP 403: "
    )
    received = wrapper.received()
    assert bad not in received and deep in received
    assert _staged(repos.other) == []
    rows = wrapper.calls()
    assert (rows[0]["call"]["tool"], rows[0]["decision"], rows[0]["status"]) == (
        "git_add",
        "block",
        403,
    )
    assert rows[1]["decision"] == "allow" and any(
        "forwarded without inspecting the body" in n for n in rows[1]["call"]["notes"]
    )


def test_tag_relays_a_repeated_name_and_records_its_most_out_of_scope_reading(repos):
    """shadow (ambiguous: tag): relayed as it came, and recorded as the write a
    first-wins parser would run, not the read Python (and this server) takes."""
    wrapper = Wrapper(repos, "shadow")
    bad = repos.add_other(14, tail=b',"name":"git_status"')
    answer = wrapper.exchange(bad)
    wrapper.close()
    assert "result" in answer and bad in wrapper.received()
    assert _staged(repos.other) == []  # the server kept the last name: git_status
    (row,) = wrapper.calls()
    assert (row["call"]["tool"], row["call"]["scope"], row["call"]["stage"]) == (
        "git_add",
        "out",
        "act",
    )
    assert any(n.startswith("ambiguous (tagged by its most") for n in row["call"]["notes"])


# -- HTTP decides the same bytes the same way --------------------------------------------


def test_http_and_stdio_decide_the_same_bytes_the_same_way(repos, tmp_path):
    bodies = {
        "invalid utf-8": repos.add_other(20, b'{"note":"caf\xe9"}'),
        "deep": repos.add_other(21, b'{"deep":' + DEEP + b"}"),
        "repeated name": repos.add_other(22, tail=b',"name":"git_status"'),
        "plain, in scope": repos.status_mine(23),
    }
    wrapper = Wrapper(repos, "enforce")
    for body in bodies.values():
        wrapper.exchange(body)
    wrapper.close()
    stdio = [(r["decision"], r["status"], r.get("reason") or "") for r in wrapper.calls()]
    upstream = EchoUpstream().start()
    try:
        with ProxyProcess(
            tmp_path,
            ledger=str(repos.ledger),
            policy="enforce",
            routes=f"git.mcp.test=127.0.0.1:{upstream.port}",
            confdir=str(tmp_path / "confdir"),
        ) as proxy:
            with httpx.Client(proxy=proxy.proxy_url("http-1"), timeout=30) as client:
                statuses = [
                    client.post(
                        "http://git.mcp.test/mcp",
                        content=body,
                        headers={"content-type": "application/json"},
                    ).status_code
                    for body in bodies.values()
                ]
        rows = [e for e in proxy_events(proxy.trace) if e["type"] == "tool_call"]
    finally:
        upstream.stop()
    assert statuses == [400, 400, 400, 200]
    agent_sent = [s for s in upstream.seen if "offscope-tools-list" not in s["body"]]
    assert [s["path"] for s in agent_sent] == ["/mcp"]  # only the plain call arrived
    http = [(r["decision"], r["status"], r.get("reason") or "") for r in rows]
    assert http == stdio
    assert [d for d, _, _ in stdio] == ["block", "block", "block", "allow"]


# -- a normal SDK shutdown is an end, not a crash ---------------------------------------


async def test_sdk_shutdown_stdin_closed_then_sigterm_is_an_ordinary_end(tmp_path):
    """The SDK's `stdio_client` exit closes stdin, waits 2 s, then SIGTERMs the
    wrapper's process group. A server slow to stop (the tee lingers) is still
    running then: the forwarded SIGTERM kills it (143), and the run ended as
    the client asked."""
    record = tmp_path / "received.jsonl"
    ledger = write_ledger(
        tmp_path / "ledger.yaml",
        """\
schema: offscope.ledger/1
id: stdio-files
targets:
  paths: ["/srv/app/**"]
extract:
  - match: {source: mcp}
    targets: {path: "{args.path}"}
""",
    )
    trace = tmp_path / "trace.jsonl"
    server = [sys.executable, str(TEE), "--linger", "60", str(record), "--"]
    server += [sys.executable, str(SERVER), str(tmp_path / "calls.jsonl")]
    args = wrapper_args(ledger, trace, "--policy", "enforce", "--run", "sdk-exit", "--", *server)
    async with session(args) as s:
        result = await s.call_tool("read_file", {"path": "/srv/app/a"})
    assert not result.isError
    (end,) = events(trace, "run_end")
    assert end["reason"] == "exit", end
    assert "closed stdin, then sent SIGTERM" in end["detail"]
    assert end["exit_code"] == 143  # what the signal left, as the shell reports it
