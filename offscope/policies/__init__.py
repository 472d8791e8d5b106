"""What the proxy does with a tagged call: mode, operator replies, friction."""

from __future__ import annotations

from pathlib import Path

from offscope.errors import InputError
from offscope.policies.decide import CompiledPolicy, OperatorReply, PolicyVerdict, RunHistory
from offscope.policies.model import PRESETS_DIR, Policy, preset_names

__all__ = [
    "CompiledPolicy",
    "OperatorReply",
    "Policy",
    "RunHistory",
    "PolicyVerdict",
    "load_policy",
    "preset_names",
]


def load_policy(spec: str | Path) -> CompiledPolicy:
    """A policy file path, or the name of a bundled preset (`offscope validate --presets`)."""
    from offscope.yamlio import load_model

    path = Path(spec)
    if not path.exists() and str(spec) in preset_names():
        path = PRESETS_DIR / f"{spec}.yaml"
    elif not path.exists():
        raise InputError(
            "no such policy file or preset",
            path=str(spec),
            hint=f"presets: {', '.join(preset_names())}",
        )
    return CompiledPolicy(load_model(Policy, path))
