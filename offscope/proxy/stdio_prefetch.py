"""`offscope mcp`: ask the stdio server for its tool list before a call offscope cannot stage.

As over HTTP (offscope/proxy/mcp_prefetch.py): a `tools/call` for a tool whose
annotations offscope has not learnt (the client called without listing, or its
cached list outlived the list's ttl) would be staged by its default, `act`. Over
stdio the server is offscope's own child, so before deciding such a call the
bridge writes a `tools/list` of its own to the server's stdin (with the call's
2026-07-28 `_meta`, when it has one), takes the answer off the server's stdout
(the client never sees it), learns the annotations, and then decides the call.
At most once per `RETRY_SECONDS`, waiting at most `TIMEOUT_SECONDS`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from typing import Any

import structlog

from offscope.proxy.extract.mcp import (
    ToolRegistry,
    tool_annotations,
    tool_output_schemas,
)
from offscope.proxy.extract.mcp_wire2026 import VERSION_META_KEY, fresh_until, tool_header_params

log = structlog.get_logger("offscope")

TIMEOUT_SECONDS = 5.0
RETRY_SECONDS = 30.0
_ID = "offscope-tools-list"
_ID_BYTES = json.dumps(_ID).encode()


class StdioListPrefetch:
    """One stdio session's own tools/list requests to its server."""

    def __init__(self, tools: ToolRegistry, server: str) -> None:
        self.tools = tools
        self.server = server  # the ToolRegistry key of the stdio server
        self._asked_at = -RETRY_SECONDS
        self._answer: asyncio.Future[None] | None = None

    def wanted(self, line: bytes) -> bytes | None:
        """The tools/list line to send first, when `line` is a tools/call for a tool
        offscope has no fresh annotations for (and it did not just ask); else None."""
        if b"tools/call" not in line:
            return None
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            return None
        if not isinstance(message, dict) or message.get("method") != "tools/call":
            return None
        params = message.get("params") if isinstance(message.get("params"), dict) else {}
        name = params.get("name") if isinstance(params, dict) else None
        now = time.monotonic()
        if not isinstance(name, str) or now - self._asked_at < RETRY_SECONDS:
            return None
        if self.tools.annotations(self.server, name) is not None and not self.tools.stale(
            self.server, None, now
        ):
            return None
        self._asked_at = now
        self._answer = asyncio.get_running_loop().create_future()
        return _list_request(params.get("_meta") if isinstance(params, dict) else None)

    async def wait(self) -> None:
        """Until the server answered the tools/list just sent (or the timeout)."""
        if self._answer is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._answer), TIMEOUT_SECONDS)
        except TimeoutError:
            log.warning("tools_list_prefetch_failed", server=self.server, error="no answer in time")
        self._answer = None

    def reply(self, line: bytes) -> bool:
        """Whether `line` is the server's answer to offscope's own tools/list (then it
        is learnt here and never relayed to the client)."""
        if _ID_BYTES not in line:
            return False
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            return False
        if not isinstance(message, dict) or message.get("id") != _ID or "method" in message:
            return False
        if isinstance(message.get("result"), dict):
            self.tools.remember(
                self.server,
                tool_annotations(message),
                tool_output_schemas(message),
                None,
                tool_header_params(message),
                fresh_until(message),
            )
            log.info("tools_list_prefetched", server=self.server)
        else:
            log.warning("tools_list_prefetch_failed", server=self.server, error="an error answer")
        if self._answer is not None and not self._answer.done():
            self._answer.set_result(None)
        return True


def _list_request(meta: Any) -> bytes:
    params: dict[str, Any] = {}
    if isinstance(meta, Mapping) and VERSION_META_KEY in meta:  # a 2026-07-28 client: stateless
        params["_meta"] = {k: v for k, v in meta.items() if k.startswith("io.modelcontext")}
    body = {"jsonrpc": "2.0", "id": _ID, "method": "tools/list", "params": params}
    return json.dumps(body).encode() + b"\n"
