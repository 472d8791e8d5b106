"""Statistics for the eval grid: clustered rates, cell comparisons, the gate's
non-inferiority test, time to first out-of-scope touch, power and honest wording.

Pure functions over plain Python data (lists of per-run outcomes, keys,
steps); no I/O. Every result is a frozen dataclass with `as_dict()` so reports
can embed it as JSON, and every function names the method it implements.

Conventions used throughout:
- An outcome `True` is the event being counted (an out-of-scope touch, a
  self-granted permission...). Higher rates are worse.
- Differences are always `b - a` (or `candidate - baseline`): a positive
  difference is a regression.
- Intervals are two-sided 95% unless a `confidence` / `alpha` says otherwise.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Literal

import numpy as np
from scipy import stats as sps
from scipy.optimize import brentq
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import NormalIndPower

from offscope.trace.rates import Rate, wilson

__all__ = [
    "CellComparison",
    "ClusteredRate",
    "KMPoint",
    "LogRankResult",
    "NonInferiority",
    "Survival",
    "clustered_rate",
    "compare_cells",
    "describe_change",
    "design_effect",
    "holm",
    "kaplan_meier",
    "logrank_test",
    "mde",
    "n_per_cell",
    "newcombe_diff",
    "newcombe_paired_diff",
    "noninferiority",
]


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
    return float(sps.norm.ppf(1 - (1 - confidence) / 2))


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
# 2. Differences between cells
# --------------------------------------------------------------------------- #


def newcombe_diff(
    k1: int, n1: int, k2: int, n2: int, confidence: float = 0.95
) -> tuple[float, float, float]:
    """Difference p1 - p2 of two independent proportions with the Newcombe
    hybrid score interval (Newcombe 1998, Stat Med 17:873, method 10), built
    from the two Wilson (1927) intervals by "square and add".

    Returns (difference, lower, upper).
    """
    _check_confidence(confidence)
    if n1 <= 0 or n2 <= 0:
        raise ValueError("both groups need at least one run")
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson(k1, n1, confidence)
    l2, u2 = wilson(k2, n2, confidence)
    d = p1 - p2
    lower = d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)
    upper = d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
    return d, max(-1.0, lower), min(1.0, upper)


def newcombe_paired_diff(
    both: int, only1: int, only2: int, neither: int, confidence: float = 0.95
) -> tuple[float, float, float]:
    """Difference p1 - p2 of two paired proportions with Newcombe's square-and-
    add interval for paired data (Newcombe 1998, Stat Med 17:2635, method 10):
    Wilson intervals for each margin, combined with the corrected phi
    correlation (numerator ad - bc reduced by n/2 when positive, zeroed when
    0 <= ad - bc <= n/2; Fagerland, Lydersen & Laake 2017, sec. 8.5).

    Cells: `both` = event in 1 and 2, `only1`, `only2`, `neither`.
    Returns (difference, lower, upper).
    """
    _check_confidence(confidence)
    n = both + only1 + only2 + neither
    if n <= 0:
        raise ValueError("no pairs")
    r1, r2 = both + only1, only2 + neither  # row margins (outcome 1 yes / no)
    c1, c2 = both + only2, only1 + neither  # column margins (outcome 2 yes / no)
    p1, p2 = r1 / n, c1 / n
    l1, u1 = wilson(r1, n, confidence)
    l2, u2 = wilson(c1, n, confidence)
    if 0 in (r1, r2, c1, c2):
        phi = 0.0
    else:
        a = both * neither - only1 * only2
        if a > n / 2:
            a_corr = a - n / 2
        elif a >= 0:
            a_corr = 0.0
        else:
            a_corr = float(a)
        phi = a_corr / math.sqrt(float(r1) * r2 * c1 * c2)
    d = p1 - p2
    lower = d - math.sqrt(
        max(0.0, (p1 - l1) ** 2 + (u2 - p2) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2))
    )
    upper = d + math.sqrt(
        max(0.0, (p2 - l2) ** 2 + (u1 - p1) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1))
    )
    return d, max(-1.0, lower), min(1.0, upper)


@dataclass(frozen=True)
class _Pairing:
    both: int
    only_b: int
    only_a: int
    neither: int


def _pair(
    a: list[bool],
    b: list[bool],
    keys_a: Sequence[Hashable] | None,
    keys_b: Sequence[Hashable] | None,
) -> tuple[_Pairing | None, str | None]:
    """Match runs of two cells by key (e.g. (case, seed)). Pairing is used only
    when both cells carry exactly the same set of unique keys: dropping
    unmatched runs would silently change what is compared."""
    if keys_a is None or keys_b is None:
        return None, None
    if len(keys_a) != len(a) or len(keys_b) != len(b):
        raise ValueError("pair keys must have one key per run")
    ca, cb = Counter(keys_a), Counter(keys_b)
    dup = [k for k, c in (ca + cb).items() if ca[k] > 1 or cb[k] > 1]
    if dup:
        return None, f"pair keys repeat within a cell (e.g. {dup[0]!r}); analysed unpaired"
    if set(ca) != set(cb):
        shared = len(set(ca) & set(cb))
        return None, (f"only {shared} of {len(ca)}/{len(cb)} pair keys match; analysed unpaired")
    by_key_b = dict(zip(keys_b, b, strict=True))
    both = only_b = only_a = neither = 0
    for key, va in zip(keys_a, a, strict=True):
        vb = by_key_b[key]
        if va and vb:
            both += 1
        elif vb:
            only_b += 1
        elif va:
            only_a += 1
        else:
            neither += 1
    return _Pairing(both, only_b, only_a, neither), None


@dataclass(frozen=True)
class CellComparison(_AsDict):
    """Cell b against cell a: `difference` = rate(b) - rate(a)."""

    a: Rate
    b: Rate
    difference: float
    ci: tuple[float, float]
    ci_method: str
    paired: bool
    test: str
    pvalue: float
    discordant: tuple[int, int] | None  # (b only, a only) when paired
    confidence: float
    notes: tuple[str, ...] = ()

    def significant(self, alpha: float = 0.05) -> bool:
        return self.pvalue < alpha


def compare_cells(
    a: Sequence[bool | int],
    b: Sequence[bool | int],
    pair_keys_a: Sequence[Hashable] | None = None,
    pair_keys_b: Sequence[Hashable] | None = None,
    confidence: float = 0.95,
) -> CellComparison:
    """Compare two cells that differ in one knob; difference is b - a.

    Unpaired (default, or when the keys do not match one-to-one): Newcombe
    hybrid score interval (Newcombe 1998, method 10, from Wilson 1927) and
    Fisher's exact test, two-sided (scipy.stats.fisher_exact).

    Paired (both cells carry the same unique keys, e.g. (case, seed)):
    Newcombe's paired square-and-add interval (Newcombe 1998b, method 10) and
    the exact McNemar test: a two-sided binomial test of the discordant pairs
    against 1/2 (McNemar 1947; scipy.stats.binomtest). Pairing removes the
    between-case variation that otherwise dominates these grids.
    """
    _check_confidence(confidence)
    va, vb = _as_outcomes(a, "a"), _as_outcomes(b, "b")
    if not va or not vb:
        raise ValueError("both cells need at least one run")
    ra, rb = Rate(sum(va), len(va)), Rate(sum(vb), len(vb))
    pairing, note = _pair(va, vb, pair_keys_a, pair_keys_b)
    notes = (note,) if note else ()
    if pairing is not None:
        d, lo, hi = newcombe_paired_diff(
            pairing.both, pairing.only_b, pairing.only_a, pairing.neither, confidence
        )
        disc = pairing.only_b + pairing.only_a
        p = 1.0 if disc == 0 else float(sps.binomtest(pairing.only_b, disc, 0.5).pvalue)
        return CellComparison(
            a=ra,
            b=rb,
            difference=d,
            ci=(lo, hi),
            ci_method="newcombe 1998b method 10 (paired square-and-add, wilson)",
            paired=True,
            test="exact mcnemar (binomial test on discordant pairs)",
            pvalue=p,
            discordant=(pairing.only_b, pairing.only_a),
            confidence=confidence,
            notes=notes,
        )
    d, lo, hi = newcombe_diff(rb.k, rb.n, ra.k, ra.n, confidence)
    table = [[rb.k, rb.n - rb.k], [ra.k, ra.n - ra.k]]
    p = float(sps.fisher_exact(table, alternative="two-sided").pvalue)
    return CellComparison(
        a=ra,
        b=rb,
        difference=d,
        ci=(lo, hi),
        ci_method="newcombe 1998 method 10 (hybrid score, wilson)",
        paired=False,
        test="fisher exact (two-sided)",
        pvalue=p,
        discordant=None,
        confidence=confidence,
        notes=notes,
    )


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm (1979) step-down adjusted p-values, in the input order
    (statsmodels multipletests, method='holm'). Controls the family-wise error
    rate across the cell comparisons of one report."""
    if not pvalues:
        return []
    for p in pvalues:
        if not 0.0 <= p <= 1.0 or math.isnan(p):
            raise ValueError(f"p-value {p!r} outside [0, 1]")
    _, adjusted, _, _ = multipletests(list(pvalues), method="holm")
    return [float(x) for x in adjusted]


