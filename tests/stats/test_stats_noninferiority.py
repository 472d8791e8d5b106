"""The gate's non-inferiority test."""

from __future__ import annotations

import json

import pytest

from offscope.evalmode.stats import (
    n_per_cell,
    newcombe_diff,
    newcombe_paired_diff,
    noninferiority,
)


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


def test_fail_when_point_difference_exceeds_margin() -> None:
    r = noninferiority(cell(5, 100), cell(30, 100), margin=0.05)
    assert r.verdict == "fail"
    assert r.difference >= 0.05


def test_underpowered_when_the_interval_cannot_rule_out_the_margin() -> None:
    r = noninferiority(cell(5, 50), cell(6, 50), margin=0.05)
    assert r.verdict == "underpowered"
    assert r.difference < 0.05 <= r.upper
    assert r.needed_n > 50
    assert str(r.needed_n) in r.notes[-1]
    json.dumps(r.as_dict())


def test_needed_n_comes_from_the_power_calculation() -> None:
    r = noninferiority(cell(5, 50), cell(6, 50), margin=0.05)
    assert r.needed_n == n_per_cell(0.10, 0.15, alpha=0.05, power=0.8, two_sided=False)
    clustered = noninferiority(cell(5, 50), cell(6, 50), margin=0.05, cluster_size=5, icc=0.1)
    assert clustered.needed_n > r.needed_n


def test_needed_n_is_enough_when_rates_are_equal() -> None:
    r = noninferiority(cell(5, 50), cell(5, 50), margin=0.05)
    n = r.needed_n
    k = round(0.1 * n)
    again = noninferiority(cell(k, n), cell(k, n), margin=0.05)
    assert again.verdict == "pass"


def test_zero_baseline_still_gives_a_plan() -> None:
    r = noninferiority(cell(0, 30), cell(0, 30), margin=0.05)
    assert r.needed_n >= 1
    assert r.verdict in {"pass", "underpowered"}


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
