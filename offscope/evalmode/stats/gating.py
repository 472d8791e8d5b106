"""The gate's non-inferiority test."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Literal

from offscope.evalmode.stats._base import _as_outcomes, _AsDict
from offscope.evalmode.stats.differences import _cases, _diff_test, _pair
from offscope.evalmode.stats.power import _check_alpha_power, gate_plan_n
from offscope.trace.rates import Rate

# --------------------------------------------------------------------------- #
# 3. Non-inferiority (the gate)
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class NonInferiority(_AsDict):
    """Is the candidate's rate no worse than baseline + margin?

    Two one-sided tests at level `alpha`, both on the case-clustered
    difference (`_diff_test`):

      pass          non-inferiority shown: the one-sided (1 - alpha) upper
                    bound of (candidate - baseline) is below the margin
                    (H0: difference >= margin rejected)
      regression    not pass, and the candidate is significantly worse:
                    one-sided p of H0 "candidate <= baseline" below alpha
                    (`gate.compare` adjusts these p-values by Holm across
                    the gate's checks before calling a regression)
      inconclusive  neither: the data cannot rule out a regression of
                    `margin`, nor show one (underpowered)
    """

    baseline: Rate
    candidate: Rate
    difference: float
    upper: float
    lower: float
    margin: float
    alpha: float
    paired: bool
    clustered: bool
    n_cases: int
    pvalue_regression: float
    method: str
    verdict: Literal["pass", "regression", "inconclusive"]
    needed_n: int | None
    notes: tuple[str, ...] = ()


def noninferiority(
    baseline: Sequence[bool | int],
    candidate: Sequence[bool | int],
    margin: float,
    alpha: float = 0.05,
    baseline_keys: Sequence[Hashable] | None = None,
    candidate_keys: Sequence[Hashable] | None = None,
    power: float = 0.8,
    baseline_clusters: Sequence[Hashable] | None = None,
    candidate_clusters: Sequence[Hashable] | None = None,
    plan_draws: int = 400,
) -> NonInferiority:
    """The gate's test for one rate: H0 p_cand - p_base >= margin against
    H1 p_cand - p_base < margin (events are bad, so "worse" is "higher"),
    and the regression test H0 p_cand <= p_base at the same alpha.

    Bounds: the more conservative of Newcombe's score bound (paired on the
    keys when both cells carry the same unique keys, Newcombe 1998b; else
    Newcombe 1998 hybrid score) at one-sided level alpha, and, when runs
    cluster within cases (`*_clusters`), the cluster-robust t bound over
    cases (Johnson's skew correction; for the upper bound a standard error
    no smaller than it can be on the boundary, see `_ni_floor`). Regression p-value: the larger of the one-sided exact McNemar
    (paired) / Fisher (unpaired) p and the cluster t p.

    `needed_n` (not for a pass): runs per cell, on the same cases, for
    which this test passes with probability `power` when the true rates are
    equal at the baseline's observed rate, found by simulating this very
    test (`plan_draws` draws, fixed random state; case effects with the
    observed ICC); None when more reps of these cases cannot get there, or
    when `plan_draws` is 0 (no plan wanted).
    """
    if not 0 < margin < 1:
        raise ValueError(f"margin={margin} must be in (0, 1) (an absolute rate difference)")
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha={alpha} must be in (0, 0.5)")
    _check_alpha_power(alpha, power)
    vb, vc = _as_outcomes(baseline, "baseline"), _as_outcomes(candidate, "candidate")
    if not vb or not vc:
        raise ValueError("both cells need at least one run")
    rb, rc = Rate(sum(vb), len(vb)), Rate(sum(vc), len(vc))
    pairing, note = _pair(vb, vc, baseline_keys, candidate_keys)
    notes = [note] if note else []
    cases = _cases(vb, vc, baseline_clusters, candidate_clusters, pairing)
    res = _diff_test(cases, "greater", 1 - alpha, 1 - alpha, margin)
    method = (
        "newcombe 1998b method 10 (paired)"
        if pairing is not None
        else "newcombe 1998 method 10 (hybrid score)"
    )
    method += ", one-sided bounds; regression: exact " + (
        "mcnemar" if pairing is not None else "fisher"
    )
    if cases.clustered:
        method += f"; case-clustered t ({cases.n_cases - 1} df), the more conservative of both"
    if res.upper < margin:
        verdict: Literal["pass", "regression", "inconclusive"] = "pass"
    elif res.pvalue < alpha:
        verdict = "regression"
    else:
        verdict = "inconclusive"
    needed: int | None = None
    if (
        verdict != "pass" and plan_draws > 0
    ):  # also for a regression: the gate may downgrade it after Holm
        needed = gate_plan_n(rb.k / rb.n, margin, alpha, power, cases, draws=plan_draws)
    if verdict == "inconclusive":
        notes.append(
            f"cannot rule out a regression of {margin * 100:g} points at this n; "
            + (
                f"about {needed} runs per cell are needed"
                if needed is not None
                else "more reps of these cases are not enough: add cases"
            )
        )
    return NonInferiority(
        baseline=rb,
        candidate=rc,
        difference=res.difference,
        upper=res.upper,
        lower=res.lower,
        margin=margin,
        alpha=alpha,
        paired=pairing is not None,
        clustered=cases.clustered,
        n_cases=cases.n_cases,
        pvalue_regression=res.pvalue,
        method=method,
        verdict=verdict,
        needed_n=needed,
        notes=tuple(notes),
    )
