"""Power, sample sizes and minimum detectable effects of the tests that are run, and
the gate's decisions over simulated draws (bench/gate_calibration.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np

from offscope.evalmode.stats._base import _AsDict
from offscope.evalmode.stats.differences import (
    _Cases,
    _cluster_t,
    _newcombe_arr,
    _newcombe_paired_arr,
    _ni_floor,
    _t_bounds,
    _t_pvalue,
)
from offscope.evalmode.stats.rates import _anova_icc

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
    from scipy import stats as sps
    from scipy.special import gammaln

    x = np.arange(n + 1)
    lc = gammaln(n + 1) - gammaln(x + 1) - gammaln(n - x + 1)  # log C(n, x)
    if not two_sided:
        xx, yy = np.meshgrid(x, x, indexing="ij")
        return sps.hypergeom.sf(xx - 1, 2 * n, xx + yy, n) < alpha
    t_all = np.arange(2 * n + 1)
    l2 = gammaln(2 * n + 1) - gammaln(t_all + 1) - gammaln(2 * n - t_all + 1)
    out = np.zeros((n + 1, n + 1), dtype=bool)
    for t in range(2 * n + 1):
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
    from scipy import stats as sps

    d = np.arange(n + 1)
    level = alpha / 2 if two_sided else alpha
    c = sps.binom.ppf(level, d, 0.5)  # smallest k with P(X <= k) >= level: one too many, unless ...
    return np.where(sps.binom.cdf(c, d, 0.5) < level, c, c - 1)  # ... the tail is still below it


def _mcnemar_rejects(
    n: int, alpha: float, two_sided: bool, x: np.ndarray, y: np.ndarray
) -> np.ndarray:
    """Does the exact McNemar test reject with x pairs where only the higher
    cell had the event and y where only the other did (x + y <= n)?"""
    small = np.minimum(x, y) if two_sided else y
    return (x + y > 0) & (small <= _mcnemar_crit(n, alpha, two_sided)[np.minimum(x + y, n)])


def _mcnemar_reject(n: int, alpha: float, two_sided: bool) -> np.ndarray:
    """R[x, y] of `_mcnemar_rejects` over the whole grid (False where x + y > n)."""
    x = np.arange(n + 1)
    xx, yy = np.meshgrid(x, x, indexing="ij")
    return (xx + yy <= n) & _mcnemar_rejects(n, alpha, two_sided, xx, yy)


def _fisher_rejects(
    n: int, alpha: float, two_sided: bool, x: np.ndarray, y: np.ndarray
) -> np.ndarray:
    """Does Fisher's exact test reject for x of n events in the higher cell
    and y of n in the other? Like `_fisher_reject`, but only for the totals
    that occur (simulations at large n)."""
    from scipy import stats as sps

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
    from scipy.special import gammaln

    x = np.arange(n + 1)
    return gammaln(n + 1) - gammaln(x + 1) - gammaln(n - x + 1)


@lru_cache(maxsize=4096)
def _fisher_total(n: int, t: int, alpha: float) -> np.ndarray:
    """Two-sided Fisher rejections for x = max(0, t - n)..min(t, n) given the
    total t (scipy's rule: sum of tables no more likely, tolerance 1e-7)."""
    from scipy.special import gammaln

    xs = np.arange(max(0, t - n), min(t, n) + 1)
    lc = _log_choose(n)
    pmf = np.exp(
        lc[xs] + lc[t - xs] - (gammaln(2 * n + 1) - gammaln(t + 1) - gammaln(2 * n - t + 1))
    )
    srt = np.sort(pmf)
    cum = np.cumsum(srt)
    idx = np.searchsorted(srt, pmf * (1 + 1e-7), side="right")
    return np.minimum(cum[idx - 1], 1.0) < alpha


def _exact_power(
    n: int, p_lo: float, p_hi: float, alpha: float, two_sided: bool
) -> tuple[float, float]:
    """(Fisher, McNemar) power with n independent runs per cell, exact."""
    from scipy import stats as sps
    from scipy.special import gammaln, xlogy

    k = np.arange(n + 1)
    fisher = float(
        sps.binom.pmf(k, n, p_hi) @ _fisher_reject(n, alpha, two_sided) @ sps.binom.pmf(k, n, p_lo)
    )
    q_hi, q_lo = p_hi * (1 - p_lo), p_lo * (1 - p_hi)  # only the higher / only the other cell
    xx, yy = np.meshgrid(k, k, indexing="ij")
    zz = n - xx - yy
    ok = zz >= 0
    zs = np.where(ok, zz, 0)
    logp = (
        gammaln(n + 1)
        - gammaln(xx + 1)
        - gammaln(yy + 1)
        - gammaln(zs + 1)
        + xlogy(xx, q_hi)
        + xlogy(yy, q_lo)
        + xlogy(zs, 1 - q_hi - q_lo)
    )
    mcnemar = float(np.exp(logp)[ok & _mcnemar_reject(n, alpha, two_sided)].sum())
    return min(fisher, 1.0), min(mcnemar, 1.0)


# The case-rate quantile function is evaluated on this many equiprobable nodes
# and each draw's uniform is rounded to its node: scipy's beta.ppf is ~2 us a value,
# so evaluating it per draw (draws x cases values for every candidate rate of a
# bisection) made one MDE take seconds and a grid report minutes. Rounding moves a
# case rate by less than the quantile's change over 1/8192 of probability, far
# below the Monte Carlo error of the 1,000-2,000 draws, and keeps common random
# numbers (a draw keeps its node whatever the rate).
_QUANTILE_NODES = 8192
# Below this the case rates are p itself: beta(p s, (1 - p) s) with s = 1/icc - 1 above
# 1e9 has a standard deviation under 2e-5, and scipy's inverse takes seconds per table there.
_ICC_FLOOR = 1e-9


@lru_cache(maxsize=256)
def _beta_quantiles(p: float, icc: float) -> np.ndarray:
    """beta(p s, (1 - p) s).ppf at the node midpoints, s = 1/icc - 1."""
    from scipy import stats as sps

    s = 1 / icc - 1
    nodes = (np.arange(_QUANTILE_NODES) + 0.5) / _QUANTILE_NODES
    table = np.asarray(sps.beta.ppf(nodes, p * s, (1 - p) * s))
    table.flags.writeable = False  # shared by every caller through the cache
    return table


def _case_rates(u: np.ndarray, p: float, icc: float) -> np.ndarray:
    """Case-level rates with mean p and intraclass correlation icc: the beta
    quantiles of uniforms u (beta(a, b) with a + b = 1/icc - 1), each uniform
    rounded to the nearest of `_QUANTILE_NODES` equiprobable nodes."""
    if icc < _ICC_FLOOR or p <= 0 or p >= 1:
        return np.full(u.shape, p)
    node = np.minimum((u * _QUANTILE_NODES).astype(np.intp), _QUANTILE_NODES - 1)
    return _beta_quantiles(p, icc)[node]


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
        return cls(
            rng.random((draws, cases)),
            rng.random((draws, cases)),
            rng.random((draws, cases, reps)),
            rng.random((draws, cases, reps)),
        )


def _simulated_power(
    d: _Draws, p_lo: float, p_hi: float, icc: float, alpha: float, two_sided: bool
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
        return (
            "exact: every outcome enumerated; Fisher exact (unpaired) and exact McNemar "
            "(paired, independent pair members); the smaller power is reported"
        )
    return (
        f"simulated, {draws} draws, random state {random_state}: cases x {cluster_size} reps, case rates "
        "beta-distributed with the given ICC; the test rejects when the exact test (Fisher "
        "unpaired / McNemar paired) and the case-clustered t test both reject; the smaller "
        "power is reported"
    )


class _Planner:
    """Power at a given number of cases for fixed p0, p1 and design."""

    def __init__(
        self,
        p0: float,
        alpha: float,
        two_sided: bool,
        cluster_size: int,
        icc: float,
        draws: int,
        seed: int,
    ) -> None:
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
            f, m = _simulated_power(
                self._draws[cases], p_lo, p_hi, self.icc, self.alpha, self.two_sided
            )
            pw = min(f, m)
            se, draws, seed = (
                math.sqrt(max(pw * (1 - pw), 1e-12) / self.draws),
                self.draws,
                self.seed,
            )
        return Power(
            self.p0,
            p1,
            cases * self.m,
            cases,
            self.m,
            self.icc,
            self.alpha,
            self.two_sided,
            min(f, m),
            f,
            m,
            se,
            draws,
            seed,
            power_method(self.m, self.draws, self.seed),
        )


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


def _fewest_cases(cluster_size: int) -> int:
    """The fewest cases per cell the test can be computed on: one run per case needs
    one; several need two, for the case-clustered test's between-case variance."""
    return 1 if cluster_size == 1 else 2


def power_at(
    n: int,
    p0: float,
    p1: float,
    alpha: float = 0.05,
    two_sided: bool = True,
    cluster_size: int = 1,
    icc: float = 0.0,
    draws: int = 2000,
    seed: int = 0,
) -> Power:
    """Power of the report's contrast test with `n` runs per cell (n is
    rounded down to whole cases of `cluster_size` runs)."""
    _check_rates(p0, p1)
    _check_design(cluster_size, icc, draws)
    cases = n // cluster_size
    if cases < _fewest_cases(cluster_size):
        raise ValueError(f"n={n} is less than two cases of {cluster_size} runs")
    return _Planner(p0, alpha, two_sided, cluster_size, icc, draws, seed).power(cases, p1)


# A report asks the same question for every contrast that shares a baseline cell (a
# 12-cell grid: 32 calls, 14 distinct); the answer is a pure function of the arguments.
@lru_cache(maxsize=1024)
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
    lo = _fewest_cases(cluster_size)
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


@lru_cache(maxsize=1024)  # as n_per_cell: a pure function, asked again per contrast
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
    if cases < _fewest_cases(cluster_size):
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


# Paired outcomes summed over cases: (both, candidate only, baseline only, neither).
PairTable = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def gate_decisions(
    kb: np.ndarray,
    nb: np.ndarray,
    kc: np.ndarray,
    nc: np.ndarray,
    paired: PairTable | None,
    margin: float,
    alpha: float,
    clustered: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """The gate's per-check decisions over simulated draws (axis -1: cases):
    (pass, regression before any multiplicity adjustment), exactly as
    `noninferiority` decides one check. `clustered` is `_Cases.clustered`
    (at least two cases, some with several runs). `paired` is the per-draw paired table
    (both, candidate only, baseline only, neither) when runs pair one-to-one."""
    from scipy import stats as sps

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


def simulate_pairs(
    rng: np.random.Generator,
    rate_b: np.ndarray,
    rate_c: np.ndarray,
    reps: int,
    shared: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, PairTable]:
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
    table = (
        (b & c).sum((-2, -1)),
        (c & ~b).sum((-2, -1)),
        (b & ~c).sum((-2, -1)),
        (~b & ~c).sum((-2, -1)),
    )
    return b.sum(-1), n, c.sum(-1), n.copy(), table


def gate_plan_n(
    p: float,
    margin: float,
    alpha: float,
    power: float,
    cases: _Cases,
    draws: int = 400,
    seed: int = 0,
    max_reps: int = 256,
) -> int | None:
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
        passed, _ = gate_decisions(
            kb,
            nb,
            kc,
            nc,
            table if cases.pairing is not None else None,
            margin,
            alpha,
            cases.clustered,
        )
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
