"""Ledger coverage: which declared entries calls actually use.

A ledger declares reach: target patterns, extraction rules, grants. Reach no
call ever uses is scope a team can remove before it is abused ("unused
reach"). One implementation serves the live proxy (Prometheus gauges of used
and declared entries per kind, a periodic log summary), `offscope report
--coverage` and `offscope replay`: each feeds `observe(tag)` with the
call's tag under the ledger (the tag names the extract rules that yielded a
target: coverage costs the proxy no second matching).

What "used" means, per entry kind:
- a target pattern (host, repository, record, account, path): some in-scope
  target of a call matches it (a target brought in by a grant uses the grant);
- an extraction rule: it matched a call and yielded at least one target;
- a grant: it brought a target of some call into scope.
Stage rules and operator routes are not counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from offscope.ledgers.globs import literal_prefix
from offscope.ledgers.kinds import plural
from offscope.ledgers.matcher import (
    CompiledLedger,
    TagResult,
    TargetSet,
    canonical_pattern,
    normalize,
)
from offscope.vocab import ENTRY_KINDS, TARGET_KINDS, EntryKind, TargetKind

# Distinct in-scope values remembered per kind (a value seen before is not
# matched against the patterns again); past this the memory starts over.
MAX_SEEN = 100_000


@dataclass(frozen=True, slots=True)
class Entry:
    """One declared entry, named as in the ledger file."""

    kind: EntryKind
    index: int
    entry: str  # the pattern, the grant id, or a short description of the rule

    @property
    def where(self) -> str:
        """Its place in the ledger file: `targets.hosts[2]`, `extract[0]`, `grants[1]`."""
        if self.kind == "extract":
            return f"extract[{self.index}]"
        if self.kind == "grant":
            return f"grants[{self.index}]"
        return f"targets.{plural(self.kind)}[{self.index}]"

    def as_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "entry": self.entry, "where": self.where}


class _TargetIndex:
    """Which target entries and extract rules a ledger declares, indexed for
    lookup. Built once per set of targets (100,000 targets take a few hundred
    milliseconds): `prepare` builds it off the event loop after a compile, and a
    ledger that only gained grants shares it."""

    def __init__(self, ledger: CompiledLedger) -> None:
        self.targets = ledger.ledger.targets  # identity: the index is for these targets
        self.extract = ledger.ledger.extract
        self.entries: dict[EntryKind, list[Entry]] = {k: [] for k in ENTRY_KINDS if k != "grant"}
        self.exact: dict[TargetKind, dict[str, list[int]]] = {k: {} for k in TARGET_KINDS}
        self.globs: dict[TargetKind, list[tuple[int, TargetSet]]] = {k: [] for k in TARGET_KINDS}
        for kind in TARGET_KINDS:
            for i, raw in enumerate(ledger.ledger.targets.of_kind(kind)):
                self.entries[kind].append(Entry(kind, i, raw))
                pattern = canonical_pattern(kind, raw)
                if not literal_prefix(pattern)[1]:  # no wildcard: one hash lookup
                    self.exact[kind].setdefault(normalize(kind, pattern), []).append(i)
                else:  # the matcher's own membership test, for this one pattern
                    self.globs[kind].append((i, TargetSet(kind, [raw])))
        for i, rule in enumerate(ledger.ledger.extract):
            self.entries["extract"].append(
                Entry(
                    "extract", i, _describe(rule.match.model_dump(exclude_none=True), rule.targets)
                )
            )


def prepare(ledger: CompiledLedger) -> None:
    """Build the ledger's coverage index now (call it off the event loop)."""
    _index_of(ledger)


def _index_of(ledger: CompiledLedger) -> _TargetIndex:
    index: _TargetIndex | None = getattr(ledger, "_coverage_index", None)
    if (
        index is None
        or index.targets is not ledger.ledger.targets
        or index.extract is not ledger.ledger.extract
    ):
        index = _TargetIndex(ledger)
        ledger._coverage_index = index  # type: ignore[attr-defined]  # a cache that copies of the ledger share
    return index


