"""Cell comparisons: Newcombe intervals, exact tests, Holm; the study's n checks."""

from __future__ import annotations

import json

import pytest
from scipy.stats import binomtest

from offscope.evalmode.stats import (
    compare_cells,
    holm,
    mde,
    newcombe_diff,
    newcombe_paired_diff,
)
from offscope.trace.rates import wilson


def cell(k: int, n: int) -> list[bool]:
    return [True] * k + [False] * (n - k)


@pytest.mark.parametrize(
    ("k1", "n1", "k2", "n2", "lo", "hi"),
    [
        # Newcombe (1998) Stat Med 17:873, Table II, method 10.
        # (Note: 56/70 - 48/80 is 0.8 - 0.6 = 0.2000, not 0.1833.)
        (56, 70, 48, 80, 0.0524, 0.3339),
        (9, 10, 3, 10, 0.1705, 0.8090),
        (6, 7, 2, 7, 0.0582, 0.8062),
        (5, 56, 0, 29, -0.0381, 0.1926),
        (0, 10, 0, 20, -0.1611, 0.2775),
        (0, 10, 0, 10, -0.2775, 0.2775),
        (10, 10, 0, 20, 0.6791, 1.0000),
        (10, 10, 0, 10, 0.6075, 1.0000),
    ],
)
def test_newcombe_unpaired_published_values(k1, n1, k2, n2, lo, hi) -> None:
    d, got_lo, got_hi = newcombe_diff(k1, n1, k2, n2)
    assert d == pytest.approx(k1 / n1 - k2 / n2)
    assert got_lo == pytest.approx(lo, abs=5e-5)
    assert got_hi == pytest.approx(hi, abs=5e-5)


@pytest.mark.parametrize(
    ("k", "n", "lo", "hi"),
    # Wilson intervals, Newcombe (1998) Stat Med 17:857, Table I.
    [
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_published_values(k, n, lo, hi) -> None:
    got = wilson(k, n)
    assert got == pytest.approx((lo, hi), abs=5e-5)


@pytest.mark.parametrize(
    ("table", "est", "lo", "hi"),
    [
        # Cavo et al. 2012, Fagerland, Lydersen & Laake (2017) ch. 8.
        ((59, 6, 16, 80), -0.0621, -0.1186, -0.0046),
        # Bentur et al. 2009, same book.
        ((1, 1, 7, 12), -0.2857, -0.5069, -0.0256),
        # Newcombe (1998b) Stat Med 17:2635, example (a), method 10.
        ((36, 12, 2, 0), 0.2000, 0.0569, 0.3404),
    ],
)
def test_newcombe_paired_published_values(table, est, lo, hi) -> None:
    d, got_lo, got_hi = newcombe_paired_diff(*table)
    assert (d, got_lo, got_hi) == pytest.approx((est, lo, hi), abs=5e-5)


def test_seed_26_vs_4_is_unambiguous() -> None:
    # "At fifty trajectories per cell, 26 versus 4 is unambiguous..."
    c = compare_cells(cell(26, 50), cell(4, 49))
    assert not c.paired and c.test.startswith("fisher")
    assert c.pvalue < 0.05
    assert c.significant()
    assert c.difference == pytest.approx(4 / 49 - 26 / 50)
    assert c.ci[1] < 0  # the interval excludes no change


def test_seed_4_vs_2_is_noise() -> None:
    # "...and 4 versus 2 is noise."
    c = compare_cells(cell(4, 50), cell(2, 50))
    assert c.pvalue > 0.05
    assert not c.significant()
    assert c.ci[0] < 0 < c.ci[1]
    # and the change is smaller than what 50 per cell can detect
    # (the arcsine approximation used to claim even 8% -> 0% was detectable; the exact tests
    # the report runs cannot detect any drop from 8% at 50 per cell with 80% power)
    assert mde(50, 0.08, direction="down") is None


def test_paired_uses_exact_mcnemar() -> None:
    keys = [(f"case{i}", 0) for i in range(30)]
    a = [False] * 30
    b = [True] * 10 + [False] * 20  # 10 discordant, all b-only
    c = compare_cells(a, b, keys, list(reversed(keys)))  # order must not matter
    assert c.paired
    # keys reversed: b's True runs are case20..29 while a is all False
    assert c.discordant == (10, 0)
    assert c.pvalue == pytest.approx(2 * 0.5**10)
    assert c.pvalue == pytest.approx(binomtest(10, 10, 0.5).pvalue)
    d, lo, hi = newcombe_paired_diff(0, 10, 0, 20)
    assert c.ci == (lo, hi) and c.difference == pytest.approx(d)


def test_paired_with_no_discordant_pairs_has_p_one() -> None:
    keys = list(range(10))
    c = compare_cells(cell(3, 10), cell(3, 10), keys, keys)
    assert c.paired and c.pvalue == 1.0


def test_mismatched_or_repeated_keys_fall_back_to_unpaired() -> None:
    c = compare_cells(cell(3, 10), cell(5, 10), list(range(10)), list(range(5, 15)))
    assert not c.paired and "match" in c.notes[0]
    c = compare_cells(cell(3, 4), cell(1, 4), [1, 1, 2, 3], [1, 2, 3, 4])
    assert not c.paired and "repeat" in c.notes[0]
    json.dumps(c.as_dict())


def test_pairing_gives_power_the_unpaired_test_lacks() -> None:
    # Same marginals; pairing by case removes between-case noise.
    keys = list(range(40))
    a = [True] * 20 + [False] * 20
    b = [True] * 12 + [False] * 28  # b improves on 8 cases, never worsens
    paired = compare_cells(a, b, keys, keys)
    unpaired = compare_cells(a, b)
    assert paired.pvalue < 0.05 < unpaired.pvalue


def test_holm_hand_values_and_order() -> None:
    # sorted: .005*4=.02, .01*3=.03, .03*2=.06, .04*1 -> max(.06, .04) = .06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([]) == []
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    with pytest.raises(ValueError):
        holm([1.2])