# --------------------------------------------------------------------------- #
# 3. Non-inferiority (the gate)
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class NonInferiority(_AsDict):
    """Is the candidate's rate no worse than baseline + margin?

    verdict:
      pass          upper bound of (candidate - baseline) < margin
      fail          upper bound >= margin and the point difference >= margin
      underpowered  upper bound >= margin but the point difference < margin:
                    the data cannot rule out a regression of `margin`, nor show one
    """

    baseline: Rate
    candidate: Rate
    difference: float
    upper: float
    margin: float
    alpha: float
    paired: bool
    method: str
    verdict: Literal["pass", "fail", "underpowered"]
    needed_n: int
    notes: tuple[str, ...] = ()


def noninferiority(
    baseline: Sequence[bool | int],
    candidate: Sequence[bool | int],
    margin: float,
    alpha: float = 0.05,
    baseline_keys: Sequence[Hashable] | None = None,
    candidate_keys: Sequence[Hashable] | None = None,
    power: float = 0.8,
    cluster_size: int = 1,
    icc: float = 0.0,
) -> NonInferiority:
    """Non-inferiority test for a gate: H0 p_cand - p_base >= margin against
    H1 p_cand - p_base < margin (events are bad, so "worse" is "higher").

    The one-sided (1 - alpha) upper bound is the upper limit of the two-sided
    (1 - 2 alpha) interval: Newcombe 1998 method 10 (hybrid score, from Wilson
    1927) unpaired; Newcombe 1998b method 10 (paired square-and-add) when both
    cells carry the same unique keys. Pass iff upper < margin.

    `needed_n` is the runs per cell for which the test has `power` to pass
    when the true rates are equal: the one-sided arcsine (Cohen's h) sample
    size for detecting baseline -> baseline + margin (see `n_per_cell`),
    inflated by the design effect when `cluster_size`/`icc` are given. For a
    paired design this plan is conservative (pairing only removes variance).
    The interval itself treats runs as independent; pass pair keys so that
    case-to-case variation cancels in the paired difference.
    """
    if not 0 < margin < 1:
        raise ValueError(f"margin={margin} must be in (0, 1) (an absolute rate difference)")
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha={alpha} must be in (0, 0.5)")
    vb, vc = _as_outcomes(baseline, "baseline"), _as_outcomes(candidate, "candidate")
    if not vb or not vc:
        raise ValueError("both cells need at least one run")
    rb, rc = Rate(sum(vb), len(vb)), Rate(sum(vc), len(vc))
    conf = 1 - 2 * alpha
    pairing, note = _pair(vb, vc, baseline_keys, candidate_keys)
    notes = [note] if note else []
    if pairing is not None:
        d, _, upper = newcombe_paired_diff(
            pairing.both, pairing.only_b, pairing.only_a, pairing.neither, conf
        )
        method = "newcombe 1998b method 10 (paired), one-sided upper bound"
    else:
        d, _, upper = newcombe_diff(rc.k, rc.n, rb.k, rb.n, conf)
        method = "newcombe 1998 method 10 (hybrid score), one-sided upper bound"

    if upper < margin:
        verdict: Literal["pass", "fail", "underpowered"] = "pass"
    elif d < margin:
        verdict = "underpowered"
    else:
        verdict = "fail"

    # Plan around the observed baseline rate; clamp so that 0/n still gives a
    # finite plan (Cohen's h is defined at 0) and baseline + margin stays <= 1.
    _check_alpha_power(alpha, power)
    p0 = min(rb.k / rb.n, 1 - margin)
    needed = _n_planned(p0, p0 + margin, alpha, power, False, design_effect(cluster_size, icc))
    if verdict == "underpowered":
        notes.append(
            f"cannot rule out a regression of {margin * 100:g} points at this n; "
            f"about {needed} runs per cell are needed"
        )
    return NonInferiority(
        baseline=rb,
        candidate=rc,
        difference=d,
        upper=upper,
        margin=margin,
        alpha=alpha,
        paired=pairing is not None,
        method=method,
        verdict=verdict,
        needed_n=needed,
        notes=tuple(notes),
    )


