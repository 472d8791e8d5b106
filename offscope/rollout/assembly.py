"""Which of the four changes differ between production and the eval suite,
from the `assembly` events the proxy records (offscope/proxy/surface.py) and
the grid's configuration block. Used by `offscope shadow-compare`.

- model: the model ids production's LLM requests named against the eval's;
- scope clause: production's clause hashes against the hashes of the eval's
  clause texts, hashed the same way (so a match names the eval clause);
- tool surface: the eval hashes its cases' surface, production each server's
  `tools/list`: they do not compare, so this says whether production's
  surfaces changed during the window (drift) and how many there were;
- credentials: salted fingerprints per upstream; they compare with the
  eval's only under the same salt, and a change within production shows as
  more than one fingerprint for an upstream.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from offscope.rollout.gate.changes import Change
from offscope.trace.events import AssemblyEvent


def _clause_hash(text: str) -> str:
    # as offscope/proxy/surface.py's scope_clause_hash hashes what the marker found
    return "sha256:" + hashlib.sha256(" ".join(text.split()).encode()).hexdigest()


def _runs(events: list[AssemblyEvent], component: str) -> dict[str, set[str]]:
    """value -> runs that recorded it."""
    out: dict[str, set[str]] = defaultdict(set)
    for e in events:
        if e.component == component:
            out[e.value].add(e.run)
    return out


def _counts(values: dict[str, set[str]]) -> str:
    return ", ".join(
        f"{v} ({len(r)} runs)" for v, r in sorted(values.items(), key=lambda kv: -len(kv[1]))
    )


def assembly_changes(events: Iterable[AssemblyEvent], config: dict[str, Any]) -> list[Change]:
    events = list(events)
    return [
        _model(events, config),
        _scope_clause(events, config),
        _surface(events),
        _credentials(events, config),
    ]


def _model(events: list[AssemblyEvent], config: dict[str, Any]) -> Change:
    seen = _runs(events, "model")
    eval_id = (config.get("model") or {}).get("id")
    if not seen:
        return Change(
            "model", None, "production recorded no model id (no LLM request crossed the proxy)"
        )
    other = sorted(v for v in seen if v != eval_id)
    detail = f"eval {eval_id}; production {_counts(seen)}"
    return Change("model", bool(other), detail)


def _scope_clause(events: list[AssemblyEvent], config: dict[str, Any]) -> Change:
    seen = _runs(events, "scope_clause")
    if not seen:
        return Change(
            "scope clause",
            None,
            "production recorded no scope-clause hash (set the ledger's `scope_clause.marker`)",
        )
    clauses = config.get("scope_clause") or {}
    known = {_clause_hash(text): name for name, text in clauses.items() if isinstance(text, str)}
    named = {
        f"{v[:19]}… = eval '{known[v]}'"
        if v in known
        else ("absent" if v == "absent" else f"{v[:19]}… (no eval clause)"): r
        for v, r in seen.items()
    }
    return Change("scope clause", any(v not in known for v in seen), f"production {_counts(named)}")


def _surface(events: list[AssemblyEvent]) -> Change:
    surfaces = [e for e in events if e.component == "tool_surface"]
    if not surfaces:
        return Change(
            "tool surface",
            None,
            "production recorded no tool surface (no tools/list, no LLM tools)",
        )
    drift = [e for e in surfaces if e.drift]
    servers = {(e.source, e.upstream) for e in surfaces}
    distinct = {(e.source, e.upstream, e.value) for e in surfaces}
    detail = (
        f"{len(distinct)} surfaces over {len(servers)} servers/endpoints; not comparable to the eval's "
        "case surface"
    )
    if drift:
        parts = []
        for e in drift[:5]:
            what = "; ".join(
                f"{label} {', '.join(names)}"
                for label, names in (
                    ("added", e.added),
                    ("removed", e.removed),
                    ("changed", e.changed),
                )
                if names
            )
            parts.append(
                f"{e.source} {e.upstream} changed in run {e.run}" + (f" ({what})" if what else "")
            )
        detail = f"{len(drift)} changes during the window: " + "; ".join(parts) + f". {detail}"
    return Change("tool surface", bool(drift), detail)


def _credentials(events: list[AssemblyEvent], config: dict[str, Any]) -> Change:
    creds = [e for e in events if e.component == "credential"]
    if not creds:
        return Change("credentials", None, "production recorded no credential fingerprint")
    by_upstream: dict[str, set[str]] = defaultdict(set)
    for e in creds:
        by_upstream[e.upstream].add(e.value)
    changed = sorted(u for u, fps in by_upstream.items() if len(fps) > 1)
    detail = "; ".join(
        f"{u}: {len(fps)} fingerprint{'s' if len(fps) > 1 else ''}"
        for u, fps in sorted(by_upstream.items())
    )
    salts = {e.salt_id for e in creds}
    block = config.get("credentials")
    if changed:
        return Change(
            "credentials", True, f"changed during the window on {', '.join(changed)}; {detail}"
        )
    if isinstance(block, dict) and isinstance(block.get("upstreams"), dict):
        if salts != {block.get("salt_id")} or "process-local" in salts:
            return Change(
                "credentials",
                None,
                f"{detail}; the eval's fingerprints are under another salt",
                unknown="not comparable",
            )
        shared = {u: fp for u, fp in block["upstreams"].items() if fp != "none"}
        differs = sorted(
            u
            for u in by_upstream
            for k, fp in shared.items()
            if _same_host(u, k) and fp not in by_upstream[u]
        )
        if differs:
            return Change(
                "credentials", True, f"differ from the eval's on {', '.join(differs)}; {detail}"
            )
    return Change("credentials", False, f"one per upstream: {detail}")


def _same_host(upstream: str, key: str) -> bool:
    return upstream == key or upstream.rpartition(":")[0] == key
