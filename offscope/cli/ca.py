"""`offscope ca`: where the CA bundle is and how to make clients trust it."""

from __future__ import annotations

import argparse

from offscope.cli._parsers import add_command
from offscope.cli.proxy import add_confdir_argument
from offscope.proxy.client_env import ca_variables, export_lines, proxy_variables
from offscope.proxy.mitm.ca import ensure_ca


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub,
        "ca",
        help="print the CA bundle path and the environment a client needs",
        description="Print the path of the proxy's CA certificate (created on first use) and "
        "the environment lines that make common clients trust it. With --proxy, also the "
        "proxy variables in both spellings (curl reads only the lower-case http_proxy for "
        "http:// URLs) and an empty NO_PROXY, so that no inherited exclusion lets a client "
        "go around the proxy.",
        epilog='examples:\n  eval "$(offscope ca)"                                   # trust the CA\n'
        '  eval "$(offscope ca --proxy 127.0.0.1:8080 --run run-1)"  # trust it and use the proxy',
    )
    add_confdir_argument(p)
    p.add_argument("--path", action="store_true", help="print only the certificate path")
    p.add_argument(
        "--proxy",
        metavar="HOST:PORT",
        help="also print the proxy variables for a proxy listening here (default: not printed)",
    )
    p.add_argument(
        "--run",
        default="run-1",
        metavar="RUN_ID",
        help="with --proxy: the run id, sent as the proxy user name (default run-1)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cert = ensure_ca(args.confdir)
    if args.path:
        print(cert)
        return 0
    variables = ca_variables(cert)
    if args.proxy:
        variables |= proxy_variables(f"http://{args.run}:x@{args.proxy}")
    print("\n".join(export_lines(variables)))
    return 0
