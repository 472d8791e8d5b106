"""A flow whose handling raises is still recorded, and the record says whether
it went upstream (the addon in-process, with mitmproxy's own test harness)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mitmproxy.test import taddons, tflow

from offscope.proxy.mitm.addon import OffscopeAddon
from tests.support.sidecar_kit import LEDGER_YAML


def _boom(*args, **kwargs):
    raise RuntimeError("extractor exploded")


@pytest.mark.parametrize(("policy", "sent"), [("shadow", True), ("enforce", False)])
def test_a_failing_flow_is_recorded_with_what_happened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str, sent: bool
) -> None:
    ledger = tmp_path / "ledger.yaml"
    ledger.write_text(LEDGER_YAML, encoding="utf-8")
    trace = tmp_path / "trace.jsonl"
    addon = OffscopeAddon()
    with taddons.context(addon) as tctx:
        tctx.configure(
            addon, offscope_ledger=str(ledger), offscope_policy=policy, offscope_trace=str(trace)
        )
        assert addon.engine is not None
        monkeypatch.setattr(addon.engine, "_classify", _boom)
        flow = tflow.tflow()
        flow.request.host, flow.request.port, flow.request.path = (
            "crm.acme.test",
            80,
            "/customers/9999",
        )
        flow.request.headers["host"] = "crm.acme.test"
        flow.request.headers["x-offscope-run"] = "r1"
        addon.request(flow)
        addon.engine.close()
    assert (flow.response is None) is sent  # open: forwarded; closed: offscope answered 503
    if not sent:
        assert flow.response is not None and flow.response.status_code == 503
    (event,) = [
        e for e in map(json.loads, trace.read_text().splitlines()) if e["type"] == "tool_call"
    ]
    assert event["run"] == "r1" and event["call"]["targets"][0]["value"] == "crm.acme.test"
    note = " ".join(event["call"]["notes"])
    assert "extractor exploded" in note
    assert ("forwarded unchecked" in note) is sent and (event["decision"] == "block") is (not sent)
