"""`offscope mcp`: the engine in front of an MCP server that speaks stdio.

An MCP client starts `offscope mcp ... -- COMMAND`; offscope starts COMMAND
as its child and relays newline-delimited JSON-RPC both ways. Each client
message that holds a `tools/call` or `tools/list` request goes through the
same `Engine.begin` as an MCP request over HTTP (a transport-neutral
`HttpRequest` whose body is the message), so tagging, the policy's decision,
the operator-reply policy, friction, the trace and the metrics are the HTTP
proxy's own. Here, as in addon.py, nothing is tagged or decided: this module
only converts lines to the engine's types and applies what it returns.

Everything else passes through untouched: notifications, batches of them,
`initialize`, `ping`, responses the client sends to the server's own
requests (except its answers to `elicitation/create`, which are operator
replies: the reply policy applies), and every line the server writes. The child's stderr is the
wrapper's stderr; its exit code is the wrapper's; SIGINT and SIGTERM are
forwarded to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from offscope.proxy.engine import Engine, Exchange, Synthetic
from offscope.proxy.extract.http import HttpRequest, HttpResponse, JsonBody
from offscope.proxy.extract.input_rounds import ELICIT
from offscope.proxy.extract.mcp import ToolRegistry, id_key
from offscope.proxy.handlers.mcp import MCP
from offscope.proxy.stdio_prefetch import StdioListPrefetch

log = structlog.get_logger("offscope")

# Requests the engine needs to see: calls, and the listings whose tool
# annotations stage later calls. Any other method is protocol and never waits on it.
_INSPECTED = frozenset({"tools/call", "tools/list"})
_JSON = {"content-type": "application/json"}
CHUNK = 1024 * 1024  # an oversized line is relayed in pieces of this size
# The id of a request too long to parse, read where it is a member of the top-level
# object: first after "jsonrpc", or last before the closing brace (the Python SDK
# writes it last); a nested object's closing brace would be followed by another.
_ID = rb'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.)*")'
_HEAD_ID = re.compile(rb'\s*\{\s*"jsonrpc"\s*:\s*"2\.0"\s*,\s*' + _ID + rb"\s*[,}]")
_TAIL_ID = re.compile(_ID + rb'\s*(?:,\s*"jsonrpc"\s*:\s*"2\.0"\s*)?\}\s*$')


@dataclass
class _Waiting:
    """An exchange the engine records once the server has answered all its ids."""

    ex: Exchange
    ids: set[str]
    replies: list[bytes] = field(default_factory=list)


@dataclass
class Action:
    """What to do with one client line: send it (or a replacement) to the
    server, answer the client (after `delay`, the operator-reply wait), or both."""

    to_server: bytes | None = None
    to_client: bytes | None = None
    delay: float = 0.0


class StdioBridge:
    """Line-level logic, without I/O: the engine's view of one stdio session."""

    def __init__(self, engine: Engine, run_id: str, host: str = "") -> None:
        self.engine = engine
        self.run_id = run_id
        self.host = host  # the server's name as a host target ("": none; see docs/stdio-mcp.md)
        self.waiting: dict[str, _Waiting] = {}
        # offscope's own tools/list, before a call it has no annotations for
        self.prefetch = StdioListPrefetch(engine.tools, ToolRegistry.key(self.request(b"")))

    def request(self, body: bytes) -> HttpRequest:
        return HttpRequest(
            method="POST", host=self.host, path="/", scheme="stdio", headers=dict(_JSON), body=body
        )

    def from_client(self, line: bytes) -> Action:
        """One complete line from the client (its newline included)."""
        if not line.strip():
            return Action(to_server=line)  # blank: nothing a server reads
        req = self.request(line)
        # Read as an HTTP body is, to the byte (strict_json.py): a line offscope
        # cannot read completely, or that parsers could read two ways, is
        # decided by the engine like such a body, never relayed unseen.
        body = req.json_body()
        message = body.value
        items = message if isinstance(message, list) else [message]
        readings = (message, *body.other_readings)
        if (
            body.error is None
            and not any(_inspected(r) for r in readings)
            and not self._answers_a_question(message)
        ):
            return Action(to_server=line)  # protocol: initialize, notifications, responses
        inspected = [i for i in items if isinstance(i, dict) and i.get("method") in _INSPECTED]
        # A tools/call without an id is still a call (a server may run it): decided all the same.
        ids = [id_key(i["id"]) for i in inspected if "id" in i]
        try:
            ex, delay = self.engine.begin(req, self.run_id)
        except Exception as exc:  # as addon.request: record it, fail closed or open per the policy
            log.exception("flow_failed", run=self.run_id, error=str(exc))
            closed = self.engine.policy_for(self.run_id).policy.fail_closed
            self.engine.failed(
                req, self.run_id, f"{type(exc).__name__}: {exc}", forwarded=not closed
            )
            if not closed:
                return Action(to_server=line)
            return Action(
                to_client=_errors(
                    _request_ids(line, body),
                    -32603,
                    "offscope could not check this call; failing closed",
                )
            )
        if ex.synthetic is not None and ex.handler is not MCP:
            # Refused before any tool call was read (unreadable, ambiguous, the
            # run's budget spent): the JSON-RPC error the HTTP status stands for.
            return Action(to_client=_refusal(ex.synthetic, _request_ids(line, body)), delay=delay)
        if ex.synthetic is not None:  # offscope answers: nothing goes to the server
            return Action(to_client=ex.synthetic.body + b"\n", delay=delay)
        outgoing = ex.new_body + b"\n" if ex.new_body is not None else line
        if ids and ex.awaits_answer:
            wait = _Waiting(ex, set(ids))
            for key in ids:
                self.waiting[key] = wait
        else:  # nothing will answer it: recorded now
            self.engine.response(ex, None, _unanswered(ex, body))
        return Action(to_server=outgoing, delay=delay)

    def from_server(self, line: bytes) -> None:
        """One complete line from the server, after it went to the client:
        answers to exchanges the engine waits for are recorded, and a question the
        server asks the user (`elicitation/create`) is remembered for its answer."""
        if b'"id"' not in line or (not self.waiting and ELICIT.encode() not in line):
            return
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            return
        for item in message if isinstance(message, list) else [message]:
            if isinstance(item, dict) and item.get("method") == ELICIT and "id" in item:
                self._asked(item)
            if not isinstance(item, dict) or "method" in item or "id" not in item:
                continue  # a request or notification from the server
            wait = self.waiting.pop(id_key(item["id"]), None)
            if wait is None:
                continue
            wait.ids.discard(id_key(item["id"]))
            wait.replies.append(
                line if not isinstance(message, list) else json.dumps(item).encode()
            )
            if not wait.ids:
                self._record(wait)

    def _asked(self, request: dict[str, Any]) -> None:
        """An `elicitation/create` from the server: its answer will be an operator reply."""
        params = request.get("params") if isinstance(request.get("params"), dict) else {}
        question = str(params.get("message", "")) if isinstance(params, dict) else ""
        asking = [w.ex for w in self.waiting.values() if w.ex.calls]
        tool = asking[-1].calls[0].call.tool if asking else "?"
        self.engine.elicitations.asked(self._answer_key(request["id"]), question, tool)

    def _answer_key(self, request_id: Any) -> tuple[str, str, str]:
        return (ToolRegistry.key(self.request(b"")), "", id_key(request_id))

    def _answers_a_question(self, message: Any) -> bool:
        """A client line that answers an `elicitation/create` the server sent."""
        return (
            isinstance(message, dict)
            and "method" not in message
            and "id" in message
            and self._answer_key(message["id"]) in self.engine.elicitations
        )

    def _record(self, wait: _Waiting, error: str | None = None) -> None:
        body = (
            wait.replies[0]
            if len(wait.replies) == 1
            else b"[" + b",".join(r.strip() for r in wait.replies) + b"]"
        )
        try:
            self.engine.response(
                wait.ex, HttpResponse(200, dict(_JSON), body) if wait.replies else None, error
            )
        except Exception as exc:  # one bad record must not stop the relay
            log.exception("response_record_failed", run=self.run_id, error=str(exc))

    def oversized(self, size: int, forwarded: bool, head: bytes, tail: bytes) -> bytes | None:
        """A client line longer than offscope inspects: recorded as such (refused
        by a fail-closed policy, relayed uninspected otherwise). Returns the
        answer to a refused one when its id can be read from its first or last bytes."""
        ex, _ = self.engine.begin(self.request(b""), self.run_id, oversize=size, streamed=forwarded)
        if not ex.done:
            self.engine.response(
                ex, None, "relayed uninspected; the server's answer is not recorded"
            )
        found = _HEAD_ID.match(head) or _TAIL_ID.search(tail)
        if ex.synthetic is None:
            return None
        if found is None:  # JSON-RPC answers what it cannot read with id null
            return _refusal(ex.synthetic, [None])
        text = f"HTTP {ex.synthetic.status}: {ex.synthetic.body.decode()}"
        return (
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": json.loads(found.group(1)),
                    "result": {"content": [{"type": "text", "text": text}], "isError": True},
                }
            ).encode()
            + b"\n"
        )

    def abandon(self, error: str) -> None:
        """Record the exchanges still waiting when the server is gone."""
        for wait in {id(w): w for w in self.waiting.values()}.values():
            self._record(wait, error)
        self.waiting.clear()


