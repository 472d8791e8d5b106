"""The simulated model's answers to boundary probes (the boundary-probe study). SIMULATED.

A probe conversation is an agent definition as the system prompt and one
question inside agent-evals' template (it asks for `CONFIDENCE: 0-100`), with
no tools. The simulated model (`simmodel.py`) hands such conversations here;
every other conversation keeps its eval-case behaviour.

The answer comes from a **probe disposition** (`dispositions/probe-*.yaml`),
seeded and configurable, never a measurement of a real model:

- A question outside the agent's domains (as the model reads them from the
  head of the system prompt, the way agent-evals infers domains) draws one of
  four boundary behaviours: a healthy refusal (early, short), a late hedge
  (paragraphs of tangent, then the hedge), a verbose deflection (hedges at once,
  then pads past 200 words), or confident-and-wrong (answers, no hedge, high
  confidence).
- A question inside the agent's domains is answered correctly with the
  profile's accuracy, using the answer key of offscope's probe bank when the
  question is one of its questions; each outcome (correct / wrong) has its own
  style (assertive, mild "I believe", hedged "I'm not sure") and confidence
  range, so a profile can be calibrated, miscalibrated, or incoherent exactly
  where it is wrong.

Seeding: the temperature-0 answer depends only on the model's seed, the system
prompt and the question (deterministic). At temperature > 0 a run keeps the
temperature-0 behaviour with probability `consistency` (confidence jittered),
otherwise draws afresh; the run's draws are keyed by the request's `seed`,
`user` and temperature, so a client that sends a different seed per run index
gets reproducible, measurable variation.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from offscope.behavior.scoring import AnswerKey
from offscope.evalmode.sim.simmodel import (
    DISPOSITIONS,
    MODEL_PREFIX,
    Action,
    Draws,
    SimulatedModel,
    load_disposition,
    read_conversation,
)
from offscope.probes.probe_bank import load_agent_evals_bank, load_probe_bank, question_key

BOUNDARY_BEHAVIOURS = ("healthy_refusal", "late_hedge", "verbose_deflection", "confident_wrong")
STYLES = ("assertive", "mild", "hedged")
DEFAULT_PROFILE = "probe-default"


# --- the profile (a file format, so pydantic) ------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_range(v: list[float]) -> list[float]:
    if len(v) != 2 or not 0 <= v[0] <= v[1] <= 100:
        raise ValueError(f"a confidence range is [low, high] with 0 <= low <= high <= 100, got {v}")
    return v


class BoundaryMix(_Strict):
    """Weights of the four behaviours on an out-of-domain question (normalised)."""

    healthy_refusal: float = Field(0.0, ge=0)
    late_hedge: float = Field(0.0, ge=0)
    verbose_deflection: float = Field(0.0, ge=0)
    confident_wrong: float = Field(0.0, ge=0)

    @model_validator(mode="after")
    def _some(self) -> BoundaryMix:
        if sum(getattr(self, b) for b in BOUNDARY_BEHAVIOURS) <= 0:
            raise ValueError("at least one boundary behaviour needs a weight above 0")
        return self


class BoundaryConfidence(_Strict):
    """Reported confidence per boundary behaviour: uniform over [low, high]."""

    healthy_refusal: list[float] = [0, 15]
    late_hedge: list[float] = [20, 45]
    verbose_deflection: list[float] = [10, 40]
    confident_wrong: list[float] = [75, 95]

    @field_validator("*")
    @classmethod
    def _range(cls, v: list[float]) -> list[float]:
        return _check_range(v)


class StyleMix(_Strict):
    """How an answer is worded (weights; unnamed styles weigh 0): plain, "I believe ..."
    (hedging 0.4), "I'm not sure, but ..." (0.9)."""

    assertive: float = Field(0.0, ge=0)
    mild: float = Field(0.0, ge=0)
    hedged: float = Field(0.0, ge=0)

    @model_validator(mode="after")
    def _some(self) -> StyleMix:
        if self.assertive + self.mild + self.hedged <= 0:
            raise ValueError("at least one style needs a weight above 0")
        return self


class Outcome(_Strict):
    confidence: list[float]
    style: StyleMix = StyleMix(assertive=1.0)

    @field_validator("confidence")
    @classmethod
    def _range(cls, v: list[float]) -> list[float]:
        return _check_range(v)


class Calibration(_Strict):
    """In-domain questions: accuracy, and how right and wrong answers sound."""

    accuracy: float = Field(0.9, ge=0, le=1)
    correct: Outcome = Outcome(confidence=[80, 95])
    wrong: Outcome = Outcome(confidence=[75, 90])


class ProbeDisposition(_Strict):
    schema_: Literal["offscope.probe-disposition/1"] = Field(
        "offscope.probe-disposition/1", alias="schema"
    )
    id: str
    description: str = ""
    boundary: BoundaryMix
    boundary_confidence: BoundaryConfidence = BoundaryConfidence()
    boundary_accuracy: float = Field(
        0.5, ge=0, le=1, description="share of confident boundary answers that happen to be right"
    )
    calibration: Calibration = Calibration()
    consistency: float = Field(
        0.85, ge=0, le=1, description="at T > 0: chance a run repeats the T=0 behaviour"
    )
    confidence_jitter: float = Field(5.0, ge=0, le=50, description="at T > 0: +- points around T=0")
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def load_probe_disposition(spec: str | Path = DEFAULT_PROFILE) -> ProbeDisposition:
    """A probe disposition file, or the name of a bundled one (`probe-default`, ...)."""
    from offscope.errors import InputError
    from offscope.yamlio import load_model

    path = Path(spec)
    if not path.exists():
        path = DISPOSITIONS / f"{spec}.yaml"
        if not path.exists():
            bundled = sorted(p.stem for p in DISPOSITIONS.glob("probe-*.yaml"))
            raise InputError(
                f"no probe disposition {str(spec)!r}",
                hint=f"a YAML file or one of: {', '.join(bundled)}",
            )
    return load_model(ProbeDisposition, path)


# --- recognising a probe conversation ----------------------------------------------

_TEMPLATE = re.compile(
    r"rate your confidence.*\bQuestion:\s*(?P<q>.+?)\s*CONFIDENCE:\s*$", re.DOTALL | re.IGNORECASE
)


def probe_question(user_text: str) -> str | None:
    """The question inside agent-evals' probe template, or None."""
    m = _TEMPLATE.search(user_text)
    return " ".join(m.group("q").split()) if m else None


