"""`offscope replay`: what a candidate ledger or policy would have done to recorded traffic.

Every recorded tool call is tagged again under the candidate ledger and
decided again under the candidate policy, with the proxy's own tagger
(`CompiledLedger.tag`, and for plain HTTP the proxy's alternative-readings
check `tag_readings`) and the proxy's own `decide()`: no second
implementation. What re-tagging needs is in the record (`call.input`,
offscope.trace/2). The report says:

- which calls would change scope or decision, grouped by target and tool;
- the metrics under the recorded tags and under the new ones, side by side;
- the candidate ledger's unused reach (offscope/ledgers/coverage.py);
- for a policy that blocks, which runs would have been interrupted, and where.

Limits, said per call in the report: a value the candidate ledger reads that
the record holds only as a digest, redacted or cut to size cannot be
re-extracted ("incomplete"); an offscope.trace/1 call has no inputs, so its
recorded targets are checked against the candidate ledger instead of being
extracted again ("fallback"). Calls the proxy refused before tagging (an
ambiguous request, a body it could not inspect) keep their recorded decision.
Counterfactual caveat: after a call that would have been blocked, the agent
would have seen a different answer; what it did next is what it did after the
recorded answer.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from offscope.evalmode.stats import (
    common_tau,
    first_touch_runs,
    kaplan_meier,
    rate_interval,
)
from offscope.ledgers.coverage import Coverage
from offscope.ledgers.matcher import CallInput, CompiledLedger, TagResult
from offscope.ledgers.model import Match, TargetLists
from offscope.policies.decide import CompiledPolicy, PolicyVerdict, RunHistory
from offscope.proxy.engine import tag_readings
from offscope.trace.events import Event, RunStart, ToolCall, ToolCallEvent
from offscope.trace.metrics import Aggregate, Folder, RunState, aggregate
from offscope.trace.rates import wilson
from offscope.trace.redact import KEEP_ALL, REDACTED

SCHEMA = "offscope.replay/1"
EXAMPLES = 3  # example run ids per group
# Reasons the proxy gives when it refuses a request before tagging decides it:
# a candidate policy does not re-decide those (the request was never tagged alone).
_REFUSED = (
    "host header disagrees",
    "chunked body",
    "body over the inspection limit",
    "extraction error",
    "ambiguous request",
    "offscope error",
)
_STREAMED = "request body went upstream before offscope could inspect it"
_CAPPED = re.compile(r"…\[\d+ more (chars|keys|items)\]$|^\[truncated: too deep\]$")


# -- what the candidate reads, and what the record lost ------------------------------


@dataclass(frozen=True)
class Needs:
    """What the candidate ledger's and policy's rules read besides the destination."""

    fields: tuple[str, ...]
    headers: tuple[str, ...]
    basic_auth: bool

    @classmethod
    def of(cls, ledger: CompiledLedger, policy: CompiledPolicy) -> Needs:
        policy_matches: list[Match] = [r.match for r in policy.policy.friction]
        for rule in policy.policy.history:
            policy_matches += [rule.after, rule.then]
        fields = [*ledger.rule_fields, *(k for m in policy_matches for k in (m.args or {}))]
        return cls(tuple(dict.fromkeys(fields)), ledger.read_headers, ledger.reads_basic_auth)


def _dig(data: Any, dotted: str) -> tuple[bool, Any]:
    """(present, value) of a dotted field, stopping at a digest or a marker."""
    for part in dotted.split("."):
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        else:
            return isinstance(
                data, str
            ), data  # a string here is a digest or marker of what held the field
    return True, data


def _kept(dotted: str, kept: list[str]) -> bool:
    if KEEP_ALL in kept:
        return True
    parts = dotted.split(".")
    return any(".".join(parts[:i]) in kept for i in range(1, len(parts) + 1))


def _lost(value: Any) -> str | None:
    """Why a recorded string is not the value that was sent, if it is not."""
    if not isinstance(value, str):
        return None
    if REDACTED in value:
        return "redacted"
    if _CAPPED.search(value):
        return "cut to size"
    return None


def missing_inputs(tc: ToolCall, needs: Needs) -> list[str]:
    """What the candidate reads that this record cannot give back."""
    rec = tc.input
    assert rec is not None
    out: list[str] = []
    kept = rec.kept or []
    for dotted in needs.fields:
        present, value = _dig(tc.args, dotted)
        if not present:
            continue  # the call did not carry it: nothing was lost
        if not _kept(dotted, kept):
            out.append(
                f"args.{dotted} is stored as a digest (add it to the recording ledger's keep_args)"
            )
        elif why := _lost(value):
            out.append(f"args.{dotted} was {why}")
    headers, read = rec.headers or {}, rec.read_headers or []
    for h in needs.headers:
        if h in headers:
            if why := _lost(headers[h]):
                out.append(f"header.{h} was {why}")
        elif h not in read and tc.source != "llm":  # read but absent: the call did not send it
            out.append(f"header.{h} was not recorded (the recording ledger did not read it)")
    if needs.basic_auth and rec.basic_auth_user is None and tc.source != "llm":
        out.append("basic_auth.user was not recorded (the recording ledger did not read it)")
    if why := _lost(rec.path):
        out.append(f"the path was {why}")
    for name, values in (rec.query or {}).items():
        if any(_lost(v) for v in values):
            out.append(f"query.{name} was redacted")
    return out


def call_input(tc: ToolCall) -> CallInput:
    """The tagger's input rebuilt from a trace/2 record. Values the record
    holds only as digests or markers are left out, never matched as values
    (a digest is not a customer id)."""
    rec = tc.input
    assert rec is not None
    return CallInput(
        source=tc.source,
        tool=tc.tool,
        method=tc.method,
        host=rec.host,
        path=rec.path,
        query=rec.query or {},
        args=usable_args(tc.args, rec.kept or []),
        headers=rec.headers or {},
        basic_auth_user=rec.basic_auth_user,
        annotations=rec.annotations,
    )


def usable_args(args: Any, kept: list[str], path: str = "") -> Any:
    """The recorded arguments with every digest and redaction marker removed."""
    if isinstance(args, dict):
        out = {}
        for k, v in args.items():
            dotted = f"{path}.{k}" if path else str(k)
            if _kept(dotted, kept):
                if _lost(v) is None:
                    out[k] = v
            elif isinstance(v, dict):
                out[k] = usable_args(v, kept, dotted)
        return out
    return args if (not path and KEEP_ALL in kept and _lost(args) is None) else None


def _fallback_input(tc: ToolCall) -> CallInput:
    """A /1 record's call as far as grants need it (tool, method, path, args)."""
    host = next((t.value for t in tc.targets if t.kind == "host"), None)
    path = None
    if tc.url:
        rest = tc.url.split("://", 1)[-1]
        path = "/" + rest.partition("/")[2].split("?", 1)[0]
    return CallInput(
        source=tc.source, tool=tc.tool, method=tc.method, host=host, path=path, args=tc.args
    )


