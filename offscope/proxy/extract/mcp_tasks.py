"""MCP tasks: a `tools/call` answered with a task handle, its result fetched later.

A client that asks for a task (`params.task`) gets `{"task": {"taskId": ...}}` back
at once; it polls `tasks/get` and fetches the tool's result with `tasks/result`. The
call was tagged and decided when it was made; its later result belongs to it. This
module keeps, per server and task id, the call a task came from (bounded), so the
result can be recorded as the same call (`continues`: the call's step).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

MAX_OPEN_TASKS = 4096


@dataclass(frozen=True, slots=True)
class TaskCall:
    """The call a task came from: its step, and what was decided about it."""

    step: int
    pending: Any  # the PendingCall as decided (its call, tag and verdict)


def task_id_of(result: Any) -> str | None:
    """The task id of a `CreateTaskResult` (`{"task": {"taskId": ...}}`), else None."""
    task = result.get("task") if isinstance(result, dict) else None
    task_id = task.get("taskId") if isinstance(task, dict) else None
    return task_id if isinstance(task_id, str) and task_id else None


class TaskCalls:
    """Open tasks by (server, task id), least recent dropped first."""

    def __init__(self, max_tasks: int = MAX_OPEN_TASKS) -> None:
        self.max_tasks = max_tasks
        self._open: OrderedDict[tuple[str, str], TaskCall] = OrderedDict()

    def created(self, server: str, task_id: str, step: int, pending: Any) -> None:
        self._open[(server, task_id)] = TaskCall(step, pending)
        self._open.move_to_end((server, task_id))
        while len(self._open) > self.max_tasks:
            self._open.popitem(last=False)

    def result_of(self, server: str, task_id: Any) -> TaskCall | None:
        """The call whose result a `tasks/result` fetches (once: the result is recorded once)."""
        if not isinstance(task_id, str):
            return None
        return self._open.pop((server, task_id), None)

    def __len__(self) -> int:
        return len(self._open)