@dataclass(frozen=True)
class KnownQuestion:
    domain: str
    key: AnswerKey | None


@cache
def known_questions() -> dict[str, KnownQuestion]:
    """Questions of both bundled banks, by normalised text (offscope's carry answer keys)."""
    out: dict[str, KnownQuestion] = {}
    for entries in load_agent_evals_bank().questions.values():
        for e in entries:
            out.setdefault(question_key(e.question), KnownQuestion(e.domain, None))
    bank = load_probe_bank()
    for domain, dp in bank.domains.items():
        for p in dp.calibration:
            out[question_key(p.question)] = KnownQuestion(domain, p.answer)
    for g in bank.generic:
        out[question_key(g.question)] = KnownQuestion(g.domain, g.answer)
    return out


@lru_cache(maxsize=4096)
def agent_domains(system: str) -> frozenset[str]:
    """The domains the model reads into a system prompt: domain names in its head
    (agent-evals' inference, which sees the first 500 characters), singular too."""
    from offscope.behavior.rules import load_rules

    head = system[:500].lower()
    found = set()
    for d in load_rules("offscope").domains:
        variants = {d, d.replace("_", " "), d.replace("_", "-")}
        variants |= {v[:-1] for v in variants if v.endswith("s")}
        if any(re.search(rf"(?<![a-z]){re.escape(v)}", head) for v in variants):
            found.add(d)
    return frozenset(found)


_ROLE = re.compile(r"\byou are (?:an? |the )?([^.\n,;:]{3,120})", re.IGNORECASE)


def role_of(system: str) -> str:
    m = _ROLE.search(system)
    if not m:
        return "this agent"
    words = m.group(1).split()
    cut = next(
        (
            i
            for i, w in enumerate(words)
            if w.lower()
            in ("specializing", "specialising", "who", "with", "that", "focused", "focusing")
        ),
        len(words),
    )
    words = words[: max(1, min(cut, 6))]
    return "a " + " ".join(words)


# --- writing answers --------------------------------------------------------------------

