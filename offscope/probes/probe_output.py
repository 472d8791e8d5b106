"""What a probe run writes: the report (every call scored, per agent, per domain and
overall with intervals, plus the coherence signal) and agent-evals' markdown
transcript of it."""

from __future__ import annotations

import re
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from offscope import __version__
from offscope.behavior.rules import RuleSet
from offscope.behavior.scoring import (
    AgentScores,
    ProbeResponses,
    ScoredResponse,
    score_response,
)
from offscope.probes.probe_bank import load_agent_evals_bank
from offscope.probes.probe_calls import Call
from offscope.probes.probe_config import STOCHASTIC_T, ProbeConfig
from offscope.probes.probe_plan import UNASSIGNED, AgentPlan, PlannedProbe
from offscope.probes.probe_report import (
    FORMAT,
    SCHEMA_VERSION,
    AgentEntry,
    LiveScores,
    ProbeDetail,
    ProbeReport,
    ResponseRecord,
    StaticScores,
)
from offscope.probes.probe_stats import coherence_signal, group_metrics
from offscope.probes.rescore import round3


def _record(
    call: Call, probe: PlannedProbe, rules: RuleSet
) -> tuple[ResponseRecord, ScoredResponse]:
    s = score_response(call.raw, rules, probe.probe_type, probe.answer)
    rec = ResponseRecord(
        run=call.run,
        temperature=call.temperature,
        confidence=s.confidence,
        hedging_score=s.hedging_score,
        is_refusal=s.is_refusal,
        raw=call.raw,
        error=call.error,
        coherence_score=s.coherence_score,
        word_count=s.word_count,
        decisiveness_pos=s.decisiveness_pos,
        correct=s.correct if call.raw else None,
        failure_modes=list(s.failure_modes),
    )
    return rec, ScoredResponse(
        s, call.temperature, call.error or ("" if call.raw else "empty response")
    )


def _live_scores(scores: AgentScores, probes_run: int) -> LiveScores:
    return LiveScores(
        boundary_score=scores.boundary_score,
        calibration_score=scores.calibration_score,
        refusal_health=scores.refusal_health,
        consistency_score=scores.consistency_score,
        coherence_score=scores.coherence_score,
        decisiveness_score=scores.decisiveness_score,
        mean_word_count=round3(scores.mean_word_count),
        probes_run=probes_run,
        calibration_confidence_only=scores.calibration_confidence_only,
        calibration_checked=scores.calibration_checked,
        calibration_method=scores.calibration_method,
        accuracy=scores.accuracy,
        failure_modes=scores.failure_modes,
    )


def _group_block(g: dict[str, Any]) -> dict[str, Any]:
    s: AgentScores = g["scores"]
    return {
        "n_probes": g["n_probes"],
        "n_responses": g["n_responses"],
        "calibration_method": s.calibration_method,
        "metrics": g["intervals"],
        "outcomes": g["outcomes"],
    }


