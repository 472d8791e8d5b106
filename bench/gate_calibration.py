"""Calibration of the gate's test (`offscope gate`), by simulation.

For each scenario, simulate many baseline/candidate comparisons of one rate
in one cell, run the gate's per-check decision on each (the vectorised
`stats.gate_decisions`, the same code `gate.compare` runs through
`stats.noninferiority`; tests/evalmode/stats/test_gate_calibration.py checks that they
agree draw for draw), and count:

- no change (candidate = baseline): the false-alarm rate, P(verdict
  "regression");
- at the margin (candidate = baseline + margin on average): P(verdict
  "pass"), the chance that a regression of exactly the margin gets through.

Both are error rates of a one-sided test at level alpha, so both must be at
most alpha. The simulated rate is allowed a Monte Carlo margin of
3 standard errors of a proportion alpha over the draws (3 sqrt(alpha (1 -
alpha) / draws)); "ok" says whether every scenario is within it.

Scenarios: runs paired by (case, rep) as `offscope grid` pairs them, 21
cases (the bundled case set) with 3 reps (63 runs per cell, the demo) or
10 cases with 20 reps; independent (no case effect; and one run per case)
and case-clustered (case rates beta-distributed with ICC 0.3, the same case
rate on both sides: a case that is hard for the baseline is hard for the
candidate). At the margin, the clustered regression is concentrated in a
quarter of the cases (their rate rises by 4 x margin, the others' not at
all) or spread evenly. The two runs of a pair are either independent given
their case's rates, or share one uniform draw ("shared": as a simulated
model with common random draws, where paired runs differ only where the
rates do; the paired interval alone is then far too narrow).

Usage: python bench/gate_calibration.py [--draws 10000] [--random-state 1]
Prints one JSON object. Takes well under a minute on one core.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

import numpy as np

from offscope.evalmode import stats

ALPHA = 0.05
MARGIN = 0.05
BASE_RATES = (0.1, 0.3)
DESIGNS = ((21, 3), (10, 20), (63, 1))  # (cases, reps per case)
ICC = 0.3


def _case_rates(
    rng: np.random.Generator, p: float, icc: float, shape: tuple[int, int]
) -> np.ndarray:
    if icc == 0:
        return np.full(shape, p)
    s = 1 / icc - 1
    return rng.beta(p * s, (1 - p) * s, size=shape)


def _shift(rates: np.ndarray, how: str, rng: np.random.Generator) -> np.ndarray:
    """Candidate case rates: baseline + MARGIN on average over cases."""
    if how == "none":
        return rates
    if how == "even":
        return np.minimum(rates + MARGIN, 1.0)
    # concentrated: a quarter of the cases (chosen per draw) take 4 x MARGIN
    draws, cases = rates.shape
    k = max(1, round(cases / 4))
    hit = np.argsort(rng.random((draws, cases)), axis=1) < k
    return np.minimum(rates + hit * MARGIN * cases / k, 1.0)


def scenario(
    p: float, cases: int, reps: int, icc: float, change: str, pairs: str, draws: int, state: int
) -> dict[str, Any]:
    rng = np.random.default_rng(state)
    rate_b = _case_rates(rng, p, icc, (draws, cases))
    rate_c = _shift(rate_b, change, rng)
    kb, nb, kc, nc, table = stats.simulate_pairs(
        rng, rate_b, rate_c, reps, shared=pairs == "shared"
    )
    clustered = cases >= 2 and reps > 1
    passed, regression = stats.gate_decisions(kb, nb, kc, nc, table, MARGIN, ALPHA, clustered)
    true_diff = float((rate_c - rate_b).mean())
    return {
        "base_rate": p,
        "cases": cases,
        "reps": reps,
        "icc": icc,
        "change": change,
        "pairs": pairs,
        "true_difference": round(true_diff, 4),
        "p_pass": float(passed.mean()),
        "p_regression": float(regression.mean()),
        "p_inconclusive": float((~passed & ~regression).mean()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draws", type=int, default=10000, help="simulated comparisons per scenario")
    ap.add_argument(
        "--random-state", type=int, default=1, help="random state of the first scenario"
    )
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    mc_margin = 3 * math.sqrt(ALPHA * (1 - ALPHA) / args.draws)
    rows: list[dict[str, Any]] = []
    state = args.random_state
    for p in BASE_RATES:
        for cases, reps in DESIGNS:
            for icc in (0.0, ICC) if reps > 1 else (0.0,):
                for change in ("none", "even", "concentrated") if icc else ("none", "even"):
                    for pairs in ("independent", "shared"):
                        rows.append(scenario(p, cases, reps, icc, change, pairs, args.draws, state))
                        state += 1
    no_change = [r for r in rows if r["change"] == "none"]
    at_margin = [r for r in rows if r["change"] != "none"]
    worst_alarm = max(r["p_regression"] for r in no_change)
    worst_pass = max(r["p_pass"] for r in at_margin)
    out = {
        "alpha": ALPHA,
        "margin": MARGIN,
        "draws": args.draws,
        "random_state": args.random_state,
        "mc_margin": round(mc_margin, 4),
        "limit": round(ALPHA + mc_margin, 4),
        "false_alarm_rate_max": worst_alarm,
        "p_pass_at_margin_max": worst_pass,
        "ok": worst_alarm <= ALPHA + mc_margin and worst_pass <= ALPHA + mc_margin,
        "scenarios": rows,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(out, indent=2))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
