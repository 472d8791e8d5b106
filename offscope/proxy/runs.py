"""Run tracking: which run a flow belongs to, and bounded per-run state.

A production proxy sees millions of runs, so the table is an LRU with a hard
cap: runs end on an explicit end call, after an idle timeout, or when the cap
evicts the least recently active one (ended as `idle`).
"""

from __future__ import annotations

import functools
import re
from collections import OrderedDict
from dataclasses import dataclass, field

from offscope.ledgers.matcher import CompiledLedger
from offscope.policies.decide import CompiledPolicy, RunHistory
from offscope.proxy.extract.http import basic_auth_user
from offscope.trace.metrics import RunState

_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16
_SAFE_ID = re.compile(r"[^A-Za-z0-9._:@/-]")


@dataclass
class RunContext:
    state: RunState
    history: RunHistory = field(default_factory=RunHistory)
    last_seen: float = 0.0
    allocated: int = 0  # steps handed out (in request order)
    pending_llm_operator: dict[str, tuple[int, str]] = field(default_factory=dict)  # call id -> (step, question)
    # A run may carry its own ledger and policy (an eval case in a grid cell);
    # None means the proxy's current ones, so a hot reload applies to it.
    ledger: CompiledLedger | None = None
    policy: CompiledPolicy | None = None

    def allocate_step(self) -> int:
        self.allocated += 1
        return self.allocated


def run_id_from(proxyauth_user: str | None, headers: dict[str, str], run_header: str,
                client_ip: str | None) -> str:
    """The run a flow belongs to: proxy-auth user, run header, traceparent, client address."""
    if proxyauth_user:
        return _clean(proxyauth_user)
    value = headers.get(run_header.lower())
    if value:
        return _clean(value)
    m = _TRACEPARENT.match(headers.get("traceparent", "").strip().lower())
    if m:
        return "trace:" + m.group(1)
    return f"client:{client_ip or 'unknown'}"


def traceparent_of(headers: dict[str, str]) -> str | None:
    """The request's W3C traceparent when well-formed (lower-cased), else None:
    the record and the OpenTelemetry span take only a valid parent."""
    value = headers.get("traceparent", "").strip().lower()
    if not _TRACEPARENT.match(value) or value.startswith("ff"):
        return None
    _, trace_id, span_id, _ = value.split("-")
    return None if trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN else value


# The user of a `Proxy-Authorization: Basic ...` header: the same parser as for
# `Authorization`, cached because the same header arrives on every request of a run.
proxy_auth_user = functools.lru_cache(maxsize=4096)(basic_auth_user)


def _clean(value: str) -> str:
    return _SAFE_ID.sub("_", value.strip())[:128]


class RunTable:
    def __init__(self, max_runs: int = 100_000, idle_timeout: float = 300.0) -> None:
        self.max_runs = max_runs
        self.idle_timeout = idle_timeout
        self._runs: OrderedDict[str, RunContext] = OrderedDict()

    def __len__(self) -> int:
        return len(self._runs)

    def get(self, run_id: str) -> RunContext | None:
        return self._runs.get(run_id)

    def touch(self, run_id: str, ledger: str, now: float) -> tuple[RunContext, bool]:
        ctx = self._runs.get(run_id)
        created = ctx is None
        if ctx is None:
            ctx = self._runs[run_id] = RunContext(RunState(run_id, ledger))
        else:
            self._runs.move_to_end(run_id)
        ctx.last_seen = now
        return ctx, created

    def pop(self, run_id: str) -> RunContext | None:
        return self._runs.pop(run_id, None)

    def over_capacity(self) -> list[str]:
        """Run ids to evict (least recently active first)."""
        extra = len(self._runs) - self.max_runs
        return list(self._runs)[:extra] if extra > 0 else []

    def idle(self, now: float) -> list[str]:
        out = []
        for run_id, ctx in self._runs.items():  # oldest activity first
            if now - ctx.last_seen < self.idle_timeout:
                break
            out.append(run_id)
        return out

    def ids(self) -> list[str]:
        return list(self._runs)
