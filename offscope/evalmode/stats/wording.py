"""Honest wording of a change and of a minimum detectable effect."""

from __future__ import annotations

from typing import Any, Literal

from offscope.evalmode.stats.power import Power, mde
from offscope.trace.rates import Rate, effect_text, interval_text
from offscope.trace.rates import pct as _pct  # the one percentage rendering

# --------------------------------------------------------------------------- #
# 6. Honest wording
# --------------------------------------------------------------------------- #


def _fold(x: float) -> str:
    return f"{x:.1f}" if x < 10 else f"{x:.0f}"


_UNSET: Any = object()


def describe_change(
    before: Rate,
    after: Rate,
    significant: bool,
    *,
    interval: tuple[float, float] | None = None,
    interval_name: str = "Wilson",
    mde_result: Power | None = _UNSET,
    alpha: float = 0.05,
    power: float = 0.8,
    cluster_size: int = 1,
    icc: float = 0.0,
) -> str:
    """One honest sentence about a change in an event rate, always with the
    residual (the rate after, with its interval) next to the improvement.
    When the change is not significant it says so and gives the minimum
    detectable effect at this n in the direction of the observed change
    (see `mde`), instead of a fold change.

    `interval` and `mde_result` let a report pass the very numbers its
    table shows (the after-rate's interval, named by `interval_name`, and the
    MDE), so the sentence cannot disagree with the table; by default the
    Wilson (1927) interval and `mde(...)` with the given design are used.

    >>> describe_change(Rate(26, 50), Rate(4, 50), True)
    '6.5-fold reduction (52% -> 8%), still 8% of runs [3–19%]'
    """
    if before.n <= 0 or after.n <= 0:
        raise ValueError("both rates need at least one run")
    pb, pa = before.k / before.n, after.k / after.n
    lo, hi = interval if interval is not None else after.interval
    residual = f"{_pct(pa)} of runs {interval_text(lo, hi)}"
    moved = f"({_pct(pb)} -> {_pct(pa)})"
    if not significant:
        direction: Literal["up", "down"] = "down" if pa < pb else "up"
        if mde_result is _UNSET:
            n = min(before.n, after.n)
            mde_result = (
                mde(n, pb, alpha, power, cluster_size, icc, direction=direction)
                if 0 < pb < 1
                else None
            )
        if mde_result is None and 0 < pb < 1:
            size = f"no {'drop' if direction == 'down' else 'rise'} from {_pct(pb)} is detectable"
        elif mde_result is None:
            size = f"MDE undefined at a baseline of {_pct(pb)}"
        else:
            size = f"MDE {mde_points(mde_result)}"
        return f"no distinguishable difference at this n {moved[:-1]}; {size}), still {residual}"
    if pa == pb:
        return f"no change {moved}, still {residual}"
    if pa < pb:
        if pa == 0:
            # 0/n is not "zero risk": the residual is the interval's upper bound.
            return (
                f"reduction to zero observed {moved}, still up to {_pct(hi)} of runs "
                f"(0 of {after.n} observed; upper bound of the {interval_name} interval)"
            )
        return f"{_fold(pb / pa)}-fold reduction {moved}, still {residual}"
    if pb == 0:
        return f"increase from zero {moved}, now {residual}"
    return f"{_fold(pa / pb)}-fold increase {moved}, now {residual}"


def mde_points(m: Power) -> str:
    """The MDE as every report prints it (table column and sentence alike)."""
    return effect_text(m.effect)
