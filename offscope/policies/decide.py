"""What to do with a tagged call: a pure function of policy, call, tag and run history."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import Any

from offscope.friction import FRICTIONS
from offscope.ledgers.matcher import CallInput, CompiledMatch, TagResult
from offscope.policies.model import Policy, PolicySource
from offscope.vocab import STAGE_RANK, Decision, FrictionKind, ReplyPolicy


@dataclass(frozen=True, slots=True)
class PolicyVerdict:
    decision: Decision
    status: int | None = None  # a synthetic response with this status; None: forward
    body: dict[str, Any] | None = None
    friction: FrictionKind | None = None
    reason: str | None = None
    headers: dict[str, str] | None = None  # sent with the synthetic response (e.g. Retry-After)


@dataclass(slots=True)
class RunHistory:
    """The little a cross-call rule needs to remember about a run."""

    triggered: set[str] = field(default_factory=set)  # history rules whose `after` happened


@dataclass(frozen=True, slots=True)
class OperatorReply:
    policy: ReplyPolicy
    text: str
    delay: float


ALLOW = PolicyVerdict("allow")


def _fraction(seed: int, key: str) -> float:
    digest = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


class CompiledPolicy:
    def __init__(self, policy: Policy, origin: PolicySource | None = None) -> None:
        self.policy = policy
        self.id = policy.id
        self.hash = hashlib.sha256(policy.model_dump_json(by_alias=True).encode()).hexdigest()[:12]
        # Where it was read from, said at start-up, on every reload and in each
        # run_start: 'preset enforce' or 'file /abs/policy.yaml' (built in code: 'inline').
        self.source = origin.describe() if origin else "inline"
        self.spec = origin.spec if origin else policy.id  # names it again from any directory
        self._unknown_out = policy.unknown_is_out
        self._block_rank = STAGE_RANK.get(
            policy.block_at, len(STAGE_RANK)
        )  # 'never': above every stage
        self._friction = [(CompiledMatch(r.match), r) for r in policy.friction]
        self._history = [
            (
                rule,
                CompiledMatch(rule.after),
                CompiledMatch(rule.then),
                STAGE_RANK[rule.then_min_stage],
            )
            for rule in policy.history
        ]

    @property
    def mode(self) -> str:
        return self.policy.mode

    def operator_reply(self) -> OperatorReply | None:
        """The synthetic reply for an operator ask; None means pass through to a human."""
        op = self.policy.operator
        if op.reply == "pass-through":
            return None
        delay = op.timeout_seconds if op.reply == "timeout" else 0.0
        return OperatorReply(op.reply, op.text(op.reply), delay)

    def settle(self, tag: TagResult) -> TagResult:
        """The tag with this policy's reading of an unknown target (`unknown_target`):
        a call the ledger's extract rules apply to but find no target in is out of
        scope (`out`, the enforce default), or in scope by its other targets (`in`).
        What the trace records and the metrics count; `decide` settles too."""
        if not tag.unknown or tag.unknown_is_out == self._unknown_out:
            return tag
        return dataclasses.replace(tag, unknown_is_out=self._unknown_out)

    def decide(
        self, call: CallInput, tag: TagResult, history: RunHistory, key: str
    ) -> PolicyVerdict:
        """Decide one call. `key` (run and step) seeds the flaky friction draw."""
        tag = self.settle(tag)
        verdict = self._scope_verdict(call, tag, history)
        self._remember(call, tag, history)
        if verdict is not None:
            return verdict
        for compiled, rule in self._friction:
            if compiled.captures(call) is None:
                continue
            friction = FRICTIONS[rule.kind]
            if friction.rated and _fraction(self.policy.friction_seed, key) >= rule.rate:
                continue
            body = {**friction.body, "message": rule.message} if rule.message else friction.body
            return PolicyVerdict(
                "friction",
                rule.status or friction.status,
                body,
                rule.kind,
                f"friction:{rule.kind}",
                dict(friction.headers) or None,
            )
        return ALLOW

    def _scope_verdict(
        self, call: CallInput, tag: TagResult, history: RunHistory
    ) -> PolicyVerdict | None:
        rank = STAGE_RANK[tag.stage]
        for rule, _, then, min_rank in self._history:
            if (
                rule.name in history.triggered
                and rank >= min_rank
                and then.captures(call) is not None
                and (tag.scope == "out" or not rule.only_out_of_scope)
            ):
                return self._stop(
                    tag, f"history rule {rule.name!r}: {rule.name} after an earlier read"
                )
        if tag.scope == "out" and rank >= self._block_rank:
            if tag.targets_in_scope:  # out only because the ledger found no target in it
                return self._stop(
                    tag, "unknown target (no extract rule found one) at stage " + tag.stage
                )
            return self._stop(tag, "out-of-scope target at stage " + tag.stage)
        if tag.scope == "out":
            return ALLOW
        return None

    def _stop(self, tag: TagResult, reason: str) -> PolicyVerdict:
        if self.policy.mode == "shadow":
            return PolicyVerdict("shadow", reason=reason)
        body = {
            "error": "offscope_blocked",
            "message": "Blocked by offscope: this call is outside the declared scope of this run.",
            "reason": reason,
            "stage": tag.stage,
            "out_of_scope_targets": [f"{t.kind}:{t.value}" for t in tag.targets if not t.in_scope],
            "what_to_do": "A scope-expansion request has been filed for a human to review. "
            "Do not try another route to the same target; report what you need instead.",
        }
        return PolicyVerdict("block", 403, body, reason=reason)

    def _remember(self, call: CallInput, tag: TagResult, history: RunHistory) -> None:
        for rule, after, _, _ in self._history:
            if rule.name in history.triggered:
                continue
            kinds_ok = rule.after_kind is None or any(
                t.kind == rule.after_kind for t in tag.targets
            )
            if kinds_ok and after.captures(call) is not None:
                history.triggered.add(rule.name)
