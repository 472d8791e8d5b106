"""The target ledger: what an agent may touch, compiled for tagging."""

from __future__ import annotations

from pathlib import Path

from offscope.ledgers.matcher import CallInput, CompiledLedger, TagResult, TargetTag
from offscope.ledgers.model import Grant, Ledger, Match

EXAMPLES = Path(__file__).parent / "examples"

__all__ = [
    "CallInput",
    "CompiledLedger",
    "Ledger",
    "Match",
    "TagResult",
    "TargetTag",
    "EXAMPLES",
    "compile_ledger",
    "grants_path",
    "load_ledger",
    "read_grants",
    "read_ledger",
]


def grants_path(ledger_path: str | Path) -> Path:
    """Where a ledger's reviewed grants live: `billing.yaml` -> `billing.grants.yaml`."""
    p = Path(ledger_path)
    return p.with_name(f"{p.stem}.grants.yaml")


def read_ledger(path: str | Path) -> Ledger:
    """Read and validate a ledger file, without its grants overlay (InputError
    with file:line on bad input)."""
    from offscope.yamlio import load_model

    return load_model(Ledger, path)


def compile_ledger(ledger: Ledger, path: str | Path) -> CompiledLedger:
    """Compile a validated ledger read from `path` (an InputError, never a traceback)."""
    from offscope.errors import InputError

    try:
        return CompiledLedger(ledger)
    except (
        ValueError,
        RecursionError,
    ) as exc:  # validation should have caught it; stay an InputError
        raise InputError(f"cannot compile ledger: {exc}", path=str(path)) from None


def read_grants(ledger_path: str | Path, ledger_id: str) -> list[Grant]:
    """The reviewed grants in a ledger's overlay file; none if there is no overlay."""
    from offscope.errors import InputError
    from offscope.ledgers.model import GrantsOverlay
    from offscope.yamlio import load_model

    overlay_path = grants_path(ledger_path)
    if not overlay_path.exists():
        return []
    overlay = load_model(GrantsOverlay, overlay_path)
    if overlay.ledger != ledger_id:
        raise InputError(
            f"grants are for ledger {overlay.ledger!r}, not {ledger_id!r}",
            path=str(overlay_path),
            line=1,
        )
    return list(overlay.grants)


def load_ledger(path: str | Path) -> CompiledLedger:
    """Read, validate and compile a ledger file, with its grants overlay if one
    exists (InputError with file:line on bad input in either). The overlay is
    applied on top of the compiled ledger (`with_grants`), so a new grant
    never recompiles the ledger."""
    ledger = read_ledger(path)
    return compile_ledger(ledger, path).with_grants(read_grants(path, ledger.id))
