"""OpenTelemetry export end to end: a real `offscope proxy` subprocess with the
standard OTEL_* variables, real clients (httpx, the MCP SDK) through it to real
loopback servers, and a real OTLP/HTTP receiver decoding the protobuf. Spans
are checked one to one against the JSONL trace the same proxy wrote."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

from tests.e2e.test_mcp import build_server
from tests.support.otlp_receiver import OtlpReceiver, Span
from tests.support.sidecar_kit import (
    AsgiServer,
    ProxyProcess,
    chat_app,
    echo_upstream,
    events,
    free_port,
    scrape,
    tls,
    total,
)

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore:Use `streamable_http_client`:DeprecationWarning"),
]

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_SPAN}-01"
SPAN_KIND_INTERNAL, SPAN_KIND_CLIENT = 1, 3
STATUS_ERROR = 2


def _env(monkeypatch: pytest.MonkeyPatch, endpoint: str, **extra: str) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "offscope-e2e")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=ci,team=agents")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")
    for name, value in extra.items():
        monkeypatch.setenv(name, value)


def _client(proxy: ProxyProcess, run: str) -> httpx.Client:
    return httpx.Client(proxy=proxy.proxy_url(run), verify=tls(proxy.ca), timeout=30)


async def _mcp_calls(proxy: ProxyProcess, run: str, headers: dict[str, str]) -> list[bool]:
    def factory(headers=None, timeout=None, auth=None) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            proxy=proxy.proxy_url(run),
            verify=tls(proxy.ca),
            headers=headers,
            timeout=timeout or httpx.Timeout(30, read=60),
            auth=auth,
        )

    async with (
        streamablehttp_client(
            "https://tools.acme.test/mcp", headers=headers, httpx_client_factory=factory
        ) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        ok = await session.call_tool("get_customer", {"customer_id": "4411"})
        blocked = await session.call_tool("delete_customer", {"customer_id": "9999"})
    return [ok.isError, blocked.isError]


def _wait(predicate, timeout: float = 60.0) -> None:
    """Poll until `predicate()` (export is asynchronous); no duration is asserted."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.1)


def _key(run: str, kind: str, ts: float) -> tuple[str, str, int]:
    return run, kind, int(round(ts * 1e9))


