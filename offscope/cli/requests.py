"""`offscope requests`: the scope-expansion requests that blocked calls produced."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from offscope.errors import InputError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("requests", help="list scope-expansion requests written by enforce mode",
                       description="A run that needs an unnamed target produces a request, not a decision. "
                                   "List them for review.",
                       epilog="example:  offscope requests list --log offscope-trace.requests.jsonl")
    p.add_argument("action", choices=["list"], nargs="?", default="list")
    p.add_argument("--log", default="offscope-trace.requests.jsonl", help="request log (JSONL)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def read_requests(path: str | Path) -> list[dict]:
    out = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InputError(f"cannot read request log: {exc.strerror}", path=str(path)) from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            raise InputError("not a JSON line", path=str(path), line=number) from None
    return out


def run(args: argparse.Namespace) -> int:
    reqs = read_requests(args.log)
    if args.json:
        print(json.dumps(reqs, indent=2, sort_keys=True))
        return 0
    table = Table(title=f"scope-expansion requests ({len(reqs)})")
    for col in ("id", "run", "ledger", "step", "stage", "tool", "targets", "status"):
        table.add_column(col)
    for r in reqs:
        table.add_row(r["id"], r["run"], r["ledger"], str(r.get("step")), r.get("stage", ""),
                      f"{r.get('method') or ''} {r.get('url') or r.get('tool')}".strip(),
                      ", ".join(r.get("targets", [])), r.get("status", "pending"))
    Console().print(table)
    return 0
