"""The engine's view of one WebSocket: the messages the agent sends are calls.

The mitmproxy addon hands each whole message here (mitmproxy reassembles
fragments and inflates permessage-deflate first) and applies the returned
`WsAction`; nothing here touches mitmproxy, as stdio.py for `offscope mcp`.

- An MCP message (JSON-RPC with MCP methods, offscope/proxy/extract/websocket.py)
  goes through `Engine.decide_mcp`, as MCP over HTTP or stdio: each
  `tools/call` is a `source: mcp` call, staged by the annotations its server
  listed, and the operator channel applies. A refused call is answered with
  its JSON-RPC result in a text message; the server's answers are recorded
  when they pass the other way (`from_server`).
- Any other message is a `websocket` call (`Engine.frame`).
- A message offscope cannot read completely is decided by `on_error`:
  closed, it is dropped and the client gets a text message
  `{"error": "offscope_uninspectable", "status": 400, ...}`; open, it is
  forwarded and recorded as uninspected.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog
import wsproto.extensions
from wsproto.frame_protocol import CloseReason

from offscope.policies.decide import PolicyVerdict
from offscope.proxy.exchange import Exchange, Synthetic, json_response
from offscope.proxy.extract.http import MAX_PARSE, HttpRequest, HttpResponse, JsonBody
from offscope.proxy.extract.mcp import McpRequest, id_key, mcp_requests
from offscope.proxy.extract.websocket import WsReading, read_json, read_message

if TYPE_CHECKING:
    from offscope.proxy.engine import Engine

log = structlog.get_logger("offscope")

# Requests whose answers the record needs: calls, and the listings whose
# annotations stage later calls. Any other MCP method is protocol.
_INSPECTED = frozenset({"tools/call", "tools/list"})
_JSON = {"content-type": "application/json"}
MAX_WAITING = 4096  # answers awaited per socket; the oldest is recorded unanswered past it
# mitmproxy's parser closes a socket with these on what it cannot relay: a text
# message that is not UTF-8, a compressed message that inflates past the bound.
PARSER_CLOSES = {
    1007: "text message: not valid UTF-8",
    1009: f"compressed message: inflates past {MAX_PARSE} bytes",
}


@dataclass(slots=True)
class WsAction:
    """What to do with one client message: forward it, or drop it and send
    `reply` (a text message) to the client after `delay` seconds."""

    forward: bool = True
    reply: bytes | None = None
    delay: float = 0.0


@dataclass(slots=True)
class _Waiting:
    ex: Exchange
    ids: set[str]
    replies: list[bytes] = field(default_factory=list)


class WsSession:
    """One WebSocket, from the upgrade the engine allowed to its close."""

    def __init__(self, engine: Engine, upgrade: Exchange) -> None:
        self.engine = engine
        self.upgrade = upgrade
        self.waiting: dict[str, _Waiting] = {}
        # A run started through the control API: its socket lives no longer than it.
        self.registration = engine.lifecycle.registry.get(upgrade.run)

    @property
    def run(self) -> str:
        return self.upgrade.run

    def from_client(self, content: bytes, is_text: bool) -> WsAction:
        """One whole message the agent sent."""
        spent = self.engine.lifecycle.exhausted_refusal(self.run)
        if spent is not None:  # the run was ended by its budget: nothing more is sent
            return WsAction(forward=False, reply=_status_body(spent, 429))
        if (refused := self._lapsed()) is not None:
            return refused
        reading = read_message(content, is_text)
        requests = mcp_requests(reading.value) if reading.is_json else None
        if requests is None:
            action = _blocked_or_forwarded(self.engine.frame(self.upgrade, reading))
        elif not any(r.method in _INSPECTED for r in requests):
            return WsAction()  # MCP protocol (initialize, notifications, ping, ...): no step
        else:
            action = self._mcp(content, reading, requests)
        ctx = self.engine.runs.get(self.run)
        if ctx is not None and ctx.exhausted is not None:  # this call went over a budget
            self.engine.lifecycle.end_exhausted(ctx)
        return action

    def _lapsed(self) -> WsAction | None:
        """A registered run that ended (or whose ttl passed) after the upgrade:
        its credential no longer admits anything, so neither does its socket
        (enforce refuses, as admission refuses a request; shadow lets it on)."""
        reg = self.registration
        if reg is None or not (reg.ended or self.engine.clock() >= reg.expires):
            return None
        admitted = self.engine.admit(self.run, None, None, explicit=True)
        if admitted.status is None:
            self.registration = None  # shadow: counted and logged once
            return None
        return WsAction(forward=False, reply=_status_body(admitted.body or {}, admitted.status))

    def failed(self, error: str) -> WsAction:
        """A message whose handling raised: recorded (as addon.request records
        a request), then dropped with an error message (on_error: closed) or
        forwarded unchecked (open)."""
        closed = self.engine.policy_for(self.run).policy.fail_closed
        req = dataclasses.replace(self.upgrade.req, method="WS", body=b"")
        self.engine.failed(req, self.run, error, forwarded=not closed)
        if not closed:
            return WsAction()
        body = {
            "error": "offscope_error",
            "message": "offscope could not check this message; failing closed",
        }
        return WsAction(forward=False, reply=_status_body(body, 503))

    def _mcp(self, content: bytes, reading: WsReading, requests: list[McpRequest]) -> WsAction:
        req = self._request(content, reading.value)
        ex, delay = self.engine.decide_mcp(req, self.run, requests, [])
        if ex.synthetic is not None:  # refused or answered by offscope: nothing goes upstream
            return WsAction(forward=False, reply=ex.synthetic.body, delay=delay)
        ids = {id_key(r.id) for r in requests if r.method in _INSPECTED and r.id is not None}
        if ids and ex.awaits_answer:
            self._wait(_Waiting(ex, ids))
        else:  # a tools/call notification: nothing will answer it
            self._record(ex, None, "a notification: no answer" if ex.calls else None)
        return WsAction(delay=delay)

    def _request(self, content: bytes, value: Any) -> HttpRequest:
        """The MCP server as the engine names it: the upgrade's destination and path."""
        up = self.upgrade.req
        req = HttpRequest(
            method="POST",
            host=up.host,
            path=up.path,
            scheme="wss" if up.scheme == "https" else "ws",
            port=up.port,
            headers={**up.headers, **_JSON},
            body=content,
        )
        req._json = JsonBody(value=value)  # parsed once, by read_message
        return req

    def _wait(self, wait: _Waiting) -> None:
        for key in wait.ids:
            self.waiting[key] = wait
        while len(self.waiting) > MAX_WAITING:
            oldest = self.waiting.pop(next(iter(self.waiting)))
            if not any(w is oldest for w in self.waiting.values()):
                self._finish(oldest, "no answer before newer calls on this socket")

    def from_server(self, content: bytes) -> None:
        """One whole message from the server, after it went to the client:
        answers to calls offscope waits for are recorded."""
        if not self.waiting or b'"id"' not in content:
            return
        message, error = read_json(content)
        if error is not None:
            return
        for item in message if isinstance(message, list) else [message]:
            if not isinstance(item, dict) or "method" in item or "id" not in item:
                continue  # a request or notification from the server
            key = id_key(item["id"])
            wait = self.waiting.pop(key, None)
            if wait is None:
                continue
            wait.ids.discard(key)
            wait.replies.append(json.dumps(item).encode())
            if not wait.ids:
                self._finish(wait)

    def closed(self, code: int | None, by_client: bool) -> None:
        """The socket closed: record what still waits, and a message the proxy's
        parser refused (it closed the socket on it; nothing was forwarded)."""
        if by_client and code in PARSER_CLOSES:
            reading = WsReading(error=PARSER_CLOSES[code], closed=code)
            try:
                self.engine.frame(self.upgrade, reading)
            except Exception as exc:
                log.exception("frame_failed", run=self.run, error=str(exc))
        for wait in {id(w): w for w in self.waiting.values()}.values():
            self._finish(wait, f"the WebSocket closed before the answer (code {code})")
        self.waiting.clear()

    def _finish(self, wait: _Waiting, error: str | None = None) -> None:
        body = wait.replies[0] if len(wait.replies) == 1 else b"[" + b",".join(wait.replies) + b"]"
        self._record(wait.ex, HttpResponse(200, dict(_JSON), body) if wait.replies else None, error)

    def _record(self, ex: Exchange, resp: HttpResponse | None, error: str | None) -> None:
        try:
            self.engine.response(ex, resp, error)
        except Exception as exc:  # one bad record must not break the socket
            log.exception("response_record_failed", run=self.run, error=str(exc))


