"""`offscope validate` and `offscope schema`: check files, export JSON Schemas."""

from __future__ import annotations

import argparse
import json
import sys

from offscope.cli._parsers import add_command
from offscope.errors import InputError


def _models() -> dict:
    """Every offscope file format: name -> pydantic model (or schema function)."""
    from offscope.behavior.rules import RuleSet
    from offscope.evalmode.case import Case
    from offscope.evalmode.report.results_model import Results
    from offscope.evalmode.sim.simmodel import Disposition
    from offscope.ledgers.model import GrantsOverlay, Ledger
    from offscope.policies.model import Policy
    from offscope.probes.simprobe import ProbeDisposition
    from offscope.rollout.gate.budgets import BudgetFile
    from offscope.trace.events import trace_schema

    return {
        "ledger": Ledger,
        "policy": Policy,
        "case": Case,
        "trace": trace_schema,
        "grants": GrantsOverlay,
        "budget": BudgetFile,
        "disposition": Disposition,
        "probe-disposition": ProbeDisposition,
        "rules": RuleSet,
        "results": Results,
    }


# `schema:` key of a file -> its format (rule sets have none: check them with census --rules).
KINDS = {
    "offscope.ledger/1": "ledger",
    "offscope.policy/1": "policy",
    "offscope.case/1": "case",
    "offscope.grants/1": "grants",
    "offscope.budget/1": "budget",
    "offscope.disposition/1": "disposition",
    "offscope.probe-disposition/1": "probe-disposition",
    "offscope.results/1": "results",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub,
        "validate",
        help="check ledger, policy and case files (file:line errors)",
        description="Validate offscope files. The kind is read from each file's `schema:` key "
        "(offscope.ledger/1, .policy/1, .case/1, .grants/1, .budget/1, "
        ".disposition/1, .probe-disposition/1, .results/1).",
        epilog="examples:\n  offscope validate ledger.yaml policy.yaml cases/*.yaml\n"
        "  offscope validate ledger.yaml --tools tools.json   # warn: tool arguments no rule reads",
    )
    p.add_argument("files", nargs="+")
    p.add_argument(
        "--tools",
        action="append",
        default=[],
        metavar="FILE",
        help="an MCP server's tools/list result (JSON, or a JSON-lines transcript): warn about "
        "tools whose path- or id-like arguments (source, paths, *_id, ...) no extract rule of "
        "the ledgers given reads; a call naming only those is unknown (refused under enforce)",
    )
    p.set_defaults(func=run_validate)
    s = sub.add_parser(
        "schema",
        help="print the JSON Schema of a file format (for editors)",
        description="Print the JSON Schema of an offscope file format.",
        epilog="example:  offscope schema ledger > ledger.schema.json",
    )
    s.add_argument(
        "kind",
        choices=[
            "ledger",
            "policy",
            "case",
            "trace",
            "grants",
            "budget",
            "disposition",
            "probe-disposition",
            "rules",
            "results",
        ],
    )
    s.set_defaults(func=run_schema)


def run_schema(args: argparse.Namespace) -> int:
    model = _models()[args.kind]
    schema = (
        model()
        if callable(model) and not hasattr(model, "model_json_schema")
        else model.model_json_schema(by_alias=True)
    )
    print(json.dumps(schema, indent=2, sort_keys=True))
    return 0


def run_validate(args: argparse.Namespace) -> int:
    """Check every file and report every problem (not just the first), each as
    `file:line: what is wrong (what to fix)`; exit 2 if there was any."""
    from rich.console import Console

    errors: list[InputError] = []
    ledgers: list[str] = []
    for path in args.files:
        try:
            kind, name, warnings = check_file(path)
        except InputError as exc:
            errors.extend(getattr(exc, "errors", [exc]))
            continue
        for warning in warnings:
            print(f"warning: {warning}", file=sys.stderr)
        print(f"ok  {path}  ({kind} {name})")
        if kind == "ledger":
            ledgers.append(path)
    if args.tools:
        for tool_warning in tool_warnings(ledgers, args.tools):
            print(f"warning: {tool_warning}", file=sys.stderr)
    if errors:
        from rich.markup import escape

        console = Console(stderr=True, highlight=False, soft_wrap=True)
        for problem in errors:
            console.print(f"[bold red]offscope: error:[/] {escape(str(problem))}")
        noun = "problem" if len(errors) == 1 else "problems"
        console.print(
            f"{len(errors)} {noun} in {len({e.path for e in errors})} of {len(args.files)} file(s)"
        )
        return 2
    return 0


def tool_warnings(ledgers: list[str], tools_files: list[str]) -> list[str]:
    """Per ledger and tools/list file: the target-like tool arguments no extract
    rule reads (offscope/ledgers/toolcheck.py). Warnings, not errors: a field
    may be harmless, but a call that names only such fields is `unknown`."""
    from offscope.ledgers import read_ledger
    from offscope.ledgers.toolcheck import read_tools, unread_fields

    if not ledgers:
        raise InputError(
            "--tools needs a ledger to check against",
            hint="give the ledger too: offscope validate ledger.yaml --tools tools.json",
        )
    out = []
    for tools_file in tools_files:
        tools = read_tools(tools_file)
        for ledger_path in ledgers:
            for gap in unread_fields(read_ledger(ledger_path), tools):
                out.append(
                    f"{ledger_path}: tool {gap.tool!r} ({tools_file}) takes {gap.field!r}, "
                    "which looks like a target, and no extract rule reads it (add "
                    f"'{{args.{gap.field}}}' to the targets of a rule for the tool)"
                )
    return out


def check_file(path: str) -> tuple[str, str, list[InputError]]:
    """Validate one file: (its kind, its id, warnings). Raises InputError (an
    InputErrors when there are several problems)."""
    from offscope.yamlio import InputErrors, parse_yaml, problems, read_text

    text = read_text(path)
    if _is_results(text):
        from offscope.evalmode.report.results_model import parse_results

        return "results", parse_results(text, path).configuration.model.id, []
    data, node = parse_yaml(text, path)
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema not in KINDS:
        raise InputError(
            f"unknown or missing `schema:` {schema!r}",
            path=path,
            line=1,
            hint=f"use one of {', '.join(KINDS)}",
        )
    kind = KINDS[schema]
    obj, found = problems(_models()[kind], data, node, path)
    warnings: list[InputError] = []
    if kind == "ledger":
        from offscope.ledgers.model import host_port_warnings
        from offscope.yamlio import _line_of

        warnings = [
            InputError(message, path=path, line=_line_of(node, loc))
            for loc, message in host_port_warnings(data)
        ]
        if obj is not None and not found:
            from offscope.ledgers.matcher import CompiledLedger

            CompiledLedger(obj)
    if found:
        raise InputErrors(found)
    return kind, getattr(obj, "id", ""), warnings


def _is_results(text: str) -> bool:
    """results.json is JSON with thousands of values: read it as JSON (fast, exact
    numbers), not YAML; its own reader names the line of a bad field."""
    import json

    from offscope.evalmode.report.results_model import RESULTS_SCHEMA

    if not text.lstrip().startswith("{"):
        return False
    try:
        data = json.loads(text)
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("schema") == RESULTS_SCHEMA
