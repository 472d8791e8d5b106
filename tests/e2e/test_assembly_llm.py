"""The four changes on the LLM path, end to end: the `openai` SDK through the
real proxy to an OpenAI-compatible server on loopback. The trace records the
model id, the scope clause's hash (found by the ledger's marker), the hash of
the request's `tools` and a salted fingerprint of the API key, once per run
and again when one changes; a changed `tools` array within a run is counted."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionToolParam

from offscope.proxy.surface import Salt, _sha
from tests.support.sidecar_kit import (
    LEDGER_YAML,
    AsgiServer,
    chat_app,
    events,
    of_type,
    scrape,
    tls,
    total,
)

pytestmark = pytest.mark.timeout(60)

SALT = "test-deployment-salt"
KEY_1 = "sk-test-scoped-1111111111111111"
KEY_2 = "sk-test-admin-22222222222222222"
TOOL: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "http_request",
        "parameters": {"type": "object", "properties": {"url": {"type": "string"}}},
    },
}
NEW_TOOL: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "shell",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    },
}
CLAUSE = "In scope for this task: customer 4411. Anything not listed is out of scope."
MARKER = r"(?s)<scope>(?P<clause>.*?)</scope>"


def _system(clause: str) -> str:
    return f"You are a support agent.\n<scope>{clause}</scope>\nBe brief."


@pytest.fixture
def model_server():
    seen: list[dict[str, Any]] = []
    srv = AsgiServer(chat_app(seen), "chat").start()
    yield srv, seen
    srv.stop()


def _turn(
    proxy_url: str, ca: str, key: str, model: str, clause: str, tools: list[ChatCompletionToolParam]
) -> None:
    http = httpx.Client(proxy=proxy_url, verify=tls(ca), timeout=20)
    with OpenAI(
        base_url="https://llm.acme.test/v1", api_key=key, http_client=http, max_retries=0
    ) as client:
        client.chat.completions.create(
            model=model,
            tools=tools,
            messages=[
                {"role": "system", "content": _system(clause)},
                {"role": "user", "content": "Look up 4411."},
            ],
        )


async def test_model_clause_tools_and_credential_are_recorded(
    embedded, model_server, ca, tmp_path, monkeypatch
):
    monkeypatch.setenv("OFFSCOPE_FINGERPRINT_SALT", SALT)
    ledger = tmp_path / "ledger-clause.yaml"
    ledger.write_text(LEDGER_YAML + f"scope_clause:\n  marker: '{MARKER}'\n", encoding="utf-8")
    srv, _ = model_server
    async with embedded(
        policy="shadow", routes=f"llm.acme.test=127.0.0.1:{srv.port}", ledger=str(ledger)
    ) as e:
        url = e.url("llm-a")
        await asyncio.to_thread(_turn, url, ca, KEY_1, "sim-1", CLAUSE, [TOOL])
        await asyncio.to_thread(
            _turn, url, ca, KEY_1, "sim-1", CLAUSE, [TOOL]
        )  # nothing new: no events
        before = total(scrape(e.metrics_port), "offscope_tool_surface_changes_total", source="llm")
        await asyncio.to_thread(_turn, url, ca, KEY_2, "sim-2", "Any customer.", [NEW_TOOL, TOOL])
        after = total(scrape(e.metrics_port), "offscope_tool_surface_changes_total", source="llm")
        await asyncio.to_thread(
            _turn, e.url("llm-b"), ca, KEY_2, "sim-2", "Any customer.", [TOOL, NEW_TOOL]
        )
        other_run = total(
            scrape(e.metrics_port), "offscope_tool_surface_changes_total", source="llm"
        )

    assert (before, after, other_run) == (0, 1, 1)  # a new run's first tools are not a change
    evs = of_type(events(e.trace), "assembly", "llm-a")
    by = {}
    for ev in evs:
        by.setdefault(ev["component"], []).append(ev)
    assert [ev["value"] for ev in by["model"]] == ["sim-1", "sim-2"]
    assert by["model"][1]["previous"] == "sim-1"
    salt = Salt(SALT.encode(), True)
    assert [ev["value"] for ev in by["credential"]] == [
        salt.fingerprint(f"Bearer {KEY_1}"),
        salt.fingerprint(f"Bearer {KEY_2}"),
    ]
    assert {ev["salt_id"] for ev in by["credential"]} == {salt.id}
    assert by["credential"][0]["upstream"] == "llm.acme.test:443"
    assert [ev["value"] for ev in by["scope_clause"]] == [
        _sha(" ".join(CLAUSE.split())),
        _sha("Any customer."),
    ]
    first, changed = by["tool_surface"]
    assert first["tools"] == 1 and not first.get("drift")
    assert changed["drift"] and changed["added"] == ["shell"] and changed["tools"] == 2
    # llm-b's tools, in another order, hash the same as llm-a's changed surface
    (b_surface,) = [
        ev
        for ev in of_type(events(e.trace), "assembly", "llm-b")
        if ev["component"] == "tool_surface"
    ]
    assert b_surface["value"] == changed["value"]
    text = e.trace.read_text()
    assert KEY_1 not in text and KEY_2 not in text and "support agent" not in text