def _blocked_or_forwarded(verdict: Any) -> WsAction:
    if verdict.status is None:
        return WsAction()
    return WsAction(forward=False, reply=_status_body(verdict.body or {}, verdict.status))


def _status_body(body: dict[str, Any], status: int) -> bytes:
    """offscope's answer as a text message: the HTTP answer's body and its status."""
    return json.dumps({**body, "status": status}).encode()


def refuse_raw_upgrade(engine: Engine, ex: Exchange) -> Synthetic | None:
    """A 101 that mitmproxy will not relay as WebSocket messages (another
    protocol, or a handshake it does not take for a WebSocket, e.g. another
    Sec-WebSocket-Version): it would relay the bytes that follow raw, seen by
    no hook. on_error decides: closed, offscope answers 502 instead (nothing
    follows) and records the upgrade as blocked; open, it is relayed and
    recorded as uninspected. Returns the answer to send, or None."""
    note = "the server switched to a protocol offscope does not read (101, not a WebSocket)"
    if not ex.policy.policy.fail_closed:
        for pending in ex.calls:
            pending.notes = [*pending.notes, f"{note}; relayed uninspected (on_error: open)"]
        return None
    reason = "uninspectable upgrade (on_error: closed)"
    body = {
        "error": "offscope_uninspectable",
        "message": "The server switched to a protocol offscope does not inspect; "
        "offscope closed the connection instead.",
        "reason": reason,
    }
    ex.synthetic = json_response(502, body, {"connection": "close"})
    for pending in ex.calls:
        pending.verdict = PolicyVerdict("block", 502, body, reason=reason)
        pending.notes = [*pending.notes, f"{note}; refused (on_error: closed)"]
        engine.record_call(ex, pending, 502, injected=True, excerpt=ex.synthetic.body)
    ex.done = True
    return ex.synthetic