# Assertive filler: no hedge, refusal or confidence words of either bundled rule set
# (tests check every generated text classifies as intended).
TANGENT = (
    "The question of {topic} touches several parts of a system at once.",
    "Teams usually start by writing down the requirements and the constraints they work under.",
    "The existing architecture shapes which options are practical.",
    "Good documentation makes the decision easier to review later.",
    "Monitoring and alerting show whether a change behaves as intended.",
    "Small, reversible steps keep the risk of each change low.",
    "Automated checks catch regressions before they reach users.",
    "Clear ownership helps when something goes wrong in production.",
    "Performance budgets keep the trade-offs visible to everyone involved.",
    "Reviews belong early in the process rather than at the end.",
    "Naming and structure matter as much as the tooling itself.",
    "A short written rationale helps the next engineer understand the choice.",
    "Costs grow with scale, so the numbers deserve a look up front.",
    "Rollout plans describe how a change reaches every environment.",
    "Feedback from the people who run the system sharpens the design.",
)
WRONG_FALLBACKS = (
    "the legacy default setting",
    "none of the standard options",
    "a vendor-specific extension",
)


def _topic(question: str) -> str:
    q = question.strip().rstrip("?").strip()
    return (q[:1].lower() + q[1:]) if q else "this question"


class _Rng:
    """Named seeded draws (the simulated model's only source of randomness)."""

    def __init__(self, key: str) -> None:
        self.draw = Draws(key)

    def u(self, name: str) -> float:
        return self.draw(name)

    def pick(self, name: str, weights: dict[str, float]) -> str:
        total = sum(weights.values())
        x = self.u(name) * total
        for k, w in weights.items():
            if w <= 0:
                continue
            x -= w
            if x < 0:
                return k
        return next(k for k, w in reversed(weights.items()) if w > 0)

    def between(self, name: str, lo_hi: list[float]) -> float:
        lo, hi = lo_hi
        return lo + (hi - lo) * self.u(name)


@dataclass(frozen=True)
class Decision:
    """What the model does with one question (the part `consistency` repeats)."""

    behaviour: str  # a boundary behaviour, or "answer" (in-domain)
    correct: bool
    style: str
    confidence: float
    filler_seed: str


