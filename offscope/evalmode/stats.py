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
from functools import lru_cache
from typing import Any, Literal

import numpy as np
from scipy import stats as sps
from scipy.special import gammaln, xlogy
from statsmodels.stats.multitest import multipletests

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
    "Power",
    "gate_decisions",
    "gate_plan_n",
    "mde",
    "mde_points",
    "n_per_cell",
    "power_at",
    "power_method",
    "simulate_pairs",
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
    n_cases: int = 0
    clustered: bool = False
    notes: tuple[str, ...] = ()

    def significant(self, alpha: float = 0.05) -> bool:
        return self.pvalue < alpha


def compare_cells(
    a: Sequence[bool | int],
    b: Sequence[bool | int],
    pair_keys_a: Sequence[Hashable] | None = None,
    pair_keys_b: Sequence[Hashable] | None = None,
    confidence: float = 0.95,
    clusters_a: Sequence[Hashable] | None = None,
    clusters_b: Sequence[Hashable] | None = None,
) -> CellComparison:
    """Compare two cells that differ in one knob; difference is b - a.

    Exact part. Unpaired (default, or when the keys do not match one-to-one):
    Newcombe hybrid score interval (Newcombe 1998, method 10, from Wilson
    1927) and Fisher's exact test, two-sided (scipy.stats.fisher_exact).
    Paired (both cells carry the same unique keys, e.g. (case, seed)):
    Newcombe's paired square-and-add interval (Newcombe 1998b, method 10) and
    the exact McNemar test (two-sided binomial test of the discordant pairs).

    Case-clustered part, when `clusters_*` (case ids) show several runs per
    case: the cluster-robust t interval and test over cases (`_cluster_t`).
    The reported interval is then the hull of both intervals and the p-value
    the larger of both p-values (see `_diff_test`): runs of one case are not
    independent, and the exact tests alone would overstate the evidence.
    """
    _check_confidence(confidence)
    va, vb = _as_outcomes(a, "a"), _as_outcomes(b, "b")
    if not va or not vb:
        raise ValueError("both cells need at least one run")
    ra, rb = Rate(sum(va), len(va)), Rate(sum(vb), len(vb))
    pairing, note = _pair(va, vb, pair_keys_a, pair_keys_b)
    cases = _cases(va, vb, clusters_a, clusters_b, pairing)
    tail = 1 - (1 - confidence) / 2
    res = _diff_test(cases, "two-sided", tail, tail)
    if pairing is not None:
        ci_method = "newcombe 1998b method 10 (paired square-and-add, wilson)"
        test = "exact mcnemar (binomial test on discordant pairs)"
    else:
        ci_method = "newcombe 1998 method 10 (hybrid score, wilson)"
        test = "fisher exact (two-sided)"
    if cases.clustered:
        ci_method = f"hull of {ci_method} and case-clustered t ({cases.n_cases - 1} df)"
        test = f"larger p of {test} and case-clustered t ({cases.n_cases - 1} df)"
    return CellComparison(
        a=ra,
        b=rb,
        difference=res.difference,
        ci=(res.lower, res.upper),
        ci_method=ci_method,
        paired=pairing is not None,
        test=test,
        pvalue=res.pvalue,
        discordant=(pairing.only_b, pairing.only_a) if pairing is not None else None,
        confidence=confidence,
        n_cases=cases.n_cases,
        clustered=cases.clustered,
        notes=(note,) if note else (),
    )



# --------------------------------------------------------------------------- #
# 2b. The case-clustered difference test (report contrasts, gate, power)
# --------------------------------------------------------------------------- #
# One implementation over arrays: axis -1 is the case, any leading axes are
# simulation draws. The report and the gate call it with one draw; power,
# sample-size plans and bench/gate_calibration.py call it with thousands, so
# what is planned and calibrated is exactly what is run.


def _wilson_arr(k: np.ndarray, n: np.ndarray, z: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Wilson (1927) score interval over arrays: (p, lower, upper); same
    formula and end-point rule as `offscope.trace.rates.wilson`."""
    k = np.asarray(k, dtype=float)
    n = np.asarray(n, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = k / n
        denom = 1 + z * z / n
        centre = (p + z * z / (2 * n)) / denom
        half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = np.where(k == 0, 0.0, np.maximum(0.0, centre - half))
    hi = np.where(k == n, 1.0, np.minimum(1.0, centre + half))
    return p, lo, hi


def _newcombe_arr(kc: np.ndarray, nc: np.ndarray, kb: np.ndarray, nb: np.ndarray, z: float
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Newcombe (1998) hybrid score bounds of pc - pb (see `newcombe_diff`)."""
    pc, lc, uc = _wilson_arr(kc, nc, z)
    pb, lb, ub = _wilson_arr(kb, nb, z)
    d = pc - pb
    lo = d - np.sqrt((pc - lc) ** 2 + (ub - pb) ** 2)
    hi = d + np.sqrt((uc - pc) ** 2 + (pb - lb) ** 2)
    return np.maximum(-1.0, lo), np.minimum(1.0, hi)


def _newcombe_paired_arr(both: np.ndarray, only_c: np.ndarray, only_b: np.ndarray, neither: np.ndarray,
                         z: float) -> tuple[np.ndarray, np.ndarray]:
    """Newcombe (1998b) paired bounds of pc - pb (see `newcombe_paired_diff`)."""
    both, only_c, only_b, neither = (np.asarray(x, dtype=float) for x in (both, only_c, only_b, neither))
    n = both + only_c + only_b + neither
    r1, r2, c1, c2 = both + only_c, only_b + neither, both + only_b, only_c + neither
    p1, l1, u1 = _wilson_arr(r1, n, z)
    p2, l2, u2 = _wilson_arr(c1, n, z)
    a = both * neither - only_c * only_b
    a_corr = np.where(a > n / 2, a - n / 2, np.where(a >= 0, 0.0, a))
    denom = np.sqrt(r1 * r2 * c1 * c2)
    with np.errstate(divide="ignore", invalid="ignore"):
        phi = np.where(denom > 0, a_corr / denom, 0.0)
    d = p1 - p2
    lo = d - np.sqrt(np.maximum(0.0, (p1 - l1) ** 2 + (u2 - p2) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2)))
    hi = d + np.sqrt(np.maximum(0.0, (p2 - l2) ** 2 + (u1 - p1) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1)))
    return np.maximum(-1.0, lo), np.minimum(1.0, hi)


