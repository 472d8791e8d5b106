"""Runs as authenticated objects: registration, admission, per-run scope, budgets.

The engine (offscope/proxy/engine.py) holds one `RunLifecycle`, built with itself as
the `LifecycleHost`, and the lifecycle keeps what only it needs: the registered runs
(`registry`) and the runs ended by a budget. The control API starts a run
(`register_run`) and hands out its id and a credential; every flow is admitted
(`admit`) before it is tagged, so that the run a call counts against is the one its
credential opens, never the one it names. docs/runs.md has the user's view.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, Unpack

import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from offscope.ledgers.matcher import CompiledLedger, TagResult
from offscope.ledgers.model import TargetLists
from offscope.policies.decide import PolicyVerdict
from offscope.proxy.runs import UNREGISTERED, Registration, Registry, RunContext, StoreUnavailable

if TYPE_CHECKING:
    from offscope.policies.decide import CompiledPolicy
    from offscope.proxy.exporter import Exporter
    from offscope.proxy.runs import RunTable

log = structlog.get_logger("offscope")

MAX_TTL = 7 * 86400.0
MAX_EXHAUSTED = 10_000  # run ids remembered as out of budget (refused until forgotten)
_LABEL = r"^[A-Za-z0-9_.:/@-]{1,64}$"


class RunRequest(BaseModel):
    """The body of `POST /runs`."""

    model_config = ConfigDict(extra="forbid")
    targets: TargetLists | None = Field(
        None,
        description="this run's own targets (the ledger says: "
        "added to its targets, or in their place)",
    )
    labels: dict[str, str] = Field(
        default_factory=dict, description="cell, ticket, ... (into RunStart)"
    )
    ttl: float = Field(3600.0, gt=0, le=MAX_TTL, description="seconds the credential is valid")
    agent: str | None = Field(
        None, pattern=_LABEL, description="agent identity (ledger runs.history: agent)"
    )

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > 32:
            raise ValueError("at most 32 labels")
        for key, value in v.items():
            if not key or len(key) > 64 or len(value) > 256:
                raise ValueError(f"label {key[:64]!r}: keys 1-64 characters, values up to 256")
        if "auth" in v:
            raise ValueError(
                "label 'auth' is set by offscope (registered/unauthenticated/unregistered)"
            )
        return v


@dataclass(frozen=True, slots=True)
class Admission:
    """Which run a flow is attributed to, or the refusal it gets instead."""

    run: str
    status: int | None = None
    body: dict[str, Any] | None = None


class RunEnding(TypedDict, total=False):
    """What ending a run records besides its reason (RunEnd)."""

    exit_code: int | None
    task_success: bool | None
    detail: str | None


class LifecycleHost(Protocol):
    """What the run lifecycle uses of the engine: its run table, the proxy's ledger and
    policy (read at each use: a reload replaces them), the exporter, the clock, and
    starting and ending a run (a run's start and end events are the engine's)."""

    runs: RunTable
    ledger: CompiledLedger
    policy: CompiledPolicy
    exporter: Exporter
    clock: Callable[[], float]

    def start_run(self, run_id: str) -> RunContext: ...

    def end_run(
        self, run_id: str, reason: str = "end", **end: Unpack[RunEnding]
    ) -> dict | None: ...


class RunLifecycle:
    """The runs of one engine as authenticated objects: their registrations, admission,
    per-run scope and budgets."""

    def __init__(self, host: LifecycleHost) -> None:
        self.host = host
        self.registry = Registry(host.runs.max_runs)
        self._exhausted: OrderedDict[str, str] = OrderedDict()  # run id -> budget

    # -- the control API -----------------------------------------------------------

    def register_run(self, body: dict[str, Any]) -> dict[str, Any]:
        """Start a run with its own targets and labels (POST /runs). Raises
        ValueError with the problems when the body is not a RunRequest."""
        try:
            spec = RunRequest.model_validate(body)
        except ValidationError as exc:
            raise ValueError(
                "; ".join(
                    f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}"
                    for e in exc.errors(include_url=False)
                )
            ) from None
        settings = self.host.ledger.ledger.runs
        reg, credential = self.registry.register(
            self.host.clock(),
            spec.ttl,
            spec.labels,
            spec.targets,
            spec.agent,
            settings.history == "agent",
        )
        ctx = self.host.start_run(reg.run)
        ledger = self.ledger_of(ctx)
        log.info("run_registered", run=reg.run, labels=spec.labels, ttl=spec.ttl, agent=spec.agent)
        return {
            "run": reg.run,
            "credential": credential,
            "expires": reg.expires,
            "labels": spec.labels,
            "ledger": ledger.id,
            "ledger_hash": ledger.hash,
            "targets": settings.targets,
        }

    def run_summary(self, run: str) -> dict[str, Any] | None:
        """A run's live summary (GET /runs/ID): its counters, and its registration."""
        ctx = self.host.runs.get(run)
        reg = self.registry.get(run)
        if ctx is None and reg is None:
            return None
        out: dict[str, Any] = (
            ctx.state.as_dict() if ctx is not None else {"run": run, "ended": "end"}
        )
        out["active"] = ctx is not None
        out["budget_exhausted"] = self._exhausted.get(run)
        if ctx is not None and ctx.spent:
            out["spent"] = {k.removeprefix("max_"): v for k, v in ctx.spent.items()}
        if reg is not None:
            out.update(
                registered=True,
                expires=reg.expires,
                agent=reg.agent,
                credential_valid=not reg.ended and self.host.clock() < reg.expires,
            )
        return out

    def close_run(
        self, run: str, reason: str = "end", **end: Unpack[RunEnding]
    ) -> dict[str, Any] | None:
        """End a run through the control API: its credential stops working too."""
        reg = self.registry.get(run)
        if reg is not None:
            reg.ended = True
            self.registry.persist(reg)
        summary = self.host.end_run(run, reason, **end)
        if summary is None and reg is not None:
            return {"run": run, "ended": reason, "registered": True}
        return summary

    # -- admission: which run a flow belongs to -------------------------------------

    def admit(
        self, claimed: str, cred_run: str | None, credential: str | None, *, explicit: bool = False
    ) -> Admission:
        """The run a flow counts against. `claimed`: the id it names (proxy-auth user,
        run header, traceparent, client address); `cred_run`/`credential`: what it
        presents as a run credential (`explicit`: in the credential header).

        A valid credential decides, whatever else the flow names. A registered
        run's id without its credential, a forged or an expired one, is never
        attributed to that run. Under `runs.require_registered`, a flow without
        a valid credential is refused (enforce) or attributed to `unregistered`."""
        reg, cause = self.registry.check(cred_run, credential, self.host.clock())
        if reg is not None:
            return Admission(reg.run)
        named = self.registry.get(cred_run) if cred_run else None
        if named is not None and named.exhausted:
            return Admission(named.run)  # refused with the budget body when it is tagged
        if named is None and self.registry.get(claimed) is not None:
            named, cause = (
                self.registry.get(claimed),
                "missing",
            )  # a registered id by the run header
        if named is None and not explicit:
            cause = "missing"  # a client-chosen id; `RUN:x` is not a credential
        hostile = named is not None or explicit
        if not hostile and not self.host.ledger.ledger.runs.require_registered:
            return Admission(claimed)
        enforce = self.host.policy.mode == "enforce"
        self.host.exporter.unregistered(
            self.host.ledger.id, "refused" if enforce else "attributed", cause
        )
        log.warning(
            "run_credential_rejected",
            cause=cause,
            claimed=claimed,
            named=cred_run,
            action="refused" if enforce else "attributed to " + UNREGISTERED,
        )
        if not enforce:
            return Admission(UNREGISTERED)
        return Admission(
            UNREGISTERED,
            407,
            {
                "error": "offscope_run_credential_required",
                "cause": cause,
                "message": "This proxy serves registered runs only. Start a run through the control API "
                "(POST /runs) and send its credential: http://RUN:CREDENTIAL@proxy or the "
                "header X-Offscope-Run-Credential: RUN:CREDENTIAL.",
                "what_to_do": "Report that your run has no valid credential; do not retry with another id.",
            },
        )

    # -- per-run scope ------------------------------------------------------------------

    def registered_context(self, ctx: RunContext) -> dict[str, str] | None:
        """Give a new context its registration's targets and history; its labels."""
        reg: Registration | None = self.registry.get(ctx.state.run)
        if reg is None:
            return None
        ctx.targets, ctx.history, ctx.spent = reg.targets, reg.history, reg.spent
        return {**reg.labels, "auth": "registered"}

    def persist_run(self, ctx: RunContext) -> None:
        """After a call was decided: a registered run's history-rule memory and budget
        counters go to the store when they changed (they survive a restart)."""
        if self.registry.store is None:
            return
        reg = self.registry.get(ctx.state.run)
        if reg is not None and not self.registry.persist(reg):
            # What the run learnt would be lost on a restart: this call fails (closed under a
            # fail-closed policy: offscope/proxy/mitm/addon.py), and the log says why.
            raise StoreUnavailable("the state store could not record the run's history")

    def ledger_of(self, ctx: RunContext) -> CompiledLedger:
        """The ledger a run's calls are tagged by: its own (an eval case), the
        proxy's with the run's targets (a registered run), or the proxy's."""
        if ctx.ledger is not None:
            return ctx.ledger
        base = self.host.ledger
        if ctx.targets is None:
            return base
        if ctx.derived is None or ctx.derived[0] is not base:  # a reload or new grant
            replace = base.ledger.runs.targets == "replace"
            ctx.derived = (base, base.with_targets(ctx.targets, replace))
        return ctx.derived[1]

    # -- budgets ------------------------------------------------------------------------

    def exhausted_refusal(self, run: str) -> dict[str, Any] | None:
        budget = self._exhausted.get(run)
        return None if budget is None else _budget_body(budget)

    def spend(
        self, ctx: RunContext, policy: Any, tag: TagResult, verdict: PolicyVerdict
    ) -> PolicyVerdict:
        """Count a decided call against the run's budgets; the call that goes over
        one is refused (enforce) and the run is marked for ending."""
        budgets = policy.policy.budgets
        if not budgets.any or ctx.exhausted or ctx.budget_noted:
            return verdict
        spent = ctx.spent
        spent["max_tool_calls"] = spent.get("max_tool_calls", 0) + 1
        if tag.scope == "out":
            spent["max_out_of_scope"] = spent.get("max_out_of_scope", 0) + 1
        if verdict.decision == "block":
            spent["max_denials"] = spent.get("max_denials", 0) + 1
        over = budgets.over(spent)
        if over is None:
            return verdict
        if policy.mode != "enforce":  # shadow: counted and logged, never refused
            ctx.budget_noted = True
            self._budget_tripped(ctx, over, ended=False)
            return verdict
        ctx.exhausted = over
        return PolicyVerdict("block", 429, _budget_body(over), reason=f"budget {over} exhausted")

    def end_exhausted(self, ctx: RunContext) -> None:
        """After the call that went over a budget is recorded: end its run."""
        if ctx.exhausted is None or ctx.state.ended is not None:
            return
        self._budget_tripped(ctx, ctx.exhausted, ended=True)

    def _budget_tripped(self, ctx: RunContext, budget: str, *, ended: bool) -> None:
        run = ctx.state.run
        self.host.exporter.budget_exhausted(ctx.state.ledger, budget.removeprefix("max_"))
        log.warning(
            "run_budget_exhausted",
            run=run,
            budget=budget,
            spent=ctx.spent,
            action="run ended" if ended else "shadow: not enforced",
        )
        if not ended:
            return
        self._exhausted[run] = budget
        while len(self._exhausted) > MAX_EXHAUSTED:
            self._exhausted.popitem(last=False)
        reg = self.registry.get(run)
        if reg is not None:
            reg.ended, reg.exhausted = True, budget
            self.registry.persist(reg)
        self.host.end_run(run, "step_limit", detail=f"budget {budget} exhausted")

    # -- eviction and expiry -----------------------------------------------------------

    def evict(self, run: str) -> None:
        """End a run the full run table pushes out: counted, and logged when it
        had armed history rules (a registered run keeps them in its registration)."""
        ctx = self.host.runs.get(run)
        armed = bool(ctx is not None and ctx.history.triggered)
        kept = self.registry.get(run) is not None
        self.host.exporter.evicted(armed)
        if armed:
            log.warning(
                "run_evicted_with_armed_history",
                run=run,
                rules=sorted(ctx.history.triggered),  # type: ignore[union-attr]
                kept="in its registration" if kept else "lost: an unauthenticated run",
            )
        self.host.end_run(run, "idle", detail="evicted: run table full")

    def expire_registrations(self) -> int:
        """End the runs whose credential's ttl passed (housekeeping, once a second)."""
        gone = self.registry.expired(self.host.clock())
        for reg in gone:
            self.host.end_run(reg.run, "timeout", detail="run ttl passed")
        return len(gone)


def _budget_body(budget: str) -> dict[str, Any]:
    return {
        "error": "offscope_run_budget_exhausted",
        "budget": budget.removeprefix("max_"),
        "message": f"This run used up its {budget.removeprefix('max_').replace('_', ' ')} budget and "
        "has been ended. No further calls of this run are sent.",
        "what_to_do": "Stop and report what you have done and what you still need.",
    }
