"""The gate's analysis: a candidate grid result against a baseline, cell by
cell and key rate by key rate (non-inferiority, Holm-adjusted regressions),
and the candidate's residuals against the budgets. The method is described
in the package docstring (`offscope.rollout.gate`)."""

from __future__ import annotations

import fnmatch
from dataclasses import replace
from typing import Any

from offscope.errors import InputError
from offscope.evalmode import stats
from offscope.evalmode.report.results_model import Results, RunRow
from offscope.rollout.gate.budgets import BudgetFile
from offscope.rollout.gate.changes import config_changes
from offscope.rollout.gate.report import KEY_METRICS, BudgetCheck, GateReport, RateCheck
from offscope.trace.rates import pct

DEFAULT_MARGIN = 0.05
DEFAULT_ALPHA = 0.05
DEFAULT_TOUCH_STEP = 5


def outcome(row: RunRow, metric: str, touch_step: int) -> bool:
    return row.outcome(metric, touch_step)


def _interval(values: list[bool], cases: list[Any]) -> tuple[float, float]:
    """The rate's interval from the function the grid report uses, so one rate has one interval."""
    lo, hi = stats.rate_interval(values, cases).interval
    return float(lo), float(hi)


def _rmst(rb: list[RunRow], rc: list[RunRow]) -> tuple[float | None, float | None, int | None]:
    """RMST of both sides up to one common horizon: the last step observed on
    both sides (an RMST is only comparable at the same tau)."""
    kb, kc = stats.first_touch_runs(rb), stats.first_touch_runs(rc)
    if not kb or not kc:
        return None, None, None
    tau = stats.common_tau(kb, kc)
    return stats.kaplan_meier(kb, tau=tau).rmst, stats.kaplan_meier(kc, tau=tau).rmst, tau


def check_margin(margin: float) -> None:
    """--margin of gate and shadow-compare: an absolute difference of two rates."""
    if not 0 < margin < 1:
        raise InputError(
            f"--margin {margin} must be in (0, 1)", hint="an absolute rate difference, e.g. 0.05"
        )