def _cluster_t(kb: np.ndarray, nb: np.ndarray, kc: np.ndarray, nc: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
    """Cluster-robust difference pc - pb with cases as clusters:
    (d, se, df, skew shift).

    The pooled rates are ratio estimators; their difference linearises to a
    sum over cases of e_g = (kc_g - nc_g pc) / Nc - (kb_g - nb_g pb) / Nb, and
    var = G / (G - 1) * sum e_g^2 (the CR1 sandwich; Cameron & Miller 2015,
    J Human Resources 50:317), referred to a t distribution with G - 1
    degrees of freedom (their sec. VI.C, few clusters). Paired or not, the
    same case enters both sides, so case-to-case variation cancels in e_g.

    Per-case differences of rare events are skewed (most cases 0, a few
    large), and a t bound then under-covers on the long side. The skew shift
    is Johnson's (1978, JASA 73:536) correction m3 / (6 s^2 G), written in
    e_g: (G - 1) sum e^3 / (6 G sum e^2); `_t_bounds` only ever widens with
    it, never narrows.
    """
    kb, nb, kc, nc = (np.asarray(x, dtype=float) for x in (kb, nb, kc, nc))
    n_b, n_c = nb.sum(-1), nc.sum(-1)
    pb, pc = kb.sum(-1) / n_b, kc.sum(-1) / n_c
    e = (kc - nc * pc[..., None]) / n_c[..., None] - (kb - nb * pb[..., None]) / n_b[..., None]
    g = int(((nb + nc) > 0).sum(-1).max())
    e2 = (e * e).sum(-1)
    se = np.sqrt(g / (g - 1) * e2) if g > 1 else np.full(pc.shape, np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        shift = np.where(e2 > 0, (g - 1) * (e**3).sum(-1) / (6 * g * e2), 0.0)
    return pc - pb, se, g - 1, shift


def _t_bounds(d: np.ndarray, se: np.ndarray, df: int, shift: np.ndarray, lower_q: float, upper_q: float
              ) -> tuple[np.ndarray, np.ndarray]:
    """One-sided bounds at levels lower_q / upper_q: the hull of the plain t
    interval and Johnson's skew-corrected one (shifted by `shift`)."""
    lo = d - float(sps.t.ppf(lower_q, df)) * se + np.minimum(shift, 0.0)
    hi = d + float(sps.t.ppf(upper_q, df)) * se + np.maximum(shift, 0.0)
    return lo, hi


def _t_pvalue(d: np.ndarray, se: np.ndarray, df: int, alternative: str, shift: np.ndarray | float = 0.0
              ) -> np.ndarray:
    """p-value of the cluster t test, consistent with `_t_bounds` (it rejects
    at alpha exactly when the matching bound excludes 0); se == 0 (every case
    moved by exactly the same amount) gives 0 when d points the tested way,
    else 1."""
    d, se, shift = (np.asarray(x, dtype=float) for x in (d, se, shift))
    lo_side = d + np.minimum(shift, 0.0)  # the lower bound's centre
    hi_side = d + np.maximum(shift, 0.0)  # the upper bound's centre
    with np.errstate(divide="ignore", invalid="ignore"):
        if alternative == "greater":
            p = sps.t.sf(lo_side / se, df)
        else:
            p = 2 * np.minimum(sps.t.sf(lo_side / se, df), sps.t.cdf(hi_side / se, df))
    deg = np.where(d > 0, 0.0, 1.0) if alternative == "greater" else np.where(d != 0, 0.0, 1.0)
    return np.where(se > 0, np.minimum(p, 1.0), deg)


@dataclass(frozen=True)
class _Cases:
    """Per-case counts of two cells on the union of their cases (in first-seen
    order) and, when runs pair one-to-one by key, the paired table."""

    kb: np.ndarray
    nb: np.ndarray
    kc: np.ndarray
    nc: np.ndarray
    pairing: _Pairing | None

    @property
    def n_cases(self) -> int:
        return int(((self.nb + self.nc) > 0).sum())

    @property
    def clustered(self) -> bool:
        """Apply the case-clustered part: at least two cases and some case
        with more than one run in a cell (otherwise runs are independent)."""
        return self.n_cases >= 2 and bool(max(self.nb.max(), self.nc.max()) > 1)


def _cases(b: list[bool], c: list[bool], clusters_b: Sequence[Hashable] | None,
           clusters_c: Sequence[Hashable] | None, pairing: _Pairing | None) -> _Cases:
    if clusters_b is None or clusters_c is None:
        clusters_b, clusters_c = range(len(b)), range(len(b), len(b) + len(c))
    if len(clusters_b) != len(b) or len(clusters_c) != len(c):
        raise ValueError("clusters must have one case id per run")
    order: dict[Hashable, int] = {}
    for x in (*clusters_b, *clusters_c):
        order.setdefault(x, len(order))
    arrays = np.zeros((4, len(order)))
    for row, (vals, cl) in enumerate(((b, clusters_b), (c, clusters_c))):
        for v, x in zip(vals, cl, strict=True):
            arrays[2 * row, order[x]] += v
            arrays[2 * row + 1, order[x]] += 1
    return _Cases(arrays[0], arrays[1], arrays[2], arrays[3], pairing)


def _exact_p(cases: _Cases, alternative: str) -> float:
    """Exact McNemar (paired) or Fisher (unpaired) p-value of candidate vs
    baseline; 'greater' = the candidate's rate is higher."""
    if cases.pairing is not None:
        up, down = cases.pairing.only_b, cases.pairing.only_a  # candidate only, baseline only
        if up + down == 0:
            return 1.0
        return float(sps.binomtest(up, up + down, 0.5, alternative=alternative).pvalue)
    kc, nc, kb, nb = int(cases.kc.sum()), int(cases.nc.sum()), int(cases.kb.sum()), int(cases.nb.sum())
    return float(sps.fisher_exact([[kc, nc - kc], [kb, nb - kb]], alternative=alternative).pvalue)


def _naive_bounds(cases: _Cases, confidence: float) -> tuple[float, float]:
    """Newcombe bounds of pc - pb at two-sided `confidence` (the scalar
    functions; `_newcombe_*_arr` are their vectorised twins)."""
    if cases.pairing is not None:
        p = cases.pairing
        _, lo, hi = newcombe_paired_diff(p.both, p.only_b, p.only_a, p.neither, confidence)
    else:
        _, lo, hi = newcombe_diff(int(cases.kc.sum()), int(cases.nc.sum()), int(cases.kb.sum()),
                                  int(cases.nb.sum()), confidence)
    return lo, hi


@dataclass(frozen=True)
class _DiffTest:
    difference: float
    lower: float
    upper: float
    naive: tuple[float, float]
    cluster: tuple[float, float] | None
    cluster_se: float | None
    p_exact: float
    p_cluster: float | None
    pvalue: float
    n_cases: int


def _ni_floor(margin: float, n_b: np.ndarray | float, n_c: np.ndarray | float) -> np.ndarray:
    """Smallest standard error the difference can have on the non-inferiority
    boundary (true difference = margin): a per-run difference with mean
    margin varies at least margin (1 - margin) (its discordance is at least
    the margin), so se >= sqrt(margin (1 - margin) / n). Used as a floor for
    the cluster t upper bound, like a score test evaluated under H0: without
    it, cases whose runs move together (or that all moved by the same small
    amount) give a t bound too narrow to trust."""
    return np.sqrt(margin * (1 - margin) / np.minimum(n_b, n_c))


def _diff_test(cases: _Cases, alternative: str, lower_q: float, upper_q: float,
               margin: float | None = None) -> _DiffTest:
    """Bounds and p-value of pc - pb. `lower_q`/`upper_q` are the confidence
    levels of the lower/upper one-sided bounds. When the runs cluster within
    cases, each bound is the more conservative of the exact-score bound
    (Newcombe, paired or not) and the cluster t bound, and the p-value is the
    larger of the exact p and the cluster t p: the test rejects only when
    both do, so its level holds when either model is right (independent runs,
    or exchangeable cases)."""
    d = float(cases.kc.sum() / cases.nc.sum() - cases.kb.sum() / cases.nb.sum())
    lo_n, _ = _naive_bounds(cases, 2 * lower_q - 1)
    _, hi_n = _naive_bounds(cases, 2 * upper_q - 1)
    p_exact = _exact_p(cases, alternative)
    if not cases.clustered:
        return _DiffTest(d, lo_n, hi_n, (lo_n, hi_n), None, None, p_exact, None, p_exact, cases.n_cases)
    _, se_a, df, shift = _cluster_t(cases.kb, cases.nb, cases.kc, cases.nc)
    se = float(se_a)
    lo_a, _ = _t_bounds(np.asarray(d), se_a, df, shift, lower_q, upper_q)
    if margin is not None:
        se_a = np.maximum(se_a, _ni_floor(margin, cases.nb.sum(), cases.nc.sum()))
    _, hi_a = _t_bounds(np.asarray(d), se_a, df, shift, lower_q, upper_q)
    lo_t, hi_t = float(lo_a), float(hi_a)
    p_t = float(_t_pvalue(np.asarray(d), se_a, df, alternative, shift))
    return _DiffTest(d, min(lo_n, lo_t), max(hi_n, hi_t), (lo_n, hi_n), (lo_t, hi_t), se, p_exact, p_t,
                     max(p_exact, p_t), cases.n_cases)



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

    Two one-sided tests at level `alpha`, both on the case-clustered
    difference (`_diff_test`):

      pass          non-inferiority shown: the one-sided (1 - alpha) upper
                    bound of (candidate - baseline) is below the margin
                    (H0: difference >= margin rejected)
      regression    not pass, and the candidate is significantly worse:
                    one-sided p of H0 "candidate <= baseline" below alpha
                    (`gate.compare` adjusts these p-values by Holm across
                    the gate's checks before calling a regression)
      inconclusive  neither: the data cannot rule out a regression of
                    `margin`, nor show one (underpowered)
    """

    baseline: Rate
    candidate: Rate
    difference: float
    upper: float
    lower: float
    margin: float
    alpha: float
    paired: bool
    clustered: bool
    n_cases: int
    pvalue_regression: float
    method: str
    verdict: Literal["pass", "regression", "inconclusive"]
    needed_n: int | None
    notes: tuple[str, ...] = ()


def noninferiority(
    baseline: Sequence[bool | int],
    candidate: Sequence[bool | int],
    margin: float,
    alpha: float = 0.05,
    baseline_keys: Sequence[Hashable] | None = None,
    candidate_keys: Sequence[Hashable] | None = None,
    power: float = 0.8,
    baseline_clusters: Sequence[Hashable] | None = None,
    candidate_clusters: Sequence[Hashable] | None = None,
    plan_draws: int = 400,
) -> NonInferiority:
    """The gate's test for one rate: H0 p_cand - p_base >= margin against
    H1 p_cand - p_base < margin (events are bad, so "worse" is "higher"),
    and the regression test H0 p_cand <= p_base at the same alpha.

    Bounds: the more conservative of Newcombe's score bound (paired on the
    keys when both cells carry the same unique keys, Newcombe 1998b; else
    Newcombe 1998 hybrid score) at one-sided level alpha, and, when runs
    cluster within cases (`*_clusters`), the cluster-robust t bound over
    cases (Johnson's skew correction; for the upper bound a standard error
    no smaller than it can be on the boundary, see `_ni_floor`). Regression p-value: the larger of the one-sided exact McNemar
    (paired) / Fisher (unpaired) p and the cluster t p.

    `needed_n` (not for a pass): runs per cell, on the same cases, for
    which this test passes with probability `power` when the true rates are
    equal at the baseline's observed rate, found by simulating this very
    test (`plan_draws` draws, fixed random state; case effects with the
    observed ICC); None when more reps of these cases cannot get there, or
    when `plan_draws` is 0 (no plan wanted).
    """
    if not 0 < margin < 1:
        raise ValueError(f"margin={margin} must be in (0, 1) (an absolute rate difference)")
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha={alpha} must be in (0, 0.5)")
    _check_alpha_power(alpha, power)
    vb, vc = _as_outcomes(baseline, "baseline"), _as_outcomes(candidate, "candidate")
    if not vb or not vc:
        raise ValueError("both cells need at least one run")
    rb, rc = Rate(sum(vb), len(vb)), Rate(sum(vc), len(vc))
    pairing, note = _pair(vb, vc, baseline_keys, candidate_keys)
    notes = [note] if note else []
    cases = _cases(vb, vc, baseline_clusters, candidate_clusters, pairing)
    res = _diff_test(cases, "greater", 1 - alpha, 1 - alpha, margin)
    method = ("newcombe 1998b method 10 (paired)" if pairing is not None
              else "newcombe 1998 method 10 (hybrid score)")
    method += ", one-sided bounds; regression: exact " + ("mcnemar" if pairing is not None else "fisher")
    if cases.clustered:
        method += f"; case-clustered t ({cases.n_cases - 1} df), the more conservative of both"
    if res.upper < margin:
        verdict: Literal["pass", "regression", "inconclusive"] = "pass"
    elif res.pvalue < alpha:
        verdict = "regression"
    else:
        verdict = "inconclusive"
    needed: int | None = None
    if verdict != "pass" and plan_draws > 0:  # also for a regression: the gate may downgrade it after Holm
        needed = gate_plan_n(rb.k / rb.n, margin, alpha, power, cases, draws=plan_draws)
    if verdict == "inconclusive":
        notes.append(
            f"cannot rule out a regression of {margin * 100:g} points at this n; "
            + (f"about {needed} runs per cell are needed" if needed is not None
               else "more reps of these cases are not enough: add cases")
        )
    return NonInferiority(
        baseline=rb,
        candidate=rc,
        difference=res.difference,
        upper=res.upper,
        lower=res.lower,
        margin=margin,
        alpha=alpha,
        paired=pairing is not None,
        clustered=cases.clustered,
        n_cases=cases.n_cases,
        pvalue_regression=res.pvalue,
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
# 5. Power of the tests that are actually run
# --------------------------------------------------------------------------- #
# Power is computed for the report's contrast test as `compare_cells` runs it
# (two-sided unless one-sided is asked for, before the Holm adjustment):
# Fisher's exact test when the cells are not paired, the exact McNemar test
# when they are (pair members taken as independent, the conservative case for
# pairs that are positively correlated), and, with several runs per case, the
# case-clustered t test that must also reject. The power shown is the smaller
# of the two designs'. Independent runs (one run per case): exact, by
# enumerating every outcome. Runs clustered in cases: simulated with case
# rates drawn from a beta distribution with the given ICC (the beta-binomial
# model, Donner & Klar 2000 sec. 2.6), with a stated number of draws and a
# fixed random state, and a Monte Carlo standard error.

N_MAX = 5000  # runs per cell beyond which a plan is reported as out of reach


def design_effect(cluster_size: float, icc: float) -> float:
    """Variance inflation for runs clustered within cases: 1 + (m - 1) * icc
    (Kish 1965; Donner & Klar 2000). `m` is the runs per case in one cell.
    Shown for reading; power and sample sizes are computed for the tests
    themselves (see above), not from this factor."""
    if cluster_size < 1:
        raise ValueError(f"cluster_size={cluster_size} must be >= 1")
    if not 0.0 <= icc <= 1.0:
        raise ValueError(f"icc={icc} must be in [0, 1]")
    return 1.0 + (cluster_size - 1) * icc


def _check_alpha_power(alpha: float, power: float) -> None:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha={alpha} must be in (0, 1)")
    if not 0 < power < 1:
        raise ValueError(f"power={power} must be in (0, 1)")
    if power <= alpha:
        raise ValueError(f"power={power} must exceed alpha={alpha}")


@lru_cache(maxsize=4)
def _fisher_reject(n: int, alpha: float, two_sided: bool) -> np.ndarray:
    """R[x, y]: Fisher's exact test rejects for x of n events in the higher
    cell and y of n in the other (two-sided as scipy.stats.fisher_exact: the
    tables no more likely than the observed one, relative tolerance 1e-7;
    one-sided: 'greater')."""
    x = np.arange(n + 1)
    lc = gammaln(n + 1) - gammaln(x + 1) - gammaln(n - x + 1)  # log C(n, x)
    if not two_sided:
        xx, yy = np.meshgrid(x, x, indexing="ij")
        return sps.hypergeom.sf(xx - 1, 2 * n, xx + yy, n) < alpha
    t_all = np.arange(2 * n + 1)
    l2 = gammaln(2 * n + 1) - gammaln(t_all + 1) - gammaln(2 * n - t_all + 1)
    out = np.zeros((n + 1, n + 1), dtype=bool)
    for t in t_all:
        xs = np.arange(max(0, t - n), min(t, n) + 1)
        pmf = np.exp(lc[xs] + lc[t - xs] - l2[t])
        srt = np.sort(pmf)
        cum = np.cumsum(srt)
        idx = np.searchsorted(srt, pmf * (1 + 1e-7), side="right")
        out[xs, t - xs] = np.minimum(cum[idx - 1], 1.0) < alpha
    return out


@lru_cache(maxsize=8)
def _mcnemar_crit(n: int, alpha: float, two_sided: bool) -> np.ndarray:
    """c[D] for D = 0..n discordant pairs: the binomial(D, 1/2) test rejects
    when the smaller count (two-sided, p = 2 P(X <= min)) or the other
    cell's count (one-sided) is at most c[D]; -1 when it never rejects."""
    d = np.arange(n + 1)
    level = alpha / 2 if two_sided else alpha
    c = sps.binom.ppf(level, d, 0.5)  # smallest k with P(X <= k) >= level: one too many, unless ...
    return np.where(sps.binom.cdf(c, d, 0.5) < level, c, c - 1)  # ... the tail is still below it


def _mcnemar_rejects(n: int, alpha: float, two_sided: bool, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Does the exact McNemar test reject with x pairs where only the higher
    cell had the event and y where only the other did (x + y <= n)?"""
    small = np.minimum(x, y) if two_sided else y
    return (x + y > 0) & (small <= _mcnemar_crit(n, alpha, two_sided)[np.minimum(x + y, n)])


def _mcnemar_reject(n: int, alpha: float, two_sided: bool) -> np.ndarray:
    """R[x, y] of `_mcnemar_rejects` over the whole grid (False where x + y > n)."""
    x = np.arange(n + 1)
    xx, yy = np.meshgrid(x, x, indexing="ij")
    return (xx + yy <= n) & _mcnemar_rejects(n, alpha, two_sided, xx, yy)


def _fisher_rejects(n: int, alpha: float, two_sided: bool, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Does Fisher's exact test reject for x of n events in the higher cell
    and y of n in the other? Like `_fisher_reject`, but only for the totals
    that occur (simulations at large n)."""
    x, y = np.asarray(x), np.asarray(y)
    if not two_sided:
        return sps.hypergeom.sf(x - 1, 2 * n, x + y, n) < alpha
    out = np.zeros(x.shape, dtype=bool)
    for t in np.unique(x + y):
        at = (x + y) == t
        out[at] = _fisher_total(n, int(t), alpha)[x[at] - max(0, t - n)]
    return out


@lru_cache(maxsize=8)
def _log_choose(n: int) -> np.ndarray:
    x = np.arange(n + 1)
    return gammaln(n + 1) - gammaln(x + 1) - gammaln(n - x + 1)


@lru_cache(maxsize=4096)
def _fisher_total(n: int, t: int, alpha: float) -> np.ndarray:
    """Two-sided Fisher rejections for x = max(0, t - n)..min(t, n) given the
    total t (scipy's rule: sum of tables no more likely, tolerance 1e-7)."""
    xs = np.arange(max(0, t - n), min(t, n) + 1)
    lc = _log_choose(n)
    pmf = np.exp(lc[xs] + lc[t - xs] - (gammaln(2 * n + 1) - gammaln(t + 1) - gammaln(2 * n - t + 1)))
    srt = np.sort(pmf)
    cum = np.cumsum(srt)
    idx = np.searchsorted(srt, pmf * (1 + 1e-7), side="right")
    return np.minimum(cum[idx - 1], 1.0) < alpha


def _exact_power(n: int, p_lo: float, p_hi: float, alpha: float, two_sided: bool) -> tuple[float, float]:
    """(Fisher, McNemar) power with n independent runs per cell, exact."""
    k = np.arange(n + 1)
    fisher = float(sps.binom.pmf(k, n, p_hi) @ _fisher_reject(n, alpha, two_sided) @ sps.binom.pmf(k, n, p_lo))
    q_hi, q_lo = p_hi * (1 - p_lo), p_lo * (1 - p_hi)  # only the higher / only the other cell
    xx, yy = np.meshgrid(k, k, indexing="ij")
    zz = n - xx - yy
    ok = zz >= 0
    zs = np.where(ok, zz, 0)
    logp = (gammaln(n + 1) - gammaln(xx + 1) - gammaln(yy + 1) - gammaln(zs + 1)
            + xlogy(xx, q_hi) + xlogy(yy, q_lo) + xlogy(zs, 1 - q_hi - q_lo))
    mcnemar = float(np.exp(logp)[ok & _mcnemar_reject(n, alpha, two_sided)].sum())
    return min(fisher, 1.0), min(mcnemar, 1.0)


def _case_rates(u: np.ndarray, p: float, icc: float) -> np.ndarray:
    """Case-level rates with mean p and intraclass correlation icc: the beta
    quantiles of uniforms u (beta(a, b) with a + b = 1/icc - 1)."""
    if icc <= 0 or p <= 0 or p >= 1:
        return np.full(u.shape, p)
    s = 1 / icc - 1
    return sps.beta.ppf(u, p * s, (1 - p) * s)


@dataclass(frozen=True)
class _Draws:
    """Uniforms for one simulated design, reused across rates (common random
    numbers keep simulated power monotone in the effect)."""

    case_lo: np.ndarray
    case_hi: np.ndarray
    run_lo: np.ndarray
    run_hi: np.ndarray

    @classmethod
    def make(cls, draws: int, cases: int, reps: int, seed: int) -> _Draws:
        rng = np.random.default_rng(seed)
        return cls(rng.random((draws, cases)), rng.random((draws, cases)),
                   rng.random((draws, cases, reps)), rng.random((draws, cases, reps)))


def _simulated_power(d: _Draws, p_lo: float, p_hi: float, icc: float, alpha: float, two_sided: bool
                     ) -> tuple[float, float]:
    """(Fisher, McNemar) power of the case-clustered contrast test, simulated."""
    lo = d.run_lo < _case_rates(d.case_lo, p_lo, icc)[..., None]
    hi = d.run_hi < _case_rates(d.case_hi, p_hi, icc)[..., None]
    draws, cases, reps = lo.shape
    n = cases * reps
    k_lo, k_hi = lo.sum(-1), hi.sum(-1)
    size = np.full(k_lo.shape, reps)
    diff, se, df, shift = _cluster_t(k_lo, size, k_hi, size)
    t_ok = _t_pvalue(diff, se, df, "two-sided" if two_sided else "greater", shift) < alpha
    f_ok = _fisher_rejects(n, alpha, two_sided, k_hi.sum(-1), k_lo.sum(-1))
    m_ok = _mcnemar_rejects(n, alpha, two_sided, (hi & ~lo).sum((-2, -1)), (lo & ~hi).sum((-2, -1)))
    return float((f_ok & t_ok).mean()), float((m_ok & t_ok).mean())


@dataclass(frozen=True)
class Power(_AsDict):
    """Power of the report's contrast test for p0 -> p1 at n runs per cell."""

    p0: float
    p1: float
    n_per_cell: int
    cases: int
    cluster_size: int
    icc: float
    alpha: float
    two_sided: bool
    power: float  # the smaller of power_fisher and power_mcnemar
    power_fisher: float
    power_mcnemar: float
    mc_se: float | None  # Monte Carlo standard error (simulated only)
    draws: int | None
    random_state: int | None
    method: str

    @property
    def effect(self) -> float:
        return abs(self.p1 - self.p0)


def power_method(cluster_size: int, draws: int, random_state: int) -> str:
    """How `power_at`, `n_per_cell` and `mde` compute power for this design."""
    if cluster_size == 1:
        return ("exact: every outcome enumerated; Fisher exact (unpaired) and exact McNemar "
                "(paired, independent pair members); the smaller power is reported")
    return (f"simulated, {draws} draws, random state {random_state}: cases x {cluster_size} reps, case rates "
            "beta-distributed with the given ICC; the test rejects when the exact test (Fisher "
            "unpaired / McNemar paired) and the case-clustered t test both reject; the smaller "
            "power is reported")


class _Planner:
    """Power at a given number of cases for fixed p0, p1 and design."""

    def __init__(self, p0: float, alpha: float, two_sided: bool, cluster_size: int, icc: float,
                 draws: int, seed: int) -> None:
        self.p0, self.alpha, self.two_sided = p0, alpha, two_sided
        self.m, self.icc, self.draws, self.seed = cluster_size, icc, draws, seed
        self._draws: dict[int, _Draws] = {}

    def power(self, cases: int, p1: float) -> Power:
        p_lo, p_hi = sorted((self.p0, p1))
        if self.m == 1:
            f, m = _exact_power(cases, p_lo, p_hi, self.alpha, self.two_sided)
            se, draws, seed = None, None, None
        else:
            if cases not in self._draws:
                self._draws = {cases: _Draws.make(self.draws, cases, self.m, self.seed)}
            f, m = _simulated_power(self._draws[cases], p_lo, p_hi, self.icc, self.alpha, self.two_sided)
            pw = min(f, m)
            se, draws, seed = math.sqrt(max(pw * (1 - pw), 1e-12) / self.draws), self.draws, self.seed
        return Power(self.p0, p1, cases * self.m, cases, self.m, self.icc, self.alpha, self.two_sided,
                     min(f, m), f, m, se, draws, seed, power_method(self.m, self.draws, self.seed))


def _check_rates(p0: float, p1: float | None = None) -> None:
    if not 0 < p0 < 1:
        raise ValueError(f"p0={p0} must be in (0, 1)")
    if p1 is not None and not 0 <= p1 <= 1:
        raise ValueError(f"p1={p1} must be in [0, 1]")


def _check_design(cluster_size: int, icc: float, draws: int) -> None:
    design_effect(cluster_size, icc)
    if icc > 0 and cluster_size == 1:
        raise ValueError("icc > 0 needs cluster_size > 1 (runs per case)")
    if draws < 100:
        raise ValueError(f"draws={draws} must be >= 100")


def power_at(n: int, p0: float, p1: float, alpha: float = 0.05, two_sided: bool = True,
             cluster_size: int = 1, icc: float = 0.0, draws: int = 2000, seed: int = 0) -> Power:
    """Power of the report's contrast test with `n` runs per cell (n is
    rounded down to whole cases of `cluster_size` runs)."""
    _check_rates(p0, p1)
    _check_design(cluster_size, icc, draws)
    cases = n // cluster_size
    if cases < (2 if cluster_size > 1 else 1):
        raise ValueError(f"n={n} is less than two cases of {cluster_size} runs")
    return _Planner(p0, alpha, two_sided, cluster_size, icc, draws, seed).power(cases, p1)


def n_per_cell(
    p0: float,
    p1: float,
    alpha: float = 0.05,
    power: float = 0.8,
    two_sided: bool = True,
    cluster_size: int = 1,
    icc: float = 0.0,
    draws: int = 2000,
    seed: int = 0,
    n_max: int = N_MAX,
) -> Power | None:
    """The smallest runs per cell (whole cases of `cluster_size` runs) at
    which the report's contrast test detects p0 -> p1 with at least `power`,
    and the power it has there. Doubling then bisection over the number of
    cases; the returned design is always one whose power was computed and
    found >= `power` (exact tests have a saw-tooth power curve, so a larger
    n can occasionally have slightly less). None beyond `n_max` runs per cell."""
    _check_rates(p0, p1)
    if p1 == p0:
        raise ValueError("p1 equals p0: no difference to detect")
    _check_alpha_power(alpha, power)
    _check_design(cluster_size, icc, draws)
    plan = _Planner(p0, alpha, two_sided, cluster_size, icc, draws, seed)
    lo = 1 if cluster_size == 1 else 2
    hi = lo
    best = plan.power(hi, p1)
    while best.power < power:
        lo, hi = hi, hi * 2
        if hi * cluster_size > n_max:
            hi = n_max // cluster_size
            best = plan.power(hi, p1)
            if best.power < power:
                return None
            break
        best = plan.power(hi, p1)
    while hi - lo > 1:  # invariant: power(hi) >= target
        mid = (lo + hi) // 2
        at = plan.power(mid, p1)
        if at.power >= power:
            hi, best = mid, at
        else:
            lo = mid
    return best


def mde(
    n: int,
    p0: float,
    alpha: float = 0.05,
    power: float = 0.8,
    cluster_size: int = 1,
    icc: float = 0.0,
    two_sided: bool = True,
    direction: Literal["up", "down"] = "up",
    draws: int = 2000,
    seed: int = 0,
) -> Power | None:
    """Minimum detectable effect: the smallest change from p0 in `direction`
    that the report's contrast test detects with at least `power` at `n` runs
    per cell (whole cases of `cluster_size` runs), as the `Power` at that p1
    (`.effect` is |p1 - p0|). Bisection on p1 (to 0.1 point) with the power
    computed as in `n_per_cell`. None when even p1 = 0 (down) or 1 (up) is
    not detected with that power."""
    if n < 1:
        raise ValueError(f"n={n} must be >= 1")
    if not 0 <= p0 <= 1:
        raise ValueError(f"p0={p0} must be in [0, 1]")
    if direction not in ("up", "down"):
        raise ValueError("direction must be 'up' or 'down'")
    if (direction == "up" and p0 == 1) or (direction == "down" and p0 == 0):
        return None
    _check_alpha_power(alpha, power)
    _check_design(cluster_size, icc, draws)
    cases = n // cluster_size
    if cases < (2 if cluster_size > 1 else 1):
        return None
    plan = _Planner(p0, alpha, two_sided, cluster_size, icc, draws, seed)
    near, far = p0, (1.0 if direction == "up" else 0.0)
    best = plan.power(cases, far)
    if best.power < power:
        return None
    while abs(far - near) > 0.001:  # invariant: power(far) >= target
        mid = (near + far) / 2
        at = plan.power(cases, mid)
        if at.power >= power:
            far, best = mid, at
        else:
            near = mid
    return best


def gate_decisions(kb: np.ndarray, nb: np.ndarray, kc: np.ndarray, nc: np.ndarray,
                   paired: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None,
                   margin: float, alpha: float, clustered: bool) -> tuple[np.ndarray, np.ndarray]:
    """The gate's per-check decisions over simulated draws (axis -1: cases):
    (pass, regression before any multiplicity adjustment), exactly as
    `noninferiority` decides one check. `clustered` is `_Cases.clustered`
    (at least two cases, some with several runs). `paired` is the per-draw paired table
    (both, candidate only, baseline only, neither) when runs pair one-to-one."""
    z = float(sps.norm.ppf(1 - alpha))
    kb_t, nb_t, kc_t, nc_t = kb.sum(-1), nb.sum(-1), kc.sum(-1), nc.sum(-1)
    if paired is not None:
        both, only_c, only_b, neither = paired
        lo, hi = _newcombe_paired_arr(both, only_c, only_b, neither, z)
        p_exact = np.where(only_c + only_b > 0, sps.binom.sf(only_c - 1, only_c + only_b, 0.5), 1.0)
    else:
        lo, hi = _newcombe_arr(kc_t, nc_t, kb_t, nb_t, z)
        p_exact = sps.hypergeom.sf(kc_t - 1, nb_t + nc_t, kb_t + kc_t, nc_t)
    if clustered:
        d, se, df, shift = _cluster_t(kb, nb, kc, nc)
        se_ni = np.maximum(se, _ni_floor(margin, nb_t, nc_t))
        hi = np.maximum(hi, _t_bounds(d, se_ni, df, shift, 1 - alpha, 1 - alpha)[1])
        p_exact = np.maximum(p_exact, _t_pvalue(d, se, df, "greater", shift))
    passed = hi < margin
    return passed, ~passed & (p_exact < alpha)


def simulate_pairs(rng: np.random.Generator, rate_b: np.ndarray, rate_c: np.ndarray, reps: int,
                   shared: bool = False) -> tuple[np.ndarray, ...]:
    """Runs of two cells on the same cases and (case, rep) pairs (draws x
    cases arrays of case rates): returns kb, nb, kc, nc and the paired table
    (both, cand only, base only, neither) summed over cases, ready for
    `gate_decisions`. Pair members are independent given the case rates, or
    with `shared` driven by one uniform per pair (as a simulated model with
    common random draws: the two runs differ only where the rates do)."""
    u = rng.random((*rate_b.shape, reps))
    b = u < rate_b[..., None]
    c = (u if shared else rng.random((*rate_c.shape, reps))) < rate_c[..., None]
    n = np.full(rate_b.shape, reps)
    table = ((b & c).sum((-2, -1)), (c & ~b).sum((-2, -1)), (b & ~c).sum((-2, -1)), (~b & ~c).sum((-2, -1)))
    return b.sum(-1), n, c.sum(-1), n.copy(), table


def gate_plan_n(p: float, margin: float, alpha: float, power: float, cases: _Cases,
                draws: int = 400, seed: int = 0, max_reps: int = 256) -> int | None:
    """Runs per cell (more reps of the same cases) at which the gate's test
    passes with probability `power` when both cells truly have rate p;
    simulated with the baseline's observed ICC. None if `max_reps` reps (or
    N_MAX independent runs) are not enough."""
    if cases.clustered:
        icc, _ = _anova_icc(cases.kb[cases.nb > 0], cases.nb[cases.nb > 0])
        icc = min(max(icc or 0.0, 0.0), 0.99)
        g, top = cases.n_cases, max_reps
    else:
        icc, g, top = 0.0, 1, N_MAX  # independent runs: plan over runs
    rng_case = np.random.default_rng(seed)
    rates = _case_rates(rng_case.random((draws, g if cases.clustered else 1)), p, icc)

    def ok(m: int) -> bool:
        # independent runs are simulated as one block of m runs, cluster part off
        kb, nb, kc, nc, table = simulate_pairs(np.random.default_rng(seed + 1), rates, rates, m)
        passed, _ = gate_decisions(kb, nb, kc, nc, table if cases.pairing is not None else None,
                                   margin, alpha, cases.clustered)
        return bool(passed.mean() >= power)

    lo, hi = 0, 1
    while not ok(hi):
        lo, hi = hi, hi * 2
        if hi > top:
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi * g



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
    '6.5-fold reduction (52% -> 8%), still 8% of runs [3%, 19%]'
    """
    if before.n <= 0 or after.n <= 0:
        raise ValueError("both rates need at least one run")
    pb, pa = before.k / before.n, after.k / after.n
    lo, hi = interval if interval is not None else after.interval
    residual = f"{_pct(pa)} of runs [{_pct(lo)}, {_pct(hi)}]"
    moved = f"({_pct(pb)} -> {_pct(pa)})"
    if not significant:
        direction: Literal["up", "down"] = "down" if pa < pb else "up"
        if mde_result is _UNSET:
            n = min(before.n, after.n)
            mde_result = (mde(n, pb, alpha, power, cluster_size, icc, direction=direction)
                          if 0 < pb < 1 else None)
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
    return f"{m.effect * 100:.0f} points"
