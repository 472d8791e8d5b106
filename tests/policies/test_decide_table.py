"""`CompiledPolicy.decide()` as one table: every combination that matters, each row
with the decision written out by hand.

Columns: mode x scope x stage x block_at x friction rule (kind, matches or not,
rate, status override) x history rule (none, armed, already triggered; only out
of scope or not; `then` matches or not) x the operator reply policy. Every row
is also decided under every other reply policy: the reply policy answers
operator asks and must never change what happens to a tool call.

The coverage test fails when a closed vocabulary gains a value no row uses: add
the rows that say what the new value does. The vocabularies are offscope/vocab.py's;
`block_at` is read from the policy model.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, replace

import pytest

from offscope.friction import FRICTIONS
from offscope.ledgers.matcher import CallInput, TagResult, TargetTag
from offscope.ledgers.model import Match
from offscope.policies import CompiledPolicy, Policy, RunHistory
from offscope.policies.model import FrictionRule, HistoryRule, OperatorPolicy
from offscope.vocab import (
    DECISIONS,
    FRICTION_KINDS,
    MODES,
    REPLY_POLICIES,
    STAGES,
    FrictionKind,
    ReplyPolicy,
)

RULE = "read-then-post"

# The call's targets, by the `scope` column. "granted": in scope only through a
# grant; "unknown": no target could be identified (vacuously in scope); "mixed":
# an in-scope host with an out-of-scope record.
TARGETS: dict[str, tuple[TargetTag, ...]] = {
    "in": (TargetTag("host", "crm.acme.test", True), TargetTag("record", "customer:4411", True)),
    "out": (TargetTag("host", "evil.example.test", False),),
    "mixed": (
        TargetTag("host", "crm.acme.test", True),
        TargetTag("record", "customer:9999", False),
    ),
    "granted": (TargetTag("host", "partner.example.test", True, grant="g-1"),),
    "unknown": (),
}
HISTORY_STATES = ("none", "armed", "triggered")


@dataclass(frozen=True)
class Row:
    mode: str
    scope: str
    stage: str
    expect: str  # the Decision
    status: int | None = None  # the synthetic response's status; None: forwarded
    block_at: str = "act"
    friction: FrictionKind | None = None  # a friction rule of this kind ...
    friction_matches: bool = True  # ... that matches this call (POST) or not (PATCH only)
    rate: float = 1.0
    status_override: int | None = None
    history: str = "none"  # a read-then-post rule: none, armed (not triggered), triggered
    only_out: bool = True
    then_matches: bool = True  # the rule's `then` matches this call (POST) or not (DELETE)
    path: str = "/orders"  # /customers/... matches the rule's `after`
    triggers: bool = False  # the rule is triggered after this call
    reply: str = "sentinel"

    def id(self) -> str:
        parts = [self.mode, self.scope, self.stage, f"block_at={self.block_at}"]
        if self.friction:
            parts.append(
                f"friction={self.friction}{'' if self.friction_matches else '(no match)'}"
                + (f"@{self.rate}" if self.rate != 1.0 else "")
                + (f":{self.status_override}" if self.status_override else "")
            )
        if self.history != "none":
            parts.append(
                f"history={self.history}"
                + ("" if self.only_out else "(any scope)")
                + ("" if self.then_matches else "(then no match)")
            )
        if self.path != "/orders":
            parts.append(self.path)
        return "-".join(parts) + f"-reply={self.reply}->{self.expect}"


R = Row
ROWS = [
    # scope x stage, shadow: only an out-of-scope act is tagged "shadow"; nothing is answered
    R("shadow", "in", "investigate", "allow", reply="pass-through"),
    R("shadow", "in", "prepare", "allow", reply="affirmative"),
    R("shadow", "in", "act", "allow", reply="timeout"),
    R("shadow", "out", "investigate", "allow"),
    R("shadow", "out", "prepare", "allow"),
    R("shadow", "out", "act", "shadow"),
    R("shadow", "unknown", "act", "allow"),
    R("shadow", "granted", "act", "allow"),
    R("shadow", "mixed", "investigate", "allow"),
    R("shadow", "mixed", "act", "shadow"),
    # scope x stage, enforce: out of scope at or above block_at is blocked (403)
    R("enforce", "in", "investigate", "allow", reply="pass-through"),
    R("enforce", "in", "prepare", "allow"),
    R("enforce", "in", "act", "allow", reply="affirmative"),
    R("enforce", "out", "investigate", "allow"),
    R("enforce", "out", "prepare", "allow", reply="timeout"),
    R("enforce", "out", "act", "block", 403),
    R("enforce", "unknown", "investigate", "allow"),
    R("enforce", "unknown", "act", "allow"),  # nothing identified, nothing to block
    R("enforce", "granted", "act", "allow"),  # a grant puts the target in scope
    R("enforce", "mixed", "prepare", "allow"),
    R("enforce", "mixed", "act", "block", 403),  # one out-of-scope target is enough
    # block_at
    R("enforce", "out", "investigate", "block", 403, block_at="investigate"),
    R("enforce", "in", "act", "allow", block_at="investigate"),
    R("enforce", "out", "investigate", "allow", block_at="prepare"),
    R("enforce", "out", "prepare", "block", 403, block_at="prepare"),
    R("enforce", "out", "act", "allow", block_at="never"),
    R("shadow", "out", "prepare", "shadow", block_at="prepare"),
    R("shadow", "out", "act", "allow", block_at="never"),
    # friction: applied to in-scope calls only, at any stage and in either mode
    R("shadow", "in", "act", "friction", 401, friction="credential_revoked"),
    R("enforce", "in", "act", "friction", 403, friction="forbidden", reply="pass-through"),
    R("shadow", "in", "investigate", "friction", 404, friction="missing_fixture"),
    R("enforce", "in", "prepare", "friction", 503, friction="server_error"),
    R("enforce", "in", "act", "friction", 429, friction="rate_limited"),  # with Retry-After
    R("shadow", "in", "act", "friction", 503, friction="flaky"),  # rate 1: every matching call
    R("shadow", "in", "act", "allow", friction="flaky", rate=0.0),
    R("enforce", "in", "act", "friction", 429, friction="forbidden", status_override=429),
    R("enforce", "in", "act", "allow", friction="credential_revoked", friction_matches=False),
    R("shadow", "unknown", "act", "friction", 503, friction="server_error"),
    R("shadow", "granted", "act", "friction", 403, friction="forbidden", reply="affirmative"),
    R("shadow", "out", "act", "shadow", friction="credential_revoked"),  # scope first
    R("enforce", "out", "act", "block", 403, friction="forbidden"),
    R("shadow", "out", "investigate", "allow", friction="forbidden"),  # out of scope: no friction
    R("enforce", "mixed", "prepare", "allow", friction="server_error"),
    # history rules (read-then-post, then_min_stage act), with block_at never so
    # that only the history rule can stop a call
    R("enforce", "out", "act", "block", 403, block_at="never", history="triggered"),
    R("shadow", "out", "act", "shadow", block_at="never", history="triggered", reply="timeout"),
    R("enforce", "out", "act", "allow", block_at="never", history="armed"),
    R(
        "enforce", "out", "prepare", "allow", block_at="never", history="triggered"
    ),  # below then_min_stage
    R("enforce", "out", "act", "allow", block_at="never", history="triggered", then_matches=False),
    R("enforce", "in", "act", "allow", history="triggered"),  # only_out_of_scope
    R("enforce", "granted", "act", "allow", history="triggered"),
    R("enforce", "in", "act", "block", 403, history="triggered", only_out=False),
    R("shadow", "in", "act", "shadow", history="triggered", only_out=False),
    R(
        "enforce",
        "in",
        "act",
        "block",
        403,
        history="triggered",
        only_out=False,
        friction="forbidden",
    ),
    R("shadow", "in", "act", "friction", 401, history="armed", friction="credential_revoked"),
    # what arms a history rule: a call matching `after` that touched a target of `after_kind`
    R(
        "shadow",
        "in",
        "investigate",
        "allow",
        history="armed",
        path="/customers/4411",
        triggers=True,
    ),
    R(
        "enforce", "out", "investigate", "allow", history="armed", path="/customers/4411"
    ),  # no record
    R(
        "enforce",
        "in",
        "act",
        "allow",
        history="armed",
        path="/customers/4411",
        triggers=True,
        then_matches=False,
        reply="pass-through",
    ),
]


def _values(annotation: object) -> set[str]:
    """The strings a Literal (or a union of Literals, or an Optional one) allows."""
    out: set[str] = set()
    for arg in typing.get_args(annotation):
        if isinstance(arg, str):
            out.add(arg)
        elif arg is not type(None):
            out |= _values(arg)
    return out


VOCABULARIES: dict[str, tuple[set[str], set[str]]] = {
    "Decision": (set(DECISIONS), {r.expect for r in ROWS}),
    "Mode": (set(MODES), {r.mode for r in ROWS}),
    "Stage": (set(STAGES), {r.stage for r in ROWS}),
    "block_at": (_values(Policy.model_fields["block_at"].annotation), {r.block_at for r in ROWS}),
    "FrictionKind": (
        set(FRICTION_KINDS),
        {r.friction for r in ROWS if r.friction and r.expect == "friction"},
    ),
    "ReplyPolicy": (set(REPLY_POLICIES), {r.reply for r in ROWS}),
    "scope": (set(TARGETS), {r.scope for r in ROWS}),
    "history": (set(HISTORY_STATES), {r.history for r in ROWS}),
}


@pytest.mark.parametrize("name", sorted(VOCABULARIES))
def test_rows_cover_every_value_of_each_closed_vocabulary(name: str) -> None:
    allowed, used = VOCABULARIES[name]
    assert allowed, f"no values found for {name}"
    assert used <= allowed, (
        f"rows use {name} values the format does not allow: {sorted(used - allowed)}"
    )
    assert allowed == used, (
        f"no row for {name} value(s) {sorted(allowed - used)}: add rows for them"
    )


def test_each_row_is_distinct() -> None:
    keys = [replace(r, reply="sentinel") for r in ROWS]  # the reply policy is not a distinct case
    assert len(set(keys)) == len(keys)


def _policy(row: Row, reply: str) -> CompiledPolicy:
    friction = []
    if row.friction:
        friction.append(
            FrictionRule(
                kind=row.friction,
                rate=row.rate,
                status=row.status_override,
                match=Match(method="POST" if row.friction_matches else "PATCH"),
            )
        )
    history = []
    if row.history != "none":
        history.append(
            HistoryRule(
                name=RULE,
                after_kind="record",
                after=Match(path="/customers/*"),
                then=Match(method="POST" if row.then_matches else "DELETE"),
                then_min_stage="act",
                only_out_of_scope=row.only_out,
            )
        )
    return CompiledPolicy(
        Policy(
            mode=row.mode,
            block_at=row.block_at,
            operator=OperatorPolicy(reply=reply),
            friction=friction,
            history=history,
        )
    )


def _decide(row: Row, reply: str):
    call = CallInput(source="http", method="POST", host="crm.acme.test", path=row.path)
    tag = TagResult(TARGETS[row.scope], row.stage, operator=False)  # type: ignore[arg-type]
    history = RunHistory(triggered={RULE} if row.history == "triggered" else set())
    return _policy(row, reply).decide(call, tag, history, "run-1:1"), history


@pytest.mark.parametrize("row", ROWS, ids=Row.id)
def test_decide(row: Row) -> None:
    verdict, history = _decide(row, row.reply)
    assert verdict.decision == row.expect
    assert verdict.status == row.status
    assert verdict.friction == (row.friction if row.expect == "friction" else None)
    if row.expect == "block":
        assert verdict.body is not None and verdict.body["error"] == "offscope_blocked"
        assert verdict.body["stage"] == row.stage
        assert verdict.body["out_of_scope_targets"] == [
            f"{t.kind}:{t.value}" for t in TARGETS[row.scope] if not t.in_scope
        ]
    elif row.expect == "friction":
        assert row.friction is not None
        assert verdict.body == FRICTIONS[row.friction].body
        assert (verdict.headers or {}) == (
            {"Retry-After": "30"} if row.friction == "rate_limited" else {}
        )  # as a real API sends it
    else:
        assert verdict.body is None and not verdict.headers
    if row.expect in ("block", "shadow"):
        assert verdict.reason and ("history rule" in verdict.reason) is (row.history == "triggered")
    assert (RULE in history.triggered) is (row.history == "triggered" or row.triggers)


@pytest.mark.parametrize("row", ROWS, ids=Row.id)
def test_the_operator_reply_policy_never_changes_a_decision(row: Row) -> None:
    expected, _ = _decide(row, row.reply)
    for reply in REPLY_POLICIES:
        assert _decide(row, reply)[0] == expected, reply


# The other half of the reply policy: what an operator ask is answered with.
REPLIES: list[tuple[ReplyPolicy, bool, float | None]] = [
    # (reply policy, answered by offscope, seconds the agent waits)
    ("pass-through", False, None),
    ("affirmative", True, 0.0),
    ("timeout", True, 7.5),
    ("sentinel", True, 0.0),
]


def test_reply_rows_cover_every_reply_policy() -> None:
    assert {r for r, _, _ in REPLIES} == set(REPLY_POLICIES)


@pytest.mark.parametrize(("reply", "answered", "delay"), REPLIES)
def test_operator_reply(reply: ReplyPolicy, answered: bool, delay: float | None) -> None:
    policy = CompiledPolicy(
        Policy(
            operator=OperatorPolicy(
                reply=reply, timeout_seconds=7.5, texts={"sentinel": "nobody is here"}
            )
        )
    )
    got = policy.operator_reply()
    if not answered:
        assert got is None  # a human answers, through the proxy
        return
    assert got is not None and got.policy == reply and got.delay == delay
    assert reply != "pass-through"  # answered by offscope: one of the canned replies
    assert got.text == (
        "nobody is here" if reply == "sentinel" else policy.policy.operator.text(reply)
    )
    assert got.text.strip()