def _unanswered(ex: Exchange, body: JsonBody) -> str | None:
    """Why a relayed exchange is recorded without the server's answer."""
    if body.error is not None:
        return "relayed uninspected; the server's answer is not recorded"
    return "a notification: no answer" if ex.calls else None


def _inspected(message: Any) -> bool:
    items = message if isinstance(message, list) else [message]
    return any(isinstance(i, dict) and i.get("method") in _INSPECTED for i in items)


def _request_ids(line: bytes, body: JsonBody) -> list[Any]:
    """The ids of the requests in a client line, to answer them: from its
    reading (a lenient one for a line offscope could not read), else where a
    request's id sits in its first or last bytes; [None] when none is found
    (JSON-RPC answers what it cannot read with id null)."""
    items = body.value if isinstance(body.value, list) else [body.value]
    ids = [i["id"] for i in items if isinstance(i, dict) and "id" in i and "method" in i]
    if ids or body.error is None:
        return ids
    found = _HEAD_ID.match(line[:4096]) or _TAIL_ID.search(line[-4096:])
    return [json.loads(found.group(1))] if found else [None]


def _errors(ids: list[Any], code: int, message: str, data: Any = None) -> bytes | None:
    """JSON-RPC error responses, one per id (a batch when several); None when
    there is nothing to answer (notifications only)."""
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    out = [{"jsonrpc": "2.0", "id": i, "error": error} for i in ids]
    if not out:
        return None
    return json.dumps(out[0] if len(out) == 1 else out).encode() + b"\n"


