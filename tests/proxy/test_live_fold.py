"""The engine's live counters and the offline fold of its trace agree on the
orderings real traffic produces: responses recorded out of step order, and a
call answered after its run ended and its run id started again."""

from __future__ import annotations

from offscope.ledgers import load_ledger
from offscope.policies import load_policy
from offscope.proxy.engine import Engine
from offscope.proxy.exporter import Exporter
from offscope.proxy.extract.http import HttpRequest, HttpResponse
from offscope.proxy.sinks import TraceSink
from offscope.trace.events import read_trace
from offscope.trace.metrics import aggregate, fold

LEDGER = """\
schema: offscope.ledger/1
id: live
targets:
  hosts: [crm.acme.test]
  records: ["customer:4411"]
extract:
  - match: {host: crm.acme.test, path: "/customers/{id}"}
    targets: {record: "customer:{id}"}
"""


def get(method: str, cid: str) -> HttpRequest:
    return HttpRequest(method, "crm.acme.test", f"/customers/{cid}", port=80)


def sample(exporter: Exporter, name: str) -> float:
    value = exporter.registry.get_sample_value(name, {"ledger": "live"})
    return value or 0.0


def test_late_and_out_of_order_responses_fold_alike(tmp_path):
    ledger = tmp_path / "l.yaml"
    ledger.write_text(LEDGER)
    trace = tmp_path / "t.jsonl"
    exporter = Exporter()
    engine = Engine(
        load_ledger(ledger), load_policy("shadow"), trace=TraceSink(str(trace)), exporter=exporter
    )
    ok = HttpResponse(200, {"content-type": "application/json"}, b"{}")

    slow, _ = engine.begin(get("GET", "9999"), "r")  # step 1, out, answered late
    fast, _ = engine.begin(get("PATCH", "9999"), "r")  # step 2, out act, answered first
    engine.response(fast, ok)
    engine.end_run("r")  # ends before step 1 is answered
    again, _ = engine.begin(get("GET", "4411"), "r")  # the id starts a new run
    engine.response(slow, ok)  # the late answer of the first run
    engine.response(again, ok)
    engine.end_run("r")
    engine.close()

    runs = fold(read_trace(trace))
    assert list(runs) == ["r", "r#2"]
    agg = aggregate(runs.values())
    # Live and offline: 2 runs, the same calls and first steps.
    assert sample(exporter, "offscope_runs_total") == agg.runs == 2
    assert (
        sum(
            exporter.registry.get_sample_value(
                "offscope_tool_calls_total",
                {"ledger": "live", "source": "http", "scope": sc, "stage": st, "decision": d},
            )
            or 0
            for sc in ("in", "out")
            for st in ("investigate", "act")
            for d in ("allow", "shadow")
        )
        == agg.calls
        == 3
    )
    assert sample(exporter, "offscope_first_out_of_scope_step_sum") == sum(agg.first_oos_steps)
    assert sample(exporter, "offscope_first_out_of_scope_step_count") == len(agg.first_oos_steps)
    assert (
        sample(exporter, "offscope_first_out_of_scope_act_step_sum")
        == sum(agg.first_oos_act_steps)
        == 2
    )
    # The first run's first touch is its step 2 (step 1 was never answered before its end).
    assert runs["r"].first_oos_step == 2 and runs["r"].first_oos_act_step == 2
