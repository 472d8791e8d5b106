"""Reading runs from a trace: each run's brief, labels and steps (tool calls and operator questions)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from offscope.trace.events import (
    Event,
    LlmEvent,
    OperatorEvent,
    RunStart,
    ToolCallEvent,
)


@dataclass
class Step:
    step: int
    event: ToolCallEvent | OperatorEvent
    note: str = ""  # what the model said just before (the last LLM text), when visible

    @property
    def call(self):  # untyped: its callers read it only where a step is a tool call
        return self.event.call if isinstance(self.event, ToolCallEvent) else None

    @property
    def tool_call(self) -> ToolCallEvent | None:
        return self.event if isinstance(self.event, ToolCallEvent) else None


@dataclass
class Run:
    run: str
    ledger: str
    labels: dict[str, str] = field(default_factory=dict)
    brief: str | None = None
    steps: list[Step] = field(default_factory=list)


def read_runs(events: Iterable[Event]) -> dict[str, Run]:
    runs: dict[str, Run] = {}
    last_text: dict[str, str] = {}
    for e in events:
        r = runs.get(e.run)
        if r is None:
            r = runs[e.run] = Run(e.run, e.ledger)
        if isinstance(e, RunStart):
            r.labels = dict(e.labels)
        elif isinstance(e, LlmEvent):
            if r.brief is None and e.first_user:
                r.brief = e.first_user
            if e.text:
                last_text[e.run] = e.text
        elif (
            isinstance(e, ToolCallEvent) and e.call.source != "llm" or isinstance(e, OperatorEvent)
        ) and e.step is not None:
            r.steps.append(Step(e.step, e, last_text.pop(e.run, "")))
    for r in runs.values():
        r.steps.sort(key=lambda s: s.step)
    return runs