# -- one call ------------------------------------------------------------------------


@dataclass
class Replayed:
    """A recorded call and what the candidate makes of it."""

    event: ToolCallEvent
    tag: TagResult
    decision: str
    reason: str | None
    problems: list[str]
    fallback: bool
    call: CallInput | None

    def __post_init__(self) -> None:  # computed once: the report reads them several times per call
        self.old_scope = self.event.call.scope
        self.new_scope = self.tag.scope
        self.scope_changed = self.new_scope != self.old_scope
        self.decision_changed = self.decision != self.event.decision
        self.newly_blocked = self.decision == "block" and self.event.decision != "block"
        self.newly_passed = self.event.decision == "block" and self.decision != "block"

    def replayed_event(self) -> ToolCallEvent:
        """The event as the candidate would have recorded it (for the metrics)."""
        if not (
            self.scope_changed or self.decision_changed or self.tag.stage != self.event.call.stage
        ):
            return self.event
        targets = [
            {"kind": t.kind, "value": t.value, "in_scope": t.in_scope, "grant": t.grant}
            for t in self.tag.targets
        ]
        call = self.event.call.model_copy(
            update={
                "targets": targets,
                "stage": self.tag.stage,
                "scope": self.tag.scope,
                "unknown": self.tag.unknown or None,
            }
        )
        return self.event.model_copy(
            update={"call": call, "decision": self.decision, "reason": self.reason}
        )

    old_scope: str = field(init=False)
    new_scope: str = field(init=False)
    scope_changed: bool = field(init=False)
    decision_changed: bool = field(init=False)
    newly_blocked: bool = field(init=False)
    newly_passed: bool = field(init=False)


