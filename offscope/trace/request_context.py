"""What a reviewer of a scope-expansion request sees of the run that filed it.

It reads the trace, so it lives in trace/ (policies/ sits below trace/ and
does not read traces).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from offscope.trace.events import read_trace


def run_context(
    trace: str | Path, request: dict[str, Any], steps_before: int = 5
) -> dict[str, Any]:
    """The run's brief (first LLM request, when the model call crossed the proxy)
    and the steps just before the blocked call."""
    brief = None
    steps: list[dict[str, Any]] = []
    for e in read_trace(trace):
        if e.run != request.get("run"):
            continue
        if e.type == "llm" and brief is None and e.first_user:
            brief = e.first_user
        elif (
            e.type in ("tool_call", "operator")
            and e.step is not None
            and e.step < (request.get("step") or 0)
        ):
            if e.type == "tool_call":
                steps.append(
                    {
                        "step": e.step,
                        "what": f"{e.call.method or e.call.tool} {e.call.url or ''}".strip(),
                        "scope": e.call.scope,
                        "stage": e.call.stage,
                        "status": e.status,
                    }
                )
            else:
                steps.append(
                    {
                        "step": e.step,
                        "what": f"asked operator: {e.question[:80]}",
                        "scope": "-",
                        "stage": "-",
                        "status": f"{e.provenance}/{e.policy}",
                    }
                )
    steps.sort(key=lambda s: s["step"])
    return {"brief": brief, "steps_before": steps[-steps_before:]}
