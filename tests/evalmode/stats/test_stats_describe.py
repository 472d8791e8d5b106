"""Honest wording: the residual always stands next to the improvement."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from offscope.evalmode.stats import describe_change, mde, mde_points
from offscope.trace.rates import Rate


def test_seed_example() -> None:
    assert (
        describe_change(Rate(26, 50), Rate(4, 50), True)
        == "6.5-fold reduction (52% -> 8%), still 8% of runs [3–19%]"
    )


def test_not_significant_gives_the_mde() -> None:
    text = describe_change(Rate(10, 50), Rate(5, 50), False)
    m = mde(50, 0.2, direction="down")
    assert m is not None
    assert text.startswith("no distinguishable difference at this n (20% -> 10%")
    assert f"MDE {mde_points(m)}" in text
    assert "still 10% of runs [4–21%]" in text
    assert "fold" not in text


def test_no_detectable_drop_is_said() -> None:
    # at 50 per cell not even 8% -> 0% is detected with 80% power by the tests the report runs
    text = describe_change(Rate(4, 50), Rate(2, 50), False)
    assert "no drop from 8% is detectable" in text


def test_not_significant_rise_uses_upward_mde() -> None:
    text = describe_change(Rate(10, 50), Rate(16, 50), False)
    m = mde(50, 0.2, direction="up")
    assert m is not None and f"MDE {mde_points(m)}" in text


def test_the_report_passes_its_own_interval_and_mde() -> None:
    """The sentence carries the very numbers of the table row (interval and MDE)."""
    m = mde(63, 0.3, cluster_size=3, icc=0.1, direction="down", draws=300)
    assert m is not None
    text = describe_change(Rate(19, 63), Rate(14, 63), False, interval=(0.11, 0.37), mde_result=m)
    assert "still 22% of runs [11–37%]" in text
    assert f"MDE {mde_points(m)}" in text
    zero = describe_change(
        Rate(26, 50), Rate(0, 50), True, interval=(0.0, 0.09), interval_name="clustered"
    )
    assert "still up to 9% of runs" in zero and "clustered interval" in zero


def test_increase_and_zero_cases() -> None:
    assert describe_change(Rate(2, 50), Rate(6, 50), True).startswith(
        "3.0-fold increase (4% -> 12%), now 12%"
    )
    zero = describe_change(Rate(26, 50), Rate(0, 50), True)
    assert "reduction to zero observed (52% -> 0%)" in zero
    assert "still up to 7% of runs" in zero
    assert "increase from zero" in describe_change(Rate(0, 50), Rate(10, 50), True)


def test_small_residuals_are_not_rounded_away() -> None:
    text = describe_change(Rate(100, 400), Rate(1, 400), True)
    assert "still 0.2% of runs" in text
    assert "100-fold" in text


@settings(deadline=None, max_examples=40)  # each example computes an exact MDE at its own n
@given(n1=st.integers(1, 300), n2=st.integers(1, 300), data=st.data(), sig=st.booleans())
def test_residual_always_stated(n1: int, n2: int, data, sig: bool) -> None:
    k1 = data.draw(st.integers(0, n1))
    k2 = data.draw(st.integers(0, n2))
    text = describe_change(Rate(k1, n1), Rate(k2, n2), sig)
    assert re.search(r"(still|now)( up to)? [\d.]+% of runs", text)
