"""The target ledger: what an agent may touch, compiled for tagging."""

from __future__ import annotations

from pathlib import Path

from offscope.ledgers.matcher import CallInput, CompiledLedger, TagResult, TargetTag
from offscope.ledgers.model import Ledger, Match

EXAMPLES = Path(__file__).parent / "examples"

__all__ = ["CallInput", "CompiledLedger", "Ledger", "Match", "TagResult", "TargetTag",
           "EXAMPLES", "load_ledger"]


def load_ledger(path: str | Path) -> CompiledLedger:
    """Read, validate and compile a ledger file (InputError with file:line on bad input)."""
    from offscope.yamlio import load_model

    return CompiledLedger(load_model(Ledger, path))
