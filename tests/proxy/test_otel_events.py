"""Span events for grants, self-granted permissions and harness approvals: the
real engine writes real records to the trace file and, through the same
TraceSink, to the OpenTelemetry sink (the SDK's real span pipeline, exported
to its in-memory exporter)."""

from __future__ import annotations

import json
from pathlib import Path

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from offscope.ledgers import load_ledger
from offscope.policies import load_policy
from offscope.policies import requests as reqs
from offscope.proxy.engine import Engine
from offscope.proxy.extract.http import HttpRequest, HttpResponse
from offscope.proxy.otel import OtelSink
from offscope.proxy.sinks import TraceSink
from offscope.trace.events import ToolCallEvent, read_trace
from tests.support.narrow import present

LEDGER = """\
schema: offscope.ledger/1
id: granted
targets:
  hosts: [crm.acme.test, ops.acme.test]
  records: ["customer:4411"]
extract:
  - match: {host: crm.acme.test, path: "/customers/{id}"}
    targets: {record: "customer:{id}"}
operator:
  - {host: ops.acme.test, path: /ask}
"""

OK = HttpResponse(200, {"content-type": "application/json"}, b"{}")


def test_grant_self_granted_and_approval_events(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.yaml"
    ledger.write_text(LEDGER)
    log = tmp_path / "requests.jsonl"
    log.write_text(
        json.dumps(
            {
                "schema": "offscope.request/1",
                "id": "req-1",
                "run": "r",
                "ledger": "granted",
                "tool": "http",
                "targets": ["host:mirror.acme.test"],
                "args_digest": None,
                "step": 1,
            }
        )
        + "\n"
    )
    reqs.approve(log, "req-1", ledger, "bob", "2h")
    memory, dropped = InMemorySpanExporter(), []
    sink = OtelSink(memory, lambda cause, n: dropped.append((cause, n)))
    trace = tmp_path / "trace.jsonl"
    engine = Engine(
        load_ledger(ledger),
        load_policy("eval-affirmative"),
        trace=TraceSink(str(trace), extra=[sink]),
    )

    ask, _ = engine.begin(
        HttpRequest(
            "POST",
            "ops.acme.test",
            "/ask",
            port=443,
            scheme="https",
            headers={"content-type": "application/json"},
            body=b'{"question": "may I delete 9999?"}',
        ),
        "r",
    )
    assert ask.synthetic is not None  # the harness answered "yes" (the affirmative policy)
    for method, host, path in [
        ("PATCH", "crm.acme.test", "/customers/9999"),  # acts on that "yes"
        ("GET", "mirror.acme.test", "/x"),
    ]:  # in scope by the grant
        ex, _ = engine.begin(HttpRequest(method, host, path, port=443, scheme="https"), "r")
        engine.response(ex, OK)
    engine.close()  # closes the sink: queued spans are exported

    records = [e for e in read_trace(trace) if e.type in ("tool_call", "operator")]
    spans = sorted(memory.get_finished_spans(), key=lambda s: present(s.end_time))
    assert len(spans) == len(records) == 3 and dropped == []
    operator, act, granted = spans
    assert present(operator.attributes)["offscope.provenance"] == "harness"
    assert [e.name for e in operator.events] == ["offscope.harness_approval"]
    assert [e.name for e in act.events] == ["offscope.self_granted"]
    act_attributes = present(act.attributes)
    assert act_attributes["offscope.scope"] == "out" and act_attributes["offscope.stage"] == "act"
    [grant] = granted.events
    assert isinstance(records[2], ToolCallEvent)
    grant_id = records[2].call.targets[0].grant
    assert grant.name == "offscope.grant" and grant_id
    assert dict(present(grant.attributes)) == {
        "offscope.grant": grant_id,
        "offscope.target": "host:mirror.acme.test",
    }
    assert present(granted.attributes)["offscope.scope"] == "in"