class Replayer:
    """Tags and decides recorded calls under a candidate ledger and policy."""

    def __init__(self, ledger: CompiledLedger, policy: CompiledPolicy) -> None:
        self.ledger, self.policy = ledger, policy
        self.needs = Needs.of(ledger, policy)
        self.coverage = Coverage(ledger)
        self._history: dict[str, RunHistory] = {}
        self._own: dict[
            str, CompiledLedger
        ] = {}  # runs started with their own targets (POST /runs)

    def start(self, run: str, targets: dict[str, list[str]] | None = None) -> None:
        self._history[run] = RunHistory()  # a run id started again is a new run
        self._own.pop(run, None)
        if (
            targets
        ):  # as the proxy applied them: added to the candidate's targets, or in their place
            replace = self.ledger.ledger.runs.targets == "replace"
            self._own[run] = self.ledger.with_targets(TargetLists.model_validate(targets), replace)

    def replay(self, event: ToolCallEvent) -> Replayed:
        tc = event.call
        # The run's own ledger (its targets), as it sees it: another run's grants do not apply.
        ledger = self._own.get(event.run, self.ledger).for_run(event.run)
        now = datetime.fromtimestamp(event.ts, UTC)  # grants as they stood when the call was made
        if tc.input is None:
            call = _fallback_input(tc)
            found = [(t.kind, t.value) for t in tc.targets]
            tag = TagResult(
                ledger.membership(found, call, now),
                tc.stage,
                False,
                tc.stage_from or "default",
                unknown=bool(tc.unknown),
            )
            kind = (
                "offscope.trace/1 record"
                if event.schema_.endswith("/1")
                else "record without call.input"
            )
            problems = [
                f"{kind}: its recorded targets were checked against the candidate "
                "ledger; extraction was not run again"
            ]
            problems += [
                f"target {t.kind}:{t.value} was redacted" for t in tc.targets if REDACTED in t.value
            ]
            self.coverage.observe(tag)
            fallback = True
        else:
            call = call_input(tc)
            problems = missing_inputs(tc, self.needs)
            tag = (
                tag_readings(ledger, call, now)[0] if tc.source == "http" else ledger.tag(call, now)
            )
            self.coverage.observe(tag)
            fallback = False
        tag = self.policy.settle(tag)  # the candidate policy reads unknown targets
        decision, reason = self._decide(event, call, tag)
        return Replayed(event, tag, decision, reason, problems, fallback, call)

    def _decide(
        self, event: ToolCallEvent, call: CallInput, tag: TagResult
    ) -> tuple[str, str | None]:
        if event.call.source == "llm":
            return (
                event.decision,
                event.reason,
            )  # proposed by the model: the proxy records, never decides
        if event.reason and event.reason.startswith(_REFUSED):
            return event.decision, event.reason  # refused before tagging decided it
        history = self._history.setdefault(event.run, RunHistory())
        verdict: PolicyVerdict = self.policy.decide(call, tag, history, f"{event.run}:{event.step}")
        if verdict.status is not None and _STREAMED in event.call.notes:
            # As the proxy does: a body already upstream can be neither blocked nor injected.
            return ("shadow", verdict.reason) if verdict.decision == "block" else ("allow", None)
        return verdict.decision, verdict.reason


# -- the report --------------------------------------------------------------------


@dataclass
class Group:
    target: str
    tool: str
    scope: str  # "in -> out", "out -> in" or "" (unchanged)
    decision: str  # "shadow -> block", ... or ""
    count: int = 0
    runs: list[str] = field(default_factory=list)

    def add(self, run: str) -> None:
        self.count += 1
        if len(self.runs) < EXAMPLES and run not in self.runs:
            self.runs.append(run)

    def as_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "tool": self.tool,
            "scope": self.scope or None,
            "decision": self.decision or None,
            "calls": self.count,
            "example_runs": self.runs,
        }


def _group_target(r: Replayed) -> str:
    """The target that explains a change: the first whose scope differs, else the
    first out-of-scope one, else the host."""
    old = {(t.kind, t.value): t.in_scope for t in r.event.call.targets}
    for t in r.tag.targets:
        if old.get((t.kind, t.value), not t.in_scope) != t.in_scope:
            return f"{t.kind}:{t.value}"
    for t in r.tag.targets:
        if not t.in_scope:
            return f"{t.kind}:{t.value}"
    return next((f"{t.kind}:{t.value}" for t in r.tag.targets), "-")


