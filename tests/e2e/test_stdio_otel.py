"""`offscope mcp` with the standard OTEL_* variables: the wrapper's records go
through the same record sinks as the proxy's, so each tool call becomes a span
at a real OTLP/HTTP receiver on loopback (decoded with opentelemetry-proto)."""

from __future__ import annotations

import sys
import time

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra")
pytest.importorskip("opentelemetry.proto", reason="the otel extra")
from tests.support.otlp_receiver import OtlpReceiver  # noqa: E402 - after the importorskip
from tests.support.stdio_kit import SERVER, events, session, wrapper_args, write_ledger  # noqa: E402

pytestmark = pytest.mark.timeout(120)

LEDGER = """\
schema: offscope.ledger/1
id: stdio-otel
targets:
  paths: ["/srv/app/**"]
extract:
  - match: {source: mcp}
    targets: {path: "{args.path}"}
"""


async def test_tool_calls_become_spans(tmp_path, monkeypatch):
    receiver = OtlpReceiver()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "offscope-stdio")
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")
        ledger = write_ledger(tmp_path / "ledger.yaml", LEDGER)
        trace = tmp_path / "trace.jsonl"
        args = wrapper_args(
            ledger,
            trace,
            "--policy",
            "enforce",
            "--run",
            "otel-1",
            "--",
            sys.executable,
            str(SERVER),
            str(tmp_path / "received.jsonl"),
        )
        async with session(args) as s:
            await s.list_tools()
            await s.call_tool("read_file", {"path": "/srv/app/a"})
            blocked = await s.call_tool("delete_file", {"path": "/etc/x"})
        assert blocked.isError
        deadline = (
            time.monotonic() + 30
        )  # the wrapper flushes its spans as it exits; no duration asserted
        while (
            len([x for x in receiver.spans if x.name.startswith("tools/call")]) < 2
            and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        spans = {x.name: x for x in receiver.spans if x.name.startswith("tools/call")}
    finally:
        receiver.stop()
    assert set(spans) == {"tools/call read_file", "tools/call delete_file"}
    rows = {r["call"]["tool"]: r for r in events(trace, "tool_call")}
    for tool, span in ((t, spans[f"tools/call {t}"]) for t in rows):
        a = span.attributes
        assert (
            a["offscope.run"],
            a["offscope.decision"],
            a["offscope.scope"],
            a["offscope.stage"],
        ) == (
            "otel-1",
            rows[tool]["decision"],
            rows[tool]["call"]["scope"],
            rows[tool]["call"]["stage"],
        )
        assert (
            a["mcp.method.name"] == "tools/call"
            and span.resource["service.name"] == "offscope-stdio"
        )
    assert [e[0] for e in spans["tools/call delete_file"].events] == ["offscope.block"]
