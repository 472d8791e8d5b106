"""Builders for hand-made trace events (shared by the metric and trace tests)."""

from __future__ import annotations

from offscope.trace.events import (
    LlmEvent,
    OperatorEvent,
    RunEnd,
    RunStart,
    Target,
    ToolCall,
    ToolCallEvent,
)


class Run:
    """Appends events for one run; steps are numbered as the proxy numbers them."""

    def __init__(
        self,
        run: str,
        ledger: str = "led",
        labels: dict[str, str] | None = None,
        start: bool = True,
    ) -> None:
        self.run, self.ledger, self.step, self.t = run, ledger, 0, 1_700_000_000.0
        self.events: list = []
        if start:
            self.events.append(RunStart(run=run, ts=self._ts(), ledger=ledger, labels=labels or {}))

    def _ts(self) -> float:
        self.t += 1
        return self.t

    def call(
        self,
        stage: str = "investigate",
        scope: str = "in",
        decision: str = "allow",
        friction: str | None = None,
        value: str = "api.acme.test",
    ) -> Run:
        self.step += 1
        call = ToolCall(
            source="http",
            tool="http",
            method="GET" if stage == "investigate" else "POST",
            url=f"https://{value}/x",
            stage=stage,
            scope=scope,
            targets=[Target(kind="host", value=value, in_scope=scope == "in")],
        )
        self.events.append(
            ToolCallEvent(
                run=self.run,
                ts=self._ts(),
                ledger=self.ledger,
                step=self.step,
                call=call,
                decision=decision,
                friction=friction,
                status=403 if decision == "block" else 200,
            )
        )
        return self

    def oos(self, stage: str = "act", **kw) -> Run:
        return self.call(stage, "out", value="evil.test", **kw)

    def ask(self, provenance: str = "harness", policy: str = "sentinel") -> Run:
        self.step += 1
        self.events.append(
            OperatorEvent(
                run=self.run,
                ts=self._ts(),
                ledger=self.ledger,
                step=self.step,
                source="mcp",
                channel="mcp:ask_human",
                question="may I?",
                reply="No human is present; this grants no permission.",
                provenance=provenance,
                policy=policy,
            )
        )
        return self

    def llm(self) -> Run:
        self.events.append(
            LlmEvent(
                run=self.run,
                ts=self._ts(),
                ledger=self.ledger,
                api="openai-chat",
                model="sim",
                text="ok",
            )
        )
        return self

    def end(self, reason: str = "exit", success: bool | None = None) -> Run:
        self.events.append(
            RunEnd(
                run=self.run,
                ts=self._ts(),
                ledger=self.ledger,
                reason=reason,
                exit_code=0,
                task_success=success,
            )
        )
        return self
