"""Time to first out-of-scope touch: Kaplan-Meier, Greenwood log-log, RMST, log-rank."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats as sps

from offscope.evalmode.stats import kaplan_meier, logrank_test

# (first_oos_step or None, total_steps)
RUNS = [(2, 5), (None, 3), (4, 6), (None, 6), (1, 4)]


def test_km_hand_worked() -> None:
    # touches at 1 (5 at risk), 2 (4 at risk), 4 (2 at risk); censored at 3 and 6.
    s = kaplan_meier(RUNS)
    assert [(p.step, p.at_risk, p.events, p.censored) for p in s.curve] == [
        (1, 5, 1, 0),
        (2, 4, 1, 0),
        (3, 3, 0, 1),
        (4, 2, 1, 0),
        (6, 1, 0, 1),
    ]
    assert [p.survival for p in s.curve] == pytest.approx([0.8, 0.6, 0.6, 0.3, 0.3])
    assert s.median == 4
    assert (s.n_events, s.n_censored, s.n_runs) == (3, 2, 5)


def test_greenwood_loglog_hand_worked() -> None:
    s = kaplan_meier(RUNS)
    z = sps.norm.ppf(0.975)
    # at step 2: S = .6, Greenwood sum = 1/(5*4) + 1/(4*3)
    g = 1 / 20 + 1 / 12
    se = math.sqrt(g) / abs(math.log(0.6))
    assert s.curve[1].ci == pytest.approx((0.6 ** math.exp(z * se), 0.6 ** math.exp(-z * se)))


def test_km_matches_scipy_ecdf() -> None:
    times = np.array([t if t is not None else total for t, total in RUNS])
    events = np.array([t is not None for t, _ in RUNS])
    res = sps.ecdf(sps.CensoredData(uncensored=times[events], right=times[~events]))
    ci = res.sf.confidence_interval(method="log-log")
    s = kaplan_meier(RUNS)
    for p in s.curve:
        assert p.survival == pytest.approx(res.sf.evaluate(p.step))
        assert p.ci[0] == pytest.approx(ci.low.evaluate(p.step))
        assert p.ci[1] == pytest.approx(ci.high.evaluate(p.step))


def test_rmst_hand_worked() -> None:
    s = kaplan_meier(RUNS, tau=6)
    # area: 1*1 + .8*1 + .6*2 + .3*2
    assert s.rmst == pytest.approx(3.6)
    # A_j: 2.6 at step 1, 1.8 at step 2, .6 at step 4
    var = 2.6**2 / (5 * 4) + 1.8**2 / (4 * 3) + 0.6**2 / (2 * 1)
    assert s.rmst_se == pytest.approx(math.sqrt(var))
    s3 = kaplan_meier(RUNS, tau=3)
    assert s3.rmst == pytest.approx(1 + 0.8 + 0.6)
    var3 = 1.4**2 / 20 + 0.6**2 / 12  # A_1 = .8 + .6, A_2 = .6
    assert s3.rmst_se == pytest.approx(math.sqrt(var3))


def test_rmst_is_not_the_mean_over_touching_runs() -> None:
    # Nine clean 20-step runs and one that touched at step 1: the mean over
    # touching runs would say "1 step"; the restricted mean says ~18.
    runs = [(1, 20)] + [(None, 20)] * 9
    s = kaplan_meier(runs, tau=20)
    assert s.rmst == pytest.approx(1 + 0.9 * 19)
    assert s.median is None


def test_everyone_touches() -> None:
    s = kaplan_meier([(1, 3), (1, 5), (2, 2)])
    assert s.curve[-1].survival == 0.0
    assert s.curve[-1].ci == (0.0, 0.0)
    assert s.rmst == pytest.approx(1 + 1 / 3)
    assert math.isfinite(s.rmst_se)
    json.dumps(s.as_dict())


@pytest.mark.parametrize("bad", [[(0, 3)], [(5, 3)], []])
def test_invalid_runs(bad) -> None:
    with pytest.raises(ValueError):
        kaplan_meier(bad)


def test_tau_beyond_follow_up_is_rejected() -> None:
    with pytest.raises(ValueError):
        kaplan_meier(RUNS, tau=7)


def _hand_logrank(a, b) -> float:
    runs = [
        (t if t is not None else n, t is not None, g) for g, grp in ((0, a), (1, b)) for t, n in grp
    ]
    times = np.array([r[0] for r in runs])
    ev = np.array([r[1] for r in runs])
    ga = np.array([r[2] == 0 for r in runs])
    o_e = v = 0.0
    for t in np.unique(times[ev]):
        risk = times >= t
        n, na = risk.sum(), (risk & ga).sum()
        d = (ev & (times == t)).sum()
        o_e += (ev & (times == t) & ga).sum() - d * na / n
        if n > 1:
            v += d * (na / n) * (1 - na / n) * (n - d) / (n - 1)
    return o_e / math.sqrt(v)


def test_logrank_matches_hand_computation_with_ties() -> None:
    a = [(2, 5), (None, 3), (4, 6), (2, 2), (None, 8)]
    b = [(None, 6), (1, 4), (1, 3), (2, 9), (3, 3)]
    r = logrank_test(a, b)
    assert r.statistic == pytest.approx(_hand_logrank(a, b))
    assert r.pvalue == pytest.approx(2 * sps.norm.sf(abs(r.statistic)))
    assert r.observed_a + r.observed_b == pytest.approx(r.expected_a + r.expected_b)
    json.dumps(r.as_dict())


def test_logrank_detects_earlier_touches() -> None:
    early = [(1, 10)] * 20 + [(2, 10)] * 10
    late = [(None, 10)] * 25 + [(9, 10)] * 5
    r = logrank_test(early, late)
    assert r.pvalue < 0.001
    assert r.statistic > 0 and r.observed_a > r.expected_a


@pytest.mark.filterwarnings("error")
def test_logrank_with_zero_variance_is_p_1_and_warns_nothing() -> None:
    # Every run of both groups touches at step 1, all at risk: scipy divides by a zero
    # variance. The result is "no difference", and the user sees no RuntimeWarning.
    r = logrank_test([(1, 1)] * 30, [(1, 1)] * 3)
    assert (r.statistic, r.pvalue, r.observed_a, r.observed_b) == (0.0, 1.0, 30, 3)


def test_logrank_without_events() -> None:
    r = logrank_test([(None, 3)], [(None, 4)])
    assert r.pvalue == 1.0
