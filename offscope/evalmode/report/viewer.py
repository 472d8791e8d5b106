"""The trajectory viewer: every run of a grid or a production trace, step by step.

`runs.html` lists each run with its cell, case and labels and the outcome the
metrics give it (acted, self-granted, infra error: read from the same per-run
fold every report uses, never recomputed here), and shows a selected run's
steps in order: tool calls with scope, stage, decision and targets, operator
exchanges with the reply text exactly as the agent received it and its
provenance, LLM calls with the tools the model proposed. Filters (cell, case,
outcome, label, free text) live in the page's URL fragment, so a report, a
review queue or a chat message can link to `runs.html#cell=...&run=...`.

The page is self-contained (inline CSS and script, the runs as embedded JSON,
no network), written next to report.html by the grid and by `offscope view`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from offscope.trace.events import (
    Event,
    LlmEvent,
    OperatorEvent,
    RunEnd,
    ToolCallEvent,
    ToolsFiltered,
)
from offscope.trace.metrics import Folder, RunState

# Long texts are cut in the page; the trace keeps what it keeps.
MAX_TEXT = 4000


def collect_runs(events: Iterable[Event]) -> list[dict[str, Any]]:
    """One record per run instance, in order of first appearance, with its steps."""
    folder = Folder()
    steps: dict[str, list[dict[str, Any]]] = {}
    ends: dict[str, RunEnd] = {}
    for event in events:
        folder.add(event)
        key = folder.key_of(event.run, event.sidecar)
        if isinstance(event, RunEnd):
            ends[key] = event
        if (step := _step(event)) is not None:
            steps.setdefault(key, []).append(step)
    return [
        _run_record(key, state, steps.get(key, []), ends.get(key))
        for key, state in folder.finish().items()
    ]


def _run_record(
    key: str, state: RunState, steps: list[dict[str, Any]], end: RunEnd | None
) -> dict[str, Any]:
    labels = dict(state.labels)
    outcomes = [
        name
        for name, yes in (
            ("acted", state.acted),
            ("prepared", state.prepared),
            ("investigated", state.investigated),
            ("self-granted", state.self_granted > 0),
            ("asked", state.asked_operator),
            ("blocked", state.blocked > 0),
            ("infra-error", state.ended == "infra_error"),
        )
        if yes
    ]
    if not outcomes:
        outcomes = ["in-scope"]
    # Steps in the order the agent made them: numbered steps by number, the rest
    # (LLM calls, protocol traffic) by when they started.
    steps.sort(key=lambda s: (s["at"], s["step"] or 0))
    return {
        "key": key,
        "run": state.run,
        "ledger": state.ledger,
        "cell": labels.get("cell", ""),
        "case": labels.get("case", ""),
        "labels": labels,
        "outcomes": outcomes,
        "ended": state.ended or "open",
        "detail": (end.detail if end else None) or "",
        "summary": {
            "steps": state.steps,
            "calls": state.calls,
            "out_of_scope_calls": state.oos_calls,
            "first_oos_step": state.first_oos_step,
            "self_granted": state.self_granted,
            "harness_approvals": state.harness_approvals,
            "blocked": state.blocked,
        },
        "steps": steps,
    }


def _step(event: Event) -> dict[str, Any] | None:
    at = getattr(event, "started", None) or event.ts
    if isinstance(event, ToolCallEvent):
        call = event.call
        return {
            "kind": "tool",
            "at": at,
            "step": event.step,
            "source": call.source,
            "tool": call.tool,
            "method": call.method,
            "url": call.url,
            "args": _cut(json.dumps(call.args, sort_keys=True)) if call.args is not None else None,
            "scope": call.scope,
            "stage": call.stage,
            "targets": [
                {"kind": t.kind, "value": t.value, "in_scope": t.in_scope} for t in call.targets
            ],
            "decision": event.decision,
            "status": event.status,
            "reason": event.reason,
            "friction": event.friction,
            "request_id": event.request_id,
            "response": _cut(event.response_excerpt or ""),
            "notes": list(call.notes),
        }
    if isinstance(event, OperatorEvent):
        return {
            "kind": "operator",
            "at": at,
            "step": event.step,
            "channel": event.channel,
            "question": _cut(event.question),
            "reply": _cut(event.reply),
            "provenance": event.provenance,
            "policy": event.policy,
        }
    if isinstance(event, LlmEvent):
        return {
            "kind": "llm",
            "at": at,
            "step": None,
            "model": event.model,
            "api": event.api,
            "text": _cut(event.text),
            "proposed": [
                {"tool": c.tool, "scope": c.scope, "stage": c.stage} for c in event.tool_calls
            ],
        }
    if isinstance(event, ToolsFiltered):
        return {
            "kind": "filtered",
            "at": at,
            "step": None,
            "server": event.server,
            "removed": [r.name for r in event.removed],
        }
    return None  # run_start, run_end and the rest are not steps


def _cut(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + f" … [{len(text) - MAX_TEXT} more]"


def render_viewer(runs: list[dict[str, Any]], title: str, source: str) -> str:
    """The self-contained runs.html page."""
    from offscope.evalmode.report.render import _env

    data = json.dumps({"title": title, "source": source, "runs": runs}, sort_keys=True)
    # Inside <script>, `</script` or `<!--` in a value would end or change the
    # element: every `<` (only ever inside a JSON string) becomes its \u escape.
    data = data.replace("<", "\\u003c")
    return _env().get_template("runs.html.j2").render(title=title, data=data, n=len(runs))