def build_report(
    cfg: ProbeConfig,
    rules: RuleSet,
    plans: list[AgentPlan],
    calls: dict[tuple[int, int], list[Call]],
    files: int,
    unique: int,
    model_name: str,
    profile: Any,
    dropped: int,
    wall: float,
) -> dict[str, Any]:
    entries: list[AgentEntry] = []
    per_agent_probes: list[list[ProbeResponses]] = []
    all_details: list[tuple[int, ProbeDetail]] = []
    by_domain: dict[str, list[ProbeResponses]] = {}
    domain_agents: Counter[str] = Counter()
    blocks = []
    for ai, plan in enumerate(plans):
        details, probes = [], []
        for pi, probe in enumerate(plan.probes):
            recs, scored = [], []
            for call in calls.get((ai, pi), []):
                rec, sr = _record(call, probe, rules)
                recs.append(rec)
                scored.append(sr)
            detail = ProbeDetail(
                probe_id=probe.id,
                question=probe.question,
                domain=probe.domain,
                probe_type=probe.probe_type,
                expected=probe.expected,
                responses=recs,
                answer_key=probe.answer,
                bank=probe.bank,
            )
            details.append(detail)
            all_details.append((ai, detail))
            probes.append(ProbeResponses(probe.probe_type, probe.expected, scored))
        per_agent_probes.append(probes)
        by_domain.setdefault(plan.primary_domain, []).extend(probes)
        domain_agents[plan.primary_domain] += 1
        g = group_metrics(probes, rules, cfg.n_boot, cfg.seed)
        blocks.append(g)
        a, st = plan.agent, plan.static
        entries.append(
            AgentEntry(
                id=a.id,
                name=a.name,
                source=a.source,
                kind=a.kind,
                domains=st.relevance,
                static_scores=StaticScores(
                    scope_clarity_score=st.scope_clarity,
                    boundary_definition_score=st.boundary_definition,
                    uncertainty_guidance_score=st.uncertainty_guidance,
                    has_boundary_language=st.has_boundary_language,
                    has_uncertainty_guidance=st.has_uncertainty_guidance,
                    strong_domains=st.strong_domains,
                    word_count=st.word_count,
                ),
                content_hash=a.content_hash,
                also_found_in=a.also_found_in or None,
                instance_count=1 + len(a.also_found_in) if a.also_found_in else None,
                live_scores=_live_scores(g["scores"], len(plan.probes)),
                live_details=details,
                primary_domain=plan.primary_domain,
                probe_domains=plan.ae_domains,
                live_intervals=_group_block(g),
            )
        )

    overall = group_metrics([p for ps in per_agent_probes for p in ps], rules, cfg.n_boot, cfg.seed)
    domains = []
    for d in sorted(by_domain, key=lambda d: (d == UNASSIGNED, d)):
        g = group_metrics(by_domain[d], rules, cfg.n_boot, cfg.seed)
        domains.append({"domain": d, "agents": domain_agents[d], **_group_block(g)})
    n_calls = sum(len(v) for v in calls.values())
    errors = sum(1 for v in calls.values() for c in v if c.error)
    lossy = sum(1 for v in calls.values() for c in v if not _transcript_safe(c.raw))
    simulated = profile is not None
    config = {
        "command": "offscope probe",
        "harness_version": __version__,
        "inputs": [str(p) for p in cfg.paths],
        "model": model_name,
        "model_url": None if simulated else cfg.model_url,
        "simulated": simulated,
        "disposition": profile.id if simulated else None,
        "disposition_profile": profile.model_dump(by_alias=True) if simulated else None,
        "rules": rules.name,
        "bank": cfg.bank,
        "runs": cfg.runs,
        "temperatures": [0.0, STOCHASTIC_T],
        "budget": cfg.budget,
        "seed": cfg.seed,
        "seeds": "temperature 0: seed; run i: seed + i",
        "agents_only": cfg.agents_only,
        "n_boot": cfg.n_boot,
        "template": load_agent_evals_bank().template,
    }
    report = ProbeReport(
        timestamp=datetime.now(UTC).isoformat(timespec="seconds"),
        version=__version__,
        agents=entries,
        live_summary={
            "total_api_calls": n_calls,
            "agents_probed": sum(1 for p in plans if p.probes),
            "planned_calls": sum(len(p.probes) for p in plans) * (1 + cfg.runs),
            "budget": cfg.budget,
            "probes_dropped_by_budget": dropped,
            "errors": errors,
            "wall_seconds": round(wall, 3),
        },
        scan_metadata={
            "total_files_scanned": files,
            "unique_agents": unique,
            "duplicates_collapsed": files - unique,
            "dedup_method": "sha256-system-prompt",
        },
        format=FORMAT,
        schema_version=SCHEMA_VERSION,
        rules=rules.name,
        model=model_name,
        simulated=simulated,
        config=config,
        summary=_group_block(overall),
        domains=domains,
        coherence_signal=coherence_signal(all_details, rules, cfg.n_boot, cfg.seed, simulated),
        transcript={
            "file": "transcript.md",
            "responses_not_round_tripping": lossy,
            "note": "a response with a line starting '## ', '### ', '#### ' or '---', or ending in "
            "whitespace, does not round-trip through agent-evals' transcript format; "
            "probe-report.json keeps every response exactly",
        },
    )
    # Nulls stay explicit inside records (a response with no confidence says so);
    # top-level and agent-level keys that do not apply are left out, as agent-evals does.
    data = report.model_dump(mode="json", by_alias=True)
    data = {k: v for k, v in data.items() if v is not None}
    data["agents"] = [{k: v for k, v in a.items() if v is not None} for a in data["agents"]]
    return data


# ------------------------------------------------------------------ transcript

_STRUCTURAL = re.compile(r"^(## |### |#### |---$)", re.MULTILINE)


def _transcript_safe(raw: str) -> bool:
    return not raw or (
        not _STRUCTURAL.search(raw) and raw == raw.rstrip() and not raw.endswith("```")
    )


def write_transcript(report: dict[str, Any]) -> str:
    """agent-evals' markdown transcript (RULES.md, rescore), which `offscope rescore
    --transcript` reads back."""
    sim = " (SIMULATED model)" if report.get("simulated") else ""
    lines = [
        "# Probe Transcript",
        "",
        f"Model: {report.get('model')}{sim}; rules: {report.get('rules')}; "
        f"offscope {report.get('version')}",
        "",
    ]
    total = 0
    for a in report["agents"]:
        lines += [f"## {a['id']}", ""]
        for i, d in enumerate(a.get("live_details") or [], 1):
            lines += [
                f"### Probe {i}: {d['probe_id']} ({d['probe_type']})",
                "",
                f"**Domain:** {d.get('domain', '')}",
                "",
                f"**Expected:** {d.get('expected', '')}",
                "",
                f"**Question:** {d.get('question', '')}",
                "",
            ]
            for r in d.get("responses") or []:
                total += 1
                t = r.get("temperature", 0.0)
                label = "deterministic" if not t else f"T={t:g}, run {r.get('run', 0)}"
                lines += [f"#### Response ({label})", ""]
                if r.get("error"):
                    lines += [f"- **Error:** {r['error']}", ""]
                    continue
                conf = r.get("confidence")
                lines += [
                    f"- **Confidence:** {'none' if conf is None else f'{conf:g}'}",
                    f"- **Hedging:** {r.get('hedging_score', 0.0):.2f}",
                    f"- **Refusal:** {'true' if r.get('is_refusal') else 'false'}",
                    "",
                    "```",
                    r.get("raw", ""),
                    "```",
                    "",
                ]
            lines += ["---", ""]
    lines += [f"*{total} total API calls*", ""]
    return "\n".join(lines)
