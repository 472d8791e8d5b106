"""Power and minimum detectable effect (arcsine / Cohen's h, design effect)."""

from __future__ import annotations

import math

import pytest
from scipy.stats import norm
from statsmodels.stats.power import NormalIndPower
from statsmodels.stats.proportion import proportion_effectsize

from offscope.evalmode.stats import design_effect, mde, n_per_cell


def hand_n(p0: float, p1: float, alpha: float = 0.05, power: float = 0.8) -> float:
    # n = 2 ((z_{1-a/2} + z_{power}) / h)^2, Cohen (1988) ch. 6
    h = 2 * math.asin(math.sqrt(p1)) - 2 * math.asin(math.sqrt(p0))
    return 2 * ((norm.ppf(1 - alpha / 2) + norm.ppf(power)) / h) ** 2


@pytest.mark.parametrize(("p0", "p1"), [(0.5, 0.3), (0.52, 0.08), (0.08, 0.04), (0.1, 0.2)])
def test_n_per_cell_matches_statsmodels_and_hand(p0: float, p1: float) -> None:
    sm = NormalIndPower().solve_power(
        effect_size=proportion_effectsize(p1, p0),
        alpha=0.05,
        power=0.8,
        ratio=1.0,
        alternative="two-sided",
    )
    n = n_per_cell(p0, p1)
    assert n == math.ceil(sm)
    # the hand formula ignores the far tail; it agrees to within one run
    assert abs(n - hand_n(p0, p1)) < 1


def test_cohen_table_value() -> None:
    # Cohen (1988) Table 6.4.1: h = .2, two-sided a = .05, power .8 -> n = 392
    p0 = 0.5
    p1 = math.sin(math.asin(math.sqrt(p0)) + 0.1) ** 2  # h = 0.2
    assert n_per_cell(p0, p1) in (392, 393)


def test_known_value_half_to_thirty_percent() -> None:
    assert n_per_cell(0.5, 0.3) == 93


def test_one_sided_needs_fewer_runs() -> None:
    assert n_per_cell(0.1, 0.2, two_sided=False) < n_per_cell(0.1, 0.2)


def test_design_effect_inflates_once() -> None:
    assert design_effect(5, 0.1) == pytest.approx(1.4)
    assert design_effect(1, 0.9) == 1.0
    raw = NormalIndPower().solve_power(
        effect_size=abs(proportion_effectsize(0.04, 0.08)), alpha=0.05, power=0.8
    )
    assert n_per_cell(0.08, 0.04, cluster_size=5, icc=0.1) == math.ceil(raw * 1.4)


@pytest.mark.parametrize("n", [20, 50, 200, 1000])
@pytest.mark.parametrize("p0", [0.05, 0.2, 0.5, 0.8])
def test_mde_round_trips_with_n_per_cell(n: int, p0: float) -> None:
    d = mde(n, p0)
    assert d is not None
    assert n_per_cell(p0, p0 + d) == n
    achieved = NormalIndPower().power(
        effect_size=abs(proportion_effectsize(p0 + d, p0)), nobs1=n, alpha=0.05
    )
    assert achieved == pytest.approx(0.8, abs=1e-6)


def test_mde_with_clusters_round_trips() -> None:
    d = mde(100, 0.2, cluster_size=5, icc=0.2, direction="down")
    assert d is not None
    assert n_per_cell(0.2, 0.2 - d, cluster_size=5, icc=0.2) == 100
    assert d > mde(100, 0.2, direction="down")


def test_mde_none_when_nothing_is_detectable() -> None:
    assert mde(20, 0.02, direction="down") is None
    assert mde(20, 0.98, direction="up") is None


def test_seed_sanity_at_fifty_per_cell() -> None:
    # 52% -> 8% is far beyond what 50 per cell detects; 8% -> 4% is not.
    assert mde(50, 0.52, direction="down") < 0.52 - 0.08
    assert n_per_cell(0.52, 0.08) <= 50
    assert mde(50, 0.08, direction="down") > 0.08 - 0.04
    assert n_per_cell(0.08, 0.04) > 50


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
    ],
)
def test_bad_inputs(kwargs) -> None:
    with pytest.raises(ValueError):
        n_per_cell(**kwargs)
