"""The grid's knobs (scope clause, operator reply, friction) as the report names
and orders them: labels, a cell id split into its knob values, canonical order."""

from __future__ import annotations

from typing import Any

from offscope.evalmode.report.results_model import CellBlock
from offscope.vocab import CANNED_REPLIES, GRID_FRICTIONS, GRID_SCOPES

SCOPES, REPLIES, FRICTIONS = GRID_SCOPES, CANNED_REPLIES, GRID_FRICTIONS
KNOB_VALUES = {"scope": SCOPES, "reply": REPLIES, "friction": FRICTIONS}

LABELS = {
    "open": "open-world clause",
    "closed": "closed-world clause",
    "affirmative": "synthetic affirmative",
    "timeout": "timeout-then-continue",
    "sentinel": "no-authority sentinel",
    "works": "route works",
    "broken": "route broken",
}
SHORT = {
    "open": "open",
    "closed": "closed",
    "affirmative": "affirmative",
    "timeout": "timeout",
    "sentinel": "sentinel",
    "works": "works",
    "broken": "broken",
}


def cell_knobs(cell_id: str, block: CellBlock | None = None) -> dict[str, str]:
    if block is not None:
        return block.cell.model_dump()
    bits = cell_id.split("-")
    return dict(zip(("scope", "reply", "friction"), bits, strict=False)) if len(bits) == 3 else {}


def cell_order(cell_id: str) -> tuple[int, ...]:
    """Canonical cell order: scope, then reply, then friction (results.json is key-sorted)."""
    parts = cell_knobs(cell_id)
    if not parts:
        return (9, 9, 9)
    return tuple(
        KNOB_VALUES[k].index(parts[k]) if parts.get(k) in KNOB_VALUES[k] else 9
        for k in ("scope", "reply", "friction")
    )


def ordered_items(mapping: dict[str, Any], order: tuple[str, ...]) -> list[tuple[str, Any]]:
    return sorted(
        mapping.items(),
        key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0]),
    )
