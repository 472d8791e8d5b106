"""The fixture world: the hosts a case can reach, served for real on loopback.

One ASGI app serves every case host (the proxy routes them here and adds the
run id in `x-offscope-fixture-run`); hosts with `mcp_tools` also serve a real
MCP server (official SDK, streamable HTTP) at `/mcp`. State is per run: each
write records an effect under its run only, so "acted" can be checked against
the world as well as against the trace, and no run sees another's writes.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import mcp.types as mtypes
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route

from offscope.evalmode.case import Case, Endpoint, FixtureHost, McpToolSpec
from offscope.ledgers.globs import Glob, compile_glob
from offscope.ledgers.matcher import CallInput

RUN_HEADER = "x-offscope-fixture-run"


@dataclass(frozen=True)
class Effect:
    """A write the world recorded, with the call that made it (so the grid can
    tag it with the one tagger: was this write in or out of scope?)."""

    host: str
    effect: str
    call: CallInput


_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _fill(template: Any, values: dict[str, Any]) -> Any:
    """Fill {name} placeholders in strings inside a JSON-like value (other braces stay)."""
    if isinstance(template, str):
        return _PLACEHOLDER.sub(
            lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), template
        )
    if isinstance(template, dict):
        return {k: _fill(v, values) for k, v in template.items()}
    if isinstance(template, list):
        return [_fill(v, values) for v in template]
    return template


class World:
    def __init__(self, cases: list[Case]) -> None:
        self.cases = {c.id: c for c in cases}
        self._lock = threading.Lock()
        self._run_case: dict[str, str] = {}
        self._effects: dict[str, list[Effect]] = {}
        self._routes: dict[tuple[str, str], list[tuple[Glob, Endpoint]]] = {}
        for case in cases:
            for host, spec in case.world.items():
                self._routes[(case.id, host)] = [
                    (compile_glob(e.path, "/", captures=True), e) for e in spec.endpoints
                ]
        self.mcp = self._mcp_server()
        self.sessions = StreamableHTTPSessionManager(
            app=self.mcp, stateless=True, json_response=False
        )

    # -- per-run state (called by the grid) --------------------------------------

    def register(self, run_id: str, case_id: str) -> None:
        with self._lock:
            self._run_case[run_id] = case_id
            self._effects[run_id] = []

    def finish(self, run_id: str) -> list[Effect]:
        """The effects the run made; forgets the run (bounded state)."""
        with self._lock:
            self._run_case.pop(run_id, None)
            return self._effects.pop(run_id, [])

    def effects(self, run_id: str) -> list[Effect]:
        with self._lock:
            return list(self._effects.get(run_id, []))

    def _record(self, run_id: str, effect: Effect) -> None:
        with self._lock:
            if run_id in self._effects:
                self._effects[run_id].append(effect)

    def _host_spec(self, request: Request) -> tuple[str, Case, str, FixtureHost] | None:
        run = request.headers.get(RUN_HEADER, "")
        host = request.headers.get("host", "").split(":")[0].lower()
        case_id = self._run_case.get(run)
        case = self.cases.get(case_id) if case_id else None
        spec = case.world.get(host) if case else None
        return (run, case, host, spec) if case and spec else None

    # -- plain HTTP endpoints -------------------------------------------------------

    async def http(self, request: Request) -> Response:
        found = self._host_spec(request)
        if found is None:
            return JSONResponse(
                {
                    "error": "host_not_found",
                    "message": f"no such host: {request.headers.get('host')}",
                },
                status_code=502,
            )
        run, case, host, _ = found
        for pattern, endpoint in self._routes[(case.id, host)]:
            m = pattern.match(request.url.path)
            if not m or endpoint.method != request.method:
                continue
            if endpoint.requires_auth and "authorization" not in request.headers:
                return JSONResponse({"error": "unauthorized"}, status_code=401)
            captures = m.groupdict()
            if endpoint.effect and endpoint.status < 400:
                try:
                    body = await request.json()
                except ValueError:
                    body = None
                self._record(
                    run,
                    Effect(
                        host,
                        _fill(endpoint.effect, captures),
                        CallInput(
                            source="http",
                            method=request.method,
                            host=host,
                            path=request.url.path,
                            query={
                                k: request.query_params.getlist(k) for k in request.query_params
                            },
                            args=body,
                        ),
                    ),
                )
            if endpoint.status in (204, 304):  # these statuses carry no body (HTTP semantics)
                return Response(status_code=endpoint.status)
            return JSONResponse(_fill(endpoint.body, captures), status_code=endpoint.status)
        methods = sorted(
            {e.method for p, e in self._routes[(case.id, host)] if p.match(request.url.path)}
        )
        if methods:
            return JSONResponse(
                {"error": "method_not_allowed", "allowed": methods}, status_code=405
            )
        return JSONResponse(
            {"error": "not_found", "message": f"no route {request.method} {request.url.path}"},
            status_code=404,
        )

    # -- MCP ---------------------------------------------------------------------

    def _mcp_tools(self) -> tuple[str, str, list[McpToolSpec]]:
        request = self.mcp.request_context.request
        found = self._host_spec(request) if request is not None else None
        if found is None:
            return "", "", []
        run, _, host, spec = found
        return run, host, spec.mcp_tools

    def _mcp_server(self) -> Server:
        server: Server = Server("offscope-fixture-world")

        @server.list_tools()
        async def list_tools() -> list[mtypes.Tool]:
            _, _, tools = self._mcp_tools()
            return [
                mtypes.Tool(
                    name=t.name,
                    description=t.description or t.name,
                    inputSchema={
                        "type": "object",
                        "properties": {k: {"type": v} for k, v in t.params.items()},
                        "required": sorted(t.params),
                    },
                    annotations=mtypes.ToolAnnotations(
                        readOnlyHint=t.read_only, destructiveHint=t.destructive
                    ),
                )
                for t in tools
            ]

        @server.call_tool(validate_input=False)
        async def call_tool(name: str, arguments: dict[str, Any]) -> mtypes.CallToolResult:
            run, host, tools = self._mcp_tools()
            tool = next((t for t in tools if t.name == name), None)
            if tool is None:
                return _tool_result(f"unknown tool {name!r}", error=True)
            if tool.error:
                return _tool_result(tool.error, error=True)
            if tool.effect:
                self._record(
                    run,
                    Effect(
                        host,
                        _fill(tool.effect, arguments),
                        CallInput(source="mcp", tool=name, host=host, path="/mcp", args=arguments),
                    ),
                )
            result = _fill(tool.result, arguments)
            return _tool_result(
                result if isinstance(result, str) else json.dumps(result, sort_keys=True)
            )

        return server

    def app(self) -> Starlette:
        world = self

        @contextlib.asynccontextmanager
        async def lifespan(_app: Starlette) -> AsyncIterator[None]:
            async with world.sessions.run():
                yield

        class McpEndpoint:  # an ASGI class: Route passes scope/receive/send through
            async def __call__(self, scope, receive, send) -> None:
                await world.sessions.handle_request(scope, receive, send)

        async def fallback(scope, receive, send) -> None:
            response = await world.http(Request(scope, receive))
            await response(scope, receive, send)

        return Starlette(
            routes=[
                Route("/mcp", McpEndpoint(), methods=["GET", "POST", "DELETE"]),
                Mount("/", app=fallback),
            ],
            lifespan=lifespan,
        )


def _tool_result(text: str, error: bool = False) -> mtypes.CallToolResult:
    return mtypes.CallToolResult(
        content=[mtypes.TextContent(type="text", text=text)], isError=error
    )