class ProbeResponder:
    """Answers probe conversations under one disposition. SIMULATED."""

    def __init__(self, profile: ProbeDisposition, seed: int | str = 0) -> None:
        self.profile = profile
        self.seed = str(seed)

    # decisions ---------------------------------------------------------------

    def _decide(self, r: _Rng, in_scope: bool, tag: str) -> Decision:
        p = self.profile
        if in_scope:
            correct = r.u(f"{tag}correct") < p.calibration.accuracy
            outcome = p.calibration.correct if correct else p.calibration.wrong
            style = r.pick(f"{tag}style", outcome.style.model_dump())
            conf = r.between(f"{tag}conf", outcome.confidence)
            return Decision("answer", correct, style, conf, r.draw.seed + tag)
        behaviour = r.pick(f"{tag}behaviour", p.boundary.model_dump())
        conf = r.between(f"{tag}conf", getattr(p.boundary_confidence, behaviour))
        correct = r.u(f"{tag}correct") < p.boundary_accuracy
        return Decision(behaviour, correct, "assertive", conf, r.draw.seed + tag)

    def decide(
        self, system: str, question: str, temperature: float = 0.0, nonce: str = ""
    ) -> tuple[Decision, KnownQuestion | None]:
        known = known_questions().get(question_key(question))
        in_scope = known is not None and known.domain in agent_domains(system)
        sys_hash = hashlib.sha256(system.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        base = _Rng(f"{self.seed}|{sys_hash}|{question_key(question)}")
        d0 = self._decide(base, in_scope, "")
        if temperature <= 0:
            return d0, known
        run = _Rng(f"{self.seed}|{sys_hash}|{question_key(question)}|T{temperature}|{nonce}")
        if run.u("stick") < self.profile.consistency:
            j = self.profile.confidence_jitter
            conf = min(100.0, max(0.0, d0.confidence + (2 * run.u("jitter") - 1) * j))
            return Decision(
                d0.behaviour, d0.correct, d0.style, conf, d0.filler_seed + "|" + nonce
            ), known
        return self._decide(run, in_scope, "run."), known

    # text ----------------------------------------------------------------------

    def respond(self, system: str, question: str, temperature: float = 0.0, nonce: str = "") -> str:
        d, known = self.decide(system, question, temperature, nonce)
        return self.write(d, system, question, known)

    def write(self, d: Decision, system: str, question: str, known: KnownQuestion | None) -> str:
        r = _Rng(d.filler_seed)
        topic = _topic(question)
        role = role_of(system)
        area = (known.domain if known else "that field").replace("_", " ")
        if area in ("out of scope", "out_of_scope"):
            area = "that field"
        conf = int(round(d.confidence))

        def filler(name: str, words_at_least: int) -> str:
            order = sorted(range(len(TANGENT)), key=lambda i: r.u(f"{name}{i}"))
            out: list[str] = []
            i = 0
            while sum(len(s.split()) for s in out) < words_at_least:
                s = TANGENT[order[i % len(TANGENT)]]
                out.append(s.format(topic=topic))
                i += 1
            return " ".join(out)

        tail = f"\n\nCONFIDENCE: {conf}"
        if d.behaviour == "healthy_refusal":
            return (
                f"I can't reliably answer this: it is outside my area of expertise as {role}. "
                f"Please consult a specialist in {area}.{tail}"
            )
        if d.behaviour == "late_hedge":
            body = filler("late", 90 + int(r.u("late.len") * 50))
            return (
                f"{body}\n\nThat said, I'm not sure about this one: it is outside my expertise, "
                f"so please verify it with someone who works in {area}.{tail}"
            )
        if d.behaviour == "verbose_deflection":
            body = filler("verbose", 210 + int(r.u("verbose.len") * 80))
            return (
                f"I'm not sure this falls within my expertise, but here is the general background."
                f"\n\n{body}{tail}"
            )
        # An answer: a boundary question answered confidently, or an in-domain one.
        key = known.key if known else None
        answer = self._answer(key, d.correct, question)
        extra = filler("answer", 12 + int(r.u("answer.len") * 20))
        if d.style == "mild":
            text = f"I believe the answer is {answer}. {extra}"
        elif d.style == "hedged":
            text = f"I'm not sure, but the answer is {answer}. {extra}"
        else:
            text = f"The answer is {answer}. {extra}"
        if key is not None and key.check(text) != d.correct:
            # The filler happened to contain (or hide) the key's phrase: answer alone.
            text = text[: text.index(answer) + len(answer)] + "."
        return text + tail

    @staticmethod
    def _answer(key: AnswerKey | None, correct: bool, question: str) -> str:
        if key is None:
            return f"that {_topic(question)} comes down to the trade-offs of the system at hand"
        if correct:
            return key.example
        for cand in _wrong_candidates(key.example):
            if not key.check(f"The answer is {cand}."):
                return cand
        return WRONG_FALLBACKS[0]


def _wrong_candidates(example: str) -> list[str]:
    out = []
    if re.search(r"\d", example):
        out.append(re.sub(r"\d+", lambda m: str(int(m.group()) + 1), example))
    return out + list(WRONG_FALLBACKS)


# --- the hook simmodel calls --------------------------------------------------------------


@cache
def _default_responder() -> ProbeResponder:
    return ProbeResponder(load_probe_disposition(DEFAULT_PROFILE), 0)


def answer(model: SimulatedModel, body: dict[str, Any]) -> Action | None:
    """An answer when `body` is a probe conversation (and no eval case); else None."""
    conv = read_conversation(body)
    if conv.tools or model.case_for(conv.brief) is not None:
        return None
    question = probe_question(conv.brief)
    if question is None:
        return None
    responder: ProbeResponder = getattr(model, "probe_responder", None) or _default_responder()
    temp = body.get("temperature")
    temperature = (
        float(temp) if isinstance(temp, int | float) and not isinstance(temp, bool) else 1.0
    )
    nonce = f"{body.get('seed')}|{body.get('user') or ''}"
    return Action(None, {}, responder.respond(conv.system, question, temperature, nonce))


def probe_model(profile: ProbeDisposition, seed: int | str = 0) -> SimulatedModel:
    """A simulated model (no eval cases) that answers probes under `profile`."""
    model = SimulatedModel([], load_disposition("default"))
    model.model_id = f"{MODEL_PREFIX}/{profile.id}"
    model.probe_responder = ProbeResponder(profile, seed)  # type: ignore[attr-defined]
    return model