@dataclass
class Report:
    ledger: CompiledLedger
    policy: CompiledPolicy
    traces: list[str]
    events: int = 0
    calls: int = 0
    groups: dict[tuple[str, str, str, str], Group] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    problems: dict[str, Group] = field(default_factory=dict)
    interrupted: dict[str, int] = field(default_factory=dict)  # run key -> first newly blocked step
    old: dict[str, RunState] = field(default_factory=dict)
    new: dict[str, RunState] = field(default_factory=dict)
    coverage: Coverage | None = None

    def add(self, r: Replayed, run_key: str) -> None:
        self.calls += 1
        c = self.counts
        c["scope_changed"] += r.scope_changed
        c["newly_out_of_scope"] += r.scope_changed and r.new_scope == "out"
        c["newly_in_scope"] += r.scope_changed and r.new_scope == "in"
        c["decision_changed"] += r.decision_changed
        c["newly_blocked"] += r.newly_blocked
        c["newly_passed"] += r.newly_passed
        c["incomplete"] += bool(r.problems) and not r.fallback
        c["fallback"] += r.fallback
        if r.scope_changed or r.decision_changed:
            scope = f"{r.old_scope} -> {r.new_scope}" if r.scope_changed else ""
            decision = f"{r.event.decision} -> {r.decision}" if r.decision_changed else ""
            key = (_group_target(r), r.event.call.tool, scope, decision)
            self.groups.setdefault(key, Group(*key)).add(r.event.run)
        for p in r.problems:
            self.problems.setdefault(p, Group(p, r.event.call.tool, "", "")).add(r.event.run)
        if r.newly_blocked and r.event.step is not None:
            step = self.interrupted.get(run_key)
            self.interrupted[run_key] = r.event.step if step is None else min(step, r.event.step)

    def as_dict(self) -> dict[str, Any]:
        c = self.counts
        steps = Counter(self.interrupted.values())
        return {
            "schema": SCHEMA,
            "traces": self.traces,
            "events": self.events,
            "calls": self.calls,
            "ledger": {"id": self.ledger.id, "hash": self.ledger.hash},
            "policy": {"id": self.policy.id, "mode": self.policy.mode, "hash": self.policy.hash},
            "counts": {
                k: c[k]
                for k in (
                    "scope_changed",
                    "newly_out_of_scope",
                    "newly_in_scope",
                    "decision_changed",
                    "newly_blocked",
                    "newly_passed",
                    "incomplete",
                    "fallback",
                )
            },
            "changes": [
                g.as_dict()
                for g in sorted(self.groups.values(), key=lambda g: (-g.count, g.target))
            ],
            "not_fully_replayed": [
                {"why": g.target, "calls": g.count, "example_runs": g.runs}
                for g in sorted(self.problems.values(), key=lambda g: -g.count)
            ],
            "metrics": side_by_side(list(self.old.values()), list(self.new.values())),
            "unused_reach": self.coverage.as_dict() if self.coverage else None,
            "interrupted": {
                "runs": len(self.interrupted),
                "of_runs": len(self.new),
                "at_step": dict(sorted(steps.items())),
                "note": "runs in which the candidate would have blocked a call the recorded "
                "run was not blocked on, by the first such step; what the agent did "
                "after that step is what it did after the recorded answer",
            },
        }


def replay(paths: Iterable[str | Path], ledger: CompiledLedger, policy: CompiledPolicy) -> Report:
    """Replay trace files in order (one pass, bounded memory: per-run state only)."""
    names = [str(p) for p in paths]
    report = Report(ledger, policy, names)
    replayer = Replayer(ledger, policy)
    old, new = Folder(), Folder()
    for event in _events(names):
        report.events += 1
        old.add(event)
        if isinstance(event, RunStart):
            replayer.start(event.run, event.targets)
        if isinstance(event, ToolCallEvent):
            r = replayer.replay(event)
            report.add(r, old.key_of(event.run, event.sidecar))
            event = r.replayed_event()
        new.add(event)
    report.old, report.new = old.finish(), new.finish()
    report.coverage = replayer.coverage
    return report


def _events(paths: list[str]) -> Iterator[Event]:
    """Every event of the traces: globs, rotated and compressed segments, several
    traces merged by time (offscope/trace/reader.py)."""
    from offscope.trace.reader import read_traces

    return read_traces(paths)


# -- metrics side by side ---------------------------------------------------------


def _first_touch(pairs: list[tuple[int | None, int]], tau: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "runs": len(pairs),
        "touched": sum(f is not None for f, _ in pairs),
        "median": None,
        "rmst": None,
        "rmst_ci95": None,
        "tau": None,
    }
    if pairs and tau:
        s = kaplan_meier(pairs, tau=tau)
        out.update(
            median=s.median,
            rmst=s.rmst,
            tau=s.tau,
            rmst_ci95=[s.rmst - 1.96 * s.rmst_se, s.rmst + 1.96 * s.rmst_se],
        )
    return out


