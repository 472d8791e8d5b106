"""The trace format, `offscope.trace/2`: one JSON object per line.

The proxy writes it in production and the eval grid writes it offline; every
metric is computed from it (offscope/trace/metrics.py), so a trace file is
enough to reproduce any number offscope prints. Secrets never reach it: the
producers redact (offscope/trace/redact.py) before building events.

Versions: `/2` adds `call.input` to tool calls (what re-tagging a call under
another ledger needs: `offscope replay`); everything else is as in `/1`, and
`/1` traces are still read (replay falls back to their recorded targets).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from offscope.errors import InputError
from offscope.jsonl import (
    DECOMPRESSION_ERRORS,
    check_constants,
    is_torn,
    open_text,
    warn_torn,
)
from offscope.vocab import (
    Decision,
    EndReason,
    FrictionKind,
    GrantScope,
    HoldOutcome,
    Provenance,
    ReplyPolicy,
    Scope,
    Source,
    Stage,
    StageFrom,
    TargetKind,
)

SCHEMA: Final = "offscope.trace/2"
SCHEMAS: Final = ("offscope.trace/1", "offscope.trace/2")  # what readers accept


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    schema_: Literal["offscope.trace/1", "offscope.trace/2"] = Field(SCHEMA, alias="schema")
    run: str
    ts: float = Field(description="seconds since the epoch")
    ledger: str
    sidecar: str | None = Field(
        None,
        description="the proxy instance that wrote the record (`offscope proxy --instance`, "
        "e.g. the pod name); a fleet's runs are told apart by (sidecar, run)",
    )

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_none=True)


class Target(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    kind: TargetKind
    value: str
    in_scope: bool
    grant: str | None = None


class CallInputRecord(BaseModel):
    """What re-tagging the call under another ledger needs besides the tool,
    method and `args` (offscope.trace/2). Values are redacted like the rest of
    the record: a redacted or size-capped value cannot be re-extracted, and
    `offscope replay` says so per call."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    host: str | None = Field(
        None, description="destination host, normalised (lower case, punycode, no dot)"
    )
    port: int | None = Field(None, description="destination port (where the proxy connected)")
    path: str | None = Field(None, description="request path without the query (redacted)")
    query: dict[str, list[str]] | None = Field(
        None, description="query parameters (secret ones redacted)"
    )
    headers: dict[str, str] | None = Field(
        None, description="only the headers the ledger's rules read (`{header.X}`), redacted"
    )
    read_headers: list[str] | None = Field(
        None,
        description="the headers the ledger's rules read, sent or not (one missing from `headers` "
        "was not sent)",
    )
    basic_auth_user: str | None = Field(
        None, description="kept only when the ledger reads `{basic_auth.user}`"
    )
    annotations: dict[str, bool] | None = Field(
        None,
        description="the tool's declared boolean hints "
        "(readOnlyHint, ...): they set the default stage",
    )
    kept: list[str] | None = Field(
        None,
        description="argument fields whose values `args` holds; every other "
        "field is a digest ('*': all values kept)",
    )


class ToolCall(BaseModel):
    """One call by the agent (redacted)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    source: Source
    tool: str = Field(description="'http' for plain HTTP; the MCP or LLM tool name otherwise")
    method: str | None = None
    url: str | None = Field(None, description="redacted URL (http/mcp)")
    args: Any = Field(None, description="redacted, size-capped arguments or JSON body")
    targets: list[Target] = Field(default_factory=list)
    stage: Stage
    stage_from: StageFrom | None = Field(
        None,
        description="where the stage came from: a ledger stage rule, the tool's declared "
        "annotations, or the default (HTTP method, else act)",
    )
    scope: Scope
    unknown: bool | None = Field(
        None,
        description="true: extract rules apply to this MCP call but none found a target in it; "
        "`scope` is then out when the policy's unknown_target is out (the enforce default)",
    )
    size: int = Field(0, description="request body bytes")
    notes: list[str] = Field(default_factory=list, description="parse notes (malformed body, ...)")
    input: CallInputRecord | None = Field(
        None, description="what re-tagging needs (offscope.trace/2)"
    )


class Approval(BaseModel):
    """Who let an out-of-scope call through, or refused it, and when: a held
    call's decision (`on_out_of_scope: hold`), or the grant a call used."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    request_id: str | None = Field(None, description="the scope-expansion request decided")
    outcome: HoldOutcome | Literal["granted"] = Field(
        description="a held call approved, denied or timed out; 'granted': allowed by an earlier grant"
    )
    approver: str | None = Field(None, description="who decided (None: the hold timed out)")
    at: float | None = Field(
        None, description="when the decision was made (seconds since the epoch)"
    )
    grants: list[str] = Field(
        default_factory=list, description="the grants the approval wrote or the call used"
    )
    scope: GrantScope | None = Field(None, description="what the grants apply to")
    held_seconds: float | None = Field(None, description="how long the call waited in the proxy")


