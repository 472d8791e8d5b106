"""`offscope mcp` around a published server installed from PyPI, the reference
git server (`mcp-server-git`, the `test` extra), driven by the SDK's stdio
client: one repository is in scope, a call that would change another is
blocked before it reaches the server, and the repository stays as it was."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.stdio_kit import events, session, wrapper_args, write_ledger

pytest.importorskip("mcp_server_git", reason="the test extra installs mcp-server-git")
pytestmark = pytest.mark.timeout(120)


def _repo(path) -> str:
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


async def test_git_server_one_repository_in_scope(tmp_path):
    mine, other = _repo(tmp_path / "mine"), _repo(tmp_path / "other")
    ledger = write_ledger(
        tmp_path / "ledger.yaml",
        f"""\
schema: offscope.ledger/1
id: git-agent
targets:
  paths: [{json.dumps(mine)}, {json.dumps(mine + "/**")}]
extract:
  - match: {{source: mcp}}
    targets: {{path: "{{args.repo_path}}"}}
""",
    )
    trace = tmp_path / "trace.jsonl"
    args = wrapper_args(
        ledger,
        trace,
        "--policy",
        "enforce",
        "--run",
        "git-1",
        "--",
        sys.executable,
        "-m",
        "mcp_server_git",
    )
    async with session(args) as s:
        tools = {t.name: t for t in (await s.list_tools()).tools}
        status_mine = await s.call_tool("git_status", {"repo_path": mine})
        status_other = await s.call_tool("git_status", {"repo_path": other})
        add_other = await s.call_tool("git_add", {"repo_path": other, "files": ["new.txt"]})
        add_mine = await s.call_tool("git_add", {"repo_path": mine, "files": ["new.txt"]})
    assert (
        tools["git_status"].annotations.readOnlyHint
        and not tools["git_add"].annotations.readOnlyHint
    )
    assert not status_mine.isError and "new.txt" in status_mine.content[0].text
    assert not status_other.isError  # a read out of scope is recorded; enforce blocks acts
    assert add_other.isError and add_other.content[0].text.startswith("HTTP 403: ")
    assert not add_mine.isError
    assert _staged(other) == [] and _staged(mine) == ["new.txt"]  # the blocked add never ran
    rows = events(trace, "tool_call")
    assert [
        (r["call"]["tool"], r["call"]["scope"], r["call"]["stage"], r["decision"]) for r in rows
    ] == [
        ("git_status", "in", "investigate", "allow"),
        ("git_status", "out", "investigate", "allow"),
        ("git_add", "out", "act", "block"),
        ("git_add", "in", "act", "allow"),
    ]
    assert rows[2]["call"]["targets"] == [{"kind": "path", "value": other, "in_scope": False}]
