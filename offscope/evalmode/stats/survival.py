"""Time to first out-of-scope touch: Kaplan-Meier and the log-rank test."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from offscope.evalmode.stats._base import _AsDict, _check_confidence, _z

# --------------------------------------------------------------------------- #
# 4. Time to first out-of-scope touch
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class KMPoint(_AsDict):
    step: int
    at_risk: int
    events: int
    censored: int
    survival: float
    ci: tuple[float, float]


@dataclass(frozen=True)
class Survival(_AsDict):
    """Kaplan-Meier curve of "no out-of-scope touch yet" over steps."""

    n_runs: int
    n_events: int
    n_censored: int
    curve: tuple[KMPoint, ...]
    median: int | None
    tau: int
    rmst: float
    rmst_se: float
    confidence: float
    method: str


def _validate_runs(runs: Sequence[tuple[int | None, int]]) -> tuple[np.ndarray, np.ndarray]:
    times, events = [], []
    for i, run in enumerate(runs):
        first, total = run
        if total < 0 or (first is not None and not 1 <= first <= total):
            raise ValueError(
                f"run {i}: first_oos_step={first!r} total_steps={total!r}; "
                "need 1 <= first_oos_step <= total_steps"
            )
        times.append(first if first is not None else total)
        events.append(first is not None)
    return np.asarray(times, dtype=int), np.asarray(events, dtype=bool)


class _StepsAndTouch(Protocol):
    """A run as Kaplan-Meier reads it (a trace's RunState, a results file's RunRow)."""

    @property
    def first_oos_step(self) -> int | None: ...

    @property
    def steps(self) -> int: ...


def first_touch_runs(runs: Iterable[_StepsAndTouch]) -> list[tuple[int | None, int]]:
    """`kaplan_meier`'s input from runs: (first touch, last step) of each run that took
    a step, its last step never before its first touch; a run that never touched is
    censored at its last step."""
    pairs = [(r.first_oos_step, max(r.steps, r.first_oos_step or 0)) for r in runs]
    return [(first, total) for first, total in pairs if total > 0]


def last_observed_step(runs: Sequence[tuple[int | None, int]]) -> int:
    """The last step at which a sample is observed (a touched run's first touch, an
    untouched run's censoring): Kaplan-Meier, and so an RMST, is estimable up to it."""
    return max(first if first is not None else total for first, total in runs)


def common_tau(*samples: Sequence[tuple[int | None, int]]) -> int:
    """The horizon at which the RMSTs of several samples are comparable (an RMST is
    only comparable at the same tau): the last step observed in every one of them."""
    return min(last_observed_step(sample) for sample in samples)


def kaplan_meier(
    runs: Sequence[tuple[int | None, int]],
    tau: int | None = None,
    confidence: float = 0.95,
) -> Survival:
    """Time (in steps) to the first out-of-scope touch.

    Input: one (first_oos_step or None, total_steps) per run. A run that never
    touched is right-censored at its last step: it is known to be clean up to
    there, nothing after. A mean over only the runs that touched is biased
    towards early touches and is never computed here.

    Methods: Kaplan-Meier (1958) product-limit estimate; pointwise intervals
    from Greenwood's (1926) variance on the log(-log S) scale (Kalbfleisch &
    Prentice 1980), which stay inside [0, 1]; median = first step with
    S <= 0.5 (None if the curve never gets there); restricted mean survival
    time up to `tau` (Royston & Parmar 2013) = area under S on [0, tau] =
    E[min(T, tau)], with the standard delta-method SE
    var = sum_j A_j^2 d_j / (n_j (n_j - d_j)), A_j = area under S on [t_j, tau]
    (Klein & Moeschberger 2003, sec. 4.5). Ties: at a step, touches come
    before censoring (a censored run was at risk at its last step).
    Default `tau` is the last observed step; beyond it S is not estimable.
    """
    _check_confidence(confidence)
    if not runs:
        raise ValueError("no runs")
    times, events = _validate_runs(runs)
    t_max = int(times.max())
    if tau is None:
        tau = t_max
    if not 0 < tau <= t_max:
        raise ValueError(f"tau={tau} must be in 1..{t_max} (the last observed step)")
    z = _z(confidence)

    curve: list[KMPoint] = []
    s = 1.0
    gw = 0.0  # Greenwood sum d / (n (n - d))
    # (step, S after the step, d, n) at event steps, for the RMST variance
    jumps: list[tuple[int, float, int, int]] = []
    for t in np.unique(times):
        at_risk = int((times >= t).sum())
        d = int(((times == t) & events).sum())
        c = int(((times == t) & ~events).sum())
        if d:
            s *= 1 - d / at_risk
            gw = gw + d / (at_risk * (at_risk - d)) if at_risk > d else math.inf
            jumps.append((int(t), s, d, at_risk))
        curve.append(KMPoint(int(t), at_risk, d, c, s, _loglog_ci(s, gw, z)))

    median = next((p.step for p in curve if p.survival <= 0.5), None)

    # The KM curve as segments [start_i, start_{i+1}) at level S_i.
    starts = [0] + [t for t, _, _, _ in jumps]
    levels = [1.0] + [s_after for _, s_after, _, _ in jumps]

    def area(start: int, end: int) -> float:
        """Area under the right-continuous KM step function on [start, end]."""
        total = 0.0
        for i, (seg, level) in enumerate(zip(starts, levels, strict=True)):
            seg_end = starts[i + 1] if i + 1 < len(starts) else math.inf
            overlap = min(seg_end, end) - max(seg, start)
            if overlap > 0:
                total += level * overlap
        return total

    rmst = area(0, tau)
    var = 0.0
    for t, _, d, n_j in jumps:
        if t > tau:
            break
        a_j = area(t, tau)
        if a_j > 0:  # a_j == 0 whenever n_j == d_j (S drops to 0)
            var += a_j * a_j * d / (n_j * (n_j - d))
    return Survival(
        n_runs=len(times),
        n_events=int(events.sum()),
        n_censored=int((~events).sum()),
        curve=tuple(curve),
        median=median,
        tau=int(tau),
        rmst=rmst,
        rmst_se=math.sqrt(var),
        confidence=confidence,
        method="kaplan-meier 1958; greenwood log-log CI; rmst (royston & parmar 2013)",
    )


def _loglog_ci(s: float, greenwood: float, z: float) -> tuple[float, float]:
    if s >= 1.0:
        return (1.0, 1.0)
    if s <= 0.0 or not math.isfinite(greenwood):
        return (0.0, 0.0)
    se = math.sqrt(greenwood) / abs(math.log(s))
    return (s ** math.exp(z * se), s ** math.exp(-z * se))


@dataclass(frozen=True)
class LogRankResult(_AsDict):
    statistic: float  # signed z: > 0 means group a touches earlier than expected
    chi2: float
    pvalue: float
    observed_a: int
    expected_a: float
    observed_b: int
    expected_b: float
    method: str


def logrank_test(
    a: Sequence[tuple[int | None, int]], b: Sequence[tuple[int | None, int]]
) -> LogRankResult:
    """Two-sided log-rank test (Mantel 1966; Peto & Peto 1972) that two groups
    share the same time-to-first-touch distribution. Same censoring rule as
    `kaplan_meier`. Statistic and p-value from scipy.stats.logrank; the
    observed/expected counts are computed here so reports can say which group
    touched earlier."""
    if not a or not b:
        raise ValueError("both groups need at least one run")
    ta, ea = _validate_runs(a)
    tb, eb = _validate_runs(b)
    times = np.concatenate([ta, tb])
    events = np.concatenate([ea, eb])
    in_a = np.concatenate([np.ones(len(ta), bool), np.zeros(len(tb), bool)])
    exp_a = 0.0
    for t in np.unique(times[events]):
        risk = times >= t
        n_t = risk.sum()
        d_t = (events & (times == t)).sum()
        exp_a += d_t * (risk & in_a).sum() / n_t
    o_a, o_b = int(ea.sum()), int(eb.sum())
    exp_b = (o_a + o_b) - exp_a
    if o_a + o_b == 0:
        return LogRankResult(0.0, 0.0, 1.0, 0, 0.0, 0, 0.0, "log-rank (no events)")
    from scipy import stats as sps

    # Zero variance (below) is a case handled here, not a warning for the user to read.
    with np.errstate(divide="ignore", invalid="ignore"):
        res = sps.logrank(
            sps.CensoredData(uncensored=ta[ea], right=ta[~ea]),
            sps.CensoredData(uncensored=tb[eb], right=tb[~eb]),
        )
    zstat = float(res.statistic)
    pval = float(res.pvalue)
    if not math.isfinite(zstat):  # zero variance, e.g. every event at one step with all at risk
        zstat, pval = 0.0, 1.0
    return LogRankResult(
        statistic=zstat,
        chi2=zstat * zstat,
        pvalue=pval,
        observed_a=o_a,
        expected_a=float(exp_a),
        observed_b=o_b,
        expected_b=float(exp_b),
        method="log-rank (scipy.stats.logrank)",
    )
