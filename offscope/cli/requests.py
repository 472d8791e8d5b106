"""`offscope requests`: review the scope-expansion requests that blocked calls produced."""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from offscope.cli._parsers import add_command
from offscope.policies import requests as reqs
from offscope.proxy import DEFAULT_REQUESTS
from offscope.trace.request_context import run_context

if TYPE_CHECKING:
    from offscope.ledgers.model import Grant
    from offscope.state.review import ReviewStore

EPILOG = """\
examples:
  offscope requests list --log trace.requests.jsonl
  offscope requests show req-1a2b3c4d5e6f --trace trace.jsonl      # with the run's brief and steps
  offscope requests approve req-1a2b3c4d5e6f --ledger ledger.yaml --approver alice@acme.test --expires 8h \\
      --reason "ticket OPS-42: mirror is the sanctioned fallback this week"
  offscope requests deny req-1a2b3c4d5e6f --approver alice@acme.test --reason "use the primary"

A fleet (proxies started with --state postgresql://...) has one review queue in
its store; give the same URL here, and no --log or --ledger:
  offscope requests list --state postgresql://offscope@db.internal/offscope
  offscope requests approve req-1a2b3c4d5e6f --state postgresql://... --approver alice@acme.test
  offscope requests export --state postgresql://... --ledger ledger.yaml   # grants as YAML, for GitOps

An approval is bound to the exact target, tool and argument digest of the
request and (unless --scope ledger) to the run that asked, names its approver
and expires; a call the proxy holds (policy on_out_of_scope: hold) is released
the moment it is approved, or refused with a 403 the moment it is denied; it is written to the ledger's grants
overlay (ledger.grants.yaml), which a running proxy picks up within seconds.
Calls it lets through record the grant id in the trace.
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub,
        "requests",
        help="review scope-expansion requests: list, show, approve, deny",
        description="A run that needs an unnamed target produces a request, not a decision. "
        "Review them here; approvals become expiring, attributable grants.",
        epilog=EPILOG,
    )
    p.add_argument(
        "action",
        choices=["list", "show", "approve", "deny", "export"],
        nargs="?",
        default="list",
        help="export (with --state): write the store's grants of --ledger's ledger to its "
        "grants file (LEDGER.grants.yaml), a reviewable copy",
    )
    p.add_argument("request_id", nargs="?", help="request id (show, approve, deny)")
    p.add_argument(
        "--log",
        default=str(DEFAULT_REQUESTS),
        help=f"request log (JSONL; default {DEFAULT_REQUESTS}, where the proxy writes it "
        "beside its default trace)",
    )
    p.add_argument(
        "--state",
        default=None,
        metavar="URL",
        help="a fleet's state store (postgresql://...): its review queue instead of a request log",
    )
    p.add_argument("--trace", default=None, help="trace file, for the run's context (show, list)")
    p.add_argument("--ledger", default=None, help="the ledger the grant extends (approve)")
    p.add_argument("--approver", default="", help="who decides (required for approve and deny)")
    p.add_argument("--expires", default="24h", help="grant lifetime: 30m, 8h, 7d (default 24h)")
    p.add_argument(
        "--scope",
        choices=["run", "ledger"],
        default="run",
        help="approve: the grant applies only to the run that asked (run, the default) "
        "or to every run of the ledger",
    )
    p.add_argument("--reason", default="", help="why (recorded with the decision)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from offscope.errors import InputError

    # Targets, tools and URLs are the agent's text: never markup, never emoji codes.
    console = Console(emoji=False, highlight=False)
    if args.action in ("show", "approve", "deny") and not args.request_id:
        raise InputError(
            f"`offscope requests {args.action}` needs a request id", hint="offscope requests list"
        )
    store = _review_store(args.state) if args.state else None
    if args.action == "export":
        return _export(store, args.ledger, console)
    if args.action == "approve" and store is not None:
        _print_grants(
            console,
            store.approve(
                args.request_id, args.approver, args.expires, args.reason, scope=args.scope
            ),
        )
        return 0
    if args.action == "approve":
        if not args.ledger:
            raise InputError(
                "approve needs --ledger (the ledger whose grants overlay gets the grant)"
            )
        grants = reqs.approve(
            args.log,
            args.request_id,
            args.ledger,
            args.approver,
            args.expires,
            args.reason,
            scope=args.scope,
        )
        _print_grants(console, grants)
        return 0
    if args.action == "deny":
        if not args.approver.strip():
            raise InputError("--approver is required: a decision names the human who made it")
        if store is not None:
            store.deny(args.request_id, args.approver, args.reason)
        else:
            reqs.deny(args.log, args.request_id, args.approver, args.reason)
        console.print(escape(f"denied {args.request_id}"))
        return 0
    requests, decisions = store.read() if store is not None else reqs.read_log(args.log)
    if args.action == "show":
        request = (
            store.find(args.request_id)
            if store is not None
            else reqs.find(requests, args.request_id, args.log)
        )
        shown = {**request, "decision": decisions.get(args.request_id)}
        if args.trace:
            shown["context"] = run_context(args.trace, request)
        if args.json:
            print(json.dumps(shown, indent=2, sort_keys=True))
            return 0
        console.print_json(json.dumps(shown, sort_keys=True))
        return 0
    now = time.time()
    rows = [{**r, "decision": review_status(r, decisions.get(r["id"]), now)} for r in requests]
    if args.json:
        print(json.dumps(rows, indent=2, sort_keys=True))
        return 0
    cells = [
        [
            r["id"],
            f"{r['sidecar']}/{r['run']}" if r.get("sidecar") else r["run"],
            r["ledger"],
            str(r.get("step")),
            r.get("stage", ""),
            describe_call(r),
            ", ".join(r.get("targets", [])),
            r["decision"],
        ]
        for r in rows
    ]
    id_width = max([4] + [len(c[0]) + len(c[1]) for c in cells])
    if console.width < id_width + 60:  # too narrow for a table that keeps ids whole: one block each
        console.print(f"scope-expansion requests ({len(rows)})")
        for c in cells:
            console.print(
                escape(f"{c[0]}  run {c[1]}  ledger {c[2]}  step {c[3]}  {c[4]}  {c[7]}"),
                soft_wrap=True,
            )
            console.print(escape(f"    {c[5]}"), soft_wrap=True)
            console.print(escape(f"    targets: {c[6]}"), soft_wrap=True)
        return 0
    table = Table(title=f"scope-expansion requests ({len(rows)})")
    for col in ("id", "run", "ledger", "step", "stage", "call", "targets", "decision"):
        if col in ("id", "run"):  # ids are copied into `requests approve`: never cut them
            table.add_column(
                col,
                no_wrap=True,
                min_width=max([len(col)] + [len(str(r.get(col, ""))) for r in rows]),
            )
        else:
            table.add_column(col, overflow="fold")
    for c in cells:
        table.add_row(*(escape(str(x)) for x in c))
    console.print(table)
    return 0


def _review_store(spec: str) -> ReviewStore:
    from offscope.errors import InputError
    from offscope.state.db import Database, is_url
    from offscope.state.review import ReviewStore

    if not is_url(spec):
        raise InputError(
            "--state takes a fleet's postgresql:// URL",
            path=spec,
            hint="on one host the review queue is the request log: use --log",
        )
    return ReviewStore(Database(spec))  # InputError, naming the store, when it cannot


def _export(store: ReviewStore | None, ledger_path: str | None, console: Console) -> int:
    """The store's grants of one ledger, written as its grants file (reviewable YAML)."""
    from offscope.errors import InputError
    from offscope.ledgers import grants_path, read_ledger

    if store is None or not ledger_path:
        raise InputError(
            "export needs --state (the fleet's store) and --ledger (whose grants to write)"
        )
    ledger = read_ledger(ledger_path)
    grants = store.grants(ledger.id)
    target = grants_path(ledger_path)
    reqs.write_overlay(target, ledger.id, grants)
    console.print(escape(f"wrote {len(grants)} grants of ledger {ledger.id} to {target}"))
    return 0


