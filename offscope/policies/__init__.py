"""What the proxy does with a tagged call: mode, operator replies, friction."""

from __future__ import annotations

from pathlib import Path

from offscope.policies.decide import CompiledPolicy, OperatorReply, PolicyVerdict, RunHistory
from offscope.policies.model import Policy, PolicySource, preset_names, resolve_policy

__all__ = [
    "CompiledPolicy",
    "OperatorReply",
    "Policy",
    "RunHistory",
    "PolicySource",
    "PolicyVerdict",
    "load_policy",
    "preset_names",
    "resolve_policy",
]


def load_policy(spec: str | Path) -> CompiledPolicy:
    """A bundled preset by its name (`enforce`), or a policy file by its path
    (`./enforce.yaml`): `resolve_policy` says which. Bad input raises InputError
    (exit 2), naming the presets."""
    from offscope.yamlio import load_model

    source = resolve_policy(spec)
    return CompiledPolicy(load_model(Policy, source.path), source)
