"""The target ledger: what an agent may touch, compiled for tagging."""

from __future__ import annotations

from pathlib import Path

from offscope.ledgers.matcher import CallInput, CompiledLedger, TagResult, TargetTag
from offscope.ledgers.model import Ledger, Match

EXAMPLES = Path(__file__).parent / "examples"

__all__ = ["CallInput", "CompiledLedger", "Ledger", "Match", "TagResult", "TargetTag",
           "EXAMPLES", "grants_path", "load_ledger"]


def grants_path(ledger_path: str | Path) -> Path:
    """Where a ledger's reviewed grants live: `billing.yaml` -> `billing.grants.yaml`."""
    p = Path(ledger_path)
    return p.with_name(f"{p.stem}.grants.yaml")


def load_ledger(path: str | Path) -> CompiledLedger:
    """Read, validate and compile a ledger file, with its grants overlay if one
    exists (InputError with file:line on bad input in either)."""
    from offscope.errors import InputError
    from offscope.ledgers.model import GrantsOverlay
    from offscope.yamlio import load_model

    ledger = load_model(Ledger, path)
    overlay_path = grants_path(path)
    if overlay_path.exists():
        overlay = load_model(GrantsOverlay, overlay_path)
        if overlay.ledger != ledger.id:
            raise InputError(f"grants are for ledger {overlay.ledger!r}, not {ledger.id!r}",
                             path=str(overlay_path), line=1)
        ledger = ledger.model_copy(update={"grants": [*ledger.grants, *overlay.grants]})
    try:
        return CompiledLedger(ledger)
    except (ValueError, RecursionError) as exc:  # validation should have caught it; stay an InputError
        raise InputError(f"cannot compile ledger: {exc}", path=str(path)) from None
