"""The census report: the scored corpus of agent prompts (census.py) and how far its
boundary language can be trusted (census_validation.py), as one JSON-ready dict.

Its own module because the validation scores its hand-labelled corpus with the census's
own loaders and scorers: the report is the one place that needs both.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from offscope.behavior.rules import RuleSet
from offscope.probes.census import (
    KINDS,
    AgentFile,
    StaticScore,
    aggregate,
    load_agents,
    per_domain,
    score_agent_static,
)
from offscope.probes.census_validation import boundary_validation


def run_census(
    paths: Sequence[str | Path], rules: RuleSet, agents_only: bool = False
) -> dict[str, Any]:
    """The census report as a JSON-ready dict.

    `boundary_validation` says how far "boundary language" can be trusted: precision and
    recall of each built-in rule set against hand labels (census_validation).
    """
    agents, files = load_agents(paths, rules)
    scored = [(a, score_agent_static(a, rules)) for a in agents]
    true_agents = [(a, s) for a, s in scored if a.kind == "agent"]
    shown = true_agents if agents_only else scored
    kinds = Counter(a.kind for a in agents)
    return {
        "kind": "offscope-census",
        "rules": rules.name,
        "inputs": [str(p) for p in paths],
        "files_scanned": files,
        "unique": len(agents),
        "duplicates_collapsed": files - len(agents),
        "dedup_method": "sha256-system-prompt",
        "agents_only": agents_only,
        "kinds": {k: kinds.get(k, 0) for k in KINDS},
        "aggregate": {"all": aggregate(scored), "agents": aggregate(true_agents)},
        "domains": per_domain(shown, rules),
        "boundary_validation": boundary_validation(rules),
        "agents": [_agent_row(a, s) for a, s in shown],
    }


def _agent_row(a: AgentFile, s: StaticScore) -> dict[str, Any]:
    return {
        "id": a.id,
        "name": a.name,
        "source": a.source,
        "kind": a.kind,
        "content_hash": a.content_hash,
        "also_found_in": a.also_found_in,
        "instance_count": 1 + len(a.also_found_in),
        "static_scores": {
            "scope_clarity_score": s.scope_clarity,
            "boundary_definition_score": s.boundary_definition,
            "uncertainty_guidance_score": s.uncertainty_guidance,
            "has_boundary_language": s.has_boundary_language,
            "has_uncertainty_guidance": s.has_uncertainty_guidance,
            "strong_domains": s.strong_domains,
            "word_count": s.word_count,
        },
        "domains": s.relevance,
        "probe_domains": s.probe_domains,
    }
