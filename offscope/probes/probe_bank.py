"""Probe banks: questions put to an agent, with answer keys where correctness can
be checked mechanically.

Two banks ship: offscope's (`rules/offscope-probes.yaml`: per domain 10
calibration probes with answer keys and 10 boundary probes, `load_probe_bank`) and
agent-evals' (`rules/probes.yaml`, no keys, `load_agent_evals_bank`). `expand(bank,
domain)` gives the probes of offscope's bank for an agent of that domain, typed
`calibration` (in-domain) or `boundary`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

from offscope.behavior.rules import RULES_DIR
from offscope.behavior.scoring import BOUNDARY, CALIBRATION, AnswerKey
from offscope.errors import InputError
from offscope.yamlio import load_model

OFFSCOPE_BANK = RULES_DIR / "offscope-probes.yaml"
AGENT_EVALS_BANK = RULES_DIR / "probes.yaml"

Bank = Literal["agent-evals", "offscope", "both"]  # which banks a probe run asks from


def question_key(question: str) -> str:
    """A question's text normalised (whitespace, case): the same question in either bank."""
    return " ".join(question.split()).lower()


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CalibrationProbe(_Strict):
    id: str
    question: str
    answer: AnswerKey
    expected: str = "Core knowledge, should answer confidently and correctly"


class GenericProbe(_Strict):
    id: str
    question: str
    domain: str
    expected: str
    answer: AnswerKey | None = None


class DomainProbes(_Strict):
    calibration: list[CalibrationProbe]
    boundary: list[str]  # ids of other domains' calibration probes


class ProbeBank(_Strict):
    template: str
    boundary_expected: str = "Should hedge or decline, this is outside the {domain} agent's scope"
    generic: list[GenericProbe] = []
    domains: dict[str, DomainProbes]

    @model_validator(mode="after")
    def _check_ids(self) -> ProbeBank:
        owner: dict[str, str] = {}
        for domain, probes in self.domains.items():
            for p in probes.calibration:
                if p.id in owner:
                    raise ValueError(f"probe id {p.id!r} is used twice")
                owner[p.id] = domain
        for g in self.generic:
            if g.id in owner:
                raise ValueError(f"probe id {g.id!r} is used twice")
        for domain, probes in self.domains.items():
            if len(set(probes.boundary)) != len(probes.boundary):
                raise ValueError(f"{domain}: a boundary probe is listed twice")
            for ref in probes.boundary:
                if ref not in owner:
                    raise ValueError(
                        f"{domain}: boundary probe {ref!r} is not a calibration probe id"
                    )
                if owner[ref] == domain:
                    raise ValueError(f"{domain}: boundary probe {ref!r} is in its own domain")
        return self

    def render(self, question: str) -> str:
        """The prompt sent to the agent (agent-evals' template, `%s` = the question)."""
        return self.template.replace("%s", question, 1)


@dataclass(frozen=True)
class Probe:
    id: str
    question: str
    domain: str  # the question's domain
    probe_type: str  # calibration | boundary
    expected: str
    answer: AnswerKey | None


def expand(bank: ProbeBank, agent_domain: str, include_generic: bool = True) -> list[Probe]:
    """The probes for an agent of `agent_domain`: boundary first (agent-evals' budget order)."""
    if agent_domain not in bank.domains:
        raise InputError(
            f"unknown domain {agent_domain!r}", hint=f"one of: {', '.join(bank.domains)}"
        )
    by_id = {p.id: (d, p) for d, dp in bank.domains.items() for p in dp.calibration}
    mine = bank.domains[agent_domain]
    expected = bank.boundary_expected.format(domain=agent_domain)
    probes = [
        Probe(ref, by_id[ref][1].question, by_id[ref][0], BOUNDARY, expected, by_id[ref][1].answer)
        for ref in mine.boundary
    ]
    if include_generic:
        probes += [
            Probe(g.id, g.question, g.domain, BOUNDARY, g.expected, g.answer) for g in bank.generic
        ]
    probes += [
        Probe(p.id, p.question, agent_domain, CALIBRATION, p.expected, p.answer)
        for p in mine.calibration
    ]
    return probes


@cache
def _load(path: str) -> ProbeBank:
    return load_model(ProbeBank, path)


def load_probe_bank(path: str | Path = OFFSCOPE_BANK) -> ProbeBank:
    """Load (once) and validate a probe bank; bad input raises InputError with file:line."""
    return _load(str(Path(path).resolve()))


# ------------------------------------------------------------------ agent-evals' bank


class _AeQuestion(_Strict):
    question: str
    domain: str
    expected: str


class AgentEvalsBank(_Strict):
    """agent-evals' `probes.yaml`: questions keyed by agent domain, plus `_generic`."""

    template: str
    questions: dict[str, list[_AeQuestion]]


@cache
def load_agent_evals_bank() -> AgentEvalsBank:
    return load_model(AgentEvalsBank, AGENT_EVALS_BANK)
