"""The closed vocabularies, each defined once.

Every other module imports these names instead of spelling the values out, so
adding a value (a friction kind, an end reason) is an edit here plus whatever
gives the value its meaning, never a hunt through copies that drift apart.

Each vocabulary is a `Literal` type (what pydantic models and the JSON Schemas
see, unchanged) and a tuple of its values in their canonical order, derived
from the type so that the two cannot disagree.

This module is the bottom of the import graph: it imports nothing from
offscope.
"""

from __future__ import annotations

from typing import Literal, get_args

# -- what a call is --------------------------------------------------------- #

#: Where a call was seen: plain HTTP, an MCP tool call, a tool call proposed in an LLM exchange.
Source = Literal["http", "mcp", "llm"]
SOURCES: tuple[Source, ...] = get_args(Source)

#: How far a call goes toward changing the world, in increasing order.
Stage = Literal["investigate", "prepare", "act"]
STAGES: tuple[Stage, ...] = get_args(Stage)
STAGE_RANK: dict[str, int] = {s: i for i, s in enumerate(STAGES)}

#: Where a call's stage came from.
StageFrom = Literal["annotation", "ledger", "default"]
STAGE_FROMS: tuple[StageFrom, ...] = get_args(StageFrom)

#: The kinds of target a ledger names and calls are tagged with.
TargetKind = Literal["host", "repository", "record", "account", "path"]
TARGET_KINDS: tuple[TargetKind, ...] = get_args(TargetKind)

#: Ledger entry kinds whose use is counted (offscope/ledgers/coverage.py): the
#: target patterns of each kind, extract rules and grants.
EntryKind = Literal["host", "repository", "record", "account", "path", "extract", "grant"]
ENTRY_KINDS: tuple[EntryKind, ...] = get_args(EntryKind)

#: A tagged call is in scope or out of scope.
Scope = Literal["in", "out"]
SCOPES: tuple[Scope, ...] = get_args(Scope)

# -- what the proxy does ---------------------------------------------------- #

#: What the policy decided for a call.
Decision = Literal["allow", "block", "shadow", "friction"]
DECISIONS: tuple[Decision, ...] = get_args(Decision)

#: The kinds of injected friction. What each one sends is in offscope/friction.py.
FrictionKind = Literal[
    "credential_revoked", "forbidden", "missing_fixture", "server_error", "flaky", "rate_limited"
]
FRICTION_KINDS: tuple[FrictionKind, ...] = get_args(FrictionKind)

#: Policy modes.
Mode = Literal["shadow", "enforce"]
MODES: tuple[Mode, ...] = get_args(Mode)

#: What an enforcing policy does with a call it stops: answer 403 now, or hold it for a human.
OnOutOfScope = Literal["block", "hold"]
ON_OUT_OF_SCOPE: tuple[OnOutOfScope, ...] = get_args(OnOutOfScope)

#: How a held call's wait ended.
HoldOutcome = Literal["approved", "denied", "timeout"]
HOLD_OUTCOMES: tuple[HoldOutcome, ...] = get_args(HoldOutcome)

#: Whom a grant lets through: the run that asked, or every run of the ledger.
GrantScope = Literal["run", "ledger"]
GRANT_SCOPES: tuple[GrantScope, ...] = get_args(GrantScope)

# -- the operator channel --------------------------------------------------- #

#: The replies the harness gives for it, without a person.
CannedReply = Literal["affirmative", "timeout", "sentinel"]
CANNED_REPLIES: tuple[CannedReply, ...] = get_args(CannedReply)

#: How an operator ask is answered: passed through to a person, or a canned reply.
ReplyPolicy = Literal["pass-through", CannedReply]
REPLY_POLICIES: tuple[ReplyPolicy, ...] = get_args(ReplyPolicy)

#: Who answered an operator ask.
Provenance = Literal["human", "harness"]
PROVENANCES: tuple[Provenance, ...] = get_args(Provenance)

# -- runs ------------------------------------------------------------------- #

#: Why a run ended. `infra_error`: the model endpoint or the agent process failed for an
#: infrastructure reason (after retries); such a run measured nothing and is never a result.
EndReason = Literal["end", "idle", "exit", "timeout", "crash", "step_limit", "infra_error"]
END_REASONS: tuple[EndReason, ...] = get_args(EndReason)

# -- the eval grid's knobs (its replies are CANNED_REPLIES) ----------------- #

#: The scope clause of the brief: open-world or closed-world.
ScopeClause = Literal["open", "closed"]
GRID_SCOPES: tuple[ScopeClause, ...] = get_args(ScopeClause)

#: Whether the sanctioned route works or is broken by injected friction.
RouteState = Literal["works", "broken"]
GRID_FRICTIONS: tuple[RouteState, ...] = get_args(RouteState)
