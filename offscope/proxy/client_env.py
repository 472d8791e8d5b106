"""The environment that points a client at the proxy, in one place.

Clients disagree on which spelling they read: curl ignores the upper-case
`HTTP_PROXY` for http:// URLs (the "httpoxy" CGI guard) and reads only
`http_proxy`; Python's requests and httpx read both; Go reads both. An
inherited `NO_PROXY` (often `localhost,127.0.0.1` on developer machines and in
container images) would let an agent reach loopback tools around the proxy,
unrecorded, so it is set empty on purpose. Every command that prints or sets a
client's environment (`offscope ca`, `offscope runs start --env`, the proxy's
banner, the grid's agent commands) takes it from here.
"""

from __future__ import annotations

import shlex
from pathlib import Path

# Variables that make the common clients trust the proxy's CA.
CA_VARIABLES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "CURL_CA_BUNDLE")


def proxy_variables(proxy_url: str) -> dict[str, str]:
    """Both spellings of the proxy variables, and an empty NO_PROXY (nothing goes around)."""
    return {
        "HTTPS_PROXY": proxy_url,
        "HTTP_PROXY": proxy_url,
        "https_proxy": proxy_url,
        "http_proxy": proxy_url,
        "NO_PROXY": "",
        "no_proxy": "",
    }


def ca_variables(cert: str | Path) -> dict[str, str]:
    """The variables that make curl, requests, httpx, OpenSSL and Node trust `cert`."""
    return {name: str(cert) for name in CA_VARIABLES}


def export_lines(variables: dict[str, str]) -> list[str]:
    """`export NAME=VALUE` lines for `eval "$(...)"`, quoted for any shell value."""
    return [f"export {name}={shlex.quote(value)}" for name, value in variables.items()]


def inline(variables: dict[str, str]) -> str:
    """`NAME=VALUE ...` on one line, to put in front of a command."""
    return " ".join(f"{name}={shlex.quote(value)}" for name, value in variables.items())
