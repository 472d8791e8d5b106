"""Power, sample size and MDE are the power of the tests the report runs.

Every claim is checked against an independent reference: outcomes simulated
here with numpy and tested with scipy's own tests (scipy.stats.fisher_exact,
scipy.stats.binomtest, scipy.stats.ttest_1samp), never with the product's
functions. Draw counts are small and the random states fixed, so the tests
are quick and deterministic; tolerances are 3-4 Monte Carlo standard errors.

Why the one-sample t on per-case differences is the reference for the
case-clustered part: with equal runs per case, the CR1 cluster-robust
variance of the pooled difference equals s^2 / G of the per-case
differences, so the cluster t with G - 1 df is the one-sample t (with
Johnson's skew correction, stats_reference.py).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from offscope.evalmode.stats import design_effect, mde, n_per_cell, power_at
from offscope.evalmode.stats.power import _fisher_reject, _fisher_rejects, _mcnemar_reject
from tests.support.stats_reference import t_pvalue


def _reference_power(
    n_cases: int,
    reps: int,
    p0: float,
    p1: float,
    icc: float,
    draws: int,
    state: int,
    alpha: float = 0.05,
) -> tuple[float, float]:
    """(Fisher, McNemar) power by brute force with scipy, for the report's test:
    the exact test, and with reps > 1 also the t test on per-case differences."""
    rng = np.random.default_rng(state)
    hits_f = hits_m = 0
    for _ in range(draws):
        if icc > 0:
            s = 1 / icc - 1
            r0 = rng.beta(p0 * s, (1 - p0) * s, n_cases)
            r1 = rng.beta(p1 * s, (1 - p1) * s, n_cases)
        else:
            r0, r1 = np.full(n_cases, p0), np.full(n_cases, p1)
        a = rng.random((n_cases, reps)) < r0[:, None]
        b = rng.random((n_cases, reps)) < r1[:, None]
        n = n_cases * reps
        ka, kb = int(a.sum()), int(b.sum())
        f = sps.fisher_exact([[kb, n - kb], [ka, n - ka]]).pvalue < alpha
        up, down = int((b & ~a).sum()), int((a & ~b).sum())
        m = up + down > 0 and sps.binomtest(up, up + down, 0.5).pvalue < alpha
        if reps > 1:
            t_ok = t_pvalue(b.mean(1) - a.mean(1)) < alpha
            f, m = f and t_ok, m and t_ok
        hits_f += bool(f)
        hits_m += bool(m)
    return hits_f / draws, hits_m / draws


def _se(p: float, draws: int) -> float:
    return math.sqrt(max(p * (1 - p), 0.01) / draws)


def test_fisher_table_matches_scipy_everywhere() -> None:
    n = 14
    for alpha in (0.05, 0.01):
        table = _fisher_reject(n, alpha, True)
        one = _fisher_reject(n, alpha, False)
        for x in range(n + 1):
            for y in range(n + 1):
                tab = [[x, n - x], [y, n - y]]
                assert table[x, y] == (sps.fisher_exact(tab).pvalue < alpha), (x, y)
                assert one[x, y] == (sps.fisher_exact(tab, alternative="greater").pvalue < alpha), (
                    x,
                    y,
                )


def test_fisher_by_total_matches_scipy() -> None:
    n = 40
    rng = np.random.default_rng(9)
    x, y = rng.integers(0, n + 1, 200), rng.integers(0, n + 1, 200)
    got = _fisher_rejects(n, 0.05, True, x, y)
    for xi, yi, g in zip(x, y, got, strict=True):
        assert g == (sps.fisher_exact([[xi, n - xi], [yi, n - yi]]).pvalue < 0.05), (xi, yi)


def test_mcnemar_table_matches_scipy() -> None:
    n = 30
    table = _mcnemar_reject(n, 0.05, True)
    one = _mcnemar_reject(n, 0.05, False)
    for x in range(n + 1):
        for y in range(n + 1 - x):
            if x + y == 0:
                assert not table[x, y]
                continue
            assert table[x, y] == (sps.binomtest(x, x + y, 0.5).pvalue < 0.05), (x, y)
            assert one[x, y] == (
                sps.binomtest(x, x + y, 0.5, alternative="greater").pvalue < 0.05
            ), (x, y)


def test_exact_power_agrees_with_scipy_simulation() -> None:
    """The issue's case: 52% -> 8% at 15 per cell has 60-66% power, not 80%."""
    pw = power_at(15, 0.52, 0.08)
    assert pw.mc_se is None and "exact" in pw.method
    draws = 1500
    f, m = _reference_power(15, 1, 0.52, 0.08, 0.0, draws, state=11)
    assert pw.power_fisher == pytest.approx(f, abs=4 * _se(f, draws))
    assert pw.power_mcnemar == pytest.approx(m, abs=4 * _se(m, draws))
    assert 0.55 < pw.power < 0.7


def test_printed_n_delivers_the_printed_power() -> None:
    plan = n_per_cell(0.52, 0.08)
    assert plan is not None and plan.power >= 0.8
    assert plan.n_per_cell >= 16  # the normal approximation's 15 is not enough
    draws = 1500
    f, m = _reference_power(plan.n_per_cell, 1, 0.52, 0.08, 0.0, draws, state=12)
    assert min(f, m) >= plan.power - 4 * _se(plan.power, draws)


