"""Clustered rates: ANOVA ICC, design effect, case-level bootstrap."""

from __future__ import annotations

import json

import pytest

from offscope.evalmode.stats import clustered_rate
from offscope.trace.rates import wilson


def test_hand_worked_icc_and_design_effect() -> None:
    # Two cases of 4 runs: 3/4 and 1/4. By hand: p = .5, MSB = .5, MSW = .25,
    # m0 = 4, icc = (.5 - .25) / (.5 + 3 * .25) = .2, deff = 1 + 3 * .2 = 1.6.
    r = clustered_rate([1, 1, 1, 0, 1, 0, 0, 0], list("AAAABBBB"))
    assert (r.k, r.n, r.point) == (4, 8, 0.5)
    assert r.icc == pytest.approx(0.2)
    assert r.design_effect == pytest.approx(1.6)
    assert r.effective_n == pytest.approx(5.0)
    assert r.wilson_ci == wilson(4, 8)
    assert r.n_clusters == 2


def test_perfect_clustering_has_icc_one() -> None:
    r = clustered_rate([True] * 5 + [False] * 5, ["a"] * 5 + ["b"] * 5)
    assert r.icc == pytest.approx(1.0)
    assert r.design_effect == pytest.approx(5.0)  # 1 + (5 - 1) * 1


def test_equal_mean_squares_give_an_icc_of_exactly_zero() -> None:
    # 18 cases of 2 runs whose between- and within-case mean squares are equal: computed
    # naively the ICC is 1.1e-16, and as the sample-size plan's design parameter that made
    # a beta with a + b = 9e15, which took scipy 5-36 s per table (a grid report of 45 s).
    per_case = [2, 2, 1, 1, 2, 2, 2, 1, 1, 0, 1, 1, 1, 0, 0, 2, 1, 1]
    values = [i < k for k in per_case for i in range(2)]
    cases = [c for c in range(len(per_case)) for _ in range(2)]
    assert clustered_rate(values, cases, n_boot=1).icc == 0.0


def test_negative_icc_is_reported_but_design_effect_floored() -> None:
    # Identical cases: MSB = 0, icc = -1 / (m0 - 1) = -1/3.
    r = clustered_rate([1, 0, 1, 0, 1, 0, 0, 1], list("AAAABBBB"))
    assert r.icc == pytest.approx(-1 / 3)
    assert r.design_effect == 1.0


def test_bootstrap_is_deterministic_for_a_seed() -> None:
    values = [i % 3 == 0 for i in range(60)]
    clusters = [f"case{i % 12}" for i in range(60)]
    a = clustered_rate(values, clusters, seed=7)
    b = clustered_rate(values, clusters, seed=7)
    assert a.bootstrap_ci == b.bootstrap_ci
    assert a.as_dict() == b.as_dict()


def test_clustering_widens_the_interval() -> None:
    # 10 cases, 10 reps each; half the cases always touch, half never do.
    values = [c < 5 for c in range(10) for _ in range(10)]
    clusters = [str(c) for c in range(10) for _ in range(10)]
    r = clustered_rate(values, clusters, n_boot=4000)
    assert r.bootstrap_ci is not None
    w_lo, w_hi = r.wilson_ci
    b_lo, b_hi = r.bootstrap_ci
    assert b_hi - b_lo > 1.5 * (w_hi - w_lo)
    assert r.ci == (min(w_lo, b_lo), max(w_hi, b_hi))


def test_zero_events_do_not_collapse_to_a_point() -> None:
    r = clustered_rate([False] * 40, [str(i % 8) for i in range(40)])
    assert r.bootstrap_ci == (0.0, 0.0)
    assert r.ci == r.wilson_ci
    assert r.ci[1] > 0.05
    assert r.icc is None and r.design_effect == 1.0


def test_single_cluster_falls_back_to_wilson_and_says_so() -> None:
    r = clustered_rate([True, False, False, True], ["only"] * 4)
    assert r.bootstrap_ci is None
    assert r.ci == wilson(2, 4)
    assert any("one case" in n for n in r.notes)
    json.dumps(r.as_dict())


def test_input_validation() -> None:
    with pytest.raises(ValueError):
        clustered_rate([True], ["a", "b"])
    with pytest.raises(ValueError):
        clustered_rate([], [])
    with pytest.raises(ValueError):
        clustered_rate([2], ["a"])
