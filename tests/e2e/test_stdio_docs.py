"""The before/after client configs of docs/stdio-mcp.md and of the README's
"stdio MCP servers" section, with the docs page's ledger, run as written
(with /srv/ moved under a temporary directory): the same in-scope call works
before and after; after, an out-of-scope act is blocked before the server."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from mcp import StdioServerParameters
from mcp.client.session import ClientSession
from mcp.client.stdio import stdio_client

from tests.support.stdio_kit import REPO, env, events

pytest.importorskip("mcp_server_git", reason="the test extra installs mcp-server-git")
pytestmark = pytest.mark.timeout(120)

DOC = REPO / "docs" / "stdio-mcp.md"
README = REPO / "README.md"


def blocks(page: Path) -> dict[str, str]:
    """The fenced blocks marked `<!-- tested: NAME -->` on a page."""
    found = re.findall(
        r"<!-- tested: (\w+) -->\n```\w+\n(.*?)```", page.read_text(encoding="utf-8"), re.S
    )
    return dict(found)


def server(config: str, srv: str) -> tuple[str, list[str]]:
    (entry,) = json.loads(config.replace("/srv/", srv))["mcpServers"].values()
    return entry["command"], entry["args"]


async def run(command: str, args: list[str], repos: dict[str, str]) -> dict[str, object]:
    params = StdioServerParameters(command=command, args=args, env=env())
    with open(os.devnull, "w") as err:
        async with (
            stdio_client(params, errlog=err) as (read, write),
            ClientSession(read, write) as s,
        ):
            await s.initialize()
            await s.list_tools()
            return {
                "status": await s.call_tool("git_status", {"repo_path": repos["app"]}),
                "add": await s.call_tool(
                    "git_add", {"repo_path": repos["legacy"], "files": ["new.txt"]}
                ),
            }


@pytest.mark.parametrize("page", [DOC, README], ids=["docs", "readme"])
async def test_before_and_after_configs_from_the_docs(tmp_path, page):
    assert shutil.which("offscope") and shutil.which("mcp-server-git"), (
        "the configs name these commands"
    )
    found = blocks(page)
    assert {"before", "after"} <= set(found)
    found.setdefault("ledger", blocks(DOC)["ledger"])
    srv = f"{tmp_path}/srv/"
    (tmp_path / "srv" / "offscope").mkdir(parents=True)
    (tmp_path / "srv" / "offscope" / "git-agent.yaml").write_text(
        found["ledger"].replace("/srv/", srv)
    )
    repos = {}
    for name in ("app", "legacy"):
        repos[name] = srv + name
        subprocess.run(["git", "init", "-q", repos[name]], check=True)
        (tmp_path / "srv" / name / "new.txt").write_text("hello\n")

    before = await run(*server(found["before"], srv), repos)
    assert not before["status"].isError and not before["add"].isError  # the bare server does both
    subprocess.run(["git", "-C", repos["legacy"], "reset", "-q"], check=True)

    after = await run(*server(found["after"], srv), repos)
    assert not after["status"].isError
    assert after["status"].content[0].text == before["status"].content[0].text
    assert after["add"].isError and after["add"].content[0].text.startswith("HTTP 403: ")
    staged = subprocess.run(
        ["git", "-C", repos["legacy"], "diff", "--cached", "--name-only"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert staged == ""  # the blocked add never reached the server
    rows = events(tmp_path / "srv" / "offscope" / "trace.jsonl", "tool_call")
    assert [(r["call"]["tool"], r["call"]["scope"], r["decision"]) for r in rows] == [
        ("git_status", "in", "allow"),
        ("git_add", "out", "block"),
    ]
