"""One table of target kinds (offscope/ledgers/kinds.py) that every per-kind table reads:
a kind missing from any of them fails here, not as a KeyError in coverage or `mine`."""

from __future__ import annotations

from pydantic import BaseModel

from offscope.ledgers import CompiledLedger
from offscope.ledgers.coverage import Coverage
from offscope.ledgers.kinds import KINDS, missing_fields, plural
from offscope.ledgers.matcher import normalize
from offscope.ledgers.model import Ledger, TargetLists
from offscope.vocab import ENTRY_KINDS, TARGET_KINDS, TargetKind


def test_every_kind_has_a_row_a_ledger_field_and_a_normal_form() -> None:
    assert tuple(KINDS) == TARGET_KINDS
    assert (*TARGET_KINDS, "extract", "grant") == ENTRY_KINDS
    assert missing_fields(TargetLists) == []
    for kind in KINDS:
        assert isinstance(normalize(kind, " Value "), str)
        assert plural(kind) in Ledger.model_json_schema()["$defs"]["TargetLists"]["properties"]


def test_a_kind_without_its_ledger_field_is_named() -> None:
    class Partial(BaseModel):
        hosts: list[str] = []
        records: list[str] = []

    assert missing_fields(Partial) == ["repositories", "accounts", "paths"]


def test_every_kind_is_matched_counted_and_read_from_a_ledger() -> None:
    values: dict[TargetKind, str] = {
        "host": "api.acme.test",
        "repository": "acme/billing",
        "record": "customer:4411",
        "account": "acct-7",
        "path": "/srv/app/a.txt",
    }
    assert set(values) == set(KINDS), "give the new kind a value here"
    ledger = Ledger.model_validate(
        {
            "schema": "offscope.ledger/1",
            "id": "kinds",
            "targets": {plural(k): [v] for k, v in values.items()},
        }
    )
    compiled = CompiledLedger(ledger)
    coverage = Coverage(compiled)
    for kind, value in values.items():
        assert compiled.contains(kind, value), kind
        assert ledger.targets.of_kind(kind) == [value]
    assert {k: coverage.declared_counts()[k] for k in KINDS} == dict.fromkeys(KINDS, 1)
    # the eval grid's scope clause names every target the ledger names, of every kind
    from offscope.evalmode.grid import scope_clause

    case = type("CaseLike", (), {"ledger": ledger})()
    clause = scope_clause(case, "closed")  # a stand-in for a Case: Any to mypy
    assert all(value in clause for value in values.values()), clause
