"""The closed vocabularies have one owner, offscope/vocab.py.

These tests fail when a vocabulary is spelled out again somewhere else (a
copy that would drift), when vocab.py starts importing from the package (it
must stay the bottom layer), or when an output that must list the values
(the trace's JSON Schema, the exporter's label values) disagrees with it.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

from offscope import vocab
from offscope.policies.model import Policy
from offscope.proxy.metric_names import LABEL_VALUES
from offscope.trace.events import trace_schema

PACKAGE = Path(vocab.__file__).parent

# Every (Literal type, tuple) pair the module defines.
PAIRS = {
    "Source": "SOURCES",
    "Stage": "STAGES",
    "StageFrom": "STAGE_FROMS",
    "TargetKind": "TARGET_KINDS",
    "Scope": "SCOPES",
    "Decision": "DECISIONS",
    "FrictionKind": "FRICTION_KINDS",
    "Mode": "MODES",
    "CannedReply": "CANNED_REPLIES",
    "ReplyPolicy": "REPLY_POLICIES",
    "Provenance": "PROVENANCES",
    "EndReason": "END_REASONS",
    "ScopeClause": "GRID_SCOPES",
    "RouteState": "GRID_FRICTIONS",
}


def test_every_tuple_is_its_literal() -> None:
    for literal, values in PAIRS.items():
        assert getattr(vocab, values) == get_args(getattr(vocab, literal)), literal
    assert [v for v in vocab.REPLY_POLICIES if v != "pass-through"] == list(vocab.CANNED_REPLIES)
    assert list(vocab.STAGE_RANK) == list(vocab.STAGES) and sorted(vocab.STAGE_RANK.values()) == [
        0,
        1,
        2,
    ]


def test_vocab_is_the_bottom_layer() -> None:
    tree = ast.parse((PACKAGE / "vocab.py").read_text())
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m.startswith("offscope")], imported


def _string_sets(node: ast.AST) -> list[frozenset[str]]:
    """The string-literal collections of a module: Literal[...] subscripts and tuples/lists of strings."""
    found = []
    for n in ast.walk(node):
        elts = None
        if (
            isinstance(n, ast.Subscript)
            and isinstance(n.value, ast.Name)
            and n.value.id == "Literal"
        ):
            elts = n.slice.elts if isinstance(n.slice, ast.Tuple) else [n.slice]
        elif isinstance(n, ast.Tuple | ast.List):
            elts = n.elts
        strings = [
            e.value for e in elts or [] if isinstance(e, ast.Constant) and isinstance(e.value, str)
        ]
        if len(strings) >= 2 and len(strings) == len(elts or []):
            found.append(frozenset(strings))
    return found


# Same words, different vocabulary: the policy's `on_error` fails "closed" or "open".
COINCIDENCES = {"offscope/policies/model.py: GRID_SCOPES"}


def test_no_module_spells_a_vocabulary_out_again() -> None:
    # A collection equal to a whole vocabulary is a copy; a subset is a choice (and allowed).
    vocabularies = {
        frozenset(getattr(vocab, t)): t for t in PAIRS.values() if len(getattr(vocab, t)) >= 2
    }
    copies = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "vocab.py":
            continue
        for values in _string_sets(ast.parse(path.read_text())):
            if values in vocabularies:
                copies.append(f"{path.relative_to(PACKAGE.parent)}: {vocabularies[values]}")
    copies = [c for c in copies if c not in COINCIDENCES]
    assert not copies, "import these from offscope.vocab instead: " + ", ".join(copies)


def _enum(schema: dict, definition: str, field: str) -> list[str]:
    prop = schema["$defs"][definition]["properties"][field]
    options = prop.get("anyOf", [prop])
    return next(o["enum"] for o in options if "enum" in o)


def test_json_schemas_list_the_vocabularies() -> None:
    trace = trace_schema()
    assert _enum(trace, "ToolCallEvent", "friction") == list(vocab.FRICTION_KINDS)
    assert _enum(trace, "ToolCallEvent", "decision") == list(vocab.DECISIONS)
    assert _enum(trace, "ToolCall", "stage") == list(vocab.STAGES)
    assert _enum(trace, "ToolCall", "source") == list(vocab.SOURCES)
    assert _enum(trace, "ToolCall", "scope") == list(vocab.SCOPES)
    assert _enum(trace, "Target", "kind") == list(vocab.TARGET_KINDS)
    assert _enum(trace, "OperatorEvent", "policy") == list(vocab.REPLY_POLICIES)
    assert _enum(trace, "RunEnd", "reason") == list(vocab.END_REASONS)
    policy = Policy.model_json_schema(by_alias=True)
    assert _enum(policy, "FrictionRule", "kind") == list(vocab.FRICTION_KINDS)
    assert _enum(policy, "OperatorPolicy", "reply") == list(vocab.REPLY_POLICIES)


def test_exporter_label_values_come_from_the_vocabularies() -> None:
    assert LABEL_VALUES["kind"] == vocab.FRICTION_KINDS
    assert LABEL_VALUES["stage"] == vocab.STAGES
    assert LABEL_VALUES["decision"] == vocab.DECISIONS
    assert LABEL_VALUES["source"] == vocab.SOURCES and LABEL_VALUES["scope"] == vocab.SCOPES
    assert LABEL_VALUES["reason"] == vocab.END_REASONS  # the metric and the trace: one vocabulary
    assert set(LABEL_VALUES["provenance"]) == {"human", "harness", *vocab.CANNED_REPLIES}
