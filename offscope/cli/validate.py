"""`offscope validate` and `offscope schema`: check files, export JSON Schemas."""

from __future__ import annotations

import argparse
import json

from offscope.errors import InputError


def _models() -> dict:
    """Every offscope file format: name -> pydantic model (or schema function)."""
    from offscope.evalmode.case import Case
    from offscope.evalmode.gate import BudgetFile
    from offscope.evalmode.rules import RuleSet
    from offscope.evalmode.simmodel import Disposition
    from offscope.evalmode.simprobe import ProbeDisposition
    from offscope.ledgers.model import GrantsOverlay, Ledger
    from offscope.policies.model import Policy
    from offscope.trace.events import trace_schema

    return {"ledger": Ledger, "policy": Policy, "case": Case, "trace": trace_schema, "grants": GrantsOverlay,
            "budget": BudgetFile, "disposition": Disposition, "probe-disposition": ProbeDisposition,
            "rules": RuleSet}


# `schema:` key of a file -> its format (rule sets have none: check them with census --rules).
KINDS = {"offscope.ledger/1": "ledger", "offscope.policy/1": "policy", "offscope.case/1": "case",
         "offscope.grants/1": "grants", "offscope.budget/1": "budget", "offscope.disposition/1": "disposition",
         "offscope.probe-disposition/1": "probe-disposition"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="check ledger, policy and case files (file:line errors)",
                       description="Validate offscope files. The kind is read from each file's `schema:` key "
                                   "(offscope.ledger/1, .policy/1, .case/1, .grants/1, .budget/1, "
                                   ".disposition/1, .probe-disposition/1).",
                       epilog="example:  offscope validate ledger.yaml policy.yaml cases/*.yaml")
    p.add_argument("files", nargs="+")
    p.set_defaults(func=run_validate)
    s = sub.add_parser("schema", help="print the JSON Schema of a file format (for editors)",
                       description="Print the JSON Schema of an offscope file format.",
                       epilog="example:  offscope schema ledger > ledger.schema.json")
    s.add_argument("kind", choices=["ledger", "policy", "case", "trace", "grants", "budget", "disposition",
                                    "probe-disposition", "rules"])
    s.set_defaults(func=run_schema)


def run_schema(args: argparse.Namespace) -> int:
    model = _models()[args.kind]
    schema = model() if callable(model) and not hasattr(model, "model_json_schema") else \
        model.model_json_schema(by_alias=True)
    print(json.dumps(schema, indent=2, sort_keys=True))
    return 0


def run_validate(args: argparse.Namespace) -> int:
    from offscope.yamlio import parse_yaml, validate

    kinds = KINDS
    models = _models()
    for path in args.files:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise InputError(f"cannot read: {exc.strerror}", path=path) from None
        data, node = parse_yaml(text, path)
        schema = data.get("schema") if isinstance(data, dict) else None
        if schema not in kinds:
            raise InputError(f"unknown or missing `schema:` {schema!r}", path=path, line=1,
                             hint=f"use one of {', '.join(kinds)}")
        obj = validate(models[kinds[schema]], data, node, path)
        if kinds[schema] == "ledger":
            from offscope.ledgers.matcher import CompiledLedger

            CompiledLedger(obj)
        print(f"ok  {path}  ({kinds[schema]} {getattr(obj, 'id', '')})")
    return 0