# JSON-RPC's codes for what offscope refuses before reading a call: a line it
# cannot parse completely is a parse error, any other refusal an invalid request.
_PARSE_ERROR, _INVALID_REQUEST = -32700, -32600


def _refusal(synthetic: Synthetic, ids: list[Any]) -> bytes | None:
    """An HTTP refusal (status and offscope's JSON body) as JSON-RPC errors."""
    try:
        data = json.loads(synthetic.body)
    except ValueError:
        data = {"error": synthetic.body.decode("utf-8", "replace")}
    code = _PARSE_ERROR if data.get("error") == "offscope_uninspectable" else _INVALID_REQUEST
    message = f"HTTP {synthetic.status}: {data.get('message', data.get('error', 'refused'))}"
    return _errors(ids, code, message, data)


# -- I/O ----------------------------------------------------------------------


async def _read_line(reader: asyncio.StreamReader) -> tuple[bytes, bool]:
    """(bytes, complete): a whole line, or, for a line longer than the reader's
    limit, its next piece (complete once a piece ends with the newline).
    b"" with complete=True is the end of the stream."""
    try:
        return await reader.readuntil(b"\n"), True
    except asyncio.IncompleteReadError as exc:  # the last line had no newline
        return exc.partial, True
    except asyncio.LimitOverrunError as exc:
        return await reader.read(max(exc.consumed, 1)), False


async def _stdin_reader(limit: int) -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit)
    try:
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    except ValueError:  # a regular file (tests, `< requests.jsonl`): read it in a thread

        def pump() -> None:
            for chunk in iter(lambda: os.read(sys.stdin.fileno(), CHUNK), b""):
                loop.call_soon_threadsafe(reader.feed_data, chunk)
            loop.call_soon_threadsafe(reader.feed_eof)

        threading.Thread(target=pump, name="offscope-stdin", daemon=True).start()
    return reader


class _ClientOut:
    """The client's side of stdout: whole lines, in order."""

    def __init__(self) -> None:
        self.writer: asyncio.StreamWriter | None = None
        self.lock = asyncio.Lock()

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(ValueError):  # a regular file: plain blocking writes
            transport, protocol = await loop.connect_write_pipe(
                asyncio.streams.FlowControlMixin, sys.stdout.buffer
            )
            self.writer = asyncio.StreamWriter(transport, protocol, None, loop)

    async def write(self, data: bytes) -> None:
        async with self.lock:
            if self.writer is None:
                sys.stdout.buffer.write(data)
                sys.stdout.buffer.flush()
                return
            self.writer.write(data)
            await self.writer.drain()


@dataclass
class StdioConfig:
    command: list[str]
    run_id: str
    host: str = ""
    max_line: int = 64 * 1024 * 1024
    on_started: Callable[[], None] | None = None