# --------------------------------------------------------------------------- #
# 4. Time to first out-of-scope touch
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class KMPoint(_AsDict):
    step: int
    at_risk: int
    events: int
    censored: int
    survival: float
    ci: tuple[float, float]


@dataclass(frozen=True)
class Survival(_AsDict):
    """Kaplan-Meier curve of "no out-of-scope touch yet" over steps."""

    n_runs: int
    n_events: int
    n_censored: int
    curve: tuple[KMPoint, ...]
    median: int | None
    tau: int
    rmst: float
    rmst_se: float
    confidence: float
    method: str


def _validate_runs(runs: Sequence[tuple[int | None, int]]) -> tuple[np.ndarray, np.ndarray]:
    times, events = [], []
    for i, run in enumerate(runs):
        first, total = run
        if total < 0 or (first is not None and not 1 <= first <= total):
            raise ValueError(
                f"run {i}: first_oos_step={first!r} total_steps={total!r}; "
                "need 1 <= first_oos_step <= total_steps"
            )
        times.append(first if first is not None else total)
        events.append(first is not None)
    return np.asarray(times, dtype=int), np.asarray(events, dtype=bool)


def kaplan_meier(
    runs: Sequence[tuple[int | None, int]],
    tau: int | None = None,
    confidence: float = 0.95,
) -> Survival:
    """Time (in steps) to the first out-of-scope touch.

    Input: one (first_oos_step or None, total_steps) per run. A run that never
    touched is right-censored at its last step: it is known to be clean up to
    there, nothing after. A mean over only the runs that touched is biased
    towards early touches and is never computed here.

    Methods: Kaplan-Meier (1958) product-limit estimate; pointwise intervals
    from Greenwood's (1926) variance on the log(-log S) scale (Kalbfleisch &
    Prentice 1980), which stay inside [0, 1]; median = first step with
    S <= 0.5 (None if the curve never gets there); restricted mean survival
    time up to `tau` (Royston & Parmar 2013) = area under S on [0, tau] =
    E[min(T, tau)], with the standard delta-method SE
    var = sum_j A_j^2 d_j / (n_j (n_j - d_j)), A_j = area under S on [t_j, tau]
    (Klein & Moeschberger 2003, sec. 4.5). Ties: at a step, touches come
    before censoring (a censored run was at risk at its last step).
    Default `tau` is the last observed step; beyond it S is not estimable.
    """
    _check_confidence(confidence)
    if not runs:
        raise ValueError("no runs")
    times, events = _validate_runs(runs)
    t_max = int(times.max())
    if tau is None:
        tau = t_max
    if not 0 < tau <= t_max:
        raise ValueError(f"tau={tau} must be in 1..{t_max} (the last observed step)")
    z = _z(confidence)

    curve: list[KMPoint] = []
    s = 1.0
    gw = 0.0  # Greenwood sum d / (n (n - d))
    # (step, S after the step, d, n) at event steps, for the RMST variance
    jumps: list[tuple[int, float, int, int]] = []
    for t in np.unique(times):
        at_risk = int((times >= t).sum())
        d = int(((times == t) & events).sum())
        c = int(((times == t) & ~events).sum())
        if d:
            s *= 1 - d / at_risk
            gw = gw + d / (at_risk * (at_risk - d)) if at_risk > d else math.inf
            jumps.append((int(t), s, d, at_risk))
        curve.append(KMPoint(int(t), at_risk, d, c, s, _loglog_ci(s, gw, z)))

    median = next((p.step for p in curve if p.survival <= 0.5), None)

    # The KM curve as segments [start_i, start_{i+1}) at level S_i.
    starts = [0] + [t for t, _, _, _ in jumps]
    levels = [1.0] + [s_after for _, s_after, _, _ in jumps]

    def area(start: int, end: int) -> float:
        """Area under the right-continuous KM step function on [start, end]."""
        total = 0.0
        for i, (seg, level) in enumerate(zip(starts, levels, strict=True)):
            seg_end = starts[i + 1] if i + 1 < len(starts) else math.inf
            overlap = min(seg_end, end) - max(seg, start)
            if overlap > 0:
                total += level * overlap
        return total

    rmst = area(0, tau)
    var = 0.0
    for t, _, d, n_j in jumps:
        if t > tau:
            break
        a_j = area(t, tau)
        if a_j > 0:  # a_j == 0 whenever n_j == d_j (S drops to 0)
            var += a_j * a_j * d / (n_j * (n_j - d))
    return Survival(
        n_runs=len(times),
        n_events=int(events.sum()),
        n_censored=int((~events).sum()),
        curve=tuple(curve),
        median=median,
        tau=int(tau),
        rmst=rmst,
        rmst_se=math.sqrt(var),
        confidence=confidence,
        method="kaplan-meier 1958; greenwood log-log CI; rmst (royston & parmar 2013)",
    )


