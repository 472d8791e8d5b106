"""Rates with intervals: the Wilson interval of a proportion, and the one way
every command and report prints a rate, an interval or a percentage.

Which interval a rate carries is decided once (`offscope.evalmode.stats.rate_interval`:
case-clustered when the runs name several cases, else Wilson); how it is printed
is decided here, so `grid`, `report`, `gate`, `shadow-compare`, `replay`,
report.md and report.html show one rate as the same text: ``50% [36–64%] (21/42)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

NO_VALUE = "–"  # a rate with no runs, a missing figure


def pct(x: float | None) -> str:
    """A share as whole percents, one decimal below 1% and above 99% (a 0.3%
    residual is not "0%"; a bound that is 0 up to float noise is just 0%)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return NO_VALUE
    if 0.0005 <= x < 0.01 or 0.99 < x <= 0.9995:
        return f"{x * 100:.1f}%"
    return f"{x * 100:.0f}%"


def interval_text(lo: float, hi: float) -> str:
    """An interval of shares: ``[36–64%]``."""
    return f"[{pct(lo).rstrip('%')}–{pct(hi)}]"


def rate_text(
    k: int,
    n: int,
    interval: tuple[float, float] | None = None,
    *,
    counts: bool = True,
    bounds: bool = True,
) -> str:
    """A rate as every command prints it: ``50% [36–64%] (21/42)``; `counts=False`
    drops ``(k/n)`` where a table has no room for it, `bounds=False` drops the
    interval where a sentence gives its own bound (``50% (21/42)``). `interval` is
    the rate's one interval (Wilson when not given); no runs print as "–"."""
    if n <= 0:
        return NO_VALUE
    text = pct(k / n)
    if bounds:
        lo, hi = interval if interval is not None else wilson(k, n)
        text += f" {interval_text(lo, hi)}"
    return f"{text} ({k}/{n})" if counts else text


def points(x: float) -> str:
    """A difference of two rates in percentage points, signed: ``+4.8 pts``."""
    return f"{x * 100:+.1f} pts"


def effect_text(x: float) -> str:
    """A change in a rate as a sentence gives it, in whole points: ``12 points`` (an MDE)."""
    return f"{x * 100:.0f} points"


def difference_text(d: float, ci: tuple[float, float]) -> str:
    """A difference of two rates with its interval: ``+4.8 pts [-1.2, +10.9]``."""
    lo, hi = ci
    return f"{points(d)} [{lo * 100:+.1f}, {hi * 100:+.1f}]"


def wilson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials (Wilson 1927).

    Returns (0.0, 1.0) for n == 0: no data, no information.
    """
    if n <= 0:
        return (0.0, 1.0)
    if not 0 <= k <= n:
        raise ValueError(f"k={k} outside 0..n={n}")
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)  # stdlib: no scipy import on the hot path
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / denom
    # At k == 0 or k == n the exact bound is 0 or 1; float rounding would miss it.
    lo = 0.0 if k == 0 else max(0.0, centre - half)
    hi = 1.0 if k == n else min(1.0, centre + half)
    return (lo, hi)


@dataclass(frozen=True)
class Rate:
    """k of n, with its 95% interval: Wilson unless the rate was given its
    clustered one (`ci`, with `method`), as a grid cell's rate is."""

    k: int
    n: int
    ci: tuple[float, float] | None = None
    method: str = "wilson"

    @property
    def value(self) -> float | None:
        return self.k / self.n if self.n else None

    @property
    def interval(self) -> tuple[float, float]:
        return self.ci if self.ci is not None else wilson(self.k, self.n)

    def as_dict(self) -> dict:
        lo, hi = self.interval
        return {
            "k": self.k,
            "n": self.n,
            "rate": self.value,
            "ci95": [lo, hi],
            "method": self.method,
        }

    def text(self, interval: tuple[float, float] | None = None, *, counts: bool = True) -> str:
        """`rate_text` of this rate: its own interval unless a caller holds the one
        the report printed for it (`interval`)."""
        return rate_text(
            self.k, self.n, interval if interval is not None else self.interval, counts=counts
        )

    def __str__(self) -> str:
        return self.text()
