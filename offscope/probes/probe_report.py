"""The probe report: agent-evals' JSON report keys, plus offscope's.

Every key agent-evals v0.3 writes (`agents[].live_scores`, `live_details[]
.responses[].raw`, `scan_metadata`, ...) keeps its name and meaning, so
`offscope rescore` reads both tools' reports and agent-evals-aware scripts read
offscope's. offscope adds: the rule set used, the model and whether it was
simulated, the configuration block, answer keys on probes, per-response
correctness and failure modes, and the `rescore` block. Unknown keys are kept
(`extra="allow"`): a newer agent-evals report still loads.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from offscope.behavior.scoring import AnswerKey

FORMAT = "offscope-probe-report"
SCHEMA_VERSION = 1


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class ResponseRecord(_Open):
    """One run of one probe (agent-evals' ResponseRecord, snake_case)."""

    run: int = 0
    temperature: float = 0.0
    confidence: float | None = None
    hedging_score: float = 0.0
    is_refusal: bool = False
    raw: str = ""
    error: str = ""
    coherence_score: float | None = None
    word_count: int = 0
    decisiveness_pos: float = 0.0
    # offscope
    correct: bool | None = None
    failure_modes: list[str] = []


class ProbeDetail(_Open):
    probe_id: str = ""
    question: str = ""
    domain: str = ""
    probe_type: str = Field("", description="boundary | calibration")
    expected: str = ""
    responses: list[ResponseRecord] = []
    # offscope: makes calibration correctness-checked
    answer_key: AnswerKey | None = None


class LiveScores(_Open):
    boundary_score: float = 0.5
    calibration_score: float = 0.5
    refusal_health: float = 0.5
    consistency_score: float = 0.5
    coherence_score: float = 0.5
    decisiveness_score: float = 0.5
    mean_word_count: float = 0.0
    probes_run: int = 0
    # offscope
    calibration_confidence_only: float | None = None
    calibration_checked: float | None = None
    calibration_method: str | None = None
    accuracy: float | None = None
    failure_modes: dict[str, int] | None = None


class StaticScores(_Open):
    scope_clarity_score: float | None = None
    boundary_definition_score: float | None = None
    uncertainty_guidance_score: float | None = None
    has_boundary_language: bool | None = None
    has_uncertainty_guidance: bool | None = None
    strong_domains: list[str] | None = None
    weak_domains: list[str] | None = None
    max_overlap_with_other: float | None = None
    word_count: int | None = None


class AgentEntry(_Open):
    id: str
    name: str = ""
    source: str = ""
    domains: dict[str, float] | None = None
    static_scores: StaticScores | None = None
    content_hash: str | None = None
    also_found_in: list[str] | None = None
    instance_count: int | None = None
    live_scores: LiveScores | None = None
    live_details: list[ProbeDetail] | None = None
    # offscope
    kind: str | None = Field(None, description="agent | skill | command | other")
    rescore: dict[str, Any] | None = None


class ProbeReport(_Open):
    """A probe report; `offscope probe` writes it, `offscope rescore` reads and enriches it."""

    timestamp: str | None = None
    version: str | None = None
    overall_score: float | None = None
    pass_: bool | None = Field(None, alias="pass")
    agents: list[AgentEntry]
    overlaps: list[dict[str, Any]] | None = None
    gaps: list[dict[str, Any]] | None = None
    issues: list[dict[str, Any]] | None = None
    live_summary: dict[str, Any] | None = None
    scan_metadata: dict[str, Any] | None = None
    # offscope
    format: Literal["offscope-probe-report"] | None = None
    schema_version: int | None = None
    rules: str | None = Field(None, description="rule set the scores were computed with")
    model: str | None = None
    simulated: bool | None = Field(
        None, description="true when the built-in simulated model answered"
    )
    config: dict[str, Any] | None = Field(None, description="the run's configuration block")

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
