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

from offscope.errors import InputError

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


def parse_listen(spec: str, flag: str) -> tuple[str, int]:
    """A listen address, `HOST:PORT` or `[IPV6]:PORT` (an empty host is
    127.0.0.1), as (host, port); a malformed one is an InputError naming `flag`.

    An IPv6 address must be bracketed: in `::1:9464` the port cannot be told
    apart from the address's last group."""
    hint = "HOST:PORT or [IPv6]:PORT, e.g. 127.0.0.1:9464 or [::1]:9464"
    if spec.startswith("["):
        inside, bracket, rest = spec[1:].partition("]")
        host, colon, port = inside, rest[:1], rest[1:]
        if not bracket or colon != ":" or not _is_ipv6(host):
            raise InputError(f"{flag} {spec!r} is not [IPv6]:PORT", hint=hint)
    else:
        host, colon, port = spec.rpartition(":")
        if ":" in host:
            raise InputError(
                f"{flag} {spec!r}: an IPv6 address needs brackets", hint=f"e.g. [{host}]:{port}"
            )
        if not colon:
            raise InputError(f"{flag} {spec!r} is not HOST:PORT", hint=hint)
    if not port.isdigit() or int(port) > 65535:
        raise InputError(f"{flag} {spec!r}: the port must be a number from 0 to 65535", hint=hint)
    return host or "127.0.0.1", int(port)


def format_listen(host: str, port: int) -> str:
    """`host:port` for a URL: an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _is_ipv6(host: str) -> bool:
    try:
        ipaddress.IPv6Address(host.split("%")[0])
    except ValueError:
        return False
    return True
