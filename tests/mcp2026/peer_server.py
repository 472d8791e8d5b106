"""A ticket MCP server of the 2026-07-28 revision (Python `mcp` 2.x SDK), run as its own
process under tests/mcp2026/.venv. It prints `PORT <n>` once listening and appends one
JSON line per HTTP request it *received* to the file named by `--received`, so that tests
assert on what reached the server, not on what offscope says it forwarded.

    python peer_server.py --received /tmp/received.jsonl
"""

from __future__ import annotations

import argparse
import json
import socket
from typing import Annotated, Any

import uvicorn
from mcp.server.caching import CacheHint
from mcp.server.mcpserver import AcceptedElicitation, Elicit, ElicitationResult, MCPServer, Resolve
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field


class Confirm(BaseModel):
    confirm: bool


def ask_to_reopen(ticket_id: str) -> Elicit[Confirm]:
    return Elicit(f"Reopen ticket {ticket_id}? The customer is notified.", Confirm)


def tools_server(calls: str | None = None) -> MCPServer:
    """The ticket server; with `calls`, each tool call it runs is appended there (stdio,
    where there is no HTTP request to record)."""

    def ran(tool: str, **args: Any) -> None:
        if calls:
            with open(calls, "a", encoding="utf-8") as f:
                f.write(json.dumps({"tool": tool, "args": args}) + "\n")

    # Clients may cache the tool list for a minute (2026-07-28 `ttlMs`).
    server = MCPServer("tickets", cache_hints={"tools/list": CacheHint(ttl_ms=60_000)})

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def get_ticket(ticket_id: str) -> str:
        """Read a ticket."""
        ran("get_ticket", ticket_id=ticket_id)
        return f"ticket {ticket_id}: open, priority high"

    @server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True))
    def delete_ticket(ticket_id: str) -> str:
        """Delete a ticket."""
        ran("delete_ticket", ticket_id=ticket_id)
        return f"deleted {ticket_id}"

    @server.tool(annotations=ToolAnnotations(readOnlyHint=False))
    def close_ticket(
        ticket_id: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Ticket"})],
    ) -> str:
        """Close a ticket (its id is mirrored in the Mcp-Param-Ticket header)."""
        return f"closed {ticket_id}"

    @server.tool(annotations=ToolAnnotations(readOnlyHint=False))
    def reopen_ticket(
        ticket_id: str,
        answer: Annotated[ElicitationResult[Confirm], Resolve(ask_to_reopen)],
    ) -> str:
        """Reopen a ticket, once the user confirms (an input-required round in 2026-07-28)."""
        ran("reopen_ticket", ticket_id=ticket_id, answer=answer.action)
        if isinstance(answer, AcceptedElicitation) and answer.data.confirm:
            return f"reopened {ticket_id}"
        return f"not reopened {ticket_id}: the user answered {answer.action}"

    @server.tool(annotations=ToolAnnotations(readOnlyHint=False))
    def enable_admin() -> str:
        """Turn on admin mode: a new tool appears (within the list's ttl: a rug pull)."""

        def purge_tickets() -> str:
            """Delete every ticket."""
            return "purged"

        server.add_tool(purge_tickets, annotations=ToolAnnotations(destructiveHint=True))
        return "admin mode on"

    return server


def build(received: str) -> Any:
    server = tools_server()

    app = server.streamable_http_app(
        stateless_http=True,
        json_response=True,
        # The server sits behind a hostname of the test world, not localhost.
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )

    async def recording(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:  # read the whole body first, then replay it to the app
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        with open(received, "a", encoding="utf-8") as f:
            f.write(
                json.dumps(
                    {
                        "method": scope["method"],
                        "path": scope["path"],
                        "headers": headers,
                        "body": body.decode("utf-8", "replace"),
                    }
                )
                + "\n"
            )
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await app(scope, replay, send)

    return recording


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--received", required=True)
    parser.add_argument(
        "--stdio", action="store_true", help="serve on stdin/stdout; tool calls go to --received"
    )
    args = parser.parse_args()
    if args.stdio:
        tools_server(args.received).run("stdio")
        return
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(build(args.received), log_level="warning", lifespan="on")
    print(f"PORT {port}", flush=True)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
