"""Whether a destination is this machine, however it is spelled.

The proxy must never forward to its own listen or control/metrics ports: an
agent that reached the control API could end or impersonate runs. Spellings
are compared after resolution, not as strings, because resolvers accept many:
`127.1`, `0x7f000001`, `2130706433`, `0`, `[::ffff:127.0.0.1]`, `LOCALHOST.`.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import socket

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@functools.lru_cache(maxsize=1024)
def is_local(host: str) -> bool:
    """Whether a destination is this machine, however it is spelled: `127.1`,
    `0x7f000001`, `2130706433`, `0`, `[::ffff:127.0.0.1]`, `LOCALHOST.`, a name
    that resolves to loopback, or one of this machine's own addresses."""
    return any(_is_own_address(ip) for ip in _addresses(host.strip("[]").rstrip(".")))


def _addresses(host: str) -> list[Address]:
    with contextlib.suppress(ValueError):
        return [ipaddress.ip_address(host)]
    with contextlib.suppress(OSError):  # the legacy IPv4 forms a resolver accepts
        return [ipaddress.IPv4Address(socket.inet_aton(host))]
    try:  # a name: what the proxy would connect to
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return []
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]


def _is_own_address(ip: Address) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_unspecified or ip in _machine_addresses()


@functools.cache
def _machine_addresses() -> frozenset[Address]:
    with contextlib.suppress(OSError):
        return frozenset(_addresses(socket.gethostname()))
    return frozenset()