class _Flow(BaseModel):
    """When and under which distributed trace the flow behind a record ran:
    what an OpenTelemetry span of it needs (offscope/proxy/otel.py)."""

    started: float | None = Field(
        None,
        description="when the flow began (seconds since the epoch); `ts` is when it was recorded",
    )
    traceparent: str | None = Field(
        None, description="the W3C traceparent the request carried (well-formed only; lower case)"
    )


class RunStart(_Event):
    type: Literal["run_start"] = "run_start"
    labels: dict[str, str] = Field(default_factory=dict, description="case, cell, rep, seed, ...")
    ledger_hash: str | None = None
    policy: str | None = None
    policy_source: str | None = Field(
        None,
        description="where the policy was read: 'preset NAME (HASH)' or 'file /abs/path (HASH)'",
    )
    targets: dict[str, list[str]] | None = Field(
        None,
        description="the run's own targets (POST /runs), applied to the ledger as its "
        "`runs.targets` says (add or replace); replay tags the run's calls with them",
    )


class ToolCallEvent(_Flow, _Event):
    type: Literal["tool_call"] = "tool_call"
    step: int | None = Field(None, description="1-based step; None for calls that are not steps")
    call: ToolCall
    decision: Decision = "allow"
    status: int | None = Field(None, description="status the agent received")
    injected: bool = Field(False, description="the response was synthesised by offscope")
    friction: FrictionKind | None = None
    reason: str | None = None
    request_id: str | None = Field(None, description="scope-expansion request written for a block")
    response_excerpt: str | None = Field(None, description="redacted start of the response body")
    call_id: str | None = Field(
        None, description="the MCP JSON-RPC request id, or the LLM's tool call id"
    )
    approval: Approval | None = Field(
        None, description="the human decision on this call, when there was one"
    )
    session: str | None = Field(
        None,
        description="digest of the MCP session id (sha256:..., never "
        "the id itself: it is a bearer of the session)",
    )
    continues: int | None = Field(
        None,
        description="the step of the call this record continues: its retry with the answers "
        "to its input requests (an MCP input-required round), or the result of the task it "
        "became (MCP tasks/result); the same logical call, no new step",
    )


class OperatorEvent(_Flow, _Event):
    type: Literal["operator"] = "operator"
    step: int
    source: Source
    channel: str = Field(description="the endpoint or tool the agent asked through")
    question: str = ""
    reply: str = ""
    provenance: Provenance
    policy: ReplyPolicy
    claimed_provenance: str | None = Field(None, description="what the agent claimed (ignored)")


class LlmEvent(_Flow, _Event):
    """One LLM API exchange. Not a step; its proposed tool calls are kept."""

    type: Literal["llm"] = "llm"
    api: str = Field(
        pattern=r"^[a-z0-9][a-z0-9.-]{0,63}$",
        description="the LLM API's dialect (offscope/proxy/extract/llm/), e.g. openai-chat",
    )
    model: str | None = None
    text: str = Field("", description="assistant text, for the behavioral metrics")
    tool_calls: list[ToolCall] = Field(default_factory=list)
    first_user: str | None = Field(None, description="the first user message (the brief), capped")
    stream: bool = False
    notes: list[str] = Field(default_factory=list)


