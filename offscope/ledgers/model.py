"""The target ledger file format (`offscope.ledger/1`), as pydantic models.

A ledger declares, before any run, the in-scope targets of an agent or a case,
how targets are found in calls (extraction rules), which calls are at which
stage, and which calls are "asking a human" (operator channels). Everything
not declared in scope is out of scope.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from offscope.ledgers.globs import GlobError, is_literal, parse
from offscope.ledgers.hostnames import HostError, ascii_host, split_port
from offscope.vocab import TARGET_KINDS, GrantScope, Source, Stage, TargetKind

# Template references a rule may use besides path captures.
_REF = re.compile(r"\{([^{}]+)\}")
_REF_NAMESPACES = ("args", "body", "query", "header", "basic_auth", "url")
_ID = r"^[a-z0-9][a-z0-9._-]{0,62}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_glob(value: str, sep: str | None = "/", captures: bool = False) -> str:
    if is_literal(value):  # nothing to check: parsing each cost most of a big ledger's load
        return value
    try:
        parse(value, sep, captures=captures)
    except GlobError as exc:
        raise ValueError(str(exc)) from None
    return value


def _check_host(value: str) -> str:
    """A host or host glob in its canonical spelling (see offscope/ledgers/hostnames.py)."""
    try:
        host = ascii_host(value, strict=True)
    except HostError as exc:
        raise ValueError(str(exc)) from None
    if not host:
        raise ValueError(f"host {value!r} is empty")
    return _check_glob(host, sep=None)


class Match(_Strict):
    """Which calls a rule applies to. Every given field must match; an empty
    Match matches every call. Shared by extraction, stage, operator, friction
    and block rules so that one matcher serves them all."""

    source: Source | None = None
    host: str | None = Field(None, description="exact host or glob, e.g. '*.acme.test'")
    path: str | None = Field(None, description="path glob or template with {captures}")
    method: str | list[str] | None = Field(None, description="HTTP method(s), or method argument")
    tool: str | list[str] | None = Field(None, description="MCP / LLM tool name glob(s)")
    query: dict[str, str] | None = Field(
        None, description="query parameters that must equal these globs"
    )
    args: dict[str, str] | None = Field(
        None, description="dotted argument/body fields that must equal these globs"
    )

    @field_validator("host")
    @classmethod
    def _host(cls, v: str | None) -> str | None:
        return None if v is None else _check_host(v)

    @field_validator("path")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("/", "*")):
            raise ValueError(f"path {v!r} must start with '/' or a glob")
        return None if v is None else _check_glob(v, captures=True)

    @field_validator("tool")
    @classmethod
    def _tool(cls, v: str | list[str] | None) -> str | list[str] | None:
        for t in [v] if isinstance(v, str) else v or []:
            _check_glob(t, sep=None)
        return v

    @field_validator("method")
    @classmethod
    def _method(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, str):
            return v.upper()
        return [m.upper() for m in v] if v else v


def _host_pattern(h: str) -> str:
    return _check_host(h)


def _repo_pattern(r: str) -> str:
    if r.count("/") != 1 and "*" not in r:
        raise ValueError(f"repository {r!r} must be 'owner/name'")
    _check_glob(r)
    return r.lower()


def _record_pattern(r: str) -> str:
    kind, sep, ident = r.partition(":")
    if not sep or not kind or not ident or any(c in kind for c in "*?["):
        raise ValueError(
            f"record {r!r} must be 'type:id' with a literal type (globs only in the id)"
        )
    return _check_glob(r, sep=None)


def _account_pattern(a: str) -> str:
    return _check_glob(a, sep=None)


def _path_pattern(p: str) -> str:
    return _check_glob(p)


def _llm_endpoint(e: str) -> str:
    """'host' or 'host:port' (here the port counts): the host part in its canonical spelling."""
    name, port = split_port(e.strip())
    host = _check_host(name)
    return f"{host}:{port}" if port else host


# Validated element by element, so an error names the list item (and its line).
HostPattern = Annotated[str, AfterValidator(_host_pattern)]
LlmEndpoint = Annotated[str, AfterValidator(_llm_endpoint)]
RepositoryPattern = Annotated[str, AfterValidator(_repo_pattern)]
RecordPattern = Annotated[str, AfterValidator(_record_pattern)]
AccountPattern = Annotated[str, AfterValidator(_account_pattern)]
PathPattern = Annotated[str, AfterValidator(_path_pattern)]


class TargetLists(_Strict):
    """The in-scope set. Globs allowed everywhere (see offscope/ledgers/globs.py)."""

    hosts: list[HostPattern] = Field(
        default_factory=list,
        description="'api.acme.test' or '*.acme.test' (any port; IDN names allowed)",
    )
    repositories: list[RepositoryPattern] = Field(
        default_factory=list, description="'owner/name', globs allowed"
    )
    records: list[RecordPattern] = Field(
        default_factory=list, description="typed ids 'customer:4411', 'invoice:2024-*'"
    )
    accounts: list[AccountPattern] = Field(default_factory=list)
    paths: list[PathPattern] = Field(
        default_factory=list, description="filesystem or URL path globs '/srv/app/**'"
    )

    def of_kind(self, kind: TargetKind) -> list[str]:
        from offscope.ledgers.kinds import plural

        patterns: list[str] = getattr(self, plural(kind))
        return patterns


class ExtractRule(_Strict):
    """Find targets in a matching call. Templates may reference path captures
    `{owner}`, tool arguments or JSON body fields `{args.repo.name}` (alias
    `{body.x}`), query parameters `{query.id}`, headers `{header.X-Account}`,
    the basic-auth user `{basic_auth.user}`, and parts of a URL argument
    `{url.host}` / `{url.path}`. A list value yields one target per element;
    a missing value yields no target."""

    match: Match = Field(default_factory=Match)
    targets: dict[TargetKind, str | list[str]]

    @model_validator(mode="after")
    def _refs(self) -> ExtractRule:
        captures = set(re.findall(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", self.match.path or ""))
        for kind, templates in self.targets.items():
            for template in [templates] if isinstance(templates, str) else templates:
                refs = _REF.findall(template)
                if not refs:
                    raise ValueError(
                        f"targets.{kind}: template {template!r} references nothing; "
                        "put literal targets under `targets:` of the ledger instead"
                    )
                for ref in refs:
                    ns = ref.split(".", 1)[0]
                    if "." not in ref and ref not in captures:
                        raise ValueError(
                            f"targets.{kind}: {{{ref}}} is not a capture of match.path"
                        )
                    if "." in ref and ns not in _REF_NAMESPACES:
                        raise ValueError(
                            f"targets.{kind}: unknown reference {{{ref}}}; "
                            f"use one of {', '.join(_REF_NAMESPACES)}"
                        )
        return self


class StageRule(_Strict):
    match: Match
    stage: Stage


class LlmSettings(_Strict):
    hosts: list[LlmEndpoint] = Field(
        default_factory=list,
        description="LLM API endpoints: 'host' (any port) or 'host:port'; added to "
        "the built-in provider hosts unless builtin_hosts is false",
    )
    builtin_hosts: bool = Field(
        True,
        description="also treat the well-known provider hosts (api.openai.com, "
        "api.anthropic.com, ...) as LLM endpoints",
    )
    tool_calls_are_steps: bool = Field(
        False,
        description="count tool calls the model asks for as steps (for agents whose tools are "
        "local and never cross the proxy); off by default to avoid counting a call twice",
    )


class HumanReplies(_Strict):
    """Which operator replies come from a person. Provenance is decided only by
    this configuration, never by what the agent or a reply says: a reply on any
    route not declared here is recorded as `harness`."""

    routes: list[Match] = Field(
        default_factory=list,
        description="operator routes (HTTP endpoints, MCP tools) whose upstream is a person",
    )
    llm_header: str | None = Field(
        None,
        description="header the harness sets on the LLM request that carries a person's reply to the "
        "LLM operator tool; its value must equal the secret in token_env or token_file",
    )
    token_env: str | None = Field(None, description="environment variable holding that secret")
    token_file: str | None = Field(
        None, description="file holding that secret (never the secret itself here)"
    )

    @model_validator(mode="after")
    def _token(self) -> HumanReplies:
        if self.llm_header and not (self.token_env or self.token_file):
            raise ValueError(
                "humans.llm_header needs token_env or token_file (the secret is never in the ledger)"
            )
        return self


class ScopeClause(_Strict):
    """Where the scope clause is in the agent's system prompt, so the proxy can
    record its hash (one of the four changes) without keeping the prompt."""

    marker: str = Field(
        description="regular expression that finds the clause in the system prompt; its "
        "group named `clause`, if any, else the whole match, is hashed"
    )

    @field_validator("marker")
    @classmethod
    def _marker(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as exc:
            raise ValueError(
                f"scope_clause.marker {v!r} is not a regular expression: {exc}"
            ) from None
        return v


class Grant(_Strict):
    """A reviewed scope expansion (written by `offscope requests approve`)."""

    id: str
    target: str = Field(description="'kind:value', e.g. 'host:mirror.acme.test'")
    tool: str | None = None
    method: str | None = Field(None, description="HTTP method the grant is bound to (None: any)")
    host: str | None = Field(
        None,
        description="host the grant is bound to (canonical: lower case, punycode); a grant with a "
        "path and no host applies to no call",
    )
    path: str | None = Field(None, description="request path the grant is bound to (None: any)")
    query_digest: str | None = Field(
        None,
        description="digest of the query parameters the grant is bound to; a grant with a path "
        "and no query_digest binds the empty query",
    )
    args_digest: str | None = Field(
        None,
        description="digest of the call's JSON arguments, or of its raw body when that is not "
        "JSON (None: any)",
    )
    approver: str
    reason: str = ""
    expires: str = Field(description="ISO 8601 timestamp after which the grant stops applying")
    request_id: str | None = None
    created: str | None = Field(None, description="when the approval was given (ISO 8601)")
    scope: GrantScope = Field(
        "ledger",
        description="'run': applies only to the run named in `run` (what `offscope requests approve` "
        "writes by default); 'ledger': to every run of this ledger",
    )
    run: str | None = Field(None, description="the run a 'run'-scoped grant applies to")

    @model_validator(mode="after")
    def _run_scope(self) -> Grant:
        if self.scope == "run" and not self.run:
            raise ValueError("a grant with scope 'run' names its run (`run:`)")
        return self

    @field_validator("expires")
    @classmethod
    def _expires(cls, v: str) -> str:
        from datetime import datetime

        try:
            datetime.fromisoformat(v)
        except ValueError:
            raise ValueError(
                f"expires {v!r} is not an ISO 8601 timestamp (e.g. 2026-07-01T00:00:00Z)"
            ) from None
        return v

    @field_validator("target")
    @classmethod
    def _target(cls, v: str) -> str:
        kind, sep, value = v.partition(":")
        if not sep or kind not in TARGET_KINDS or not value:
            raise ValueError(
                f"grant target {v!r} must be 'kind:value' with kind one of "
                f"{', '.join(TARGET_KINDS)}"
            )
        return v


class GrantsOverlay(_Strict):
    """`<ledger>.grants.yaml` beside a ledger: reviewed grants, written by
    `offscope requests approve`, merged into the ledger when it is loaded."""

    schema_: Literal["offscope.grants/1"] = Field("offscope.grants/1", alias="schema")
    ledger: str = Field(description="id of the ledger these grants extend")
    grants: list[Grant] = Field(default_factory=list)
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class RunSettings(_Strict):
    """How runs started through the control API (`POST /runs`) relate to this
    ledger (docs/runs.md)."""

    targets: Literal["add", "replace"] = Field(
        "add", description="a run's own targets are added to this ledger's targets, or replace them"
    )
    require_registered: bool = Field(
        False,
        description="traffic without a valid run credential is refused (enforce) or attributed "
        "to the run 'unregistered' and alerted (shadow)",
    )
    history: Literal["run", "agent"] = Field(
        "run",
        description="what history rules remember across: the authenticated run, or every run "
        'started for the same `agent` (POST /runs {"agent": ...})',
    )


class Ledger(_Strict):
    """A target ledger: what this agent (or eval case) may touch."""

    schema_: Literal["offscope.ledger/1"] = Field("offscope.ledger/1", alias="schema")
    id: str = Field(pattern=_ID, description="short id, used as the Prometheus `ledger` label")
    description: str = ""
    targets: TargetLists = Field(default_factory=TargetLists)
    extract: list[ExtractRule] = Field(default_factory=list)
    stages: list[StageRule] = Field(default_factory=list)
    operator: list[Match] = Field(
        default_factory=list,
        description="calls that ask a human (HTTP endpoint, MCP tool or LLM tool)",
    )
    llm: LlmSettings = Field(default_factory=LlmSettings)
    humans: HumanReplies = Field(default_factory=HumanReplies)
    grants: list[Grant] = Field(default_factory=list)
    scope_clause: ScopeClause | None = Field(
        None,
        description="how to find the scope clause in the system prompt of LLM requests; the proxy "
        "records its hash per run",
    )
    runs: RunSettings = Field(default_factory=RunSettings)
    denied_tools: list[str] = Field(
        default_factory=list,
        description="MCP or LLM tool name globs never offered to the agent when the policy sets "
        "`filter_tools` (docs/approvals.md)",
    )
    keep_args: list[str] = Field(
        default_factory=list,
        description="argument or JSON body fields (dotted, e.g. 'customer_id', 'refund.amount') "
        "whose values the trace keeps; '*' keeps them all. Every other field is "
        "stored as its name and a digest (secret-named fields are always redacted)",
    )

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    def semantic_problems(self) -> list[tuple[tuple, str]]:
        """Problems pydantic cannot see alone: duplicate rules and targets."""
        problems: list[tuple[tuple, str]] = []
        for field in ("extract", "stages", "operator"):
            seen: dict[str, int] = {}
            for i, rule in enumerate(getattr(self, field)):
                key = rule.model_dump_json()
                if key in seen:
                    problems.append(
                        ((field, i), f"duplicate rule: {field}[{i}] repeats {field}[{seen[key]}]")
                    )
                seen.setdefault(key, i)
        for kind in TARGET_KINDS:
            plural = {"repository": "repositories"}.get(kind, kind + "s")
            seen_t: dict[str, int] = {}
            for i, t in enumerate(self.targets.of_kind(kind)):
                if t in seen_t:
                    problems.append((("targets", plural, i), f"duplicate target {t!r}"))
                seen_t.setdefault(t, i)
        return problems


def host_port_warnings(data: object) -> list[tuple[tuple, str]]:
    """Host targets and host matches that carry a port, which offscope ignores
    (a host target names the host on every port). For `offscope validate`.
    (`llm.hosts` entries are endpoints, where a port is meaningful.)"""
    if not isinstance(data, dict):
        return []
    found: list[tuple[tuple, object]] = []
    targets = data.get("targets")
    if isinstance(targets, dict) and isinstance(targets.get("hosts"), list):
        found += [(("targets", "hosts", i), h) for i, h in enumerate(targets["hosts"])]
    for field in ("extract", "stages"):
        for i, rule in enumerate(data.get(field) or []):
            if isinstance(rule, dict) and isinstance(rule.get("match"), dict):
                found.append(((field, i, "match", "host"), rule["match"].get("host")))
    for i, m in enumerate(data.get("operator") or []):
        if isinstance(m, dict):
            found.append((("operator", i, "host"), m.get("host")))
    warnings = []
    for loc, host in found:
        if isinstance(host, str) and split_port(host.strip())[1] is not None:
            name = split_port(host.strip())[0]
            warnings.append(
                (
                    loc,
                    f"host {host!r} has a port, which is ignored: host targets and "
                    f"host matches apply to every port of {name!r} (write {name!r})",
                )
            )
    return warnings
