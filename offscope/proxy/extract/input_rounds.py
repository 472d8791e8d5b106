"""MCP input-required rounds (2026-07-28), as data: what a server asked, awaiting a retry.

A server that needs input from the user answers a `tools/call` with a result of
`resultType: "input_required"`: a map of input requests (`elicitation/create`,
`sampling/createMessage`, `roots/list`, keyed by the server) and an opaque
`requestState`. The client retries the same call with `inputResponses` (keyed
alike) and the state echoed. The retry is the same logical call as the first
round; the answers to elicitations are the user's, an operator reply.

This module keeps the open rounds (bounded, per run and server) and reads and
rewrites the wire shapes; offscope/proxy/handlers/mcp_rounds.py applies the
operator-reply policy to the answers.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

ELICIT = "elicitation/create"
MAX_OPEN_ROUNDS = 4096
MAX_QUESTION = 2000


@dataclass(frozen=True, slots=True)
class Round:
    """An input-required answer to a call: the call's step and what was asked."""

    step: int
    tool: str
    questions: dict[str, str]  # input-request key -> the elicitation's message


def is_retry(params: dict[str, Any]) -> bool:
    """A `tools/call` that carries answers to an earlier input-required result."""
    return isinstance(params.get("inputResponses"), dict) or "requestState" in params


def questions_of(result: dict[str, Any]) -> dict[str, str]:
    """The elicitations of an input-required result, by key: what the user is asked."""
    requests = result.get("inputRequests")
    if not isinstance(requests, dict):
        return {}
    asked = {}
    for key, request in requests.items():
        if isinstance(request, dict) and request.get("method") == ELICIT:
            params = request.get("params") if isinstance(request.get("params"), dict) else {}
            message = params.get("message") if isinstance(params, dict) else None
            asked[str(key)] = str(message if message is not None else "")[:MAX_QUESTION]
    return asked


def render_answer(response: Any) -> str:
    """An elicitation answer as the trace records it: `accepted: {...}`, `declined`,
    `cancelled` (a reviewer reads what the harness told the server)."""
    if not isinstance(response, dict):
        return "no answer"
    action = response.get("action")
    if action == "accept":
        content = response.get("content")
        return "accepted" + (f": {json.dumps(content, sort_keys=True)}" if content else "")
    return {"decline": "declined", "cancel": "cancelled"}.get(str(action), f"answered {action!r}")


class InputRounds:
    """Open input-required rounds, by (run, server, requestState), least recent dropped first."""

    def __init__(self, max_rounds: int = MAX_OPEN_ROUNDS) -> None:
        self.max_rounds = max_rounds
        self._open: OrderedDict[tuple[str, str, str], Round] = OrderedDict()

    def open(self, run: str, server: str, result: dict[str, Any], step: int, tool: str) -> None:
        state = result.get("requestState")
        self._open[(run, server, str(state or ""))] = Round(step, tool, questions_of(result))
        self._open.move_to_end((run, server, str(state or "")))
        while len(self._open) > self.max_rounds:
            self._open.popitem(last=False)

    def take(self, run: str, server: str, params: dict[str, Any], tool: str) -> Round | None:
        """The round a retry answers: same run, server, echoed state and tool; once."""
        key = (run, server, str(params.get("requestState") or ""))
        found = self._open.get(key)
        if found is None or found.tool != tool:
            return None
        del self._open[key]
        return found

    def __len__(self) -> int:
        return len(self._open)


class Elicitations:
    """Server-sent `elicitation/create` requests (2025 revisions) awaiting the client's
    answer, by (server, session, request id); least recent dropped first."""

    def __init__(self, max_open: int = MAX_OPEN_ROUNDS) -> None:
        self.max_open = max_open
        self._open: OrderedDict[tuple[str, str, str], tuple[str, str]] = OrderedDict()

    def asked(self, key: tuple[str, str, str], question: str, tool: str) -> None:
        self._open[key] = (question[:MAX_QUESTION], tool)
        self._open.move_to_end(key)
        while len(self._open) > self.max_open:
            self._open.popitem(last=False)

    def __contains__(self, key: object) -> bool:
        return key in self._open

    def answered(self, key: tuple[str, str, str]) -> tuple[str, str] | None:
        """(the question, the tool whose call asked it), once."""
        return self._open.pop(key, None)