def test_no_drop_from_8_percent_is_detectable_at_50() -> None:
    """The old MDE claimed 8% -> 0% was detectable with 80% power at 50 per cell."""
    assert mde(50, 0.08, direction="down") is None
    f, m = _reference_power(50, 1, 0.08, 0.0, 0.0, 1000, state=13)
    assert max(f, m) < 0.4


def test_mde_is_the_smallest_detectable_change() -> None:
    m = mde(80, 0.3, direction="up")
    assert m is not None and m.power >= 0.8
    draws = 1200
    f, mc = _reference_power(80, 1, 0.3, m.p1, 0.0, draws, state=14)
    assert min(f, mc) >= 0.8 - 4 * _se(0.8, draws)
    # a change 3 points smaller is detected with visibly less power
    f, mc = _reference_power(80, 1, 0.3, m.p1 - 0.03, 0.0, draws, state=15)
    assert min(f, mc) < 0.8


def test_clustered_power_agrees_with_scipy_simulation() -> None:
    pw = power_at(30, 0.5, 0.15, cluster_size=3, icc=0.2, draws=1000, seed=4)
    assert pw.cases == 10 and pw.mc_se is not None and "simulated, 1000 draws" in pw.method
    draws = 500
    f, m = _reference_power(10, 3, 0.5, 0.15, 0.2, draws, state=16)
    tol = 4 * math.hypot(_se(f, draws), pw.mc_se)
    assert pw.power_fisher == pytest.approx(f, abs=tol)
    assert pw.power_mcnemar == pytest.approx(m, abs=tol)


def test_clustered_plan_delivers_and_costs_more_than_independent() -> None:
    plan = n_per_cell(0.5, 0.2, cluster_size=4, icc=0.3, draws=800)
    iid = n_per_cell(0.5, 0.2)
    assert plan is not None and iid is not None and plan.mc_se is not None
    assert plan.n_per_cell % 4 == 0 and plan.n_per_cell > iid.n_per_cell
    draws = 400
    f, m = _reference_power(plan.cases, 4, 0.5, 0.2, 0.3, draws, state=17)
    assert min(f, m) >= plan.power - 4 * math.hypot(_se(plan.power, draws), plan.mc_se)


def test_one_sided_needs_fewer_runs() -> None:
    one, two = n_per_cell(0.1, 0.3, two_sided=False), n_per_cell(0.1, 0.3)
    assert one is not None and two is not None and one.n_per_cell < two.n_per_cell


def test_design_effect_is_only_for_reading() -> None:
    assert design_effect(5, 0.1) == pytest.approx(1.4)
    assert design_effect(1, 0.9) == 1.0


def test_mde_none_when_nothing_is_detectable() -> None:
    assert mde(20, 0.02, direction="down") is None
    assert mde(20, 0.98, direction="up") is None
    assert mde(50, 0.0, direction="down") is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"p0": 0.0, "p1": 0.1},
        {"p0": 1.0, "p1": 0.1},
        {"p0": 0.1, "p1": 0.1},
        {"p0": 0.1, "p1": 1.5},
        {"p0": 0.1, "p1": 0.2, "alpha": 0},
        {"p0": 0.1, "p1": 0.2, "power": 1},
        {"p0": 0.1, "p1": 0.2, "cluster_size": 0},
        {"p0": 0.1, "p1": 0.2, "icc": 1.5},
        {"p0": 0.1, "p1": 0.2, "icc": 0.1},  # icc without runs per case
        {"p0": 0.1, "p1": 0.2, "cluster_size": 3, "draws": 10},
    ],
)
def test_bad_inputs(kwargs) -> None:
    with pytest.raises(ValueError):
        n_per_cell(**kwargs)


def test_quantised_case_rates_give_the_exact_quantiles_mde(monkeypatch):
    """The case rates come from a table of beta quantiles (fast); the MDE they
    give equals the one from scipy's beta.ppf evaluated per draw (slow)."""
    import numpy as np
    import scipy.stats as sps

    from offscope.evalmode.stats import power as power_module

    u = np.random.default_rng(1).random(5000)
    table = power_module._case_rates(u, 0.3, 0.1)
    exact = sps.beta.ppf(u, 0.3 * 9, 0.7 * 9)
    assert np.max(np.abs(table - exact)) < 0.01
    fast = power_module.mde(42, 0.3, cluster_size=2, icc=0.1)

    def per_draw(u, p, icc):
        if icc <= 0 or p <= 0 or p >= 1:
            return np.full(u.shape, p)
        s = 1 / icc - 1
        return sps.beta.ppf(u, p * s, (1 - p) * s)

    monkeypatch.setattr(power_module, "_case_rates", per_draw)
    slow = power_module.mde(42, 0.3, cluster_size=2, icc=0.1)
    assert fast is not None and slow is not None
    assert abs(fast.effect - slow.effect) <= 0.002


def test_an_icc_of_rounding_noise_is_no_clustering() -> None:
    """An ICC of 1e-16 (two equal mean squares, rounded) draws every case at p itself, as
    an ICC of 0 does: the beta it would name has a + b = 1e16, a point mass scipy takes
    seconds to invert, so the design parameter is floored rather than inverted."""
    from offscope.evalmode.stats import power as power_module

    u = np.random.default_rng(3).random(1000)
    assert np.array_equal(power_module._case_rates(u, 0.38, 1.46e-16), np.full(1000, 0.38))
    noisy = power_module.mde(40, 0.38, cluster_size=2, icc=1.46e-16, draws=200)
    flat = power_module.mde(40, 0.38, cluster_size=2, icc=0.0, draws=200)
    assert noisy is not None and flat is not None and noisy.effect == flat.effect
