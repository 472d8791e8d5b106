"""Honest wording: the residual always stands next to the improvement."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from offscope.evalmode.stats import describe_change, mde
from offscope.trace.rates import Rate


def test_seed_example() -> None:
    assert (
        describe_change(Rate(26, 50), Rate(4, 50), True)
        == "6.5-fold reduction (52% -> 8%), still 8% of runs [3%, 19%]"
    )


def test_not_significant_gives_the_mde() -> None:
    text = describe_change(Rate(4, 50), Rate(2, 50), False)
    expected = round(mde(50, 0.08, direction="down") * 100)
    assert text.startswith("no distinguishable difference at this n (8% -> 4%")
    assert f"MDE {expected} points" in text
    assert "still 4% of runs [1%, 13%]" in text
    assert "fold" not in text


def test_not_significant_rise_uses_upward_mde() -> None:
    text = describe_change(Rate(10, 50), Rate(16, 50), False)
    assert f"MDE {round(mde(50, 0.2, direction='up') * 100)} points" in text


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


@given(n1=st.integers(1, 500), n2=st.integers(1, 500), data=st.data(), sig=st.booleans())
def test_residual_always_stated(n1: int, n2: int, data, sig: bool) -> None:
    k1 = data.draw(st.integers(0, n1))
    k2 = data.draw(st.integers(0, n2))
    text = describe_change(Rate(k1, n1), Rate(k2, n2), sig)
    assert re.search(r"(still|now)( up to)? [\d.]+% of runs", text)
