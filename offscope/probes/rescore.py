"""Rescore: recompute behavioural metrics from stored response text, no API call.

Sources, in agent-evals' order (RULES.md, rescore): a report's per-agent
`live_details[].responses[].raw` (agent-evals' JSON or offscope's ProbeReport);
failing that, a markdown transcript. The report is edited in place as a JSON
dict, so keys this code does not know survive untouched.

What is written: `live_scores.coherence_score / decisiveness_score /
mean_word_count` (exactly as agent-evals' rescore writes them, rounding
included), a per-agent `rescore` block with every per-agent score under the
chosen rules, and a `rescore` block on each response.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from offscope.behavior.rules import RuleSet
from offscope.behavior.scoring import (
    AgentScores,
    AnswerKey,
    ProbeResponses,
    ScoredResponse,
    score_agent,
    score_response,
)
from offscope.errors import InputError
from offscope.probes.probe_report import FORMAT, SCHEMA_VERSION, ProbeReport
from offscope.yamlio import read_text  # also used by `offscope rescore --transcript`

_AGENT = re.compile(r"^## (.+)$")
_PROBE = re.compile(r"^### Probe \d+: (\S+) \((\w+)\)$")
_RESPONSE = re.compile(r"^#### Response \((.+)\)")
_TEMP_RUN = re.compile(r"T=([\d.]+), run (\d+)")
_META = re.compile(r"^\*\*(Domain|Expected|Question):\*\* ?(.*)$")


def round3(x: float) -> float:
    """agent-evals' rounding: float64(int(f*1000+0.5)) / 1000 (truncation toward zero)."""
    return float(int(x * 1000 + 0.5)) / 1000


# ---------------------------------------------------------------- transcript


@dataclass
class TranscriptResponse:
    run: int
    temperature: float
    raw: str


@dataclass
class TranscriptProbe:
    probe_id: str
    probe_type: str
    domain: str = ""
    expected: str = ""
    question: str = ""
    responses: list[TranscriptResponse] = field(default_factory=list)


def _lines(text: str) -> list[str]:
    # Go's bufio.ScanLines: split on \n, drop one trailing \r, no empty last token.
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def parse_transcript(
    text: str, keep_closing_fence: bool = True
) -> dict[str, list[TranscriptProbe]]:
    """Per agent id, its probes with raw response texts (agent-evals' transcript format).

    A response is every line after the first fence that follows `#### Response (...)`,
    up to the next `## `, `### `, `#### ` line or `---` line: responses may contain
    bare fences of their own. agent-evals keeps the closing fence and any blank lines
    in the raw text (`keep_closing_fence`); offscope's rules drop them.
    """
    agents: dict[str, list[TranscriptProbe]] = {}
    agent: str | None = None
    probe: TranscriptProbe | None = None
    temp, run = 0.0, 0
    collecting = in_code = False
    code: list[str] = []

    def flush() -> None:
        nonlocal collecting, in_code, code
        if in_code and probe is not None and code:
            body = code
            if not keep_closing_fence:
                body = list(code)
                while body and not body[-1].strip():
                    body.pop()
                if body and body[-1].startswith("```"):
                    body.pop()
            probe.responses.append(TranscriptResponse(run, temp, "\n".join(body)))
        code = []
        in_code = collecting = False

    for line in _lines(text):
        structural = line.startswith(("## ", "### ", "#### ")) or line == "---"
        if collecting and structural:
            flush()
        if m := _AGENT.match(line):
            agent = m.group(1)
            agents.setdefault(agent, [])
            probe = None
            continue
        if (m := _PROBE.match(line)) and agent is not None:
            probe = TranscriptProbe(probe_id=m.group(1), probe_type=m.group(2))
            agents[agent].append(probe)
            continue
        if m := _RESPONSE.match(line):
            label = m.group(1)
            collecting, in_code, code = True, False, []
            if label.startswith("deterministic"):
                temp, run = 0.0, 0
            elif tm := _TEMP_RUN.search(label):
                temp, run = float(tm.group(1)), int(tm.group(2))
            continue
        if collecting:
            if not in_code:
                in_code = line.startswith("```")
                continue
            code.append(line)
        elif probe is not None and (m := _META.match(line)):
            setattr(probe, m.group(1).lower(), m.group(2).strip())
    flush()
    return agents


# ------------------------------------------------------------------ scoring


def _score_details(details: list[dict[str, Any]], rules: RuleSet) -> AgentScores:
    """Rescore one agent's `live_details` in place (adds `rescore` to each response)."""
    probes = []
    for d in details:
        if not isinstance(d, dict):
            continue
        probe_type = str(d["probe_type"]) if isinstance(d.get("probe_type"), str) else ""
        key = (
            AnswerKey.model_validate(d["answer_key"])
            if isinstance(d.get("answer_key"), dict)
            else None
        )
        pr = ProbeResponses(probe_type=probe_type, expected=str(d.get("expected") or ""))
        for r in d.get("responses") or []:
            if not isinstance(r, dict) or not isinstance(r.get("raw"), str) or not r["raw"]:
                continue  # agent-evals skips responses without text
            temp = r.get("temperature")
            temp = (
                float(temp) if isinstance(temp, int | float) and not isinstance(temp, bool) else 0.0
            )
            s = score_response(r["raw"], rules, probe_type or None, key)
            r["rescore"] = s.as_dict()
            pr.responses.append(ScoredResponse(s, temp))  # agent-evals ignores `error` here
        probes.append(pr)
    return score_agent(probes, rules)


