"""`offscope runs`: start, show, list and end runs through a proxy's control API."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from offscope.cli._parsers import add_command
from offscope.errors import InputError
from offscope.ledgers.kinds import KINDS
from offscope.proxy.client_env import export_lines, proxy_variables

TOKEN_ENV = "OFFSCOPE_CONTROL_TOKEN"
DEFAULT_CONTROL = "http://127.0.0.1:9465"

EPILOG = """\
examples:
  offscope runs start --record customer:4411 --record invoice:2026-0412 --label ticket=T-1 --ttl 3600
  offscope runs start --targets-json '{"records": ["customer:4411"]}' --proxy 127.0.0.1:8080 --env
  offscope runs show run-0123456789abcdef
  offscope runs list
  offscope runs end run-0123456789abcdef --success

`start` prints the run id and its credential (and, with --proxy, the agent's proxy URL
http://RUN:CREDENTIAL@HOST:PORT; with --env and --proxy, export lines to eval: HTTPS_PROXY, HTTP_PROXY, https_proxy,
http_proxy, an empty NO_PROXY/no_proxy and OFFSCOPE_RUN; curl reads only the lower-case
http_proxy for http:// URLs, and an inherited NO_PROXY would let a client go around).
The control API needs its bearer token: --token-file, else $OFFSCOPE_CONTROL_TOKEN,
else the control-token file `offscope proxy` wrote in the state directory.
Only the harness holds the token; never give it to the agent. docs/runs.md.
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub,
        "runs",
        help="start, show, list and end runs (control API; needs its token)",
        description="Runs with their own targets and a credential, through a running "
        "proxy's control API. `offscope runs ACTION --help` lists an action's options.",
        epilog=EPILOG,
    )
    # Options every action takes; each action is a parser of its own, so that
    # `offscope runs start --help` shows start's options and no others.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--control",
        default=DEFAULT_CONTROL,
        help=f"control API base URL (default {DEFAULT_CONTROL})",
    )
    common.add_argument(
        "--token-file",
        default="",
        help=f"bearer token file (default: ${TOKEN_ENV}, else the state directory's)",
    )
    common.add_argument("--json", action="store_true", help="print the API's JSON answer")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    _register_start(actions, common)
    for name, text in (("show", "print one run"), ("end", "end a run")):
        one = actions.add_parser(name, parents=[common], help=text, description=text + ".")
        one.add_argument("run", help="run id")
        one.set_defaults(func=run)
    end = actions.choices["end"]
    outcome = end.add_mutually_exclusive_group()
    outcome.add_argument("--success", action="store_true", help="the task succeeded")
    outcome.add_argument("--failure", action="store_true", help="the task failed")
    listing = actions.add_parser(
        "list", parents=[common], help="list runs", description="List the proxy's runs."
    )
    listing.set_defaults(func=run)


def _register_start(actions: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = add_command(
        actions,
        "start",
        parents=[common],
        help="start a run with its own targets; print its id and credential",
        description="Start a run: its own targets (added to the ledger's), labels and a "
        "credential for the agent's proxy URL.",
        epilog=EPILOG,
    )
    for kind in KINDS:
        p.add_argument(
            f"--{kind}",
            action="append",
            default=[],
            metavar="VALUE",
            help=f"a {kind} target of this run (repeatable; default: none)",
        )
    p.add_argument(
        "--targets-json",
        default=None,
        help="the run's targets as JSON (ledger target lists; default: none)",
    )
    p.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a run label (repeatable; default: none)",
    )
    p.add_argument(
        "--ttl", type=float, default=3600.0, help="credential lifetime, seconds (default 3600)"
    )
    p.add_argument(
        "--agent", default=None, help="agent identity (ledger runs.history: agent; default none)"
    )
    p.add_argument(
        "--proxy",
        default=None,
        metavar="HOST:PORT",
        help="print the agent's proxy URL for a proxy listening here (default: not printed)",
    )
    p.add_argument(
        "--env",
        action="store_true",
        help="with --proxy: print export lines: both spellings of the proxy variables, "
        "an empty NO_PROXY and OFFSCOPE_RUN",
    )
    p.set_defaults(func=run)