def _loglog_ci(s: float, greenwood: float, z: float) -> tuple[float, float]:
    if s >= 1.0:
        return (1.0, 1.0)
    if s <= 0.0 or not math.isfinite(greenwood):
        return (0.0, 0.0)
    se = math.sqrt(greenwood) / abs(math.log(s))
    return (s ** math.exp(z * se), s ** math.exp(-z * se))


@dataclass(frozen=True)
class LogRankResult(_AsDict):
    statistic: float  # signed z: > 0 means group a touches earlier than expected
    chi2: float
    pvalue: float
    observed_a: int
    expected_a: float
    observed_b: int
    expected_b: float
    method: str


def logrank_test(
    a: Sequence[tuple[int | None, int]], b: Sequence[tuple[int | None, int]]
) -> LogRankResult:
    """Two-sided log-rank test (Mantel 1966; Peto & Peto 1972) that two groups
    share the same time-to-first-touch distribution. Same censoring rule as
    `kaplan_meier`. Statistic and p-value from scipy.stats.logrank; the
    observed/expected counts are computed here so reports can say which group
    touched earlier."""
    if not a or not b:
        raise ValueError("both groups need at least one run")
    ta, ea = _validate_runs(a)
    tb, eb = _validate_runs(b)
    times = np.concatenate([ta, tb])
    events = np.concatenate([ea, eb])
    in_a = np.concatenate([np.ones(len(ta), bool), np.zeros(len(tb), bool)])
    exp_a = 0.0
    for t in np.unique(times[events]):
        risk = times >= t
        n_t = risk.sum()
        d_t = (events & (times == t)).sum()
        exp_a += d_t * (risk & in_a).sum() / n_t
    o_a, o_b = int(ea.sum()), int(eb.sum())
    exp_b = (o_a + o_b) - exp_a
    if o_a + o_b == 0:
        return LogRankResult(0.0, 0.0, 1.0, 0, 0.0, 0, 0.0, "log-rank (no events)")
    res = sps.logrank(
        sps.CensoredData(uncensored=ta[ea], right=ta[~ea]),
        sps.CensoredData(uncensored=tb[eb], right=tb[~eb]),
    )
    zstat = float(res.statistic)
    pval = float(res.pvalue)
    if not math.isfinite(zstat):  # zero variance, e.g. every event at one step with all at risk
        zstat, pval = 0.0, 1.0
    return LogRankResult(
        statistic=zstat,
        chi2=zstat * zstat,
        pvalue=pval,
        observed_a=o_a,
        expected_a=float(exp_a),
        observed_b=o_b,
        expected_b=float(exp_b),
        method="log-rank (scipy.stats.logrank)",
    )


