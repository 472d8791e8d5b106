"""Clustered rates: a rate over runs that are clustered in cases."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from offscope.evalmode.stats._base import _as_outcomes, _AsDict, _check_confidence
from offscope.trace.rates import Rate, wilson

# --------------------------------------------------------------------------- #
# 1. Clustered rates
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class ClusteredRate(_AsDict):
    """A rate over runs that are clustered within cases.

    `ci` is the interval to report: the hull of the naive Wilson interval and
    the case-level bootstrap interval (see `clustered_rate` for why).
    """

    k: int
    n: int
    point: float
    wilson_ci: tuple[float, float]
    bootstrap_ci: tuple[float, float] | None
    ci: tuple[float, float]
    n_clusters: int
    mean_cluster_size: float
    icc: float | None
    design_effect: float
    effective_n: float
    n_boot: int
    seed: int
    confidence: float
    method: str
    notes: tuple[str, ...] = ()


def _anova_icc(ks: np.ndarray, ns: np.ndarray) -> tuple[float | None, float]:
    """ANOVA estimator of the intraclass correlation for binary outcomes and
    the adjusted mean cluster size m0 (Fleiss 1981; Donner 1986; Donner & Klar
    2000, ch. 4). Returns (icc or None when undefined, m0)."""
    n_total = float(ns.sum())
    n_clusters = len(ns)
    if n_clusters < 2:
        return None, float(n_total)
    p = ks.sum() / n_total
    p_i = ks / ns
    msb = float((ns * (p_i - p) ** 2).sum() / (n_clusters - 1))
    m0 = float((n_total - (ns**2).sum() / n_total) / (n_clusters - 1))
    if n_total - n_clusters <= 0:
        # every cluster has one run: no within-cluster variation to compare with
        return None, m0
    msw = float((ns * p_i * (1 - p_i)).sum() / (n_total - n_clusters))
    denom = msb + (m0 - 1) * msw
    if denom <= 0:
        # all outcomes identical: the correlation is undefined, not zero
        return None, m0
    if abs(msb - msw) <= 1e-12 * max(msb, msw):
        # equal mean squares up to rounding: an ICC of 1e-16 is zero (and as a design
        # parameter it made a beta with a + b = 1e16, which scipy takes seconds to invert)
        return 0.0, m0
    return (msb - msw) / denom, m0


def clustered_rate(
    values: Sequence[bool | int],
    clusters: Sequence[Hashable],
    n_boot: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> ClusteredRate:
    """Rate of `True` among runs that are clustered within cases.

    Methods:
    - point estimate k/n and the naive Wilson score interval (Wilson 1927),
      which assumes independent runs;
    - a case-level (cluster) bootstrap percentile interval: resample whole
      cases with replacement, recompute the pooled rate (Davison & Hinkley
      1997, sec. 3.8; Field & Welsh 2007), deterministic for a given `seed`;
    - the ICC by the one-way ANOVA estimator and the design effect
      1 + (m0 - 1) * icc with m0 the adjusted mean cluster size (Donner &
      Klar 2000). A negative ICC estimate is reported as is but the design
      effect is floored at 1: with cases as clusters, "runs of one case are
      less alike than runs of different cases" is sampling noise, and an
      interval narrower than the naive one would overstate precision.

    `ci` (the one to report) is the hull of the Wilson and bootstrap
    intervals: the percentile bootstrap under-covers with few clusters and
    collapses to a point at 0/n or n/n (every resample is 0), while Wilson
    ignores clustering; the hull is never narrower than either. With a single
    cluster the bootstrap is impossible and `ci` is the Wilson interval, with a
    note saying so.
    """
    _check_confidence(confidence)
    outcomes = _as_outcomes(values, "values")
    if len(outcomes) != len(clusters):
        raise ValueError(
            f"values ({len(outcomes)}) and clusters ({len(clusters)}) differ in length"
        )
    if not outcomes:
        raise ValueError("no runs: a rate needs at least one run")
    if n_boot < 1:
        raise ValueError("n_boot must be >= 1")

    # Group by cluster in first-seen order so the bootstrap is reproducible
    # for a given input order and seed.
    order: dict[Hashable, int] = {}
    for c in clusters:
        order.setdefault(c, len(order))
    ks = np.zeros(len(order))
    ns = np.zeros(len(order))
    for v, c in zip(outcomes, clusters, strict=True):
        i = order[c]
        ns[i] += 1
        ks[i] += v
    k, n = int(ks.sum()), int(ns.sum())
    point = k / n
    w = wilson(k, n, confidence)
    icc, m0 = _anova_icc(ks, ns)
    deff = 1.0 + (m0 - 1.0) * max(icc, 0.0) if icc is not None else 1.0
    notes: list[str] = []

    boot: tuple[float, float] | None = None
    if len(order) < 2:
        notes.append(
            "only one case: a case-level bootstrap is impossible; the Wilson interval "
            "assumes independent runs and is likely too narrow"
        )
        ci = w
        method = "wilson (single cluster)"
    else:
        rng = np.random.default_rng(seed)
        idx = rng.integers(0, len(order), size=(n_boot, len(order)))
        reps = ks[idx].sum(axis=1) / ns[idx].sum(axis=1)
        a = (1 - confidence) / 2
        lo, hi = np.quantile(reps, [a, 1 - a])
        boot = (float(lo), float(hi))
        ci = (min(w[0], boot[0]), max(w[1], boot[1]))
        method = "hull of wilson and case-level bootstrap percentile"
        if len(order) < 10:
            notes.append(
                f"only {len(order)} cases: the percentile bootstrap under-covers with "
                "few clusters; treat the interval as a lower bound on uncertainty"
            )
    if icc is None and len(order) >= 2:
        notes.append("ICC undefined (no within- or between-case variation); design effect set to 1")

    return ClusteredRate(
        k=k,
        n=n,
        point=point,
        wilson_ci=w,
        bootstrap_ci=boot,
        ci=ci,
        n_clusters=len(order),
        mean_cluster_size=n / len(order),
        icc=icc,
        design_effect=deff,
        effective_n=n / deff,
        n_boot=n_boot,
        seed=seed,
        confidence=confidence,
        method=method,
        notes=tuple(notes),
    )


# --------------------------------------------------------------------------- #
# 2. The one interval of a rate
# --------------------------------------------------------------------------- #

# The case-level bootstrap of a printed rate: its resamples and random state are
# fixed, and cases are taken in id order, so the interval is a function of the
# runs alone and every command that reads the same runs prints the same one.
RATE_RESAMPLES = 1000
RATE_RANDOM_STATE = 0


def rate_clustering(
    values: Sequence[bool | int], clusters: Sequence[Hashable | None] | None
) -> ClusteredRate | None:
    """The case-clustered rate behind a printed interval, or None when the runs
    are not clustered: no case labels (production), a run without one, or a
    single case (then Wilson is the interval, as `clustered_rate` would say)."""
    if not values or clusters is None or any(c is None for c in clusters):
        return None
    if len(set(clusters)) < 2:
        return None
    pairs = sorted(zip(clusters, values, strict=True), key=lambda cv: str(cv[0]))
    return clustered_rate(
        [v for _, v in pairs],
        [c for c, _ in pairs],
        n_boot=RATE_RESAMPLES,
        seed=RATE_RANDOM_STATE,
    )


def rate_interval(
    values: Sequence[bool | int], clusters: Sequence[Hashable | None] | None = None
) -> Rate:
    """A rate with the one 95% interval every command prints for it (docs/statistics.md):
    with runs from several cases (`clusters`, one case id per run), the hull of
    Wilson and the case-level bootstrap; otherwise Wilson."""
    k, n = int(sum(bool(v) for v in values)), len(values)
    c = rate_clustering(values, clusters)
    if c is None:
        return Rate(k, n)
    return Rate(k, n, ci=c.ci, method=c.method)
