"""Property-based tests: extraction never raises; the funnel is monotone."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offscope.ledgers import EXAMPLES, load_ledger
from offscope.proxy.extract.http import HttpRequest, extract_http
from offscope.proxy.extract.llm import (
    DIALECTS,
    LlmResponseParser,
    dialect,
    parse_request,
    substitute_tool_results,
)
from offscope.proxy.extract.mcp import (
    mcp_messages,
    response_messages,
    result_text,
    tool_annotations,
)
from offscope.proxy.extract.sse import SseParser, parse_sse
from offscope.trace.events import Event, OperatorEvent, Target, ToolCall, ToolCallEvent
from offscope.trace.metrics import RunState
from offscope.vocab import STAGE_RANK
from tests.support import core_wire as w

# Every registered dialect is fuzzed: a new one is in these tests as soon as it registers.
APIS = sorted(DIALECTS)
LEDGER = load_ledger(EXAMPLES / "billing-agent.yaml")
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "id",
                    "type",
                    "method",
                    "params",
                    "name",
                    "arguments",
                    "jsonrpc",
                    "result",
                    "tools",
                    "annotations",
                    "content",
                    "choices",
                    "delta",
                    "tool_calls",
                    "index",
                    "function",
                    "output",
                    "item",
                    "output_index",
                    "content_block",
                    "input",
                    "partial_json",
                    "response",
                    "message",
                    "messages",
                    "tool_call_id",
                    "call_id",
                    "tool_use_id",
                    "role",
                    "model",
                    "stream",
                    "x",
                ]
            )
            | st.text(max_size=8),
            inner,
            max_size=5,
        )
    ),
    max_leaves=20,
)
# JSON-ish bytes: arbitrary values, plausible wire texts, and raw garbage.
bodies = st.one_of(
    st.binary(max_size=300),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.sampled_from(
        [
            w.chat_stream(),
            w.responses_stream(),
            w.anthropic_stream(),
            json.dumps(w.CHAT_COMPLETION).encode(),
        ]
    ).flatmap(lambda b: st.integers(0, len(b)).map(lambda i: b[:i] + b"\x00\xff{" + b[i:])),
)


def chunked(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(body) + 1) for c in cuts})
    out, last = [], 0
    for p in [*points, len(body)]:
        out.append(body[last:p])
        last = p
    return out


@SETTINGS
@given(
    method=st.sampled_from(["GET", "POST", "put", "DELETE", "x"]),
    host=st.text(max_size=20),
    path=st.text(max_size=40),
    body=bodies,
    headers=st.dictionaries(
        st.sampled_from(["content-type", "authorization", "x-account"]), st.text(max_size=30)
    ),
)
def test_http_and_mcp_requests_never_raise(method, host, path, body, headers) -> None:
    req = HttpRequest(method, host, path, headers=headers, body=body)
    call, notes = extract_http(req)
    assert call.source == "http" and isinstance(notes, list)
    found = mcp_messages(req)
    assert found is None or all(isinstance(m.method, str) for m in found[0])
    # And the tagger accepts whatever the extractor produced.
    LEDGER.tag(call)


@SETTINGS
@given(
    body=bodies, ctype=st.sampled_from(["application/json", "text/event-stream", "", "text/html"])
)
def test_mcp_responses_never_raise(body, ctype) -> None:
    for message in response_messages(body, ctype):
        assert message.get("jsonrpc") == "2.0"
        tool_annotations(message)
        is_error, text = result_text(message)
        assert isinstance(is_error, bool) and isinstance(text, str)


@SETTINGS
@given(
    api=st.sampled_from(APIS),
    body=bodies,
    cuts=st.lists(st.integers(0, 10_000), max_size=20),
    streaming=st.booleans(),
)
def test_llm_parser_never_raises(api, body, cuts, streaming) -> None:
    parser = LlmResponseParser(api, w.STREAMS[api][0] if streaming else "application/json")
    for piece in chunked(body, cuts):
        parser.feed(piece)
    result = parser.finish()
    assert isinstance(result.text, str)
    for call in result.tool_calls:
        call.to_call_input()
    parse_request(api, body)


@SETTINGS
@given(
    api=st.sampled_from(APIS),
    body=json_values,
    replies=st.dictionaries(st.text(max_size=5), st.text(max_size=5)),
)
def test_substitute_never_raises(api, body, replies) -> None:
    found = substitute_tool_results(api, body, replies)
    assert all(cid in replies for cid, _ in found)


@SETTINGS
@given(api=st.sampled_from(APIS), cuts=st.lists(st.integers(0, 100_000), max_size=60))
def test_llm_stream_chunking_does_not_change_the_result(api, cuts) -> None:
    content_type, fixture = w.STREAMS[api]
    body = fixture()
    whole = LlmResponseParser(api, content_type)
    whole.feed(body)
    expect = whole.finish()
    assert expect.tool_calls, f"{api}'s stream fixture has no tool call"
    parser = LlmResponseParser(api, content_type)
    for piece in chunked(body, cuts):
        parser.feed(piece)
    got = parser.finish()
    assert [(c.name, c.args) for c in got.tool_calls] == [
        (c.name, c.args) for c in expect.tool_calls
    ]
    assert got.text == expect.text


def test_every_registered_dialect_has_a_recorded_stream() -> None:
    assert sorted(w.STREAMS) == APIS, "give a new dialect its wire fixture in core_wire.STREAMS"
    for api, (content_type, _) in w.STREAMS.items():
        assert dialect(api).streams(content_type), api


@SETTINGS
@given(
    body=st.binary(max_size=400) | st.text(max_size=200).map(str.encode),
    cuts=st.lists(st.integers(0, 1000), max_size=30),
)
def test_sse_parser_never_raises_and_ignores_chunking(body, cuts) -> None:
    parser = SseParser()
    events = [e for piece in chunked(body, cuts) for e in parser.feed(piece)] + parser.close()
    assert events == parse_sse(body)


# --- the funnel ---------------------------------------------------------------------------

event_specs = st.lists(
    st.one_of(
        st.tuples(
            st.just("call"),
            st.sampled_from(["investigate", "prepare", "act"]),
            st.sampled_from(["in", "out"]),
            st.sampled_from(["allow", "block", "shadow"]),
            st.booleans(),
        ),
        st.tuples(st.just("ask"), st.sampled_from(["human", "harness"])),
    ),
    max_size=40,
)


def _build(specs) -> list[Event]:
    events: list[Event] = []
    step = 0
    for spec in specs:
        if spec[0] == "call":
            _, stage, scope, decision, is_step = spec
            step += is_step
            call = ToolCall(
                source="http",
                tool="http",
                stage=stage,
                scope=scope,
                targets=[Target(kind="host", value="h", in_scope=scope == "in")],
            )
            events.append(
                ToolCallEvent(
                    run="r",
                    ts=0.0,
                    ledger="l",
                    step=step if is_step else None,
                    call=call,
                    decision=decision,
                )
            )
        else:
            step += 1
            events.append(
                OperatorEvent(
                    run="r",
                    ts=0.0,
                    ledger="l",
                    step=step,
                    source="http",
                    channel="c",
                    provenance=spec[1],
                    policy="sentinel",
                )
            )
    return events


@SETTINGS
@given(specs=event_specs)
def test_funnel_monotone_and_signals_once(specs) -> None:
    state = RunState("r", "l")
    reached: list[str] = []
    for event in _build(specs):
        for sig in state.observe(event):
            if sig.kind == "reached":
                assert sig.stage is not None
                reached.append(sig.stage)
        # Monotone at every prefix, by construction.
        assert state.acted <= state.prepared <= state.investigated
    assert len(reached) == len(set(reached))
    assert reached == sorted(reached, key=STAGE_RANK.__getitem__)
    # The signals agree with the final state and with a direct reading of the events.
    oos = [
        e
        for e in _build(specs)
        if isinstance(e, ToolCallEvent) and e.step is not None and e.call.scope == "out"
    ]
    top = max((STAGE_RANK[e.call.stage] for e in oos), default=-1)
    assert state.reached == top == len(reached) - 1
    assert state.oos_calls == len(oos)
    assert state.first_oos_step == (oos[0].step if oos else None)
    assert state.self_granted <= min(state.harness_replies, state.oos_calls)