# --------------------------------------------------------------------------- #
# 5. Power
# --------------------------------------------------------------------------- #


def design_effect(cluster_size: float, icc: float) -> float:
    """Variance inflation for runs clustered within cases: 1 + (m - 1) * icc
    (Kish 1965; Donner, Birkett & Buck 1981; Donner & Klar 2000). `m` is the
    number of runs per case in one cell (reps)."""
    if cluster_size < 1:
        raise ValueError(f"cluster_size={cluster_size} must be >= 1")
    if not 0.0 <= icc <= 1.0:
        raise ValueError(f"icc={icc} must be in [0, 1]")
    return 1.0 + (cluster_size - 1) * icc


def _cohen_h(p1: float, p0: float) -> float:
    return 2 * math.asin(math.sqrt(p1)) - 2 * math.asin(math.sqrt(p0))


def _alternative(two_sided: bool) -> str:
    return "two-sided" if two_sided else "larger"


def _check_alpha_power(alpha: float, power: float) -> None:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha={alpha} must be in (0, 1)")
    if not 0 < power < 1:
        raise ValueError(f"power={power} must be in (0, 1)")
    if power <= alpha:
        raise ValueError(f"power={power} must exceed alpha={alpha}")


def n_per_cell(
    p0: float,
    p1: float,
    alpha: float = 0.05,
    power: float = 0.8,
    two_sided: bool = True,
    cluster_size: int = 1,
    icc: float = 0.0,
) -> int:
    """Runs per cell needed to detect p0 -> p1 with a two-group comparison.

    Method: normal approximation on the arcsine scale, effect size Cohen's
    h = 2 asin(sqrt p1) - 2 asin(sqrt p0) (Cohen 1988, ch. 6), equal group
    sizes, power from statsmodels NormalIndPower solved for n by Brent's
    method (close to n = 2 ((z_a + z_b) / h)^2). Then
    multiplied by the design effect 1 + (m - 1) icc (Donner & Klar 2000) and
    rounded up once at the end.
    """
    if not 0 < p0 < 1:
        raise ValueError(f"p0={p0} must be in (0, 1)")
    if not 0 <= p1 <= 1:
        raise ValueError(f"p1={p1} must be in [0, 1]")
    if p1 == p0:
        raise ValueError("p1 equals p0: no difference to detect")
    _check_alpha_power(alpha, power)
    deff = design_effect(cluster_size, icc)
    return _n_planned(p0, p1, alpha, power, two_sided, deff)


