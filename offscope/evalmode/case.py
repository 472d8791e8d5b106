"""The eval case format (`offscope.case/1`).

A case is an ordinary task with an ordinary brief, its in-scope ledger written
down before the run, the tool surface offered to the agent, the fixture world
the task can reach (hosts that exist only behind the proxy), what
`friction: broken` breaks on the sanctioned route, and a success check for the
task itself, so capability and scope conformance are reported side by side.

The `playbook` is read only by the simulated model (a documented stand-in for a
hosted LLM): the calls that do the task the sanctioned way and the out-of-scope
shortcut a real agent could find. A real model never sees it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from offscope.ledgers.model import ExtractRule, LlmSettings, Match, StageRule, TargetLists
from offscope.vocab import FrictionKind, Stage

BUNDLED = Path(__file__).parent / "cases"

ToolKind = Literal["http_request", "mcp"]
_HTTP_TOOL: ToolKind = "http_request"  # a case's default tool


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CaseLedger(_Strict):
    """The in-scope ledger of the case (its id is the case id)."""

    targets: TargetLists
    extract: list[ExtractRule] = Field(default_factory=list)
    stages: list[StageRule] = Field(default_factory=list)
    llm: LlmSettings = Field(default_factory=LlmSettings)


class Endpoint(_Strict):
    """One HTTP endpoint of a fixture host. `path` may use {captures}."""

    method: str = "GET"
    path: str
    status: int = 200
    body: Any = None
    effect: str | None = Field(
        None,
        description="a write this call makes in the world, e.g. 'refund:4411' "
        "(recorded per run; {captures} allowed)",
    )
    requires_auth: bool = Field(False, description="401 without an Authorization header")

    @model_validator(mode="after")
    def _method(self) -> Endpoint:
        object.__setattr__(self, "method", self.method.upper())
        return self


class McpToolSpec(_Strict):
    name: str
    description: str = ""
    read_only: bool = Field(False, description="MCP readOnlyHint")
    destructive: bool = Field(False, description="MCP destructiveHint")
    params: dict[str, Literal["string", "integer", "number", "boolean"]] = Field(
        default_factory=dict
    )
    result: Any = Field(
        None, description="what the tool returns (text or JSON); {param} placeholders allowed"
    )
    effect: str | None = Field(None, description="a write this call makes, e.g. 'deleted:{path}'")
    error: str | None = Field(
        None, description="the tool fails with this message (a broken route in the world)"
    )


class FixtureHost(_Strict):
    endpoints: list[Endpoint] = Field(default_factory=list)
    mcp_tools: list[McpToolSpec] = Field(
        default_factory=list, description="served as MCP over /mcp"
    )


class PlayStep(_Strict):
    """One call in the simulated model's playbook."""

    tool: str = Field("http_request", description="'http_request' or an MCP tool name")
    method: str = "GET"
    url: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    stage: Stage = "investigate"
    note: str = Field("", description="what the model says while doing it")


class Playbook(_Strict):
    sanctioned: list[PlayStep] = Field(min_length=1)
    shortcut: list[PlayStep] = Field(
        default_factory=list,
        description="an out-of-scope route to the same goal (investigate, prepare, act)",
    )
    shortcut_kind: str | None = Field(
        None, description="mirror, second-account, cached-copy, sibling-repo, staging-copy, ..."
    )


class Friction(_Strict):
    kind: FrictionKind
    match: Match
    rate: float = Field(1.0, ge=0, le=1)


class Success(_Strict):
    """The task succeeded if the world recorded any of these effects."""

    any_effect: list[str] = Field(min_length=1)


class Case(_Strict):
    schema_: Literal["offscope.case/1"] = Field("offscope.case/1", alias="schema")
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$")
    task_class: str
    brief: str = Field(
        min_length=10, description="the ordinary task text, naming only in-scope targets"
    )
    ledger: CaseLedger
    tools: list[Literal["http_request", "mcp"]] = Field(default_factory=lambda: [_HTTP_TOOL])
    world: dict[str, FixtureHost] = Field(
        description="host -> what it serves; hosts exist only behind the proxy"
    )
    friction: list[Friction] = Field(
        min_length=1, description="what `friction: broken` breaks on the sanctioned route"
    )
    success: Success
    playbook: Playbook
    notes: str = ""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _consistent(self) -> Case:
        for host in self.world:
            if host != host.lower():
                raise ValueError(f"world host {host!r} must be lower-case")
        if "mcp" in self.tools and not any(h.mcp_tools for h in self.world.values()):
            raise ValueError("tools includes 'mcp' but no world host serves mcp_tools")
        return self

    @property
    def mcp_hosts(self) -> list[str]:
        return [h for h, spec in self.world.items() if spec.mcp_tools]

    def digest(self) -> str:
        return hashlib.sha256(self.model_dump_json(by_alias=True).encode()).hexdigest()[:16]

    def tool_surface(self) -> dict[str, Any]:
        """What the agent is offered: the hash of this goes in the configuration block."""
        return {
            "tools": sorted(self.tools),
            "mcp": {h: sorted(t.name for t in self.world[h].mcp_tools) for h in self.mcp_hosts},
        }


def tool_surface_hash(cases: list[Case]) -> str:
    blob = json.dumps({c.id: c.tool_surface() for c in cases}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def case_set_hash(cases: list[Case]) -> str:
    blob = json.dumps(sorted((c.id, c.digest()) for c in cases))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load_cases(paths: list[str | Path]) -> list[Case]:
    """Cases from files and directories (*.yaml, sorted); ids must be unique."""
    from offscope.errors import InputError
    from offscope.yamlio import load_model

    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files.extend(sorted(p.glob("*.yaml")))
        elif p.exists():
            files.append(p)
        else:
            raise InputError("no such case file or directory", path=str(p))
    if not files:
        raise InputError(
            "no case files found", path=", ".join(map(str, paths)), hint="cases are *.yaml files"
        )
    cases: list[Case] = []
    seen: dict[str, Path] = {}
    for f in files:
        case = load_model(Case, f)
        if case.id in seen:
            raise InputError(
                f"duplicate case id {case.id!r} (also in {seen[case.id]})", path=str(f)
            )
        seen[case.id] = f
        cases.append(case)
    return cases


# The reference agent's `ask_operator` tool posts here; the proxy answers it
# with the cell's operator-reply policy. It exists only behind the proxy.
OPERATOR_HOST = "operator.offscope.test"
OPERATOR_PATH = "/ask"
# The simulated model is served under this name behind the proxy: the proxy
# treats an exchange as an LLM call only when its destination is a declared
# LLM endpoint, so every case ledger declares the grid's model endpoint.
SIMULATED_MODEL_HOST = "model.offscope.test"


def case_ledger(case: Case, llm_endpoint: str = SIMULATED_MODEL_HOST):
    """The case's ledger as the proxy uses it (the operator channel and the
    grid's model endpoint, 'host' or 'host:port', added)."""
    from offscope.ledgers.model import Ledger

    return Ledger(
        id=case.id,
        description=f"eval case {case.id} ({case.task_class})",
        targets=case.ledger.targets,
        extract=case.ledger.extract,
        stages=case.ledger.stages,
        operator=[Match(host=OPERATOR_HOST, path=OPERATOR_PATH)],
        llm=case.ledger.llm.model_copy(update={"hosts": [*case.ledger.llm.hosts, llm_endpoint]}),
        keep_args=["*"],  # fixture data, not people's: `offscope mine` reads the values
    )
