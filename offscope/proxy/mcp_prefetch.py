"""A tools/call for a tool whose list offscope has not seen: ask the server first.

offscope stages an MCP call from the annotations its server declared in a tools/list
result (read-only -> investigate, destructive -> act). An agent that cached the list,
or an SDK of the stateless 2026-07-28 revision that calls a tool without listing, sends
a tools/call offscope has no annotations for; defaulted to `act`, a read-only call to an
out-of-scope record is blocked as if it were a write. So before deciding such a call the
proxy sends the server a tools/list of its own (statelessly in the new revision, with the
session's headers in the old one), learns the annotations, and then decides.

The fetch is bounded: a few seconds at most, and one per server per `RETRY_SECONDS`
(a server that does not list the tool is not asked again on every call). When it
fails, the call is staged as before (the default) and the log says why. A list that
gave a ttl (`ttlMs`, 2026-07-28) is fresh only that long: a call after it runs out
has the list fetched again, since the agent's cached copy may have changed under it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import structlog

from offscope.ledgers import CompiledLedger
from offscope.proxy.extract.http import HttpRequest
from offscope.proxy.extract.mcp import (
    ToolRegistry,
    response_messages,
    session_of,
    tool_annotations,
    tool_output_schemas,
)
from offscope.proxy.extract.mcp_wire2026 import (
    METHOD_HEADER,
    VERSION_HEADER,
    VERSION_META_KEY,
    fresh_until,
    tool_header_params,
)

log = structlog.get_logger("offscope")

TIMEOUT_SECONDS = 5.0
RETRY_SECONDS = 30.0
MAX_LIST_BYTES = 4 * 1024 * 1024
# The client's headers that a server needs to answer tools/list as it would the client.
_FORWARDED = ("authorization", "cookie", "mcp-session-id", VERSION_HEADER, "user-agent")
_ID = "offscope-tools-list"


class ToolListPrefetch:
    """Fetches a server's tool list when a tools/call arrives before offscope saw it."""

    def __init__(self, tools: ToolRegistry, verify: bool = True) -> None:
        self.tools = tools
        self.verify = verify
        self._asked: dict[str, float] = {}  # server -> when it was last asked

    def wanted(self, req: HttpRequest, ledger: CompiledLedger) -> tuple[str, str | None] | None:
        """The (server, session) to ask, when `req` is a plain tools/call for a tool
        offscope has no annotations for, on a host the ledger names, and the server was
        not asked recently; else None. offscope sends nothing of its own to a host
        outside the ledger, nor for a body servers could read otherwise."""
        if req.method.upper() != "POST" or b"tools/call" not in req.body:
            return None
        parsed = req.json_body()
        if parsed.notes or parsed.error or parsed.ambiguity:
            return None
        if not ledger.contains("host", req.host):
            return None
        message = parsed.value
        if not isinstance(message, dict) or message.get("method") != "tools/call":
            return None
        params = message.get("params")
        name = params.get("name") if isinstance(params, dict) else None
        if not isinstance(name, str):
            return None
        server, session = ToolRegistry.key(req), session_of(req)
        if session is not None and "mcp-session-id" not in req.headers:
            return None  # the legacy transport answers on the client's own stream
        now = time.monotonic()
        known = self.tools.annotations(server, name, session) is not None
        if known and not self.tools.stale(server, session, now):
            return None  # learnt from a list still fresh by its own ttl (or one with none)
        if now - self._asked.get(server, -RETRY_SECONDS) < RETRY_SECONDS:
            return None
        self._asked[server] = now
        if len(self._asked) > 4096:  # bounded: forget the oldest servers
            for old in sorted(self._asked, key=self._asked.__getitem__)[:1024]:
                del self._asked[old]
        return server, session

    async def fetch(
        self, req: HttpRequest, route: tuple[str, int] | None, server: str, session: str | None
    ) -> bool:
        """Ask the server (at its `route`, if the proxy routes its host) for its tool
        list and remember what it declares; whether that worked."""
        import httpx  # ~15 ms at every sidecar start, for a call few proxies ever make

        body, headers = _list_request(req)
        url = req.url
        if route is not None:  # as the proxy forwards it: plain HTTP, the original Host
            url = f"http://{route[0]}:{route[1]}{req.path}"
            headers["host"] = req.host
        try:
            async with (
                httpx.AsyncClient(verify=self.verify, timeout=TIMEOUT_SECONDS) as client,
                client.stream("POST", url, content=body, headers=headers) as resp,
            ):
                data = b""
                async for chunk in resp.aiter_bytes():
                    data += chunk
                    if len(data) > MAX_LIST_BYTES:
                        raise ValueError("tool list larger than offscope reads")
                content_type = resp.headers.get("content-type", "")
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("tools_list_prefetch_failed", server=server, error=str(exc))
            return False
        for message in response_messages(data, content_type):
            if message.get("id") == _ID and isinstance(message.get("result"), dict):
                self.tools.remember(
                    server,
                    tool_annotations(message),
                    tool_output_schemas(message),
                    session,
                    tool_header_params(message),
                    fresh_until(message),
                )
                log.info("tools_list_prefetched", server=server)
                return True
        log.warning("tools_list_prefetch_failed", server=server, error="no tools/list result")
        return False


def _list_request(req: HttpRequest) -> tuple[bytes, dict[str, str]]:
    """A tools/list as the client would send it: the stateless revision's envelope
    (copied from the call's `_meta`) and the client's session and auth headers."""
    message = req.json_body().value
    params = message.get("params") if isinstance(message, dict) else None
    meta = params.get("_meta") if isinstance(params, Mapping) else None
    list_params: dict[str, Any] = {}
    headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
    }
    if isinstance(meta, Mapping) and VERSION_META_KEY in meta:
        list_params["_meta"] = {k: v for k, v in meta.items() if k.startswith("io.modelcontext")}
        headers[METHOD_HEADER] = "tools/list"
    headers.update({k: v for k, v in req.headers.items() if k in _FORWARDED})
    body = {"jsonrpc": "2.0", "id": _ID, "method": "tools/list", "params": list_params}
    return json.dumps(body).encode(), headers
