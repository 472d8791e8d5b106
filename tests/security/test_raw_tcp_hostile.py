"""Raw TCP through a real `offscope proxy`: a CONNECT tunnel whose bytes are
neither TLS nor HTTP goes to mitmproxy's TCP layer, where no HTTP or WebSocket
hook sees them. Such a stream is a call to its destination that offscope
cannot read: the policy decides it, then `on_error` (closed: the proxy never
connects; open: relayed and recorded). The server records every byte it got.
"""

from __future__ import annotations

import base64
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from tests.support.sidecar_kit import ProxyProcess, events, of_type

pytestmark = pytest.mark.timeout(120)

LEDGER = """\
schema: offscope.ledger/1
id: raw-tcp
targets:
  hosts: [127.0.0.1]
"""
OPEN_POLICY = """\
schema: offscope.policy/1
id: enforce-open
mode: enforce
block_at: act
on_error: open
"""


@dataclass
class TcpRecorder:
    """Accepts connections on 127.0.0.1 and keeps every byte received."""

    received: list[bytes] = field(default_factory=list)
    connections: int = 0

    def __post_init__(self) -> None:
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
            self.connections += 1
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        with conn:
            while chunk := conn.recv(65536):
                self.received.append(chunk)

    def got(self, marker: bytes) -> bool:
        return marker in b"".join(self.received)


@dataclass
class World:
    server: TcpRecorder
    enforce: ProxyProcess
    open: ProxyProcess


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, confdir: str) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("raw-tcp")
    ledger, policy = tmp / "ledger.yaml", tmp / "enforce-open.yaml"
    ledger.write_text(LEDGER, encoding="utf-8")
    policy.write_text(OPEN_POLICY, encoding="utf-8")
    server = TcpRecorder()
    enforce = ProxyProcess(tmp, ledger=str(ledger), policy="enforce", confdir=confdir, name="e")
    open_ = ProxyProcess(tmp, ledger=str(ledger), policy=str(policy), confdir=confdir, name="o")
    with enforce, open_:
        yield World(server, enforce, open_)
    server.sock.close()


def tunnel(proxy: ProxyProcess, run: str, authority: str, payload: bytes) -> None:
    """CONNECT AUTHORITY through the proxy, then raw bytes (no TLS, no HTTP)."""
    auth = base64.b64encode(f"{run}:x".encode()).decode()
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.sendall(
            f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n"
            f"Proxy-Authorization: Basic {auth}\r\n\r\n".encode()
        )
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        with contextlib.suppress(OSError):
            sock.sendall(payload)
            time.sleep(0.5)


def recorded(proxy: ProxyProcess, run: str) -> dict:
    deadline = time.monotonic() + 10
    while not (found := of_type(events(proxy.trace), "tool_call", run)):
        assert time.monotonic() < deadline, "no record of the stream"
        time.sleep(0.05)
    (call,) = found
    return call


def test_raw_tcp_is_refused_when_closed(world: World) -> None:
    """In scope (the ledger names 127.0.0.1), but unreadable: never connected."""
    before = world.server.connections
    tunnel(world.enforce, "tcp-closed", f"127.0.0.1:{world.server.port}", b"\x01tcp-closed 9999")
    time.sleep(0.2)
    assert not world.server.got(b"tcp-closed") and world.server.connections == before
    call = recorded(world.enforce, "tcp-closed")
    assert call["decision"] == "block" and call["call"]["method"] == "TCP"
    assert call["call"]["scope"] == "in" and call["reason"] == "raw TCP stream (on_error: closed)"


def test_raw_tcp_out_of_scope_is_blocked_even_when_open(world: World) -> None:
    """`localhost` is not a host the ledger names: an act on it is blocked."""
    tunnel(world.open, "tcp-out", f"localhost:{world.server.port}", b"\x01tcp-out 9999")
    time.sleep(0.2)
    assert not world.server.got(b"tcp-out")
    call = recorded(world.open, "tcp-out")
    assert call["decision"] == "block" and call["call"]["scope"] == "out"
    assert call["call"]["stage"] == "act"


def test_raw_tcp_in_scope_is_relayed_and_recorded_when_open(world: World) -> None:
    tunnel(world.open, "tcp-open", f"127.0.0.1:{world.server.port}", b"\x01tcp-open")
    deadline = time.monotonic() + 5
    while not world.server.got(b"tcp-open") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert world.server.got(b"tcp-open")
    call = recorded(world.open, "tcp-open")
    assert call["decision"] == "allow"
    assert any("relayed (on_error: open)" in n for n in call["call"]["notes"])
