"""WebSocket pieces for hostile tests: a loopback server that records every
message it received, and a client that writes exact frames through the proxy.

The server is starlette under uvicorn (wsproto, permessage-deflate on). Its
`/ws` route records and echoes; its `/mcp` route is the official MCP SDK's
WebSocket transport in front of a FastMCP server whose tools record each run.

The client speaks to the proxy on a raw socket: wsproto does the handshake and
reads what comes back; frames are written by `frame()` below, so a test can
send what no well-behaved library would (fragments, RSV1-compressed
payloads, text that is not UTF-8).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import wsproto
import wsproto.events as ws
from wsproto.extensions import PerMessageDeflate

from tests.support.sidecar_kit import AsgiServer

TEXT, BINARY, CONTINUATION = 0x1, 0x2, 0x0


@dataclass
class Received:
    """What the server received on one route, in order."""

    messages: list[tuple[str, str | bytes]] = field(default_factory=list)  # (path, data)
    closes: list[tuple[str, int]] = field(default_factory=list)  # (path, close code)
    tool_runs: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # MCP tools run
    lock: threading.Lock = field(default_factory=threading.Lock)

    def data(self, path: str = "/ws") -> list[str | bytes]:
        with self.lock:
            return [d for p, d in self.messages if p == path]

    def contains(self, marker: str) -> bool:
        """Whether any message the server received carries `marker`."""
        needle = marker.encode()
        with self.lock:
            return any(
                needle in (d if isinstance(d, bytes) else d.encode()) for _, d in self.messages
            )


def recording_app(seen: Received) -> Any:
    import warnings

    from mcp.server.fastmcp import FastMCP
    from mcp.server.websocket import websocket_server
    from mcp.types import ToolAnnotations
    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute
    from starlette.websockets import WebSocket

    mcp = FastMCP("crm-ws")

    @mcp.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def lookup_customer(customer_id: int) -> str:
        """Read one customer."""
        seen.tool_runs.append(("lookup_customer", {"customer_id": customer_id}))
        return f"customer {customer_id}"

    @mcp.tool()
    def delete_customer(customer_id: int) -> str:
        """Delete one customer."""
        seen.tool_runs.append(("delete_customer", {"customer_id": customer_id}))
        return f"deleted {customer_id}"

    @mcp.tool()
    def ask_human(question: str) -> str:
        """Ask the operator."""
        seen.tool_runs.append(("ask_human", {"question": question}))
        return "a real human says: not today"

    async def echo(socket_: WebSocket) -> None:
        await socket_.accept()
        while True:
            message = await socket_.receive()
            if message["type"] == "websocket.disconnect":
                with seen.lock:
                    seen.closes.append(("/ws", int(message.get("code") or 0)))
                return
            text = message.get("text")
            data: str | bytes = text if text is not None else message["bytes"]
            with seen.lock:
                seen.messages.append(("/ws", data))
            await socket_.send_text(json.dumps({"ok": True, "size": len(data)}))

    async def mcp_route(scope: Any, receive: Any, send: Any) -> None:
        async def recorded() -> Any:  # every message the SDK transport reads, as it got it
            message = await receive()
            if message["type"] == "websocket.receive":
                data = message.get("text") if message.get("text") is not None else message["bytes"]
                with seen.lock:
                    seen.messages.append(("/mcp", data))
            return message

        with warnings.catch_warnings():  # deprecated by the SDK, still what MCP-over-WS servers run
            warnings.simplefilter("ignore", DeprecationWarning)
            transport = websocket_server(scope, recorded, send)
        async with transport as (read, write):
            server = mcp._mcp_server
            await server.run(read, write, server.create_initialization_options())

    class McpApp:  # an ASGI app, not a starlette endpoint: the SDK transport reads the scope
        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            await mcp_route(scope, receive, send)

    return Starlette(routes=[WebSocketRoute("/ws", echo), WebSocketRoute("/mcp", McpApp())])


def start_server() -> tuple[AsgiServer, Received]:
    seen = Received()
    return AsgiServer(recording_app(seen), "ws-recording").start(), seen


def frame(opcode: int, payload: bytes, *, fin: bool = True, rsv1: bool = False) -> bytes:
    """One client frame (masked, as RFC 6455 requires of a client)."""
    head = bytes([(0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 1 << 16:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", n)
    mask = os.urandom(4)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def deflated(payload: bytes) -> bytes:
    """A permessage-deflate message body (RFC 7692: raw deflate, tail removed)."""
    comp = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, -15)
    data = comp.compress(payload) + comp.flush(zlib.Z_SYNC_FLUSH)
    assert data.endswith(b"\x00\x00\xff\xff")
    return data[:-4]


class WsClient:
    """One WebSocket through the proxy: ws://HOST{path} as an absolute-form upgrade."""

    def __init__(
        self,
        proxy_port: int,
        run: str,
        host: str,
        path: str,
        *,
        deflate: bool = False,
        credential: str = "x",
    ) -> None:
        self.conn = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
        self.sock = socket.create_connection(("127.0.0.1", proxy_port), timeout=10)
        self.texts: list[str] = []
        self.close_code: int | None = None
        self.status = 0
        self.extensions: list[str] = []
        auth = base64.b64encode(f"{run}:{credential}".encode())
        request = ws.Request(
            host=host,
            target=f"http://{host}{path}",
            extra_headers=[(b"proxy-authorization", b"Basic " + auth)],
            extensions=[PerMessageDeflate()] if deflate else [],
            subprotocols=["mcp"] if path == "/mcp" else [],
        )
        self.sock.sendall(self.conn.send(request))
        self._pump(lambda: self.status != 0)

    def _pump(self, done: Any, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline and self.close_code is None:
            self.sock.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                break
            self.conn.receive_data(data or None)
            for event in self.conn.events():
                if isinstance(event, ws.AcceptConnection):
                    self.status = 101
                    self.extensions = [e.name for e in event.extensions]
                elif isinstance(event, ws.RejectConnection):
                    self.status = event.status_code
                elif isinstance(event, ws.TextMessage):
                    self.texts.append(event.data)
                elif isinstance(event, ws.CloseConnection):
                    self.close_code = event.code
            if not data:
                if self.close_code is None:
                    self.close_code = 1006
                break

    def send_raw(self, *frames: bytes) -> None:
        self.sock.sendall(b"".join(frames))

    def send(self, payload: bytes | str, *, binary: bool = False) -> None:
        data = payload.encode() if isinstance(payload, str) else payload
        self.send_raw(frame(BINARY if binary else TEXT, data))

    def send_fragments(self, parts: list[bytes], *, binary: bool = False) -> None:
        first = BINARY if binary else TEXT
        self.send_raw(
            *(
                frame(first if i == 0 else CONTINUATION, part, fin=i == len(parts) - 1)
                for i, part in enumerate(parts)
            )
        )

    def send_compressed(self, payload: bytes, *, binary: bool = False, fragments: int = 1) -> None:
        """A permessage-deflate message (RSV1 on its first frame), in `fragments` frames."""
        data = deflated(payload)
        step = max(1, -(-len(data) // fragments))
        parts = [data[i : i + step] for i in range(0, len(data), step)] or [b""]
        first = BINARY if binary else TEXT
        self.send_raw(
            *(
                frame(
                    first if i == 0 else CONTINUATION,
                    part,
                    fin=i == len(parts) - 1,
                    rsv1=i == 0,
                )
                for i, part in enumerate(parts)
            )
        )

    def wait_texts(self, n: int, timeout: float = 10.0) -> list[str]:
        self._pump(lambda: len(self.texts) >= n, timeout)
        return self.texts

    def wait_closed(self, timeout: float = 10.0) -> int | None:
        self._pump(lambda: self.close_code is not None, timeout)
        return self.close_code

    def rpc(self, message: dict[str, Any], timeout: float = 10.0) -> dict[str, Any] | None:
        """Send one JSON-RPC request, return the message answering its id (None: none came)."""
        start = len(self.texts)
        self.send(json.dumps(message))

        def answer() -> dict[str, Any] | None:
            for text in self.texts[start:]:
                found = json.loads(text)
                if isinstance(found, dict) and found.get("id") == message.get("id"):
                    return found
            return None

        self._pump(lambda: answer() is not None, timeout)
        return answer()

    def close(self) -> None:
        try:
            self.sock.sendall(self.conn.send(ws.CloseConnection(code=1000)))
            self._pump(lambda: self.close_code is not None, 2)
        except (OSError, wsproto.utilities.LocalProtocolError):
            pass
        self.sock.close()

    def __enter__(self) -> WsClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class RawUpgradeServer:
    """Answers every request with `101 Switching Protocols` to whatever Upgrade it
    asked for, then records every byte that follows (a server of a protocol
    offscope does not read)."""

    def __init__(self) -> None:
        self.heads: list[bytes] = []
        self.after: list[bytes] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                head += chunk
            head, _, rest = head.partition(b"\r\n\r\n")
            self.heads.append(head)
            upgrade = next(
                (
                    line.split(b":", 1)[1].strip()
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"upgrade:")
                ),
                b"foo",
            )
            conn.sendall(
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: "
                + upgrade
                + b"\r\nConnection: Upgrade\r\n\r\n"
            )
            if rest:
                self.after.append(rest)
            while chunk := conn.recv(65536):
                self.after.append(chunk)

    def received_after(self, marker: bytes) -> bool:
        return any(marker in chunk for chunk in self.after)

    def stop(self) -> None:
        self.sock.close()
