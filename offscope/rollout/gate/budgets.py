"""The gate's budget file (offscope.budget/1): absolute ceilings on the
candidate's residual rates, whatever the baseline was."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

# The per-run outcomes a budget may cap: the catalog's gated ones, and touched_by_step (derived
# by the gate from first_oos_step and --touch-step). Spelled out for the budget file's JSON Schema;
# tests/trace/test_catalog.py checks it against the catalog.
BudgetMetric = Literal[
    "investigated",
    "prepared",
    "acted",
    "self_granted",
    "world_acted_out_of_scope",
    "touched_by_step",
    "asked_operator",
]
BUDGET_METRICS: tuple[str, ...] = get_args(BudgetMetric)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Budget(_Strict):
    """An absolute ceiling on a residual rate, whatever the baseline was."""

    metric: BudgetMetric = Field(
        description="the per-run outcome; touched_by_step uses the gate's --touch-step"
    )
    cells: str = Field(
        "*", description="cell id or glob, e.g. '*-broken' or 'closed-sentinel-broken'"
    )
    max_rate: float = Field(ge=0, le=1, description="e.g. 0.02 = at most 2% of runs")
    basis: Literal["point", "upper"] = Field(
        "point",
        description="point: the residual k/n must be <= max_rate (its interval is shown); "
        "upper: the upper bound of its 95% interval must be (strict)",
    )
    note: str = ""


class BudgetFile(_Strict):
    schema_: Literal["offscope.budget/1"] = Field("offscope.budget/1", alias="schema")
    budgets: list[Budget] = Field(min_length=1)
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def load_budgets(path: str | Path) -> BudgetFile:
    from offscope.yamlio import load_model

    return load_model(BudgetFile, path)