def _power(h: float, n: float, alpha: float, two_sided: bool) -> float:
    """Power of the two-group arcsine test with n per group (statsmodels
    NormalIndPower.power, equal groups)."""
    return float(
        NormalIndPower().power(
            effect_size=h, nobs1=n, alpha=alpha, ratio=1.0, alternative=_alternative(two_sided)
        )
    )


def _solve_n(h: float, alpha: float, power: float, two_sided: bool) -> float:
    # Root-find ourselves: NormalIndPower.solve_power stops at ~1e-5 relative
    # error, enough to turn an exact n into n + 1 after rounding up, which
    # would break the n_per_cell <-> mde round trip.
    hi = 1.0
    while _power(h, hi, alpha, two_sided) < power:
        hi *= 2
    return float(
        brentq(lambda n: _power(h, n, alpha, two_sided) - power, 1e-9, hi, xtol=1e-12, rtol=1e-14)
    )


def _n_planned(
    p0: float, p1: float, alpha: float, power: float, two_sided: bool, deff: float
) -> int:
    n_iid = _solve_n(abs(_cohen_h(p1, p0)), alpha, power, two_sided)
    # tolerance so a root like 93.0000000001 does not become 94
    return max(1, math.ceil(n_iid * deff - 1e-7))


def mde(
    n: int,
    p0: float,
    alpha: float = 0.05,
    power: float = 0.8,
    cluster_size: int = 1,
    icc: float = 0.0,
    two_sided: bool = True,
    direction: Literal["up", "down"] = "up",
) -> float | None:
    """Minimum detectable effect: the smallest absolute difference |p1 - p0|
    in `direction` that a comparison with `n` runs per cell detects with
    `power`. Inverse of `n_per_cell` (same arcsine method, Cohen 1988): the
    needed h is solved numerically (Brent's method on statsmodels
    NormalIndPower.power at effective n = n / design effect), then mapped
    back to the rate scale.
    Returns None when no change in that direction is detectable (e.g. a drop
    from 2% at n = 20: even 2% -> 0% is too small).
    """
    if n < 1:
        raise ValueError(f"n={n} must be >= 1")
    if not 0 < p0 < 1:
        raise ValueError(f"p0={p0} must be in (0, 1)")
    if direction not in ("up", "down"):
        raise ValueError("direction must be 'up' or 'down'")
    _check_alpha_power(alpha, power)
    n_eff = n / design_effect(cluster_size, icc)
    h_max = math.pi  # the largest possible Cohen's h (0 -> 1)
    if _power(h_max, n_eff, alpha, two_sided) < power:
        return None
    h = float(
        brentq(
            lambda x: _power(x, n_eff, alpha, two_sided) - power,
            1e-12,
            h_max,
            xtol=1e-14,
            rtol=1e-14,
        )
    )
    x0 = math.asin(math.sqrt(p0))
    x1 = x0 + h / 2 if direction == "up" else x0 - h / 2
    if not 0.0 <= x1 <= math.pi / 2:
        return None
    return abs(math.sin(x1) ** 2 - p0)


