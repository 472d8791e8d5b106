"""Rates with intervals: the one place a proportion gets its confidence interval."""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist


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
    """k of n, with its Wilson 95% interval."""

    k: int
    n: int

    @property
    def value(self) -> float | None:
        return self.k / self.n if self.n else None

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.k, self.n)

    def as_dict(self) -> dict:
        lo, hi = self.interval
        return {"k": self.k, "n": self.n, "rate": self.value, "ci95": [lo, hi], "method": "wilson"}

    def __str__(self) -> str:
        if not self.n:
            return "–"
        lo, hi = self.interval
        return f"{self.value:.0%} [{lo:.0%}, {hi:.0%}] ({self.k}/{self.n})"
