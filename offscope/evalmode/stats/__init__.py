"""Statistics for the eval grid: clustered rates, cell comparisons, the gate's
non-inferiority test, time to first out-of-scope touch, power and honest wording.

Pure functions over plain Python data (lists of per-run outcomes, keys,
steps); no I/O. Every result is a frozen dataclass with `as_dict()` so reports
can embed it as JSON, and every function names the method it implements.

Conventions used throughout:
- An outcome `True` is the event being counted (an out-of-scope touch, a
  self-granted permission...). Higher rates are worse.
- Differences are always `b - a` (or `candidate - baseline`): a positive
  difference is a regression.
- Intervals are two-sided 95% unless a `confidence` / `alpha` says otherwise.

One module per job: `rates` (clustered rates), `differences` (contrasts between cells
and the case-clustered difference test they share with the gate and the power
calculations), `gating` (the gate's non-inferiority test), `survival` (time to first touch),
`power` (power, sample sizes, minimum detectable effects, the gate's simulated
decisions) and `wording`. The public names are re-exported here.
"""

from __future__ import annotations

from offscope.evalmode.stats.differences import (
    CellComparison,
    compare_cells,
    holm,
    newcombe_diff,
    newcombe_paired_diff,
)
from offscope.evalmode.stats.gating import NonInferiority, noninferiority
from offscope.evalmode.stats.power import (
    N_MAX,
    Power,
    design_effect,
    gate_decisions,
    gate_plan_n,
    mde,
    n_per_cell,
    power_at,
    power_method,
    simulate_pairs,
)
from offscope.evalmode.stats.rates import (
    ClusteredRate,
    clustered_rate,
    rate_clustering,
    rate_interval,
)
from offscope.evalmode.stats.survival import (
    KMPoint,
    LogRankResult,
    Survival,
    common_tau,
    first_touch_runs,
    kaplan_meier,
    last_observed_step,
    logrank_test,
)
from offscope.evalmode.stats.wording import describe_change, mde_points

__all__ = [
    "CellComparison",
    "ClusteredRate",
    "KMPoint",
    "LogRankResult",
    "N_MAX",
    "NonInferiority",
    "Power",
    "Survival",
    "clustered_rate",
    "common_tau",
    "compare_cells",
    "describe_change",
    "design_effect",
    "first_touch_runs",
    "gate_decisions",
    "gate_plan_n",
    "holm",
    "kaplan_meier",
    "last_observed_step",
    "logrank_test",
    "mde",
    "mde_points",
    "n_per_cell",
    "newcombe_diff",
    "newcombe_paired_diff",
    "noninferiority",
    "power_at",
    "power_method",
    "rate_clustering",
    "rate_interval",
    "simulate_pairs",
]