def _print_grants(console: Console, grants: list[Grant]) -> None:
    for g in grants:
        where = f"run {g.run}" if g.scope == "run" else "every run"
        console.print(
            escape(
                f"granted {g.id}: {g.target} for tool {g.tool} (args {g.args_digest}) "
                f"by {g.approver}, {where}, expires {g.expires}"
            )
        )


def describe_call(request: dict[str, Any]) -> str:
    """What the call was, for a reviewer: the tool (for MCP and LLM tool calls), the
    method and destination, the argument values the trace keeps, the run's labels."""
    where = f"{request.get('method') or ''} {request.get('url') or ''}".strip()
    parts = [f"{request['tool']} via {where}" if request.get("tool") else where]
    args = request.get("args")
    if isinstance(args, dict) and args:
        parts.append("args " + json.dumps(args, sort_keys=True, ensure_ascii=False))
    labels = request.get("labels")
    if isinstance(labels, dict) and labels:
        parts.append("labels " + ", ".join(f"{k}={v}" for k, v in sorted(labels.items())))
    return "; ".join(p for p in parts if p)


def review_status(request: dict[str, Any], decision: dict[str, Any] | None, now: float) -> str:
    """approved/denied; for an undecided request, whether its call is held right now
    (and until when, UTC) or was blocked at once (`pending`), or its hold ran out."""
    if decision is not None:
        return str(decision.get("decision"))
    until = request.get("held_until")
    if isinstance(until, int | float):
        if now < until:
            return "held until " + time.strftime("%H:%M:%SZ", time.gmtime(until))
        return "hold timed out"
    return "pending"


def read_requests(path: str) -> list[dict]:
    """The requests in a log (decisions excluded), in order."""
    return reqs.read_log(path)[0]