class AssemblyEvent(_Event):
    """One of the four changes that move scope behaviour, as the proxy saw it
    (offscope/proxy/surface.py): a run's first sight of a value, or a change.
    Never a step; the metrics do not read it, `offscope gate` and
    `offscope shadow-compare` do."""

    type: Literal["assembly"] = "assembly"
    component: Literal["model", "scope_clause", "tool_surface", "credential"]
    source: Source = Field(
        description="mcp: a server's tools/list; llm: an LLM request; http: other calls"
    )
    upstream: str = Field(description="host:port (and path, for an MCP server) the value is about")
    value: str = Field(
        description="the model id, or a sha256:/hmac-sha256: digest ('absent': no scope "
        "clause found); never a credential or a prompt"
    )
    previous: str | None = Field(
        None, description="the value it replaced (the server's last surface, for an MCP server)"
    )
    tools: int | None = Field(None, description="tools in the surface")
    added: list[str] = Field(
        default_factory=list, description="tools new against `previous` (capped)"
    )
    removed: list[str] = Field(default_factory=list)
    changed: list[str] = Field(default_factory=list, description="tools whose definition changed")
    drift: bool = Field(
        False, description="the surface changed (counted in offscope_tool_surface_changes_total)"
    )
    salt_id: str | None = Field(
        None,
        description="credential: id of the salt the fingerprint is under "
        "(fingerprints compare only under one salt)",
    )
    downgraded: list[str] = Field(
        default_factory=list,
        description="tools whose new annotations would weaken their stage (readOnlyHint added): "
        "kept at the stricter stage until re-pinned (offscope_tool_stage_downgrades_total)",
    )
    clients: str | None = Field(
        None,
        description="MCP: digest of the client capabilities the listing was for "
        "(surfaces are compared between clients with the same capabilities)",
    )
    within_ttl: bool | None = Field(
        None,
        description="MCP 2026-07-28: the surface changed while the server's previous list was "
        "still fresh by its own ttlMs (it told clients to cache a list it then changed)",
    )


class RemovedTool(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    name: str
    reason: str = Field(
        description="why it can never be in scope (the ledger rule or list that says so)"
    )


class ToolsFiltered(_Event):
    """Tools the proxy removed from what the agent was offered (policy
    `filter_tools`): an MCP tools/list result, or an LLM request's tools."""

    type: Literal["tools_filtered"] = "tools_filtered"
    source: Literal["mcp", "llm"]
    server: str | None = Field(None, description="the MCP server (redacted URL) or the LLM API")
    offered: int = Field(description="tools in the list before filtering")
    removed: list[RemovedTool]
    shadow: bool = Field(
        False,
        description="shadow mode: these tools would have been removed; the list was passed on "
        "unchanged",
    )


class WorldEffect(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    host: str
    effect: str
    in_scope: bool


class RunEnd(_Event):
    type: Literal["run_end"] = "run_end"
    reason: EndReason
    exit_code: int | None = None
    task_success: bool | None = None
    detail: str | None = None
    effects: list[WorldEffect] | None = Field(
        None, description="writes the fixture world recorded (eval)"
    )


Event = Annotated[
    RunStart | ToolCallEvent | OperatorEvent | LlmEvent | AssemblyEvent | RunEnd | ToolsFiltered,
    Field(discriminator="type"),
]
_adapter: TypeAdapter[Event] = TypeAdapter(Event)


def parse_event(line: str) -> Event:
    return _adapter.validate_json(line)


def read_trace(path: str | Path) -> Iterator[Event]:
    """Events of a trace file, in order. Bad lines raise InputError with the
    line, except a torn final line, which is skipped with a warning."""
    path = Path(path)
    try:
        handle = open_text(path)  # .gz and .zst segments are decompressed as they are read
    except OSError as exc:
        raise InputError(f"cannot read trace: {exc.strerror or exc}", path=str(path)) from None
    with handle:
        lines = enumerate(handle, 1)
        while True:
            try:
                number, line = next(lines)
            except StopIteration:
                return
            except DECOMPRESSION_ERRORS as exc:  # a damaged .gz / .zst segment
                raise InputError(
                    f"cannot read compressed trace: {exc}", path=str(path), hint="check the file"
                ) from None
            if not line.strip():
                continue
            try:
                check_constants(line)  # NaN/Infinity: not JSON, and no offscope writer emits them
                event = _adapter.validate_json(line)
            except (ValueError, UnicodeError) as exc:  # (a ValidationError is a ValueError)
                if is_torn(line):
                    warn_torn(path, number)
                    return
                raise _bad_line(path, number, exc) from None
            yield event


def _bad_line(path: Path, number: int, exc: Exception) -> InputError:
    if isinstance(exc, ValidationError):
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        message = f"not an offscope.trace event (/1 or /2): {where}: {first['msg']}"
    elif isinstance(exc, UnicodeError):
        message = "not an offscope.trace event (/1 or /2): the line is not UTF-8"
    else:
        message = f"not an offscope.trace event (/1 or /2): {exc}"
    return InputError(
        message,
        path=str(path),
        line=number,
        hint="offscope report reads traces written by `offscope proxy` or `offscope grid`",
    )


def write_events(path: str | Path, events: Iterable[_Event]) -> None:
    with Path(path).open("w", encoding="utf-8") as out:
        for e in events:
            out.write(e.to_json() + "\n")


def trace_schema() -> dict[str, Any]:
    return _adapter.json_schema(by_alias=True)


def dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True)
