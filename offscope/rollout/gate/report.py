"""The gate's typed report: one `RateCheck` a (cell, key rate), one
`BudgetCheck` a (budget, cell), and the `GateReport` that holds them, says
whether the gate passed and gives its JSON (offscope.gate/1)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from offscope.rollout.gate.changes import Change
from offscope.trace.rates import Rate

# The gate's own wording of its key metrics (its PR comments and their tests use it).
KEY_METRICS: dict[str, str] = {
    "investigated": "any out-of-scope touch",
    "acted": "acted out of scope",
    "self_granted": "self-granted permission",
    "touched_by_step": "first touch by step {k}",
}

GateVerdict = Literal["pass", "regression", "inconclusive"]


@dataclass(frozen=True)
class RateCheck:
    cell: str
    metric: str
    baseline: Rate
    candidate: Rate
    difference: float
    upper: float
    verdict: GateVerdict
    needed_n: int | None
    paired: bool
    method: str
    notes: tuple[str, ...] = ()
    lower: float = 0.0
    p_regression: float = 1.0
    p_holm: float = 1.0
    clustered: bool = False
    # each side's rate interval, the one `offscope report` prints for it (stats.rate_interval)
    baseline_interval: tuple[float, float] | None = None
    candidate_interval: tuple[float, float] | None = None


@dataclass(frozen=True)
class BudgetCheck:
    metric: str
    pattern: str
    cell: str
    rate: Rate
    max_rate: float
    basis: str
    ok: bool
    note: str = ""


@dataclass
class GateReport:
    baseline_path: str
    candidate_path: str
    margin: float
    alpha: float
    touch_step: int
    allow_underpowered: bool
    simulated: bool
    changes: list[Change]
    checks: list[RateCheck]
    budgets: list[BudgetCheck]
    rmst: dict[str, tuple[float | None, float | None]]
    rmst_tau: dict[str, int | None] = field(default_factory=dict)
    not_compared: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[RateCheck]:
        return [c for c in self.checks if c.verdict == "regression"]

    @property
    def underpowered(self) -> list[RateCheck]:
        return [c for c in self.checks if c.verdict == "inconclusive"]

    @property
    def over_budget(self) -> list[BudgetCheck]:
        return [b for b in self.budgets if not b.ok]

    @property
    def passed(self) -> bool:
        if self.failed or self.over_budget:
            return False
        return not self.underpowered or self.allow_underpowered

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    @property
    def needed_n(self) -> int | None:
        """Runs per cell for every inconclusive check to pass (None: more
        reps of these cases are not enough for at least one of them)."""
        needs = [c.needed_n for c in self.underpowered]
        return None if not needs or None in needs else max(n for n in needs if n is not None)

    def as_dict(self) -> dict[str, Any]:
        def rate(r: Rate) -> dict[str, Any]:
            return r.as_dict()

        return {
            "schema": "offscope.gate/1",
            "passed": self.passed,
            "exit_code": self.exit_code,
            "baseline": self.baseline_path,
            "candidate": self.candidate_path,
            "margin": self.margin,
            "alpha": self.alpha,
            "touch_step": self.touch_step,
            "allow_underpowered": self.allow_underpowered,
            "simulated": self.simulated,
            "changes": [c.as_dict() for c in self.changes],
            "checks": [
                {
                    "cell": c.cell,
                    "metric": c.metric,
                    "baseline": rate(c.baseline),
                    "candidate": rate(c.candidate),
                    "baseline_interval": c.baseline_interval,
                    "candidate_interval": c.candidate_interval,
                    "difference": c.difference,
                    "upper": c.upper,
                    "lower": c.lower,
                    "p_regression": c.p_regression,
                    "p_holm": c.p_holm,
                    "verdict": c.verdict,
                    "needed_n": c.needed_n,
                    "paired": c.paired,
                    "clustered": c.clustered,
                    "method": c.method,
                    "notes": list(c.notes),
                }
                for c in self.checks
            ],
            "budgets": [
                {
                    "metric": b.metric,
                    "cells": b.pattern,
                    "cell": b.cell,
                    "rate": rate(b.rate),
                    "max_rate": b.max_rate,
                    "basis": b.basis,
                    "ok": b.ok,
                    "note": b.note,
                }
                for b in self.budgets
            ],
            "rmst": {k: list(v) for k, v in self.rmst.items()},
            "rmst_tau": self.rmst_tau,
            "not_compared": self.not_compared,
            "notes": self.notes,
        }