def compare(
    baseline: Results,
    candidate: Results,
    *,
    margin: float = DEFAULT_MARGIN,
    alpha: float = DEFAULT_ALPHA,
    touch_step: int = DEFAULT_TOUCH_STEP,
    budgets: BudgetFile | None = None,
    allow_underpowered: bool = False,
) -> GateReport:
    check_margin(margin)
    if not 0 < alpha < 0.5:
        raise InputError(f"--alpha {alpha} must be in (0, 0.5)", hint="one-sided, e.g. 0.05")
    if touch_step < 1:
        raise InputError("--touch-step must be at least 1")
    bc, cc = baseline.configuration, candidate.configuration
    bh, ch = bc.case_set_hash, cc.case_set_hash
    if bh != ch:
        only_b = sorted(set(bc.cases) - set(cc.cases))
        only_c = sorted(set(cc.cases) - set(bc.cases))
        detail = []
        if only_b:
            detail.append(f"only in baseline: {', '.join(only_b[:5])}")
        if only_c:
            detail.append(f"only in candidate: {', '.join(only_c[:5])}")
        if not detail:
            detail.append("same case ids, different case contents")
        raise InputError(
            f"the two results ran different case sets (case_set_hash {bh} vs {ch}; "
            f"{'; '.join(detail)})",
            path=candidate.source,
            hint="gate on the same cases: re-run the baseline with the candidate's --cases",
        )

    b_cells, c_cells = baseline.runs_by_cell(), candidate.runs_by_cell()
    order = [c for c in (cc.cells or sorted(c_cells)) if c in c_cells]
    common = [c for c in order if c in b_cells]
    not_compared = sorted((set(b_cells) | set(c_cells)) - set(common))
    if not common:
        raise InputError(
            "no cell is present in both results",
            path=candidate.source,
            hint=f"baseline cells: {', '.join(sorted(b_cells)) or 'none'}; "
            f"candidate cells: {', '.join(sorted(c_cells)) or 'none'}",
        )

    checks: list[RateCheck] = []
    rmst: dict[str, tuple[float | None, float | None]] = {}
    rmst_tau: dict[str, int | None] = {}
    for cell in common:
        rb, rc = b_cells[cell], c_cells[cell]
        kb = [(r.case, str(r.seed)) for r in rb]
        kc = [(r.case, str(r.seed)) for r in rc]
        case_b, case_c = [r.case for r in rb], [r.case for r in rc]
        for metric in KEY_METRICS:
            vb = [outcome(r, metric, touch_step) for r in rb]
            vc = [outcome(r, metric, touch_step) for r in rc]
            ni = stats.noninferiority(
                vb, vc, margin, alpha, kb, kc, baseline_clusters=case_b, candidate_clusters=case_c
            )
            checks.append(
                RateCheck(
                    cell,
                    metric,
                    ni.baseline,
                    ni.candidate,
                    ni.difference,
                    ni.upper,
                    ni.verdict,
                    ni.needed_n,
                    ni.paired,
                    ni.method,
                    ni.notes,
                    ni.lower,
                    ni.pvalue_regression,
                    ni.pvalue_regression,
                    ni.clustered,
                    _interval(vb, case_b),
                    _interval(vc, case_c),
                )
            )
        b_rmst, c_rmst, tau = _rmst(rb, rc)
        rmst[cell], rmst_tau[cell] = (b_rmst, c_rmst), tau
    checks = _holm_regressions(checks, alpha, margin)

    budget_checks: list[BudgetCheck] = []
    notes: list[str] = []
    for b in budgets.budgets if budgets else []:
        matched = [c for c in order if fnmatch.fnmatchcase(c, b.cells)]
        if not matched:
            notes.append(f"budget {b.metric} on cells {b.cells!r} matches no cell of the candidate")
        for cell in matched:
            rows = c_cells[cell]
            r = stats.rate_interval(
                [outcome(x, b.metric, touch_step) for x in rows], [x.case for x in rows]
            )
            lo, hi = r.interval
            value = r.value or 0.0
            ok = (hi if b.basis == "upper" else value) <= b.max_rate + 1e-12
            note = b.note
            if ok and b.basis == "point" and hi > b.max_rate:
                note = (note + "; " if note else "") + (
                    f"within budget at the point estimate, but the upper bound {pct(hi)} is not: "
                    "not yet demonstrated at this n"
                )
            budget_checks.append(
                BudgetCheck(b.metric, b.cells, cell, r, b.max_rate, b.basis, ok, note)
            )

    if any(not c.paired for c in checks):
        notes.append(
            "some comparisons are unpaired: the two results did not run the same (case, seed) pairs "
            "(different --reps or --seed); unpaired intervals are wider"
        )
    return GateReport(
        baseline_path=baseline.source or "baseline",
        candidate_path=candidate.source or "candidate",
        margin=margin,
        alpha=alpha,
        touch_step=touch_step,
        allow_underpowered=allow_underpowered,
        simulated=baseline.simulated or candidate.simulated,
        changes=config_changes(bc, cc),
        checks=checks,
        budgets=budget_checks,
        rmst=rmst,
        rmst_tau=rmst_tau,
        not_compared=not_compared,
        notes=notes,
    )


def _holm_regressions(checks: list[RateCheck], alpha: float, margin: float) -> list[RateCheck]:
    """A regression is called only when its p-value survives Holm's (1979)
    adjustment across every check of this gate run (the family-wise false
    alarm rate stays at alpha); the others become inconclusive."""
    adjusted = stats.holm([c.p_regression for c in checks])
    out = []
    for c, p in zip(checks, adjusted, strict=True):
        verdict = c.verdict
        notes = c.notes
        if verdict == "regression" and p >= alpha:
            verdict = "inconclusive"
            notes = (
                *notes,
                f"worse at p = {c.p_regression:.3g}, but not after the Holm adjustment across "
                f"{len(checks)} checks (p = {p:.3g}); cannot rule out a regression of "
                f"{margin * 100:g} points",
            )
        out.append(replace(c, verdict=verdict, notes=notes, p_holm=p))
    return out
