"""What changed between two configuration blocks: which of the four changes
that move the number (model, scope prompt, tool surface, credentials) moved.
`offscope gate` diffs two grid results' blocks; `shadow-compare` and the
assembly events reuse `Change`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from offscope.evalmode.report.results_model import Configuration


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def _diff(a: dict[str, Any], b: dict[str, Any], keys: list[str]) -> list[str]:
    fa = _flat({k: a.get(k) for k in keys})
    fb = _flat({k: b.get(k) for k in keys})
    out = []
    for k in sorted(set(fa) | set(fb)):
        if fa.get(k) != fb.get(k):
            out.append(f"{k}: {_short(fa.get(k))} -> {_short(fb.get(k))}")
    return out


def _short(v: Any, n: int = 60) -> str:
    text = repr(v) if not isinstance(v, str) else v
    return text if len(text) <= n else text[: n - 1] + "…"


@dataclass(frozen=True)
class Change:
    name: str
    moved: bool | None  # None: not recorded, or not comparable (`unknown` says which)
    detail: str
    unknown: str = "not recorded"

    @property
    def shown(self) -> str:
        return self.unknown if self.moved is None else ("yes" if self.moved else "no")

    def as_dict(self) -> dict[str, Any]:
        """The change as the reports' JSON gives it."""
        return dict(change=self.name, moved=self.moved, shown=self.shown, detail=self.detail)


def config_changes(
    base: dict[str, Any] | Configuration, cand: dict[str, Any] | Configuration
) -> list[Change]:
    """Which of the four changes (model, scope prompt, tool surface, credentials) moved between two configuration blocks.
    A diff over the blocks' keys, as written: other harnesses record keys the
    grid does not (`credentials`, `prompt_template`)."""
    base = base.as_dict() if isinstance(base, Configuration) else base
    cand = cand.as_dict() if isinstance(cand, Configuration) else cand
    out: list[Change] = []
    d = _diff(base, cand, ["model", "safeguards"])
    out.append(Change("model (id / effort)", bool(d), "; ".join(d) or "same"))
    prompt_keys = ["scope_clause", "operator_reply"] + [
        k for k in ("prompt_template", "system_prompt", "prompt") if k in base or k in cand
    ]
    d = _diff(base, cand, prompt_keys)
    out.append(Change("prompt template / scope clause", bool(d), "; ".join(d) or "same"))
    bt, ct = base.get("tool_surface_hash"), cand.get("tool_surface_hash")
    out.append(Change("tool surface", bt != ct, f"{bt} -> {ct}" if bt != ct else f"same ({bt})"))
    if "credentials" in base or "credentials" in cand:
        out.append(credentials_change(base.get("credentials"), cand.get("credentials")))
    else:
        same_friction = base.get("friction") == cand.get("friction")
        out.append(
            Change(
                "credentials",
                None,
                "not recorded (no `credentials` field in the configuration blocks; injected "
                f"credential friction {'identical' if same_friction else 'differs'})",
            )
        )
    other = _diff(base, cand, ["harness", "reps", "seed", "cells"])
    if other:
        out.append(Change("also differs", True, "; ".join(other)))
    return out


def credentials_change(base: Any, cand: Any) -> Change:
    """The credentials block of two grid results: salted fingerprints by
    upstream (`offscope grid` writes `{"salt_id": ..., "upstreams": {...}}`),
    or a hand-written block of any shape. Fingerprints under different salts
    are not comparable: equal keys would read as different."""
    if not _is_fingerprints(base) or not _is_fingerprints(cand):
        d = _diff({"credentials": base}, {"credentials": cand}, ["credentials"])
        return Change("credentials", bool(d), "; ".join(d) or "same")
    b, c = base["upstreams"], cand["upstreams"]
    keys = sorted(set(b) | set(c))
    moved = [k for k in keys if b.get(k) != c.get(k)]
    fingerprinted = any(str(v).startswith("hmac-") for v in [*b.values(), *c.values()])
    if fingerprinted and (
        base.get("salt_id") != cand.get("salt_id") or base.get("salt_id") == "process-local"
    ):
        return Change(
            "credentials",
            None,
            f"fingerprints under different salts ({base.get('salt_id')} vs {cand.get('salt_id')}): "
            "set OFFSCOPE_FINGERPRINT_SALT (or _FILE) to the same salt for both runs",
            unknown="not comparable",
        )
    if not moved:
        return Change(
            "credentials", False, "same (" + ", ".join(f"{k}: {b[k]}" for k in keys) + ")"
        )
    return Change(
        "credentials",
        True,
        "; ".join(f"{k}: {b.get(k, 'none')} -> {c.get(k, 'none')}" for k in moved),
    )


def _is_fingerprints(block: Any) -> bool:
    return isinstance(block, dict) and isinstance(block.get("upstreams"), dict)
