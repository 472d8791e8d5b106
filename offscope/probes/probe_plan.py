"""Which probes each agent of a probe run is asked: its domain, the questions of
both banks (agent-evals' by its domain rules, offscope's for its primary domain,
a question asked once), and agent-evals' budget rule when there are too many."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from offscope.behavior.rules import RuleSet
from offscope.behavior.scoring import BOUNDARY, CALIBRATION, AnswerKey
from offscope.probes.census import AgentFile, StaticScore, norm_domain, score_agent_static
from offscope.probes.probe_bank import (
    Bank,
    expand,
    load_agent_evals_bank,
    load_probe_bank,
    question_key,
)

UNASSIGNED = "unassigned"


@dataclass
class PlannedProbe:
    """One question for one agent, from either bank (`probe_bank.Probe` is one of offscope's
    bank, before planning)."""

    id: str
    question: str
    domain: str  # the question's domain
    probe_type: str  # boundary | calibration
    expected: str
    answer: AnswerKey | None
    bank: str  # agent-evals | offscope


@dataclass
class AgentPlan:
    agent: AgentFile
    static: StaticScore
    primary_domain: str
    ae_domains: list[str]
    probes: list[PlannedProbe] = field(default_factory=list)


def _infer(agent: AgentFile, names: Sequence[str]) -> list[str]:
    """agent-evals' inference: domain keys whose name appears in id + name + the
    first 500 characters of the prompt (claimed `domains:` win)."""
    if agent.claimed_domains:
        claimed = [norm_domain(d) for d in agent.claimed_domains]
        return [d for d in claimed if d in names]
    head = f"{agent.id} {agent.name} {agent.system_prompt[:500]}".lower()
    return [d for d in names if d != "_generic" and d in head]


def primary_domain(agent: AgentFile, static: StaticScore, rules: RuleSet) -> str:
    """The agent's domain for offscope's bank and per-domain reporting: a claimed or
    name-inferred domain (highest static relevance first), else its most relevant
    strong domain, else `unassigned`."""
    names = list(rules.domains)
    order = {d: i for i, d in enumerate(names)}
    cands = _infer(agent, names)
    if not cands:
        cands = list(static.strong_domains)
    if not cands:
        return UNASSIGNED
    return min(cands, key=lambda d: (-static.relevance.get(d, 0.0), order.get(d, 99)))


def plan_probes(agents: Sequence[AgentFile], rules: RuleSet, bank: Bank) -> list[AgentPlan]:
    """Probes per agent: agent-evals' bank (generic first, then its domains' questions,
    ids `probe_NNNN` numbered across agents as agent-evals does) and offscope's bank
    (the primary domain's boundary, generic and keyed calibration probes). A question
    asked twice is asked once; it keeps an answer key if either bank has one."""
    ae = load_agent_evals_bank()
    ob = load_probe_bank()
    counter = 0
    plans = []
    for agent in agents:
        static = score_agent_static(agent, rules)
        primary = primary_domain(agent, static, rules)
        ae_domains = _infer(agent, list(ae.questions))
        plan = AgentPlan(agent, static, primary, ae_domains)
        seen: dict[str, PlannedProbe] = {}

        def add(
            p: PlannedProbe, plan: AgentPlan = plan, seen: dict[str, PlannedProbe] = seen
        ) -> None:
            key = question_key(p.question)
            if key in seen:
                if seen[key].answer is None and p.answer is not None:
                    seen[key].answer = p.answer
                return
            seen[key] = p
            plan.probes.append(p)

        if bank in ("agent-evals", "both"):
            entries = [(q, "_generic") for q in ae.questions.get("_generic", [])]
            for d in ae_domains:
                entries += [(q, d) for q in ae.questions[d]]
            for q, d in entries:
                ptype = CALIBRATION if q.domain == d else BOUNDARY
                add(
                    PlannedProbe(
                        f"probe_{counter:04d}",
                        q.question,
                        q.domain,
                        ptype,
                        q.expected,
                        None,
                        "agent-evals",
                    )
                )
                counter += 1
        if bank in ("offscope", "both"):
            domain = primary if primary in ob.domains else None
            if domain is None:
                for g in ob.generic:
                    add(
                        PlannedProbe(
                            g.id, g.question, g.domain, BOUNDARY, g.expected, g.answer, "offscope"
                        )
                    )
            else:
                for p in expand(ob, domain):
                    add(
                        PlannedProbe(
                            p.id,
                            p.question,
                            p.domain,
                            p.probe_type,
                            p.expected,
                            p.answer,
                            "offscope",
                        )
                    )
        plans.append(plan)
    return plans


def apply_budget(plans: list[AgentPlan], runs: int, budget: int | None) -> int:
    """agent-evals' budget rule: at most budget // (1 + runs) probes in all; when
    over, boundary probes first (stable), the rest dropped. Returns probes dropped."""
    if budget is None:
        return 0
    max_probes = budget // (1 + runs)
    flat = [(i, p) for i, plan in enumerate(plans) for p in plan.probes]
    if len(flat) <= max_probes:
        return 0
    priority = {BOUNDARY: 0, "refusal": 1, "overlap": 2, CALIBRATION: 3}
    keep = sorted(flat, key=lambda ip: priority.get(ip[1].probe_type, 3))[:max_probes]
    kept_ids = {id(p) for _, p in keep}
    for plan in plans:
        plan.probes = [p for p in plan.probes if id(p) in kept_ids]
    return len(flat) - len(keep)
