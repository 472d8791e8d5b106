"""`offscope ca`: where the CA bundle is and how to make clients trust it."""

from __future__ import annotations

import argparse

from offscope.proxy import DEFAULT_CONFDIR
from offscope.proxy.ca import ensure_ca


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ca",
        help="print the CA bundle path and the environment a client needs",
        description="Print the path of the proxy's CA certificate (created on first use) and "
        "the environment lines that make common clients trust it.",
        epilog='example:  eval "$(offscope ca)"   # then run the agent in this shell',
    )
    p.add_argument(
        "--confdir", default=str(DEFAULT_CONFDIR), help=f"CA directory (default {DEFAULT_CONFDIR})"
    )
    p.add_argument("--path", action="store_true", help="print only the certificate path")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cert = ensure_ca(args.confdir)
    if args.path:
        print(cert)
        return 0
    for var in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "CURL_CA_BUNDLE"):
        print(f"export {var}={cert}")
    return 0