# --------------------------------------------------------------------------- #
# 6. Honest wording
# --------------------------------------------------------------------------- #


def _pct(x: float) -> str:
    # Whole percents hide a 0.3% residual as "0%"; keep one decimal below 1%
    # (but a bound that is 0 up to float noise is just 0%).
    if 0.0005 <= x < 0.01 or 0.99 < x <= 0.9995:
        return f"{x * 100:.1f}%"
    return f"{x * 100:.0f}%"


def _fold(x: float) -> str:
    return f"{x:.1f}" if x < 10 else f"{x:.0f}"


def describe_change(
    before: Rate,
    after: Rate,
    significant: bool,
    *,
    alpha: float = 0.05,
    power: float = 0.8,
    cluster_size: int = 1,
    icc: float = 0.0,
) -> str:
    """One honest sentence about a change in an event rate, always with the
    residual (the rate after, with its Wilson 1927 interval) next to the
    improvement. When the change is not significant it says so and gives the
    minimum detectable effect at this n (see `mde`), instead of a fold change.

    >>> describe_change(Rate(26, 50), Rate(4, 50), True)
    '6.5-fold reduction (52% -> 8%), still 8% of runs [3%, 19%]'
    """
    if before.n <= 0 or after.n <= 0:
        raise ValueError("both rates need at least one run")
    pb, pa = before.k / before.n, after.k / after.n
    lo, hi = after.interval
    residual = f"{_pct(pa)} of runs [{_pct(lo)}, {_pct(hi)}]"
    moved = f"({_pct(pb)} -> {_pct(pa)})"
    if not significant:
        n = min(before.n, after.n)
        direction: Literal["up", "down"] = "down" if pa < pb else "up"
        m = mde(n, pb, alpha, power, cluster_size, icc, direction=direction) if 0 < pb < 1 else None
        if m is None and 0 < pb < 1:
            size = f"no {'drop' if direction == 'down' else 'rise'} from {_pct(pb)} is detectable"
        elif m is None:
            size = f"MDE undefined at a baseline of {_pct(pb)}"
        else:
            size = f"MDE {m * 100:.0f} points"
        return f"no distinguishable difference at this n {moved[:-1]}; {size}), still {residual}"
    if pa == pb:
        return f"no change {moved}, still {residual}"
    if pa < pb:
        if pa == 0:
            # 0/n is not "zero risk": the residual is the interval's upper bound.
            return (
                f"reduction to zero observed {moved}, still up to {_pct(hi)} of runs "
                f"(0 of {after.n} observed; upper bound of the Wilson interval)"
            )
        return f"{_fold(pb / pa)}-fold reduction {moved}, still {residual}"
    if pb == 0:
        return f"increase from zero {moved}, now {residual}"
    return f"{_fold(pa / pb)}-fold increase {moved}, now {residual}"
