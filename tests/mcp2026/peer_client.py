"""An MCP client of the 2026-07-28 revision (Python `mcp` 2.x SDK), run as its own
process under tests/mcp2026/.venv: it connects to `--url` through the HTTP proxy
`--proxy` if given (trusting `--ca`), runs the steps given as JSON on stdin and prints one JSON
object per step: what the client *received* (a result, an MCP error, or an exception the
SDK raised).

Steps: {"do": "list"} | {"do": "call", "tool": NAME, "args": {...}}
     | {"do": "raw", "body": {...}, "headers": {...}}   (a hand-made POST, for wire tests)

The client answers every elicitation by accepting with `{"confirm": true}`: the harness
that auto-accepts on its user's behalf (`--elicit decline` declines instead).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import sys
from typing import Any

import httpx2

# mypy reads the 1.x SDK of the test environment; Client is the 2.x one of tests/mcp2026/.venv.
from mcp import Client, types  # type: ignore[attr-defined]
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client


def http_client(proxy: str | None, ca: str | None, headers: dict[str, str]) -> httpx2.AsyncClient:
    verify: Any = ssl.create_default_context(cafile=ca) if ca else True
    return httpx2.AsyncClient(proxy=proxy, verify=verify, headers=headers, timeout=30)


def transport(url: str, http: httpx2.AsyncClient) -> Any:
    """Streamable HTTP to `url`, or (`stdio:` + a JSON command line) a server process
    spoken to over its stdin/stdout, such as `offscope mcp -- SERVER`."""
    if url.startswith("stdio:"):
        command = json.loads(url.removeprefix("stdio:"))
        return stdio_client(StdioServerParameters(command=command[0], args=command[1:]))
    return streamable_http_client(url, http_client=http)


def answering(action: str) -> Any:
    async def on_elicit(context: Any, params: Any) -> types.ElicitResult:
        emit({"elicited": params.message})
        if action == "accept":
            return types.ElicitResult(action="accept", content={"confirm": True})
        return types.ElicitResult(action=action)

    return on_elicit


async def run(
    url: str,
    proxy: str,
    ca: str | None,
    run_id: str,
    steps: list[dict[str, Any]],
    elicit: str = "accept",
) -> None:
    headers = {"x-offscope-run": run_id}
    async with http_client(proxy, ca, headers) as raw:
        for step in steps:
            if step["do"] == "raw":
                r = await raw.post(url, json=step["body"], headers=step.get("headers", {}))
                emit({"status": r.status_code, "body": r.text})
    if not any(s["do"] != "raw" for s in steps):
        return
    async with (
        http_client(proxy, ca, headers) as transport_client,
        Client(
            transport(url, transport_client),
            elicitation_callback=answering(elicit),
        ) as client,
    ):
        emit({"protocol_version": client.protocol_version})
        for step in steps:
            try:
                if step["do"] == "list":
                    tools = await client.list_tools()
                    emit({"tools": sorted(t.name for t in tools.tools)})
                elif step["do"] == "call":
                    result = await client.call_tool(step["tool"], step.get("args", {}))
                    dumped = result.model_dump(mode="json", by_alias=True, exclude_none=True)
                    emit({"result": dumped})
            except Exception as exc:  # what the agent would see: the SDK's own exception
                emit({"exception": type(exc).__name__, "message": str(exc)[:2000]})


def emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--url", required=True, help='an MCP URL, or stdio:["cmd", "arg", ...] for a process'
    )
    parser.add_argument("--proxy", help="the HTTP proxy (none: talk to --url directly)")
    parser.add_argument("--ca")
    parser.add_argument("--run", default="mcp2026")
    parser.add_argument("--elicit", default="accept", choices=["accept", "decline", "cancel"])
    args = parser.parse_args()
    steps = json.loads(sys.stdin.read())
    asyncio.run(run(args.url, args.proxy, args.ca, args.run, steps, args.elicit))


if __name__ == "__main__":
    main()
