"""Connections that arrive while the proxy's loop is busy wait in the kernel's accept queue
(offscope/proxy/mitm/backlog.py) instead of being dropped and retried a second later."""

from __future__ import annotations

import asyncio
import select
import socket
import threading
import time

CLIENTS = 300  # three times asyncio's default backlog of 100


def _handshakes(port: int, done: list[int], started: threading.Event) -> None:
    """Open CLIENTS connections at once and count those the kernel completes within a
    second (a dropped SYN is resent only after one)."""
    socks = []
    for _ in range(CLIENTS):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        socks.append(s)
    started.set()
    pending, connected = set(socks), 0
    deadline = time.monotonic() + 1.0
    while pending and time.monotonic() < deadline:
        _, writable, _ = select.select([], list(pending), [], 0.1)
        for s in writable:
            pending.discard(s)
            connected += s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
    done.append(connected)
    for s in socks:
        s.close()


async def test_a_burst_of_connections_to_a_busy_proxy_is_queued_not_dropped(embedded) -> None:
    async with embedded() as e:
        done: list[int] = []
        started = threading.Event()
        client = threading.Thread(target=_handshakes, args=(e.p.port, done, started))
        client.start()
        started.wait(30)
        time.sleep(1.5)  # the proxy's loop (this one) accepts nothing meanwhile
        client.join(30)
        await asyncio.sleep(0.2)  # then it accepts the queue, and the clients hang up
    # With mitmproxy's own backlog of 100 about 101 get through; the rest wait for a resend.
    assert done == [CLIENTS]
