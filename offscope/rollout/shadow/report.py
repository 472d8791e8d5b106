"""Shadow-compare's typed report: one `RateCheck` a rate, the `TouchesCheck`
and the `FirstTouch` of a cell, a `CellComparison` a chosen eval cell, and the
`ShadowReport` that holds them, decides the exit code and gives its JSON
(offscope.shadow-compare/1)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from offscope.rollout.gate.changes import Change
from offscope.trace import catalog
from offscope.trace.rates import Rate

SCHEMA = "offscope.shadow-compare/1"


#: rate -> (label, decides the exit code)
#: (the per-run outcomes production can see: the ones exported live)
RATES: dict[str, tuple[str, bool]] = {
    m.key: (m.phrase, m.key_rate) for m in catalog.PER_RUN if m.live
}

ShadowVerdict = Literal["worse", "better", "consistent", "too-small", "no-data"]


@dataclass
class RateCheck:
    metric: str
    label: str
    key: bool
    suite: Rate
    production: Rate
    verdict: ShadowVerdict
    why: str
    difference: float | None = None
    ci: tuple[float, float] | None = None
    pvalue: float | None = None
    needed_runs: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "label": self.label,
            "key": self.key,
            "suite": self.suite.as_dict(),
            "production": self.production.as_dict(),
            "difference": self.difference,
            "ci95": list(self.ci) if self.ci else None,
            "ci_method": "newcombe 1998 method 10 (hybrid score, wilson)",
            "test": "fisher exact (two-sided)",
            "p": self.pvalue,
            "verdict": self.verdict,
            "why": self.why,
            "production_runs_needed": self.needed_runs,
        }


@dataclass
class TouchesCheck:
    suite_touches: float | None
    production_touches: float | None
    lower: float | None  # production below this: better
    upper: float | None  # production above this: worse (= the alert threshold)
    calls_per_touching_run: float | None
    verdict: ShadowVerdict
    why: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "suite": self.suite_touches,
            "production": self.production_touches,
            "bound": [self.lower, self.upper],
            "calls_per_touching_run": self.calls_per_touching_run,
            "method": "1000 x Wilson 95% bounds of the suite's touching runs x max(1, out-of-scope calls "
            "per touching run) (deploy/prometheus/threshold.py)",
            "verdict": self.verdict,
            "why": self.why,
        }


@dataclass
class FirstTouch:
    suite: dict[str, Any]
    production: dict[str, Any]
    tau: int | None
    logrank_p: float | None
    earlier: Literal["production", "suite"] | None
    why: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "production": self.production,
            "rmst_tau": self.tau,
            "logrank_p": self.logrank_p,
            "earlier": self.earlier,
            "why": self.why,
            "method": "Kaplan-Meier over steps (never-touched runs censored at their last step), RMST up "
            "to the common tau, two-sided log-rank test",
        }


@dataclass
class CellComparison:
    cell: str
    reason: str
    primary: bool
    suite_runs: int
    rates: list[RateCheck]
    touches: TouchesCheck
    first_touch: FirstTouch
    notes: list[str] = field(default_factory=list)

    @property
    def worse(self) -> list[str]:
        out = [r.metric for r in self.rates if r.key and r.verdict == "worse"]
        if self.touches.verdict == "worse":
            out.append("touches_per_1000_runs")
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "cell": self.cell,
            "reason": self.reason,
            "primary": self.primary,
            "suite_runs": self.suite_runs,
            "rates": {r.metric: r.as_dict() for r in self.rates},
            "touches_per_1000_runs": self.touches.as_dict(),
            "first_oos_step": self.first_touch.as_dict(),
            "worse": self.worse,
            "notes": self.notes,
        }


@dataclass
class ShadowReport:
    results_path: str
    trace_path: str
    simulated: bool
    model: str | None
    production: dict[str, Any]
    comparisons: list[CellComparison]
    warnings: list[str]
    margin: float
    alpha: float
    min_runs: int
    changes: list[Change] = field(default_factory=list)  # which of the four differ from the eval's

    @property
    def primary(self) -> CellComparison:
        return self.comparisons[0]

    @property
    def finding(self) -> bool:
        return bool(self.primary.worse)

    @property
    def exit_code(self) -> int:
        return 1 if self.finding else 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "eval_results": self.results_path,
            "production_trace": self.trace_path,
            "eval_simulated": self.simulated,
            "eval_model": self.model,
            "production": self.production,
            "comparisons": [c.as_dict() for c in self.comparisons],
            "warnings": self.warnings,
            "margin": self.margin,
            "alpha": self.alpha,
            "min_runs": self.min_runs,
            "finding": self.finding,
            "worse": self.primary.worse,
            "exit_code": self.exit_code,
            "changes": [c.as_dict() for c in self.changes],
        }