class Coverage:
    """Used and declared entries of one compiled ledger."""

    def __init__(self, ledger: CompiledLedger) -> None:
        self.ledger = ledger
        index = _index_of(ledger)
        self.entries: dict[EntryKind, list[Entry]] = {**index.entries, "grant": []}
        self._exact = index.exact
        self._globs = index.globs
        self._grant_index: dict[str, list[int]] = {}
        for i, grant in enumerate(ledger.ledger.grants):
            self.entries["grant"].append(Entry("grant", i, f"{grant.id} ({grant.target})"))
            self._grant_index.setdefault(grant.id, []).append(i)
        self.used: dict[EntryKind, set[int]] = {k: set() for k in ENTRY_KINDS}
        self._seen: dict[TargetKind, set[str]] = {k: set() for k in TARGET_KINDS}
        self.calls = 0

    def observe(self, tag: TagResult) -> bool:
        """Count one tagged call; True when an entry was used for the first time.
        The tag says which extract rules yielded a target (a tag built from a
        recorded /1 call's targets names none)."""
        self.calls += 1
        changed = False
        for t in tag.targets:
            if t.grant is not None:
                grants = self.used["grant"]
                n = len(grants)
                grants.update(self._grant_index.get(t.grant, ()))
                changed |= len(grants) != n
            elif t.in_scope:
                changed |= self._mark(t.kind, t.value)
        if tag.rules:  # the tagger says which extract rules yielded a target
            rules = self.used["extract"]
            n = len(rules)
            rules.update(tag.rules)
            changed |= len(rules) != n
        return changed

    def _mark(self, kind: TargetKind, value: str) -> bool:
        seen = self._seen[kind]
        if value in seen:
            return False
        if len(seen) >= MAX_SEEN:
            seen.clear()
        seen.add(value)
        used = self.used[kind]
        n = len(used)
        used.update(self._exact[kind].get(value, ()))
        for i, one in self._globs[kind]:
            if i not in used and value in one:
                used.add(i)
        return len(used) != n

    # -- views ---------------------------------------------------------------

    @property
    def used_total(self) -> int:
        return sum(len(v) for v in self.used.values())

    def declared_counts(self) -> dict[EntryKind, int]:
        return {k: len(self.entries[k]) for k in ENTRY_KINDS}

    def used_counts(self) -> dict[EntryKind, int]:
        return {k: len(self.used[k]) for k in ENTRY_KINDS}

    def unused(self) -> list[Entry]:
        """Declared entries no call used, in ledger order (the reach to remove)."""
        return [e for k in ENTRY_KINDS for e in self.entries[k] if e.index not in self.used[k]]

    def as_dict(self) -> dict[str, object]:
        declared, used = self.declared_counts(), self.used_counts()
        return {
            "ledger": self.ledger.id,
            "ledger_hash": self.ledger.hash,
            "calls": self.calls,
            "by_kind": {
                k: {"declared": declared[k], "used": used[k]} for k in ENTRY_KINDS if declared[k]
            },
            "unused": [e.as_dict() for e in self.unused()],
            "counted": "target patterns matched by an in-scope target; extract rules that yielded a target; "
            "grants that brought a target into scope (stage rules and operator routes are not counted)",
        }

    def summary(self) -> str:
        """One line: `host 3/4, extract 1/2, ...` (used / declared)."""
        declared, used = self.declared_counts(), self.used_counts()
        return (
            ", ".join(f"{k} {used[k]}/{declared[k]}" for k in ENTRY_KINDS if declared[k])
            or "no entries"
        )


def _describe(match: Mapping[str, object], targets: Mapping[Any, object]) -> str:
    where = " ".join(f"{k}={v}" for k, v in match.items()) or "any call"
    return f"{where} -> " + ", ".join(f"{k}: {v}" for k, v in targets.items())
