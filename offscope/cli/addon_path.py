"""`offscope addon-path`: the addon file for a stock mitmproxy (`mitmdump -s`)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "addon-path",
        help="print the addon file to load into a stock mitmproxy",
        description="Print the path of offscope's mitmproxy addon script.",
        epilog='example:  mitmdump -s "$(offscope addon-path)" --set connection_strategy=lazy '
        "--set offscope_ledger=ledger.yaml --set offscope_trace=trace.jsonl",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import offscope.proxy.mitm.mitmdump_addon as script

    print(Path(script.__file__).resolve())
    return 0
