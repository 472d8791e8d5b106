"""The case-clustered contrast test (`compare_cells` with case ids), checked
against scipy: with equal runs per case the cluster-robust t over cases is the
one-sample t on the per-case differences (with Johnson's skew correction; see
stats_reference.py)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from offscope.evalmode.stats import compare_cells, newcombe_diff, newcombe_paired_diff
from offscope.evalmode.stats.differences import _newcombe_arr, _newcombe_paired_arr, _wilson_arr
from offscope.trace.rates import wilson
from tests.support.stats_reference import t_bounds, t_pvalue


def _grid(per_case: list[tuple[int, int]], reps: int) -> tuple[list[bool], list[bool], list, list]:
    a, b, keys, cases = [], [], [], []
    for g, (ka, kb) in enumerate(per_case):
        for r in range(reps):
            a.append(r < ka)
            b.append(r >= reps - kb)  # b's events sit on other reps than a's: many discordant pairs
            keys.append((f"c{g}", r))
            cases.append(f"c{g}")
    return a, b, keys, cases


def test_clustered_contrast_is_the_more_conservative_of_exact_and_cluster_t() -> None:
    per_case = [(0, 1), (1, 1), (0, 0), (2, 3), (0, 2), (1, 0), (0, 3), (1, 1)]
    a, b, keys, cases = _grid(per_case, reps=3)
    c = compare_cells(a, b, keys, keys, clusters_a=cases, clusters_b=cases)
    assert c.paired and c.clustered and c.n_cases == 8
    diffs = np.array([(kb - ka) / 3 for ka, kb in per_case])
    p_t = t_pvalue(diffs)
    up = sum(y and not x for x, y in zip(a, b, strict=True))
    down = sum(x and not y for x, y in zip(a, b, strict=True))
    p_exact = sps.binomtest(up, up + down, 0.5).pvalue
    assert c.pvalue == pytest.approx(max(p_t, p_exact))
    t_lo, t_hi = t_bounds(diffs)
    both = sum(x and y for x, y in zip(a, b, strict=True))
    _, lo, hi = newcombe_paired_diff(both, up, down, 24 - both - up - down)
    assert c.ci[0] == pytest.approx(min(lo, t_lo))
    assert c.ci[1] == pytest.approx(max(hi, t_hi))
    assert "case-clustered t (7 df)" in c.test and "hull" in c.ci_method


def test_unpaired_clustered_uses_fisher_and_cluster_t() -> None:
    per_case = [(0, 2), (1, 2), (0, 1), (1, 3), (0, 0), (0, 2)]
    a, b, _, cases = _grid(per_case, reps=3)
    c = compare_cells(a, b, clusters_a=cases, clusters_b=cases)
    assert not c.paired and c.clustered
    diffs = np.array([(kb - ka) / 3 for ka, kb in per_case])
    ka, kb = sum(a), sum(b)
    p_f = sps.fisher_exact([[kb, 18 - kb], [ka, 18 - ka]]).pvalue
    assert c.pvalue == pytest.approx(max(p_f, t_pvalue(diffs)))


def test_one_run_per_case_is_not_clustered() -> None:
    a = [True] * 5 + [False] * 25
    b = [True] * 12 + [False] * 18
    cases = [f"c{i}" for i in range(30)]
    c = compare_cells(a, b, clusters_a=cases, clusters_b=cases)
    assert not c.clustered
    assert c.pvalue == pytest.approx(sps.fisher_exact([[12, 18], [5, 25]]).pvalue)


@pytest.mark.parametrize("k,n", [(0, 10), (3, 10), (10, 10), (1, 63), (40, 63)])
def test_vectorised_wilson_and_newcombe_match_the_scalar_ones(k: int, n: int) -> None:
    z = float(sps.norm.ppf(0.975))
    _, lo, hi = _wilson_arr(np.array([k]), np.array([n]), z)
    assert (lo[0], hi[0]) == pytest.approx(wilson(k, n))
    _, l2, h2 = newcombe_diff(k, n, 5, 20)
    lo, hi = _newcombe_arr(np.array(k), np.array(n), np.array(5), np.array(20), z)
    assert (float(lo), float(hi)) == pytest.approx((l2, h2))
    both = min(k, 3)
    _, l3, h3 = newcombe_paired_diff(both, k - both, 2, n + 5 - k)
    lo, hi = _newcombe_paired_arr(
        np.array(both), np.array(k - both), np.array(2), np.array(n + 5 - k), z
    )
    assert (float(lo), float(hi)) == pytest.approx((l3, h3))