def _score_transcript_probes(probes: list[TranscriptProbe], rules: RuleSet) -> AgentScores:
    return score_agent(
        [
            ProbeResponses(
                p.probe_type,
                p.expected,
                [
                    ScoredResponse(
                        score_response(r.raw, rules, p.probe_type or None), r.temperature
                    )
                    for r in p.responses
                ],
            )
            for p in probes
        ],
        rules,
    )


def _block(scores: AgentScores, rules: RuleSet, source: str) -> dict[str, Any]:
    return {"rules": rules.name, "source": source, **scores.as_dict()}


@dataclass
class RescoreResult:
    report: dict[str, Any]
    source: str  # "live_details" | "transcript" | "none"
    rescored: list[str]  # agent ids
    unmatched: list[str] = field(default_factory=list)  # transcript agents not in the report


def validate_report(data: Any, path: str | None = None) -> None:
    """Raise InputError unless `data` is shaped like a probe report."""
    if not isinstance(data, dict) or not isinstance(data.get("agents"), list):
        raise InputError(
            "report has no 'agents' array",
            path=path,
            hint="pass an agent-evals or offscope probe report (JSON)",
        )
    try:
        ProbeReport.model_validate(data)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in err["loc"])
        raise InputError(f"{where}: {err['msg']}", path=path) from None


def rescore(
    report: dict[str, Any] | None, rules: RuleSet, transcript: str | None = None
) -> RescoreResult:
    """Rescore a report dict (edited in place), or build one from a transcript alone."""
    if report is None:
        if transcript is None:
            raise InputError(
                "nothing to rescore", hint="give a REPORT.json, --transcript FILE.md, or both"
            )
        return _from_transcript_only(transcript, rules)

    validate_report(report)
    rescored = []
    for agent in report["agents"]:
        live = agent.get("live_scores")
        details = agent.get("live_details")
        if not isinstance(live, dict) or not isinstance(details, list):
            continue
        scores = _score_details(details, rules)
        live["coherence_score"] = scores.coherence_score
        live["decisiveness_score"] = scores.decisiveness_score
        live["mean_word_count"] = round3(scores.mean_word_count)
        agent["rescore"] = _block(scores, rules, "live_details")
        rescored.append(agent.get("id", ""))
    if rescored:
        return RescoreResult(report, "live_details", rescored)
    if transcript is None:
        return RescoreResult(report, "none", [])

    parsed = parse_transcript(transcript, rules.transcript.keep_closing_fence)
    by_id = {
        a.get("id"): a
        for a in report["agents"]
        if a.get("id") and isinstance(a.get("live_scores"), dict)
    }
    unmatched = []
    for agent_id, probes in parsed.items():
        scores = _score_transcript_probes(probes, rules)
        agent = by_id.get(agent_id)
        if agent is None:
            unmatched.append(agent_id)  # agent-evals skips these too
            continue
        live = agent["live_scores"]
        r = round3 if rules.transcript.round_transcript_scores else float
        live["coherence_score"] = r(scores.coherence_score)
        live["decisiveness_score"] = r(scores.decisiveness_score)
        live["mean_word_count"] = round3(scores.mean_word_count)
        agent["rescore"] = _block(scores, rules, "transcript")
        rescored.append(agent_id)
    return RescoreResult(report, "transcript", rescored, unmatched)


def _from_transcript_only(transcript: str, rules: RuleSet) -> RescoreResult:
    """No report: a fresh ProbeReport whose agents carry the transcript's responses."""
    parsed = parse_transcript(transcript, rules.transcript.keep_closing_fence)
    agents: list[dict[str, Any]] = []
    for agent_id, probes in parsed.items():
        details = [
            {
                "probe_id": p.probe_id,
                "question": p.question,
                "domain": p.domain,
                "probe_type": p.probe_type,
                "expected": p.expected,
                "responses": [
                    {"run": r.run, "temperature": r.temperature, "raw": r.raw} for r in p.responses
                ],
            }
            for p in probes
        ]
        scores = _score_details(details, rules)
        agents.append(
            {
                "id": agent_id,
                "live_scores": {
                    **scores.live_scores(),
                    "probes_run": len(probes),
                    "calibration_confidence_only": scores.calibration_confidence_only,
                    "calibration_checked": scores.calibration_checked,
                    "calibration_method": scores.calibration_method,
                    "accuracy": scores.accuracy,
                    "failure_modes": scores.failure_modes,
                },
                "live_details": details,
                "rescore": _block(scores, rules, "transcript"),
            }
        )
    report = ProbeReport(
        agents=agents, format=FORMAT, schema_version=SCHEMA_VERSION, rules=rules.name
    ).dump()
    # dump() drops None values; keep the agents exactly as built.
    report["agents"] = agents
    return RescoreResult(report, "transcript", [a["id"] for a in agents])


def read_json(path: str) -> dict[str, Any]:
    text = read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON: {exc.msg}", path=path, line=exc.lineno) from None
    validate_report(data, path)
    return data
