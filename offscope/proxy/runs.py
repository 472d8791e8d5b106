"""Run tracking: which run a flow belongs to, and bounded per-run state.

A production proxy sees millions of runs, so the table is an LRU with a hard
cap: runs end on an explicit end call, after an idle timeout, or when the cap
evicts the least recently active one (ended as `idle`).
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import re
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import structlog

from offscope.ledgers.matcher import CompiledLedger
from offscope.ledgers.model import TargetLists
from offscope.policies.decide import CompiledPolicy, RunHistory
from offscope.proxy.extract.http import basic_auth_user
from offscope.state.db import StoreError
from offscope.state.runs import RunStore, StoredRun
from offscope.trace.metrics import RunState

log = structlog.get_logger("offscope")

_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16
_SAFE_ID = re.compile(r"[^A-Za-z0-9._:@/-]")


@dataclass
class RunContext:
    state: RunState
    history: RunHistory = field(default_factory=RunHistory)
    last_seen: float = 0.0
    allocated: int = 0  # steps handed out (in request order)
    pending_llm_operator: dict[str, tuple[int, str]] = field(
        default_factory=dict
    )  # call id -> (step, question)
    # A run may carry its own ledger and policy (an eval case in a grid cell);
    # None means the proxy's current ones, so a hot reload applies to it.
    ledger: CompiledLedger | None = None
    policy: CompiledPolicy | None = None
    # A registered run's own targets (POST /runs), applied to the proxy's current
    # ledger: `derived` caches (base ledger, run ledger) so a reload applies too.
    targets: TargetLists | None = None
    derived: tuple[CompiledLedger, CompiledLedger] | None = None
    spent: dict[str, int] = field(default_factory=dict)  # budget counters (policy `budgets`)
    exhausted: str | None = None  # the budget this run went over (enforce: the run ends)
    budget_noted: bool = False  # shadow: a budget went over, counted once

    def allocate_step(self) -> int:
        self.allocated += 1
        return self.allocated


def run_id_from(
    proxyauth_user: str | None, headers: dict[str, str], run_header: str, client_ip: str | None
) -> str:
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


# -- registered runs (POST /runs): ids and credentials the control plane hands out ---------

UNREGISTERED = "unregistered"  # the run traffic without a valid credential is attributed to
CREDENTIAL_HEADER = (
    "x-offscope-run-credential"  # "RUN:CREDENTIAL", for harnesses without proxy auth
)
Cause = Literal["missing", "invalid", "expired"]


class StoreUnavailable(RuntimeError):
    """The state store could not be written: what needs it fails closed."""


EXPIRED_KEPT = 3600.0  # seconds an expired registration is kept, so its credential is "expired"
_DUMMY = hashlib.sha256(b"offscope: no such run").digest()


# Cached: a run's flows present the same credential on every request. The cache maps a
# credential to its digest only; every check still compares that digest with the run's.
@functools.lru_cache(maxsize=4096)
def _digest(credential: str) -> bytes:
    return hashlib.sha256(credential.encode("utf-8", "surrogateescape")).digest()


@dataclass
class Registration:
    """A run started through the control API. Only the credential's digest is kept."""

    run: str
    digest: bytes
    expires: float
    labels: dict[str, str]
    targets: TargetLists | None
    agent: str | None
    history: RunHistory
    ended: bool = False
    exhausted: str | None = None  # the budget that ended it
    spent: dict[str, int] = field(default_factory=dict)  # budget counters, shared with its run
    saved: tuple[object, ...] | None = None  # what the store holds (RunStore), to skip rewrites

    def snapshot(self) -> tuple[object, ...]:
        return (
            self.ended,
            self.exhausted,
            tuple(sorted(self.history.triggered)),
            tuple(sorted(self.spent.items())),
        )


