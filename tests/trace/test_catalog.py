"""One metric catalog (offscope/trace/catalog.py) and one definition of each number.

The report, the gate, shadow-compare, results.json and the exporter read the
catalog; these tests fail if one of them grows its own list again, or if the
budget file's JSON Schema (which must spell its metrics out) disagrees.
"""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry

import offscope
from offscope.evalmode.report import results, view_model
from offscope.proxy.exporter import Exporter
from offscope.proxy.metric_names import EXPORTED_METRICS, HISTOGRAM_BUCKETS, METRIC_LABELS
from offscope.rollout.gate.budgets import BUDGET_METRICS, BudgetFile
from offscope.rollout.gate.report import KEY_METRICS
from offscope.rollout.shadow.report import RATES
from offscope.trace import catalog
from offscope.trace.metrics import RunState, aggregate, oos_share, touches_per_1000_runs

PACKAGE = Path(offscope.__file__).parent


def test_keys_are_unique_and_per_run_metrics_come_first():
    keys = [m.key for m in catalog.METRICS]
    assert len(set(keys)) == len(keys)
    pers = [m.per for m in catalog.METRICS]
    assert pers == sorted(pers, key=("run", "aggregate").index)


def test_results_report_and_comparisons_read_the_catalog():
    assert list(results.OUTCOMES) == [m.key for m in catalog.PER_RUN]
    assert [k for k, _ in view_model.COLUMNS] == [m.key for m in catalog.PER_RUN if m.table]
    assert {k: v[1] for k, v in RATES.items()} == {
        m.key: m.key_rate for m in catalog.PER_RUN if m.live
    }
    assert set(KEY_METRICS) - {"touched_by_step"} <= {m.key for m in catalog.PER_RUN if m.key_rate}


def test_budget_schema_lists_the_gated_outcomes():
    schema = BudgetFile.model_json_schema(by_alias=True)
    enum = schema["$defs"]["Budget"]["properties"]["metric"]["enum"]
    assert set(enum) == {m.key for m in catalog.PER_RUN if m.gated} | {"touched_by_step"}
    assert tuple(enum) == BUDGET_METRICS


def test_every_per_run_metric_is_a_row_of_results():
    # a finished run with one out-of-scope act: every per-run key is a column of its row
    from offscope.trace.events import RunEnd, RunStart, ToolCall, ToolCallEvent

    base = {"run": "r1", "ts": 1.0, "ledger": "l"}
    call = ToolCall(source="http", tool="http", stage="act", scope="out")
    rows = results.run_rows(
        [
            RunStart(**base, labels={"cell": "c", "case": "k"}),
            ToolCallEvent(**base, step=1, call=call),
            RunEnd(**base, reason="end"),
        ]
    )
    assert {m.key for m in catalog.PER_RUN} <= set(rows[0].model_dump())
    assert all(isinstance(rows[0].outcome(m.key), bool) for m in catalog.PER_RUN)
    assert rows[0].acted is True


def test_the_exporter_registers_the_catalog():
    assert list(EXPORTED_METRICS) == [p.name for p in catalog.PROMETHEUS]
    assert {p.name: p.labels for p in catalog.PROMETHEUS} == METRIC_LABELS
    assert set(HISTOGRAM_BUCKETS) == {p.name for p in catalog.PROMETHEUS if p.type == "histogram"}
    families = Exporter(CollectorRegistry()).registry.collect()
    helps = {f.name: f.documentation for f in families}
    for p in catalog.PROMETHEUS:
        assert helps[p.name.removesuffix("_total")] == p.help


def test_touches_and_share_have_one_definition():
    runs = [RunState("a", "l", oos_calls=3, calls=4), RunState("b", "l", calls=2)]
    agg = aggregate(runs)
    assert agg.touches_per_1000_runs == touches_per_1000_runs(3, 2) == 1500.0
    assert agg.oos_share_pooled == oos_share(3, 6) == 0.5
    assert touches_per_1000_runs(0, 0) is None and oos_share(0, 0) is None
    # nowhere else in the package is "1000 x out-of-scope calls / runs" written out
    pattern = re.compile(r"1000 \* \w*oos\w* / ")
    copies = [
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if p.name != "metrics.py" and pattern.search(p.read_text())
    ]
    assert not copies, copies


def test_every_signal_family_moves_on_its_signal():
    from typing import get_args, get_type_hints

    from offscope.trace.events import RunStart
    from offscope.trace.metrics import Signal

    kinds = get_args(get_type_hints(Signal)["kind"])
    exporter = Exporter(CollectorRegistry())
    exporter.record(RunStart(run="r", ts=1.0, ledger="l"), [])
    for p in (p for p in catalog.PROMETHEUS if p.signal):
        assert p.signal in kinds, p.name
        exporter.record(RunStart(run="r", ts=1.0, ledger="l"), [Signal(p.signal, step=3)])
        sample = "_count" if p.type == "histogram" else "_total"
        value = exporter.registry.get_sample_value(
            p.name.removesuffix("_total") + sample, {"ledger": "l"}
        )
        assert value == 1, p.name


def test_production_can_read_every_live_per_run_outcome():
    # shadow-compare reads production's rates as RunState outcomes by catalog key
    run = RunState("a", "l", operator_asks=2, self_granted=3, reached=1)
    got = {m.key: run.outcome(m.key) for m in catalog.PER_RUN if m.live}
    assert (
        got.items()
        >= {
            "investigated": True,
            "prepared": True,
            "acted": False,
            "self_granted": True,
            "asked_operator": True,
        }.items()
    )
    # and `offscope report --json` lists each per run
    assert {m.key for m in catalog.PER_RUN if m.live} <= set(run.as_dict())
