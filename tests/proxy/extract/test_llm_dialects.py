"""The LLM dialect registry: every API is one registered class, and a POST to
a declared LLM host that no dialect recognises is an extraction error decided
by the policy's `on_error`, never parsed as some other API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offscope.ledgers import Ledger, compile_ledger
from offscope.policies import load_policy
from offscope.proxy.engine import Engine
from offscope.proxy.extract.http import HttpRequest
from offscope.proxy.extract.llm import (
    DIALECTS,
    Dialect,
    LlmResponseParser,
    dialect_for,
    is_auxiliary,
    llm_api_of,
    parse_request,
    register,
    substitute_tool_results,
)
from offscope.proxy.sinks import TraceSink

BUILTIN = {"openai-chat", "openai-responses", "anthropic-messages"}


def test_the_builtin_dialects_are_registered_classes() -> None:
    assert set(DIALECTS) >= BUILTIN
    for name, found in DIALECTS.items():
        assert isinstance(found, Dialect) and found.name == name


@pytest.mark.parametrize("api", ["gemini-1", "", "anthropic"])
def test_an_unknown_api_name_is_an_error_not_a_default(api: str) -> None:
    with pytest.raises(ValueError, match="unknown LLM API"):
        LlmResponseParser(api, "text/event-stream")
    with pytest.raises(ValueError, match="unknown LLM API"):
        parse_request(api, b"{}")
    with pytest.raises(ValueError, match="unknown LLM API"):
        substitute_tool_results(api, {}, {})


def test_registering_a_name_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        register(type("Again", (Dialect,), {"name": "openai-chat"}))


def test_an_unknown_path_matches_no_dialect() -> None:
    assert dialect_for("/v1/complete") is None and llm_api_of("/v2/generate") is None
    assert (
        is_auxiliary("/v1/embeddings")
        and is_auxiliary("/v1/files/abc")
        and not is_auxiliary("/v1/complete")
    )


LEDGER = {
    "schema": "offscope.ledger/1",
    "id": "dialects",
    "targets": {"hosts": ["llm.acme.test"]},
    "llm": {"hosts": ["llm.acme.test"], "builtin_hosts": False},
}


def engine(tmp_path: Path, policy: str) -> tuple[Engine, Path]:
    trace = tmp_path / "trace.jsonl"
    led = compile_ledger(Ledger.model_validate(LEDGER), "ledger.yaml")
    return Engine(led, load_policy(policy), trace=TraceSink(trace)), trace


def post(path: str) -> HttpRequest:
    body = json.dumps({"model": "m", "prompt": "hi", "tools": [{"name": "x"}]}).encode()
    return HttpRequest(
        "POST",
        "llm.acme.test",
        path,
        scheme="https",
        port=443,
        headers={"content-type": "application/json"},
        body=body,
    )


def records(trace: Path) -> list[dict]:
    return [json.loads(line) for line in trace.read_text().splitlines()]


def test_unknown_llm_api_closed_is_refused_and_recorded(tmp_path: Path) -> None:
    eng, trace = engine(tmp_path, "enforce")
    ex, _ = eng.begin(post("/v1/complete"), "r1")
    eng.close()
    assert ex.synthetic is not None and ex.synthetic.status == 400
    assert json.loads(ex.synthetic.body)["error"] == "offscope_uninspectable"
    calls = [e for e in records(trace) if e["type"] == "tool_call"]
    assert len(calls) == 1 and calls[0]["decision"] == "block" and calls[0]["injected"]
    assert (
        "no LLM dialect recognises POST /v1/complete"
        in calls[0]["reason"] + json.loads(ex.synthetic.body)["message"]
    )


def test_unknown_llm_api_open_is_forwarded_with_the_error_noted(tmp_path: Path) -> None:
    eng, trace = engine(tmp_path, "shadow")
    ex, _ = eng.begin(post("/v1/complete"), "r1")
    assert ex.synthetic is None
    eng.response(ex, None, "connection refused")
    eng.close()
    calls = [e for e in records(trace) if e["type"] == "tool_call"]
    assert len(calls) == 1 and calls[0]["decision"] == "allow"
    assert any(
        "extraction error: no LLM dialect recognises POST /v1/complete" in n
        for n in calls[0]["call"]["notes"]
    )
    assert not [e for e in records(trace) if e["type"] == "llm"]


def test_auxiliary_calls_on_an_llm_host_are_plain_calls_not_errors(tmp_path: Path) -> None:
    eng, trace = engine(tmp_path, "enforce")
    ex, _ = eng.begin(post("/v1/embeddings"), "r1")
    assert ex.synthetic is None
    eng.response(ex, None, "connection refused")
    eng.close()
    calls = [e for e in records(trace) if e["type"] == "tool_call"]
    assert len(calls) == 1 and not any("extraction error" in n for n in calls[0]["call"]["notes"])


def test_a_known_api_is_an_llm_exchange(tmp_path: Path) -> None:
    eng, trace = engine(tmp_path, "enforce")
    ex, _ = eng.begin(post("/v1/chat/completions"), "r1")
    assert ex.synthetic is None
    eng.response(ex, None, "connection refused")
    eng.close()
    assert [e["api"] for e in records(trace) if e["type"] == "llm"] == ["openai-chat"]
