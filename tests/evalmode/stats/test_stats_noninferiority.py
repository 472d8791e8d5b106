"""The gate's non-inferiority test."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats as sps
from statsmodels.stats.proportion import confint_proportions_2indep

from offscope.evalmode.stats import (
    newcombe_diff,
    newcombe_paired_diff,
    noninferiority,
)
from tests.support.stats_reference import ni_upper, t_pvalue


def cell(k: int, n: int) -> list[bool]:
    return [True] * k + [False] * (n - k)


def test_upper_bound_is_newcombe_at_one_minus_two_alpha() -> None:
    r = noninferiority(cell(10, 100), cell(12, 100), margin=0.1)
    d, _, upper = newcombe_diff(12, 100, 10, 100, confidence=0.90)
    assert r.difference == pytest.approx(d)
    assert r.upper == pytest.approx(upper)
    assert not r.paired


def test_pass_when_upper_bound_below_margin() -> None:
    r = noninferiority(cell(50, 500), cell(48, 500), margin=0.05)
    assert r.verdict == "pass"
    assert r.upper < 0.05


def test_regression_when_significantly_worse() -> None:
    r = noninferiority(cell(5, 100), cell(30, 100), margin=0.05)
    assert r.verdict == "regression"
    p = sps.fisher_exact([[30, 70], [5, 95]], alternative="greater").pvalue
    assert r.pvalue_regression == pytest.approx(p)


def test_point_difference_at_the_margin_is_not_a_regression() -> None:
    """The old gate failed whenever the point difference reached the margin (here 6 points);
    one-sided Fisher p = 0.28, so the data show nothing: inconclusive."""
    r = noninferiority(cell(5, 50), cell(8, 50), margin=0.05)
    assert r.difference >= 0.05
    assert r.verdict == "inconclusive"
    assert r.pvalue_regression > 0.2


def test_inconclusive_when_the_interval_cannot_rule_out_the_margin() -> None:
    r = noninferiority(cell(5, 50), cell(6, 50), margin=0.05)
    assert r.verdict == "inconclusive"
    assert r.difference < 0.05 <= r.upper
    assert r.needed_n is not None and r.needed_n > 50
    assert str(r.needed_n) in r.notes[-1]
    json.dumps(r.as_dict())


def _reference_pass_rate(n: int, p: float, margin: float, draws: int, state: int) -> float:
    """P(statsmodels' Newcombe upper bound < margin) with equal true rates, unpaired."""
    rng = np.random.default_rng(state)
    kb, kc = rng.binomial(n, p, draws), rng.binomial(n, p, draws)
    hits = 0
    for b, c in zip(kb, kc, strict=True):
        _, upper = confint_proportions_2indep(
            int(c), n, int(b), n, method="newcomb", compare="diff", alpha=0.10
        )
        hits += upper < margin
    return hits / draws


def test_needed_n_delivers_the_planned_power() -> None:
    r = noninferiority(cell(5, 50), cell(6, 50), margin=0.05)
    assert r.needed_n is not None
    draws = 400
    rate = _reference_pass_rate(r.needed_n, 0.10, 0.05, draws, state=3)
    assert rate >= 0.8 - 4 * (0.16 / draws) ** 0.5
    # and clearly fewer runs do not
    assert _reference_pass_rate(r.needed_n // 2, 0.10, 0.05, draws, state=4) < 0.8


def test_zero_baseline_still_gives_a_plan() -> None:
    r = noninferiority(cell(0, 30), cell(0, 30), margin=0.05)
    assert r.verdict in {"pass", "inconclusive"}
    if r.verdict == "inconclusive":
        assert r.needed_n is not None and r.needed_n > 30


def _clustered(diffs_by_case: list[tuple[int, int]], reps: int) -> tuple[list, list, list]:
    """Per case (baseline events, candidate events) over `reps` paired runs."""
    base, cand, keys = [], [], []
    for g, (kb, kc) in enumerate(diffs_by_case):
        for r in range(reps):
            base.append(r < kb)
            cand.append(r < kc)
            keys.append((f"case{g}", r))
    return base, cand, keys


def test_case_clustered_bound_and_p_are_the_conservative_ones() -> None:
    """A regression concentrated in a few cases: the runs of those cases move together, and
    the cluster t over cases (scipy ttest_1samp on per-case differences) is wider than
    Newcombe's paired interval, which treats the 200 runs as independent (reference:
    stats_reference.py, the one-sample t on per-case differences)."""
    per_case = [(1, 1)] * 7 + [(1, 9), (1, 8), (0, 6)]
    base, cand, keys = _clustered(per_case, reps=20)
    cases = [k[0] for k in keys]
    r = noninferiority(
        base,
        cand,
        margin=0.05,
        baseline_keys=keys,
        candidate_keys=keys,
        baseline_clusters=cases,
        candidate_clusters=cases,
    )
    assert r.paired and r.clustered and r.n_cases == 10
    diffs = np.array([(kc - kb) / 20 for kb, kc in per_case])
    t_upper = ni_upper(diffs, 0.05, 0.05, 200)
    only_c = sum(c and not b for b, c in zip(base, cand, strict=True))
    only_b = sum(b and not c for b, c in zip(base, cand, strict=True))
    both = sum(b and c for b, c in zip(base, cand, strict=True))
    _, _, n_upper = newcombe_paired_diff(
        both, only_c, only_b, 200 - both - only_c - only_b, confidence=0.90
    )
    assert t_upper > n_upper
    assert r.upper == pytest.approx(max(t_upper, n_upper))
    p_t = t_pvalue(diffs, "greater")
    p_mc = sps.binomtest(only_c, only_c + only_b, 0.5, alternative="greater").pvalue
    assert r.pvalue_regression == pytest.approx(max(p_t, p_mc))
    assert p_mc < 0.05 < p_t or r.verdict == "regression"


def test_paired_uses_newcombe_paired() -> None:
    keys = [(f"c{i // 5}", i % 5) for i in range(100)]
    base = [i % 10 == 0 for i in range(100)]
    cand = [i % 10 == 0 and i < 50 for i in range(100)]  # fewer touches, same cases
    r = noninferiority(base, cand, margin=0.05, baseline_keys=keys, candidate_keys=keys)
    assert r.paired
    # both=5, base only=5, cand only=0, neither=90
    d, _, upper = newcombe_paired_diff(5, 0, 5, 90, confidence=0.90)
    assert r.difference == pytest.approx(d) == pytest.approx(-0.05)
    assert r.upper == pytest.approx(upper)
    assert r.verdict == "pass"


@pytest.mark.parametrize("margin", [0, -0.1, 1.0])
def test_bad_margin(margin: float) -> None:
    with pytest.raises(ValueError):
        noninferiority(cell(1, 10), cell(1, 10), margin=margin)