class BoundedPerMessageDeflate(wsproto.extensions.PerMessageDeflate):
    """permessage-deflate that refuses a message inflating past MAX_PARSE bytes
    (close 1009): wsproto inflates without a bound, and mitmproxy holds a whole
    message before any hook, so a small bomb would cost the proxy gigabytes."""

    limit = MAX_PARSE

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._inflated = 0  # bytes of the current message so far

    def frame_inbound_payload_data(self, proto: Any, data: bytes) -> bytes | CloseReason:
        if not self._inbound_compressed or not self._inbound_is_compressible:
            return data
        assert self._decompressor is not None
        room = self.limit - self._inflated
        try:
            out = self._decompressor.decompress(bytes(data), room + 1)
        except zlib.error:
            return CloseReason.INVALID_FRAME_PAYLOAD_DATA
        self._inflated += len(out)
        if self._inflated > self.limit:
            return CloseReason.MESSAGE_TOO_BIG
        return out

    def frame_inbound_complete(self, proto: Any, fin: bool) -> bytes | CloseReason | None:
        if fin:
            self._inflated = 0
        return super().frame_inbound_complete(proto, fin)


def bound_inflation() -> None:
    """Make mitmproxy's WebSocket layer use the bounded inflater: it builds its
    extension as `wsproto.extensions.PerMessageDeflate()` for each socket, so
    the class there is the one hook (the addon calls this once, at load)."""
    wsproto.extensions.PerMessageDeflate = BoundedPerMessageDeflate  # type: ignore[misc]
