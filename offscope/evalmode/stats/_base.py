"""What the statistics share: JSON-ready results, z quantiles, input checks."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import fields, is_dataclass
from typing import Any

import numpy as np

from offscope.trace.rates import Rate

# --------------------------------------------------------------------------- #
# JSON helper
# --------------------------------------------------------------------------- #


def _jsonable(value: Any) -> Any:
    """Dataclasses -> dicts, tuples -> lists, numpy scalars -> Python, so that
    `json.dumps(result.as_dict())` always works."""
    if isinstance(value, Rate):
        return value.as_dict()
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        # JSON has no inf/nan; None is the honest "undefined".
        return None
    return value


class _AsDict:
    def as_dict(self) -> dict[str, Any]:
        out = _jsonable(self)
        assert isinstance(out, dict)
        return out


def _z(confidence: float) -> float:
    # scipy.special's ndtri is what scipy.stats.norm.ppf computes (the same values), without
    # importing scipy.stats (~0.8 s of CPU in a process that needs nothing else of it).
    from scipy.special import ndtri

    return float(ndtri(1 - (1 - confidence) / 2))


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence} must be in (0, 1)")


def _as_outcomes(values: Sequence[bool | int], name: str) -> list[bool]:
    out = []
    for v in values:
        if v not in (0, 1):  # True/False compare equal to 1/0
            raise ValueError(f"{name}: outcomes must be booleans (or 0/1), got {v!r}")
        out.append(bool(v))
    return out