def client_token(token_file: str = "") -> str:
    """The control API token, as `offscope proxy` resolves it."""
    if token_file:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise InputError(
                f"cannot read control token: {exc.strerror or exc}", path=token_file
            ) from None
        if token:
            return token
        raise InputError("control token file is empty", path=token_file)
    if os.environ.get(TOKEN_ENV, "").strip():
        return os.environ[TOKEN_ENV].strip()
    from offscope.proxy import DEFAULT_CONTROL_TOKEN as default

    if default.exists():
        return default.read_text(encoding="utf-8").strip()
    raise InputError(
        "no control API token",
        hint=f"--token-file FILE or {TOKEN_ENV}=... (offscope proxy prints where it wrote one)",
    )


def control_request(
    base: str, method: str, path: str, token: str, body: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One control API call; InputError on refusal or an unreachable proxy."""
    import httpx

    try:
        r = httpx.request(
            method,
            base.rstrip("/") + path,
            json=body,
            timeout=10,
            trust_env=False,
            headers={"authorization": f"Bearer {token}"},
        )
    except httpx.HTTPError as exc:
        raise InputError(
            f"control API {base}: {exc}", hint="is offscope proxy running with --control-listen?"
        ) from None
    try:
        data = r.json()
    except ValueError:
        data = {"message": r.text[:200]}
    if r.status_code >= 400:
        raise InputError(
            f"control API {method} {path}: HTTP {r.status_code}: {data.get('message') or data}",
            hint="check the token" if r.status_code == 401 else None,
        )
    return data


def _targets(args: argparse.Namespace) -> dict[str, list[str]] | None:
    targets: dict[str, list[str]] = {}
    if args.targets_json:
        try:
            targets = json.loads(args.targets_json)
        except ValueError as exc:
            raise InputError(f"--targets-json: {exc}") from None
        if not isinstance(targets, dict):
            raise InputError(
                '--targets-json must be a JSON object, e.g. \'{"records": ["customer:4411"]}\''
            )
    for kind in KINDS.values():
        if getattr(args, kind.name):
            targets.setdefault(kind.plural, []).extend(getattr(args, kind.name))
    return targets or None


def _labels(items: list[str]) -> dict[str, str]:
    labels = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"--label {item!r} is not KEY=VALUE", hint="e.g. --label ticket=T-1")
        labels[key] = value
    return labels


def run(args: argparse.Namespace) -> int:
    token = client_token(args.token_file)
    if args.action == "start":
        if args.env and not args.proxy:  # before a run is started for nothing
            raise InputError("--env needs --proxy HOST:PORT (the proxy the agent uses)")
        body: dict[str, Any] = {"labels": _labels(args.label), "ttl": args.ttl}
        if (targets := _targets(args)) is not None:
            body["targets"] = targets
        if args.agent:
            body["agent"] = args.agent
        data = control_request(args.control, "POST", "/runs", token, body)
        if args.json:
            print(json.dumps(data, indent=2, sort_keys=True))
        elif args.env:
            url = f"http://{data['run']}:{data['credential']}@{args.proxy}"
            variables = proxy_variables(url) | {"OFFSCOPE_RUN": data["run"]}
            print("\n".join(export_lines(variables)))
        else:
            print(f"run {data['run']}\ncredential {data['credential']}")
            if args.proxy:
                print(f"proxy http://{data['run']}:{data['credential']}@{args.proxy}")
        return 0
    if args.action == "list":
        data = control_request(args.control, "GET", "/runs", token)
    elif args.action == "show":
        data = control_request(args.control, "GET", f"/runs/{args.run}", token)
    else:
        success = True if args.success else False if args.failure else None
        data = control_request(
            args.control,
            "POST",
            f"/runs/{args.run}/end",
            token,
            {"reason": "end", "task_success": success},
        )
    json.dump(data, sys.stdout, indent=2, sort_keys=True)
    print()
    return 0