class Registry:
    """Registered runs, bounded: a registration lives until its ttl passes (an
    ended run's is kept until then, so its credential is refused as expired
    rather than forgotten); over `max_runs`, the oldest is dropped."""

    def __init__(self, max_runs: int = 100_000, max_agents: int = 10_000) -> None:
        self.max_runs = max_runs
        self.store: RunStore | None = None  # registrations that survive a restart
        self.on_store_failure: Callable[[], None] = lambda: None  # counted by the exporter
        self._regs: OrderedDict[str, Registration] = OrderedDict()
        # Per agent identity (ledger `runs.history: agent`): history across its runs.
        self._agents: OrderedDict[str, RunHistory] = OrderedDict()
        self._max_agents = max_agents

    def __len__(self) -> int:
        return len(self._regs)

    def register(
        self,
        now: float,
        ttl: float,
        labels: dict[str, str],
        targets: TargetLists | None,
        agent: str | None,
        share_history: bool,
    ) -> tuple[Registration, str]:
        run = "run-" + secrets.token_hex(8)
        credential = secrets.token_urlsafe(32)
        history = self._agent_history(agent) if share_history and agent else RunHistory()
        reg = Registration(run, _digest(credential), now + ttl, labels, targets, agent, history)
        self._regs[run] = reg
        while len(self._regs) > self.max_runs:
            self._regs.popitem(last=False)
        if not self.persist(reg):  # acknowledged with its credential: must survive a restart
            del self._regs[run]
            raise StoreUnavailable("the state store could not record the run")
        return reg, credential

    def attach(self, store: RunStore, now: float, keep: float = EXPIRED_KEPT) -> int:
        """Keep registrations in `store` from now on, and take back the ones it holds
        (a restart); returns how many."""
        self.store = store
        loaded = store.load(now, keep)
        for row in loaded:
            targets = TargetLists.model_validate(row.targets) if row.targets is not None else None
            history = (
                self._agent_history(row.agent) if row.agent and row.triggered else RunHistory()
            )
            history.triggered.update(row.triggered)
            reg = Registration(
                row.run,
                row.digest,
                row.expires,
                row.labels,
                targets,
                row.agent,
                history,
                row.ended,
                row.exhausted,
                dict(row.spent),
            )
            reg.saved = reg.snapshot()
            self._regs[row.run] = reg
        return len(loaded)

    def persist(self, reg: Registration) -> bool:
        """Write a registration to the store when what it holds changed; False when the
        store could not be written (logged; the caller decides what fails)."""
        if self.store is None:
            return True
        snapshot = reg.snapshot()
        if snapshot == reg.saved:
            return True
        try:
            self._save(reg)
        except StoreError as exc:
            self.on_store_failure()
            log.error("state_write_failed", run=reg.run, error=str(exc))
            return False
        reg.saved = snapshot
        return True

    def _save(self, reg: Registration) -> None:
        assert self.store is not None
        self.store.save(
            StoredRun(
                reg.run,
                reg.digest,
                reg.expires,
                reg.labels,
                reg.targets.model_dump(mode="json") if reg.targets is not None else None,
                reg.agent,
                reg.ended,
                reg.exhausted,
                sorted(reg.history.triggered),
                dict(reg.spent),
            )
        )

    def _agent_history(self, agent: str) -> RunHistory:
        history = self._agents.get(agent)
        if history is None:
            history = self._agents[agent] = RunHistory()
            while len(self._agents) > self._max_agents:
                self._agents.popitem(last=False)
        self._agents.move_to_end(agent)
        return history

    def get(self, run: str) -> Registration | None:
        return self._regs.get(run)

    def check(
        self, run: str | None, credential: str | None, now: float
    ) -> tuple[Registration | None, Cause]:
        """The registration a credential opens, else why not. The digests are
        compared in constant time, against a dummy when the run is unknown."""
        reg = self._regs.get(run) if run else None
        if credential is None:
            return None, "missing"
        ok = hmac.compare_digest(_digest(credential), reg.digest if reg else _DUMMY)
        if reg is None or not ok:
            return None, "invalid"
        if reg.ended or now >= reg.expires:
            return None, "expired"
        return reg, "missing"  # cause unused when a registration is returned

    def expired(self, now: float, keep: float = EXPIRED_KEPT) -> list[Registration]:
        """Registrations whose ttl just passed (the caller ends their runs). They
        are kept `keep` seconds more, so a late credential is refused as expired."""
        gone = []
        for reg in list(self._regs.values()):
            if now >= reg.expires and not reg.ended:
                reg.ended = True
                self.persist(reg)
                gone.append(reg)
            if now >= reg.expires + keep:
                del self._regs[reg.run]
        return gone


def proxy_credentials(authorization: str | None) -> tuple[str | None, str | None]:
    """(user, password) of a `Basic` Proxy-Authorization value."""
    if not authorization or authorization[:6].lower() != "basic ":
        return None, None
    try:
        decoded = base64.b64decode(authorization[6:].strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None, None
    user, sep, password = decoded.partition(":")
    return user or None, password if sep else None


def header_credentials(value: str | None) -> tuple[str | None, str | None]:
    """(run, credential) of an `X-Offscope-Run-Credential: RUN:CREDENTIAL` header."""
    if not value:
        return None, None
    run, sep, credential = value.strip().partition(":")
    return (run or None, credential) if sep and credential else (None, None)