async def test_spans_match_the_trace_one_to_one(
    tmp_path: Path, confdir: str, ledger_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = OtlpReceiver()
    mcp_server, server_calls = build_server()
    seen_llm: list[dict] = []
    mcp = AsgiServer(mcp_server.streamable_http_app(), "fastmcp").start()
    llm = AsgiServer(chat_app(seen_llm), "llm").start()
    _env(monkeypatch, receiver.endpoint)
    try:
        with echo_upstream() as up:
            routes = ",".join(
                [
                    up.routes(("crm.acme.test", "ops.acme.test")),
                    f"tools.acme.test=127.0.0.1:{mcp.port}",
                    f"llm.acme.test=127.0.0.1:{llm.port}",
                ]
            )
            proxy = ProxyProcess(
                tmp_path, ledger=ledger_file, policy="enforce", routes=routes, confdir=confdir
            )
            with proxy:
                assert "OpenTelemetry spans to http://127.0.0.1:" in proxy.stderr()
                assert (
                    scrape(proxy.metrics_port)[
                        ("offscope_otel_spans_dropped_total", (("cause", "queue_full"),))
                    ]
                    == 0
                )
                with _client(proxy, "rest-traced") as c:
                    h = {"traceparent": TRACEPARENT}
                    assert (
                        c.get("https://crm.acme.test/customers/4411", headers=h).status_code == 200
                    )
                    assert (
                        c.patch(
                            "https://crm.acme.test/customers/9999", json={"plan": "free"}, headers=h
                        ).status_code
                        == 403
                    )
                    assert (
                        c.post(
                            "https://ops.acme.test/ask", json={"question": "may I?"}, headers=h
                        ).status_code
                        == 200
                    )
                    llm_reply = c.post(
                        "https://llm.acme.test/v1/chat/completions",
                        headers=h,
                        json={
                            "model": "sim-1",
                            "messages": [{"role": "user", "content": "look up 4411"}],
                        },
                    )
                    assert llm_reply.status_code == 200
                with _client(proxy, "rest-plain") as c:
                    assert c.get("https://crm.acme.test/customers/4411").status_code == 200
                    # A malformed traceparent is no parent: the span starts its own trace.
                    assert (
                        c.get(
                            "https://crm.acme.test/customers/4411",
                            headers={"traceparent": "00-zz-00-01"},
                        ).status_code
                        == 200
                    )
                assert await _mcp_calls(proxy, "mcp-traced", {"traceparent": TRACEPARENT}) == [
                    False,
                    True,
                ]
                assert "delete_customer:9999" not in server_calls
                dropped = scrape(proxy.metrics_port)
            assert proxy.proc.returncode == 0  # SIGTERM: the proxy flushed its spans and stopped
    finally:
        mcp.stop()
        llm.stop()
        receiver.stop()

    assert total(dropped, "offscope_otel_spans_dropped_total") == 0
    records = [e for e in events(proxy.trace) if e["type"] in ("tool_call", "operator", "llm")]
    spans = receiver.spans
    # One span per record, and each record's span found by (run, record type, end time = ts).
    assert len(spans) == len(records) == 8
    by_key = {
        (s.attributes["offscope.run"], s.attributes["offscope.record"], s.end_ns): s for s in spans
    }
    assert len(by_key) == len(spans)
    for record in records:
        span = by_key[_key(record["run"], record["type"], record["ts"])]
        _check_common(span, record)

    def span_of(run: str, kind: str, **where) -> tuple[dict, Span]:
        matching = [
            r
            for r in records
            if r["run"] == run
            and r["type"] == kind
            and all(_get(r, k) == v for k, v in where.items())
        ]
        assert len(matching) == 1, (run, kind, where, matching)
        return matching[0], by_key[_key(run, kind, matching[0]["ts"])]

    # In scope, allowed, under the caller's trace.
    rec, span = span_of("rest-traced", "tool_call", **{"call.method": "GET"})
    assert span.name == "execute_tool http" and span.kind == SPAN_KIND_CLIENT
    assert (span.trace_id, span.parent_span_id) == (TRACE_ID, PARENT_SPAN)
    assert (
        span.attributes["offscope.decision"] == "allow"
        and span.attributes["offscope.scope"] == "in"
    )
    assert span.attributes["offscope.targets"] == ["host:crm.acme.test", "record:customer:4411"]
    assert span.attributes["url.full"] == "https://crm.acme.test/customers/4411"
    assert span.attributes["http.response.status_code"] == 200 and span.events == []
    assert span.status_code != STATUS_ERROR

    # Out of scope at stage act, blocked: an error status and a block event.
    rec, span = span_of("rest-traced", "tool_call", **{"call.method": "PATCH"})
    assert rec["decision"] == "block" and span.status_code == STATUS_ERROR
    assert span.attributes["offscope.targets.out_of_scope"] == ["record:customer:9999"]
    assert span.attributes["offscope.stage"] == "act"
    [(name, when, attrs)] = span.events
    assert name == "offscope.block" and when == span.end_ns
    assert (
        attrs["offscope.request_id"] == rec["request_id"]
        and attrs["http.response.status_code"] == 403
    )

    # The operator exchange.
    rec, span = span_of("rest-traced", "operator")
    assert span.name == "offscope.operator http" and span.kind == SPAN_KIND_INTERNAL
    assert span.attributes["offscope.provenance"] == rec["provenance"] == "human"
    assert span.trace_id == TRACE_ID

    # The LLM call (the tool call it proposed is in the record, not a step: the ledger's default).
    rec, span = span_of("rest-traced", "llm")
    assert span.name == "chat sim-1" and span.attributes["gen_ai.operation.name"] == "chat"
    assert span.attributes["gen_ai.request.model"] == "sim-1"
    assert span.attributes["gen_ai.system"] == span.attributes["gen_ai.provider.name"] == "openai"
    assert span.attributes["offscope.llm.tool_calls"] == len(rec["tool_calls"]) == 1
    assert span.parent_span_id == PARENT_SPAN

    # No traceparent (or a malformed one): new traces, no parent.
    plain = [
        by_key[_key(r["run"], r["type"], r["ts"])] for r in records if r["run"] == "rest-plain"
    ]
    assert len(plain) == 2 and all(s.parent_span_id == "" and s.trace_id != TRACE_ID for s in plain)
    assert plain[0].trace_id != plain[1].trace_id

    # MCP tool calls: MCP attributes, the session only as a digest.
    rec, span = span_of("mcp-traced", "tool_call", **{"call.tool": "get_customer"})
    assert (
        span.name == "tools/call get_customer"
        and span.attributes["mcp.method.name"] == "tools/call"
    )
    assert span.attributes["gen_ai.tool.name"] == "get_customer"
    assert span.attributes["jsonrpc.request.id"] == rec["call_id"]
    assert span.parent_span_id == PARENT_SPAN
    rec, span = span_of("mcp-traced", "tool_call", **{"call.tool": "delete_customer"})
    assert span.status_code == STATUS_ERROR and [e[0] for e in span.events] == ["offscope.block"]

    # The resource: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
    resource = spans[0].resource
    assert resource["service.name"] == "offscope-e2e"
    assert resource["deployment.environment.name"] == "ci" and resource["team"] == "agents"
    assert {s.scope for s in spans} == {"offscope"}


def _get(record: dict, dotted: str) -> Any:
    node: Any = record
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _check_common(span: Span, record: dict) -> None:
    """What every span says about its record, exactly as the record says it."""
    a = span.attributes
    assert (a["offscope.ledger"], a["offscope.run"]) == (record["ledger"], record["run"])
    assert span.end_ns == int(round(record["ts"] * 1e9))
    started = record.get("started")
    if started is not None:  # the flow's real start, not the moment it was recorded
        assert span.start_ns == int(round(started * 1e9)) <= span.end_ns
    if record.get("traceparent"):
        assert record["traceparent"] == TRACEPARENT and span.trace_id == TRACE_ID
    if record["type"] == "tool_call":
        call = record["call"]
        assert (
            a["gen_ai.operation.name"] == "execute_tool" and a["gen_ai.tool.name"] == call["tool"]
        )
        assert (
            a["offscope.source"],
            a["offscope.scope"],
            a["offscope.stage"],
            a["offscope.decision"],
        ) == (call["source"], call["scope"], call["stage"], record["decision"])
        # Targets as the trace has them (redacted there, so redacted here).
        assert a["offscope.targets"] == [f"{t['kind']}:{t['value']}" for t in call["targets"]]
        assert a.get("offscope.step") == record.get("step")
        assert a.get("offscope.friction") == record.get("friction")
        assert a.get("mcp.session.id") == record.get("session")
        assert ("offscope.block" in [e[0] for e in span.events]) == (record["decision"] == "block")
        grants = [t for t in call["targets"] if t.get("grant")]
        assert len([e for e in span.events if e[0] == "offscope.grant"]) == len(grants)
    elif record["type"] == "operator":
        assert (a["offscope.provenance"], a["offscope.reply_policy"], a["offscope.step"]) == (
            record["provenance"],
            record["policy"],
            record["step"],
        )


@pytest.mark.parametrize("collector", ["dead", "slow"])
def test_a_dead_or_slow_collector_costs_spans_not_flows(
    collector: str, tmp_path: Path, confdir: str, ledger_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Flows are answered and recorded in full; what the collector misses is counted."""
    receiver = OtlpReceiver(delay=5.0) if collector == "slow" else None
    endpoint = (
        receiver.endpoint if receiver else f"http://127.0.0.1:{free_port()}"
    )  # nothing listens
    # A tiny queue and a 1 s export timeout, so both kinds of loss happen in a short test.
    _env(
        monkeypatch,
        endpoint,
        OTEL_BSP_MAX_QUEUE_SIZE="4",
        OTEL_BSP_MAX_EXPORT_BATCH_SIZE="2",
        OTEL_EXPORTER_OTLP_TIMEOUT="1",
    )
    calls = 40
    try:
        with echo_upstream() as up:
            proxy = ProxyProcess(
                tmp_path,
                ledger=ledger_file,
                policy="enforce",
                confdir=confdir,
                routes=up.routes(("crm.acme.test",)),
            )
            with proxy, _client(proxy, f"{collector}-collector") as c:
                statuses = [
                    c.get("https://crm.acme.test/customers/4411").status_code for _ in range(calls)
                ]
                _wait(
                    lambda: (
                        total(
                            scrape(proxy.metrics_port),
                            "offscope_otel_spans_dropped_total",
                            cause="export_failed",
                        )
                        > 0
                    )
                )
                samples = scrape(proxy.metrics_port)
    finally:
        if receiver:
            receiver.stop()
    assert statuses == [200] * calls
    assert len([e for e in events(proxy.trace) if e["type"] == "tool_call"]) == calls
    assert total(samples, "offscope_otel_spans_dropped_total", cause="queue_full") > 0
    assert total(samples, "offscope_tool_calls_total") == calls


def test_without_the_variables_nothing_is_imported() -> None:
    code = (
        "import sys\n"
        "from offscope.proxy.otel import from_environment\n"
        "import offscope.proxy.mitm.addon\n"
        "assert from_environment(lambda cause, n: None, environ={}) is None\n"
        "assert from_environment(lambda cause, n: None, environ={'OTEL_EXPORTER_OTLP_ENDPOINT': "
        "'http://127.0.0.1:9', 'OTEL_SDK_DISABLED': 'true'}) is None\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_an_unsupported_protocol_exits_2(tmp_path: Path, confdir: str, ledger_file: str) -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
    }
    proc = subprocess.run(
        [
            "offscope",
            "proxy",
            "--ledger",
            ledger_file,
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--metrics",
            "",
            "--control-listen",
            "",
            "--confdir",
            confdir,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert proc.returncode == 2
    assert "OTEL_EXPORTER_OTLP_PROTOCOL='grpc' is not supported" in proc.stderr
    assert "http/protobuf" in proc.stderr


def test_without_the_extra_the_proxy_runs_unchanged() -> None:
    """The variables set but the SDK missing (an import that fails, as without
    `offscope[otel]`): no sink, a warning, nothing raised."""
    code = (
        "import sys\n"
        "sys.modules['opentelemetry.exporter.otlp.proto.http.trace_exporter'] = None  # not installed\n"
        "from offscope.proxy.otel import from_environment\n"
        "env = {'OTEL_EXPORTER_OTLP_ENDPOINT': 'http://127.0.0.1:9'}\n"
        "assert from_environment(lambda cause, n: None, environ=env) is None\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "otel_export_unavailable" in proc.stdout + proc.stderr
