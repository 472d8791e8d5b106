"""Independent reference for the case-clustered t part, written from the
textbook on per-case differences (equal runs per case), with scipy for the t
distribution: Student's one-sample t on the G per-case differences, widened
by Johnson's (1978, JASA 73:536) skew correction m3 / (6 s^2 G); for the
non-inferiority upper bound the standard error is floored at
sqrt(margin (1 - margin) / n). The product computes the same from linearised
per-case residuals (`stats.differences._cluster_t`); these tests check the two agree."""

from __future__ import annotations

import numpy as np
from scipy import stats as sps


def johnson(diffs: np.ndarray) -> tuple[float, float, float, int]:
    """(mean, se, skew shift, df) of per-case differences."""
    g = len(diffs)
    mean = float(diffs.mean())
    s2 = float(diffs.var(ddof=1))
    m3 = float(((diffs - mean) ** 3).mean())
    shift = m3 / (6 * s2 * g) if s2 > 0 else 0.0
    return mean, (s2 / g) ** 0.5, shift, g - 1


def t_pvalue(diffs: np.ndarray, alternative: str = "two-sided") -> float:
    mean, se, shift, df = johnson(diffs)
    if se == 0:
        return 0.0 if (mean > 0 if alternative == "greater" else mean != 0) else 1.0
    low = sps.t.sf((mean + min(shift, 0.0)) / se, df)
    if alternative == "greater":
        return float(low)
    return float(min(1.0, 2 * min(low, sps.t.cdf((mean + max(shift, 0.0)) / se, df))))


def t_bounds(diffs: np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    mean, se, shift, df = johnson(diffs)
    q = sps.t.ppf(1 - (1 - confidence) / 2, df)
    return mean - q * se + min(shift, 0.0), mean + q * se + max(shift, 0.0)


def ni_upper(diffs: np.ndarray, alpha: float, margin: float, n: int) -> float:
    mean, se, shift, df = johnson(diffs)
    se = max(se, (margin * (1 - margin) / n) ** 0.5)
    return mean + sps.t.ppf(1 - alpha, df) * se + max(shift, 0.0)
