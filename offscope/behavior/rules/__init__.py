"""Rule sets: which phrases hedge, refuse, limit scope; the thresholds; the domains.

A rule set is one YAML file. Two ship with offscope: `agent-evals` (reproduces
agent-evals v0.3 exactly, quirks included) and `offscope` (the default, fixing
the weaknesses agent-evals' RULES.md lists). `--rules PATH.yaml` loads a user's.
The behavioural part (`response`, `scoring`, `failure_modes`) is defined in
`offscope.behavior.scoring`, so the proxy and the eval use one definition.
"""

from __future__ import annotations

import re
from functools import cache, cached_property
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from offscope.behavior.scoring import (
    BehaviorRules,
    FailureRules,
    ResponseRules,
    ScoringRules,
    _check_regex,
)
from offscope.errors import InputError
from offscope.yamlio import load_model

RULES_DIR = Path(__file__).resolve().parent
BUILTIN = ("offscope", "agent-evals")
DEFAULT = "offscope"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PatternScore(_Strict):
    """A prompt scores `present` if any pattern matches its lowercased text, else `absent`."""

    patterns: list[str] = Field(min_length=1)
    present: float
    absent: float

    @field_validator("patterns")
    @classmethod
    def _compile(cls, v: list[str]) -> list[str]:
        return [_check_regex(p) for p in v]


class CensusRules(_Strict):
    """Static scores of a system prompt (RULES.md, static scores)."""

    extensions: list[str] = [".md", ".txt"]
    min_bytes: int = 20
    domains: str | dict[str, list[str]] = Field(
        "domains.yaml",
        description="a domains file (relative to the rule file, or bundled) or a mapping",
    )
    keyword_match: Literal["substring", "word"] = "word"
    relevance_keyword_share: float = Field(0.5, gt=0)
    strong_above: float = 0.5
    scope_clarity_full_at: int = Field(3, ge=1)
    scope_clarity_none: float = 0.2
    ascii: bool = False
    boundary: PatternScore
    uncertainty: PatternScore
    probe_domain_chars: int = 500

    @cached_property
    def compiled(self) -> CompiledCensus:
        return CompiledCensus(self)


class CompiledCensus:
    """The census patterns of a rule set, compiled once."""

    def __init__(self, c: CensusRules) -> None:
        flags = re.ASCII if c.ascii else 0
        assert isinstance(c.domains, dict), "load_rules resolves the domains file"
        self.domains: dict[str, list[str]] = c.domains
        self.word = c.keyword_match == "word"
        # A keyword is a word when no letter or digit touches it; "_" and "-" separate
        # words (prompts say "test_file", "api-first"). Lookarounds, not \b, because
        # keywords such as "ci/cd" or "next.js" may start or end with any character.
        self.keyword_re = {
            # The literal comes first and the "no letter before" check after it: the
            # same matches, but Python's engine then scans for the literal (fast).
            kw: re.compile(
                rf"{re.escape(kw.lower())}(?<![^\W_](?s:.){{{len(kw.lower())}}})(?![^\W_])", flags
            )
            for kws in self.domains.values()
            for kw in kws
        }
        self.boundary = [re.compile(p, flags) for p in c.boundary.patterns]
        self.uncertainty = [re.compile(p, flags) for p in c.uncertainty.patterns]


class TranscriptRules(_Strict):
    keep_closing_fence: bool = False
    round_transcript_scores: bool = False


class DomainsFile(_Strict):
    domains: dict[str, list[str]]


class RuleSet(_Strict):
    name: str
    description: str = ""
    response: ResponseRules
    scoring: ScoringRules = ScoringRules()
    failure_modes: FailureRules = FailureRules()
    census: CensusRules
    transcript: TranscriptRules = TranscriptRules()

    @cached_property
    def behavior(self) -> BehaviorRules:
        return BehaviorRules(
            name=self.name,
            response=self.response,
            scoring=self.scoring,
            failure_modes=self.failure_modes,
        )

    @property
    def domains(self) -> dict[str, list[str]]:
        d = self.census.domains
        assert isinstance(d, dict), "load_rules resolves the domains file"
        return d


def _resolve_domains(rules: RuleSet, rule_path: Path) -> RuleSet:
    spec = rules.census.domains
    if isinstance(spec, dict):
        return rules
    for candidate in (rule_path.parent / spec, RULES_DIR / spec):
        if candidate.is_file():
            domains = load_model(DomainsFile, candidate).domains
            census = rules.census.model_copy(update={"domains": domains})
            return rules.model_copy(update={"census": census})
    raise InputError(
        f"domains file {spec!r} not found",
        path=str(rule_path),
        hint=f"looked next to the rule file and in {RULES_DIR}",
    )


@cache
def _load_path(path: str) -> RuleSet:
    rules = load_model(RuleSet, path)
    return _resolve_domains(rules, Path(path))


def load_rules(spec: str | Path = DEFAULT) -> RuleSet:
    """A rule set by name (`offscope`, `agent-evals`) or YAML path; loaded once, cached."""
    name = str(spec)
    if name in BUILTIN:
        return _load_path(str(RULES_DIR / f"{name}.yaml"))
    path = Path(name)
    if not path.is_file():
        raise InputError(
            f"no rule set {name!r}",
            hint=f"use {' or '.join(BUILTIN)}, or a path to a rules YAML file",
        )
    return _load_path(str(path.resolve()))


def default_rules() -> RuleSet:
    """The default (`offscope`) rule set, loaded and compiled once per process."""
    return load_rules(DEFAULT)
