"""Differences between cells (the report's contrasts) and the case-clustered
difference test over arrays that the contrasts, the gate and the power
calculations share, so what is planned and calibrated is what is run."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from offscope.evalmode.stats._base import _as_outcomes, _AsDict, _check_confidence
from offscope.trace.rates import Rate, wilson

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


def _wilson_arr(
    k: np.ndarray, n: np.ndarray, z: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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


def _newcombe_arr(
    kc: np.ndarray, nc: np.ndarray, kb: np.ndarray, nb: np.ndarray, z: float
) -> tuple[np.ndarray, np.ndarray]:
    """Newcombe (1998) hybrid score bounds of pc - pb (see `newcombe_diff`)."""
    pc, lc, uc = _wilson_arr(kc, nc, z)
    pb, lb, ub = _wilson_arr(kb, nb, z)
    d = pc - pb
    lo = d - np.sqrt((pc - lc) ** 2 + (ub - pb) ** 2)
    hi = d + np.sqrt((uc - pc) ** 2 + (pb - lb) ** 2)
    return np.maximum(-1.0, lo), np.minimum(1.0, hi)


def _newcombe_paired_arr(
    both: np.ndarray, only_c: np.ndarray, only_b: np.ndarray, neither: np.ndarray, z: float
) -> tuple[np.ndarray, np.ndarray]:
    """Newcombe (1998b) paired bounds of pc - pb (see `newcombe_paired_diff`)."""
    both, only_c, only_b, neither = (
        np.asarray(x, dtype=float) for x in (both, only_c, only_b, neither)
    )
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
    lo = d - np.sqrt(
        np.maximum(0.0, (p1 - l1) ** 2 + (u2 - p2) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2))
    )
    hi = d + np.sqrt(
        np.maximum(0.0, (p2 - l2) ** 2 + (u1 - p1) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1))
    )
    return np.maximum(-1.0, lo), np.minimum(1.0, hi)


def _cluster_t(
    kb: np.ndarray, nb: np.ndarray, kc: np.ndarray, nc: np.ndarray
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
    squares = e * e
    e2 = squares.sum(-1)
    se = np.sqrt(g / (g - 1) * e2) if g > 1 else np.full(pc.shape, np.nan)
    # e * e * e, not e**3: numpy sends a cube to libm's pow(), ~100x slower over the
    # (draws x cases) arrays the power simulation passes (it was half a report's CPU).
    with np.errstate(divide="ignore", invalid="ignore"):
        shift = np.where(e2 > 0, (g - 1) * (squares * e).sum(-1) / (6 * g * e2), 0.0)
    return pc - pb, se, g - 1, shift


def _t_bounds(
    d: np.ndarray, se: np.ndarray, df: int, shift: np.ndarray, lower_q: float, upper_q: float
) -> tuple[np.ndarray, np.ndarray]:
    """One-sided bounds at levels lower_q / upper_q: the hull of the plain t
    interval and Johnson's skew-corrected one (shifted by `shift`)."""
    from scipy import stats as sps

    lo = d - float(sps.t.ppf(lower_q, df)) * se + np.minimum(shift, 0.0)
    hi = d + float(sps.t.ppf(upper_q, df)) * se + np.maximum(shift, 0.0)
    return lo, hi


def _t_pvalue(
    d: np.ndarray, se: np.ndarray, df: int, alternative: str, shift: np.ndarray | float = 0.0
) -> np.ndarray:
    """p-value of the cluster t test, consistent with `_t_bounds` (it rejects
    at alpha exactly when the matching bound excludes 0); se == 0 (every case
    moved by exactly the same amount) gives 0 when d points the tested way,
    else 1."""
    from scipy import stats as sps

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


def _cases(
    b: list[bool],
    c: list[bool],
    clusters_b: Sequence[Hashable] | None,
    clusters_c: Sequence[Hashable] | None,
    pairing: _Pairing | None,
) -> _Cases:
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
    from scipy import stats as sps

    if cases.pairing is not None:
        up, down = cases.pairing.only_b, cases.pairing.only_a  # candidate only, baseline only
        if up + down == 0:
            return 1.0
        return float(sps.binomtest(up, up + down, 0.5, alternative=alternative).pvalue)
    kc, nc, kb, nb = (
        int(cases.kc.sum()),
        int(cases.nc.sum()),
        int(cases.kb.sum()),
        int(cases.nb.sum()),
    )
    return float(sps.fisher_exact([[kc, nc - kc], [kb, nb - kb]], alternative=alternative).pvalue)


def _naive_bounds(cases: _Cases, confidence: float) -> tuple[float, float]:
    """Newcombe bounds of pc - pb at two-sided `confidence` (the scalar
    functions; `_newcombe_*_arr` are their vectorised twins)."""
    if cases.pairing is not None:
        p = cases.pairing
        _, lo, hi = newcombe_paired_diff(p.both, p.only_b, p.only_a, p.neither, confidence)
    else:
        _, lo, hi = newcombe_diff(
            int(cases.kc.sum()),
            int(cases.nc.sum()),
            int(cases.kb.sum()),
            int(cases.nb.sum()),
            confidence,
        )
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


def _diff_test(
    cases: _Cases, alternative: str, lower_q: float, upper_q: float, margin: float | None = None
) -> _DiffTest:
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
        return _DiffTest(
            d, lo_n, hi_n, (lo_n, hi_n), None, None, p_exact, None, p_exact, cases.n_cases
        )
    _, se_a, df, shift = _cluster_t(cases.kb, cases.nb, cases.kc, cases.nc)
    se = float(se_a)
    lo_a, _ = _t_bounds(np.asarray(d), se_a, df, shift, lower_q, upper_q)
    if margin is not None:
        se_a = np.maximum(se_a, _ni_floor(margin, cases.nb.sum(), cases.nc.sum()))
    _, hi_a = _t_bounds(np.asarray(d), se_a, df, shift, lower_q, upper_q)
    lo_t, hi_t = float(lo_a), float(hi_a)
    p_t = float(_t_pvalue(np.asarray(d), se_a, df, alternative, shift))
    return _DiffTest(
        d,
        min(lo_n, lo_t),
        max(hi_n, hi_t),
        (lo_n, hi_n),
        (lo_t, hi_t),
        se,
        p_exact,
        p_t,
        max(p_exact, p_t),
        cases.n_cases,
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
    from statsmodels.stats.multitest import multipletests  # pandas too: ~0.45 s

    _, adjusted, _, _ = multipletests(list(pvalues), method="holm")
    return [float(x) for x in adjusted]
