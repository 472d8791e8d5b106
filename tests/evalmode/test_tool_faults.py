"""A tool call that gets no answer is an infrastructure failure, never a result: the reference
agent against a loopback model that asks for one tool call, and a loopback tool that stalls
(accepts, never answers), answers 503, or is an MCP server that never lists its tools.

Under load (a grid with a thousand trajectories in flight on a small machine) the agent's
tool calls through the proxy can outlast its timeout; told "ReadTimeout", the model acts
otherwise than when told the answer, and such runs differed from the same runs unloaded."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from offscope.evalmode.agent import (
    AgentConfig,
    AgentResult,
    ModelTally,
    run_agent,
    run_agent_within,
)
from tests.support.loopback import send_json


class _OneToolCallModel(BaseHTTPRequestHandler):
    """Asks for one http_request to `target`, then finishes once it has the result."""

    target = ""
    seen_tool_results: list[str] = []

    def do_POST(self) -> None:  # noqa: N802
        request = json.loads(self.rfile.read(int(self.headers["content-length"])))
        results = [m["content"] for m in request["messages"] if m["role"] == "tool"]
        type(self).seen_tool_results = results
        if results:
            call = {"name": "finish", "arguments": json.dumps({"success": True, "summary": "ok"})}
        else:
            call = {"name": "http_request", "arguments": json.dumps({"url": self.target})}
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": f"c{len(results)}", "type": "function", "function": call}],
        }
        send_json(self, 200, {"choices": [{"message": message, "finish_reason": "tool_calls"}]})

    def log_message(self, *args: object) -> None:
        pass


class _Unavailable(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        self.send_response(503)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class _Slow(BaseHTTPRequestHandler):
    """Answers, but only after 0.6 s: a tool served late by a loaded harness."""

    def do_GET(self) -> None:  # noqa: N802
        time.sleep(0.6)
        send_json(self, 200, {"id": 4411})

    def log_message(self, *args: object) -> None:
        pass


def _serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def model() -> Iterator[str]:
    _OneToolCallModel.seen_tool_results = []
    yield from _serve(_OneToolCallModel)


@pytest.fixture
def stalled() -> Iterator[str]:
    """Accepts connections (the kernel does) and never answers."""
    with socket.create_server(("127.0.0.1", 0), backlog=16) as sock:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def _run(model: str, tally: ModelTally, **extra) -> AgentResult:
    cfg = AgentConfig(model_url=model, model="m", brief="do it", timeout=0.5, tally=tally, **extra)
    return asyncio.run(run_agent(cfg))


@pytest.mark.timeout(60)
def test_a_stalled_tool_ends_the_trajectory_as_an_infra_error(model: str, stalled: str) -> None:
    _OneToolCallModel.target = f"{stalled}/customers/4411"
    tally = ModelTally()
    result = _run(model, tally)
    assert result.stopped == "infra_error" and "ReadTimeout" in result.summary
    assert tally.infra_errors == 1
    assert _OneToolCallModel.seen_tool_results == []  # the model was never told "ReadTimeout"


@pytest.mark.timeout(60)
def test_a_tool_that_answers_an_error_is_the_world(model: str) -> None:
    """The control: a 503 is an answer (friction looks like this), and the model gets it."""
    for tool in _serve(_Unavailable):
        _OneToolCallModel.target = f"{tool}/customers/4411"
        tally = ModelTally()
        result = _run(model, tally)
        assert result.stopped == "finish" and tally.infra_errors == 0
        assert json.loads(_OneToolCallModel.seen_tool_results[0])["status"] == 503


@pytest.mark.timeout(60)
def test_an_mcp_server_that_never_lists_is_an_infra_error(model: str, stalled: str) -> None:
    tally = ModelTally()
    result = _run(model, tally, tools=["mcp"], mcp_servers=[f"{stalled}/mcp"])
    assert result.stopped == "infra_error" and "listing" in result.summary
    assert tally.infra_errors == 1 and result.steps == 0


@pytest.mark.timeout(60)
def test_waiting_for_a_tool_answer_is_not_the_agents_time(model: str) -> None:
    """A tool answered within the tool timeout, but later than the whole --timeout: the run
    is the agent's result (it finishes), not a `timeout` that measured the machine."""
    for tool in _serve(_Slow):
        _OneToolCallModel.target = f"{tool}/customers/4411"
        cfg = AgentConfig(model_url=model, model="m", brief="do it", timeout=5, tally=ModelTally())
        result = asyncio.run(run_agent_within(cfg, 0.3))
        assert result.stopped == "finish"
        assert json.loads(_OneToolCallModel.seen_tool_results[0])["body"] == {"id": 4411}
        assert cfg.budget.spent() >= 0.6  # the wait was counted, as waiting


@pytest.mark.timeout(60)
def test_the_agents_own_time_still_has_its_limit() -> None:
    """The control: time that is no wait for an answer counts, and the agent is stopped."""

    async def dawdles(cfg: AgentConfig) -> AgentResult:
        await asyncio.sleep(30)
        raise AssertionError("not stopped")

    cfg = AgentConfig(model_url="http://127.0.0.1:9", model="m", brief="do it")
    with pytest.raises(TimeoutError):
        asyncio.run(run_agent_within(cfg, 0.3, dawdles))
