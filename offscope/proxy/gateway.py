"""Gateway (reverse-proxy) mode: named upstreams at URLs of the proxy's own.

Many MCP clients take a server URL and never read `HTTPS_PROXY`. For them `offscope
proxy --gateway tickets=https://mcp.tickets.example --gateway-listen 127.0.0.1:8081`
serves `http://127.0.0.1:8081/tickets/...` and forwards it to
`https://mcp.tickets.example/...`: the client is configured with the gateway URL, and
each request is then tagged, decided, recorded and metered exactly as the forward
proxy does it, under the upstream's host (the ledger names the real server).

mitmproxy's reverse mode listens; `rewrite` turns a request that arrived on it into
the request for its upstream before anything else reads it. The run comes from the
run header or the run-credential header, as in forward mode, or, for a client that
can be given nothing but a URL, from a first path segment `@RUN:CREDENTIAL`
(`http://127.0.0.1:8081/@run-1a2b:CREDENTIAL/tickets/mcp`): it is read as the
run-credential header would be and never sent upstream.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from offscope.errors import InputError

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_.")


@dataclass(frozen=True, slots=True)
class Upstream:
    scheme: str
    host: str
    port: int
    base_path: str  # the upstream URL's path, without a trailing slash

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        return self.host if self.port == default else f"{self.host}:{self.port}"


def parse_gateways(spec: str) -> dict[str, Upstream]:
    """'tickets=https://mcp.tickets.example,git=http://git.internal:8000/mcp' -> map."""
    out: dict[str, Upstream] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, url = item.partition("=")
        name = name.strip().lower()
        parts = urlsplit(url.strip())
        if not name or not set(name) <= _NAME_CHARS:
            raise InputError(
                f"bad gateway name in {item!r}",
                hint="use --gateway NAME=URL with NAME made of letters, digits, '-', '_', '.'",
            )
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query:
            raise InputError(
                f"bad gateway URL in {item!r}",
                hint="use --gateway NAME=https://host[:port][/path] (no query)",
            )
        if name in out:
            raise InputError(f"gateway {name!r} is given twice", hint="one URL per name")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        out[name] = Upstream(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))
    return out


def route(gateways: dict[str, Upstream], path: str) -> tuple[Upstream, str, str | None] | None:
    """The upstream a gateway path names, the path to request there, and the run
    credential (`RUN:CREDENTIAL`) a leading `@...` segment gave:
    `/@run-1:c/tickets/mcp?x=1` -> (tickets, `<base>/mcp?x=1`, "run-1:c");
    None for no known name."""
    if not path.startswith("/"):
        return None
    credential = None
    if path.startswith("/@"):
        credential, _, path = path[2:].partition("/")
        path = "/" + path
        credential = unquote(credential)
    name, slash, rest = path[1:].partition("/")
    name, query_mark, query = name.partition("?")
    upstream = gateways.get(name.lower())
    if upstream is None:
        return None
    tail = f"{slash}{rest}" if slash else ""
    target = upstream.base_path + tail or "/"
    return upstream, target + (f"?{query}" if query_mark else ""), credential