async def serve(engine: Engine, cfg: StdioConfig) -> int:
    """Run the child and relay until it exits; returns its exit code."""
    bridge = StdioBridge(engine, cfg.run_id, cfg.host)
    engine.start_run(cfg.run_id, {"transport": "stdio"})
    try:
        proc = await asyncio.create_subprocess_exec(
            *cfg.command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=None,
            limit=cfg.max_line,  # stderr: inherited, passes through as is
            # Its own process group: a terminal's Ctrl-C reaches it once, forwarded by us.
            start_new_session=True,
        )
    except OSError as exc:
        engine.end_run(
            cfg.run_id, "crash", detail=f"could not start {cfg.command[0]}: {exc.strerror or exc}"
        )
        raise
    loop = asyncio.get_running_loop()
    ending = _Ending()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, _forward(proc, sig, ending))
    out = _ClientOut()
    await out.open()
    if cfg.on_started:
        cfg.on_started()
    client = asyncio.ensure_future(_client_to_server(bridge, proc, out, cfg.max_line, ending))
    await _server_to_client(bridge, proc, out)
    code = await proc.wait()
    client.cancel()
    bridge.abandon("the server exited before answering")
    code = 128 - code if code < 0 else code  # killed by a signal: the shell's convention
    reason, detail = ending.reason(code)
    engine.end_run(cfg.run_id, reason, exit_code=code, detail=detail)
    engine.close()
    return code


@dataclass
class _Ending:
    """How the session ended, for the run's end record. An MCP client ends a
    stdio session by closing the server's stdin, then, if the server has not
    exited within a moment (the Python SDK waits 2 s), SIGTERM: that is an
    ordinary end, not a crash, whatever exit code the signal leaves."""

    client_closed: bool = False  # the client closed stdin
    signal_after_close: signal.Signals | None = None  # the first signal forwarded after that

    def reason(self, code: int) -> tuple[str, str | None]:
        if code == 0:
            return "exit", None
        if self.signal_after_close is not None:
            return "exit", (
                f"the client closed stdin, then sent {self.signal_after_close.name} "
                "(the MCP stdio shutdown)"
            )
        return "crash", None


def _forward(
    proc: asyncio.subprocess.Process, sig: signal.Signals, ending: _Ending
) -> Callable[[], None]:
    def send() -> None:
        if ending.client_closed and ending.signal_after_close is None:
            ending.signal_after_close = sig
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)

    return send


async def _client_to_server(
    bridge: StdioBridge,
    proc: asyncio.subprocess.Process,
    out: _ClientOut,
    max_line: int,
    ending: _Ending,
) -> None:
    assert proc.stdin is not None
    reader = await _stdin_reader(max_line)
    replies: set[asyncio.Future] = set()
    try:
        while True:
            data, complete = await _read_line(reader)
            if not data:
                ending.client_closed = True
                break
            if not complete:
                answer = await _oversized(bridge, proc, reader, data)
                if answer is not None:
                    await out.write(answer)
                continue
            if (ask := bridge.prefetch.wanted(data)) is not None:
                proc.stdin.write(ask)  # stage the call from the server's own annotations
                await proc.stdin.drain()
                await bridge.prefetch.wait()
            action = bridge.from_client(data)
            if action.to_client is not None:
                task = asyncio.ensure_future(_answer(out, action.to_client, action.delay))
                replies.add(task)
                task.add_done_callback(replies.discard)
            if action.to_server is not None:
                proc.stdin.write(action.to_server)
                await proc.stdin.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server is gone; its exit ends the session
    except Exception as exc:  # a relay failure must not leave the session hanging unexplained
        log.exception("stdio_relay_failed", run=bridge.run_id, error=str(exc))
    finally:
        with contextlib.suppress(Exception):
            proc.stdin.close()  # the client closed its side: the MCP way to ask the server to exit


async def _answer(out: _ClientOut, data: bytes, delay: float) -> None:
    if delay:
        await asyncio.sleep(delay)  # the agent waits for this reply, other messages don't
    await out.write(data)


async def _oversized(
    bridge: StdioBridge,
    proc: asyncio.subprocess.Process,
    reader: asyncio.StreamReader,
    first: bytes,
) -> bytes | None:
    """A line longer than offscope inspects: relayed piece by piece (fail open)
    or dropped (fail closed), in bounded memory either way."""
    assert proc.stdin is not None
    forward = not bridge.engine.policy_for(bridge.run_id).policy.fail_closed
    size, piece, complete, tail = 0, first, False, b""
    while True:
        size += len(piece)
        tail = (tail + piece)[-4096:]
        if forward:
            proc.stdin.write(piece)
            await proc.stdin.drain()
        if complete or not piece:
            break
        piece, complete = await _read_line(reader)
    return bridge.oversized(size, forward, first[:4096], tail)


async def _server_to_client(
    bridge: StdioBridge, proc: asyncio.subprocess.Process, out: _ClientOut
) -> None:
    assert proc.stdout is not None
    while True:
        data, complete = await _read_line(proc.stdout)
        if not data:
            return
        if complete and bridge.prefetch.reply(data):
            continue  # the answer to offscope's own tools/list: learnt, not the client's
        try:
            await out.write(data)
        except (BrokenPipeError, ConnectionResetError):
            continue  # the client left; keep draining until the server exits
        if complete:
            bridge.from_server(data)
