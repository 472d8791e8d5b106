"""A FastMCP server on stdio for the `offscope mcp` tests.

Every request and notification it receives is appended to the file named by
its first argument, so a test can tell what reached the server (and what
offscope kept from it)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from mcp import types
from mcp.server.fastmcp import Context, FastMCP
from mcp.types import ToolAnnotations
from pydantic import BaseModel

RECORD = Path(sys.argv[1])


def note(kind: str, **fields) -> None:
    with RECORD.open("a", encoding="utf-8") as f:
        f.write(json.dumps({"kind": kind, **fields}) + "\n")


server = FastMCP("stdio-files")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def read_file(path: str) -> str:
    """Read a file."""
    note("call", tool="read_file", path=path)
    return f"contents of {path}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True))
def delete_file(path: str) -> str:
    """Delete a file."""
    note("call", tool="delete_file", path=path)
    return f"deleted {path}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def echo(path: str, text: str, ctx: Context) -> str:
    """Echo text back, after a log notification to the client."""
    note("call", tool="echo", path=path, size=len(text))
    await ctx.info(f"echoing {len(text)} characters")
    return text


class Confirm(BaseModel):
    confirm: bool


@server.tool()
async def truncate_file(path: str, ctx: Context) -> str:
    """Truncate a file, once the user confirms (a 2025 `elicitation/create`)."""
    answer = await ctx.elicit(f"Truncate {path}?", Confirm)
    note("call", tool="truncate_file", path=path, answer=answer.action)
    return f"truncated {path}" if answer.action == "accept" else f"kept {path}: {answer.action}"


@server.tool()
def ask_human(question: str) -> str:
    """Ask the on-call human."""
    note("call", tool="ask_human")
    return "the server's own answer"


@server.tool()
def exit_now(code: int) -> str:
    """Write to stderr and exit with `code` (the wrapper's exit code must follow)."""
    note("call", tool="exit_now", code=code)
    print(f"stdio-server exiting with {code}", file=sys.stderr, flush=True)
    os._exit(code)


async def _roots_changed(notification: types.RootsListChangedNotification) -> None:
    note("notification", method="notifications/roots/list_changed")


server._mcp_server.notification_handlers[types.RootsListChangedNotification] = _roots_changed
_list_tools = server._mcp_server.request_handlers[types.ListToolsRequest]


async def _noted_list_tools(request: types.ListToolsRequest):
    note("request", method="tools/list")
    return await _list_tools(request)


server._mcp_server.request_handlers[types.ListToolsRequest] = _noted_list_tools

if __name__ == "__main__":
    print("stdio-server starting", file=sys.stderr, flush=True)
    server.run("stdio")
