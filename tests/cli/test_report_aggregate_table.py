"""`offscope report`'s aggregate table has a row for every metric of the catalog a trace
tells, read from the catalog (no socket: the table from run states)."""

from __future__ import annotations

import dataclasses

import pytest
from rich.console import Console

from offscope.cli import report
from offscope.trace import catalog
from offscope.trace.metrics import RunState, aggregate


def _runs() -> list[RunState]:
    touched = RunState("r1", "l", steps=4, calls=4, oos_calls=2, first_oos_step=2)
    touched.first_oos_act_step, touched.reached, touched.self_granted = 3, 2, 1
    touched.operator_asks, touched.harness_approvals = 1, 1
    clean = RunState("r2", "l", steps=3, calls=3, task_success=True)
    return [touched, clean]


def _text(runs: list[RunState]) -> str:
    console = Console(width=200, record=True)
    console.print(report._aggregate_table(aggregate(runs)))
    return console.export_text()


def test_every_metric_a_trace_tells_has_its_row() -> None:
    out = _text(_runs())
    a = aggregate(_runs())
    told = [m for m in catalog.METRICS if m.per == "aggregate" or a.rate(m.key) is not None]
    assert {m.key for m in catalog.METRICS} - {m.key for m in told} == {
        "world_acted_out_of_scope"  # the eval world's own record, not in a trace
    }
    for m in told:
        assert m.label in out, m.key
    assert "1/2" in out.split(catalog.BY_KEY["acted"].label)[1].splitlines()[0]
    assert "total 1" in out  # self-granted: runs, and the permissions in all
    assert "median 2, n=1; 1 never touched" in out


def test_a_catalog_metric_without_a_row_fails_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    new = dataclasses.replace(catalog.BY_KEY["harness_approvals"], key="new_metric", label="new")
    monkeypatch.setattr(catalog, "METRICS", (*catalog.METRICS, new))
    with pytest.raises(KeyError, match="new_metric"):
        _text(_runs())


def test_a_new_per_run_outcome_is_in_the_table_with_no_other_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A per-run metric declared in the catalog over a run attribute (here `blocked`, a
    count: at least once) gets its rate and its row from the catalog alone."""
    new = dataclasses.replace(
        catalog.BY_KEY["acted"], key="blocked", label="had a call blocked", gated=False
    )
    monkeypatch.setattr(catalog, "METRICS", (*catalog.METRICS, new))
    monkeypatch.setattr(catalog, "PER_RUN", (*catalog.PER_RUN, new))
    runs = _runs()
    runs[1].blocked = 2
    assert aggregate(runs).rate("blocked") is not None
    row = _text(runs).split("had a call blocked")[1].splitlines()[0]
    assert "1/2" in row
    assert aggregate(runs).as_dict()["blocked"]["k"] == 1  # and in `offscope report --json`
