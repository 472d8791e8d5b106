"""A deep accept queue for mitmproxy's listeners.

mitmproxy listens with asyncio's default backlog of 100 connections. When more clients than
that connect while the proxy's event loop is busy (a pool of agents starting at once, a grid's
hundreds of trajectories), the kernel's accept queue overflows and drops their SYNs; a client
resends its SYN after a second, then two, four..., so its request stalls for seconds although
nothing failed. Measured on a 1,512-trajectory grid (2 processes of 512 agents): ~1,500 accept
queue overflows and ~850 SYN retransmits per run; none with the deeper queue.

listen() on a socket that is already listening sets a new backlog (POSIX), so once mitmproxy
listens, each of its TCP listening sockets gets the sidecar's own listeners' ACCEPT_BACKLOG
(offscope/proxy/listener.py; the kernel caps it at net.core.somaxconn).
"""

from __future__ import annotations

from typing import Any

from offscope.proxy.listener import ACCEPT_BACKLOG


def deepen_accept_queues(proxyserver: Any) -> None:
    """Give every TCP listener of mitmproxy's `proxyserver` addon ACCEPT_BACKLOG. mitmproxy 11
    keeps a mode's asyncio servers in `ServerInstance._servers` (no public accessor); a UDP
    server there has no `sockets` and is left alone."""
    if proxyserver is None:  # no listeners: the addon outside a proxy (taddons in tests)
        return
    for instance in proxyserver.servers:
        for server in getattr(instance, "_servers", ()):
            for listening in getattr(server, "sockets", ()):
                # dup(): asyncio's TransportSocket has no listen(); the duplicate shares the
                # listening socket, so closing it leaves the listener open.
                with listening.dup() as sock:
                    sock.listen(ACCEPT_BACKLOG)