def _touches(a: Aggregate) -> dict[str, Any]:
    """Touches per 1,000 runs with the bounds `offscope shadow-compare` uses:
    1000 x Wilson 95% bounds of the touching runs x max(1, calls per touching run)."""
    touched = a.investigated.k
    if not a.runs:
        return {"value": None, "ci95": None}
    factor = max(1.0, a.oos_calls / touched) if touched else 1.0
    lo, hi = wilson(touched, a.runs)
    return {
        "value": a.touches_per_1000_runs,
        "ci95": [1000 * lo * factor, 1000 * hi * factor],
        "method": "1000 x Wilson 95% bounds of touching runs x max(1, out-of-scope calls per touching run)",
    }


def aggregate_with_intervals(runs: list[RunState]) -> Aggregate:
    """`aggregate`, each per-run rate with the one interval every command prints for it
    (`stats.rate_interval`): case-clustered when the runs name several cases (a grid's
    trace), else Wilson (production)."""
    cases = [r.labels.get("case") for r in runs]

    def rate(values: list[bool]) -> Any:
        return rate_interval(values, cases)

    known = [r for r in runs if r.task_success is not None]
    return replace(
        aggregate(runs),
        task_success=rate_interval(
            [bool(r.task_success) for r in known], [r.labels.get("case") for r in known]
        ),
        investigated=rate([r.investigated for r in runs]),
        prepared=rate([r.prepared for r in runs]),
        acted=rate([r.acted for r in runs]),
        self_granted_runs=rate([r.self_granted > 0 for r in runs]),
        asked=rate([r.operator_asks > 0 for r in runs]),
    )


def side_by_side(old_runs: list[RunState], new_runs: list[RunState]) -> dict[str, Any]:
    """The scope metrics under the recorded and the candidate tags, each with its interval."""
    a, b = aggregate_with_intervals(old_runs), aggregate_with_intervals(new_runs)
    km = {"recorded": first_touch_runs(old_runs), "candidate": first_touch_runs(new_runs)}
    # Both RMSTs at one horizon, the last step observed on both sides: an RMST is only
    # comparable at the same tau (as gate and shadow-compare compare theirs).
    tau = common_tau(*km.values()) if all(km.values()) else None
    out: dict[str, Any] = {}
    for name, agg, runs in (("recorded", a, old_runs), ("candidate", b, new_runs)):
        d = agg.as_dict()
        out[name] = {
            "runs": agg.runs,
            "calls": agg.calls,
            "oos_calls": agg.oos_calls,
            "funnel": d["funnel"],
            "self_granted": agg.self_granted,
            "self_granted_runs": d["self_granted_runs"],
            "touches_per_1000_runs": _touches(agg),
            "first_oos_step": _first_touch(km[name], tau),
            "blocked_calls": sum(r.blocked for r in runs),
        }
    return out


# -- --fail-on ---------------------------------------------------------------------

FAIL_NAMES = {
    "newly-blocked": lambda d: d["counts"]["newly_blocked"],
    "newly-passed": lambda d: d["counts"]["newly_passed"],
    "newly-out": lambda d: d["counts"]["newly_out_of_scope"],
    "newly-in": lambda d: d["counts"]["newly_in_scope"],
    "changed": lambda d: d["counts"]["scope_changed"] + d["counts"]["decision_changed"],
    "interrupted-runs": lambda d: d["interrupted"]["runs"],
    "incomplete": lambda d: d["counts"]["incomplete"],
    "fallback": lambda d: d["counts"]["fallback"],
    "unused": lambda d: len(d["unused_reach"]["unused"]) if d["unused_reach"] else 0,
}
_CONDITION = re.compile(r"^\s*([a-z-]+)\s*(>=|<=|==|>|<)\s*(\d+)\s*$")
_OPS = {">": int.__gt__, ">=": int.__ge__, "<": int.__lt__, "<=": int.__le__, "==": int.__eq__}


def parse_condition(text: str) -> tuple[str, str, int]:
    m = _CONDITION.match(text)
    if not m or m.group(1) not in FAIL_NAMES:
        raise ValueError(
            f"--fail-on {text!r}: write NAME>N (also >=, ==, <, <=) with NAME one of "
            + ", ".join(FAIL_NAMES)
        )
    return m.group(1), m.group(2), int(m.group(3))


def failed_conditions(report: dict[str, Any], conditions: list[tuple[str, str, int]]) -> list[str]:
    out = []
    for name, op, n in conditions:
        value = int(FAIL_NAMES[name](report))
        if _OPS[op](value, n):
            out.append(f"{name}={value} ({name}{op}{n})")
    return out
