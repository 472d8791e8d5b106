"""The kinds of target, in one table that every per-kind table of the package reads.

A kind is named in a ledger's `targets:` by its plural (`targets.records`), matched
as glob patterns whose segments a separator delimits (`owner/name`: "/"), and its
values are normalised before matching (`normalize` in matcher.py). Adding a kind:
its name in `offscope.vocab.TargetKind`, its row here, its list field on
`TargetLists` (offscope/ledgers/model.py), and its normalisation if it needs one;
`tests/ledgers/test_kinds.py` fails while any of them is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from offscope.vocab import ENTRY_KINDS, TARGET_KINDS, TargetKind


@dataclass(frozen=True, slots=True)
class Kind:
    name: TargetKind
    plural: str  # the ledger field: targets.<plural>
    separator: str | None  # globs match within segments split by it (None: one segment)


KINDS: dict[TargetKind, Kind] = {
    k.name: k
    for k in (
        Kind("host", "hosts", None),
        Kind("repository", "repositories", "/"),
        Kind("record", "records", None),
        Kind("account", "accounts", None),
        Kind("path", "paths", "/"),
    )
}

# The vocabulary and this table name the same kinds, in order; coverage counts each
# kind's entries, then extract rules and grants.
if tuple(KINDS) != TARGET_KINDS or (*TARGET_KINDS, "extract", "grant") != ENTRY_KINDS:
    raise ImportError(
        f"offscope.ledgers.kinds lists {tuple(KINDS)}; offscope.vocab says target kinds "
        f"{TARGET_KINDS} and entry kinds {ENTRY_KINDS}: name a new kind in all three"
    )


def plural(kind: TargetKind) -> str:
    return KINDS[kind].plural


def missing_fields(model: Any) -> list[str]:
    """The kinds whose plural is not a field of `model` (a ledger's TargetLists must
    have one list per kind)."""
    fields = getattr(model, "model_fields", {})
    return [k.plural for k in KINDS.values() if k.plural not in fields]
