"""Boundary probes (the boundary-probe study, runtime half): put questions to agent definitions
through the real proxy and score the answers.

Each agent file's system prompt goes into a fresh conversation with one probe
question (agent-evals' template, which asks for `CONFIDENCE: 0-100`), once at
temperature 0 and K times at 0.7. Questions come from agent-evals' bank (by its
domain rules, RULES.md) and offscope's bank (answer keys, so calibration can be
checked for correctness). Every call goes through an embedded offscope proxy,
so the live behavioural histograms fire and the calls are recorded in the
trace format; the default model is the simulated one (labelled simulated).

Scores are the rule set's (`score_agent`, the same code `offscope rescore`
runs), with intervals: clustered rates (Wilson hull with a probe-level
bootstrap) for boundary respect, refusal health and accuracy; a probe-level
(cluster) percentile bootstrap for the means. Plus the study's open question:
does incoherence predict wrong answers (AUROC of 1 - coherence, point-biserial
correlation)?
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import ssl
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache, partial
from pathlib import Path
from typing import Any, Literal

import httpx
import numpy as np
from pydantic import BaseModel, ConfigDict

from offscope import __version__
from offscope.behavior.rules import RULES_DIR, RuleSet, load_rules
from offscope.behavior.scoring import (
    BOUNDARY,
    CALIBRATION,
    FAILURE_MODES,
    AgentScores,
    AnswerKey,
    ProbeResponses,
    ScoredResponse,
    boundary_respected,
    brier_term,
    consistency_confidences,
    deflects,
    refusal_healthy,
    score_agent,
    score_response,
    used_responses,
)
from offscope.errors import InputError
from offscope.evalmode.stats import clustered_rate
from offscope.probes.census import AgentFile, StaticScore, load_agents, score_agent_static
from offscope.probes.probe_bank import load_probe_bank
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
from offscope.probes.rescore import round3

Bank = Literal["agent-evals", "offscope", "both"]
LEDGER_ID = "offscope-probe"
STOCHASTIC_T = 0.7
UNASSIGNED = "unassigned"
OUTCOMES = ("healthy_refusal", *FAILURE_MODES)


# ------------------------------------------------------------------ the banks


class _AeQuestion(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    question: str
    domain: str
    expected: str


class AgentEvalsBank(BaseModel):
    """agent-evals' `probes.yaml`: questions keyed by agent domain, plus `_generic`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    template: str
    questions: dict[str, list[_AeQuestion]]


@cache
def load_agent_evals_bank() -> AgentEvalsBank:
    from offscope.yamlio import load_model

    return load_model(AgentEvalsBank, RULES_DIR / "probes.yaml")


@dataclass
class Probe:
    """One question for one agent."""

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
    probes: list[Probe] = field(default_factory=list)


def _norm_domain(d: str) -> str:
    return d.lower().replace(" ", "_").replace("-", "_")


def _infer(agent: AgentFile, names: Sequence[str]) -> list[str]:
    """agent-evals' inference: domain keys whose name appears in id + name + the
    first 500 characters of the prompt (claimed `domains:` win)."""
    if agent.claimed_domains:
        claimed = [_norm_domain(d) for d in agent.claimed_domains]
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
        seen: dict[str, Probe] = {}

        def add(p: Probe, plan: AgentPlan = plan, seen: dict[str, Probe] = seen) -> None:
            key = " ".join(p.question.split()).lower()
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
                    Probe(
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
            from offscope.probes.probe_bank import expand

            domain = primary if primary in ob.domains else None
            if domain is None:
                for g in ob.generic:
                    add(
                        Probe(
                            g.id, g.question, g.domain, BOUNDARY, g.expected, g.answer, "offscope"
                        )
                    )
            else:
                for p in expand(ob, domain):
                    add(
                        Probe(
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


# ------------------------------------------------------------------ config


@dataclass
class ProbeConfig:
    paths: list[str]
    out: Path
    rules: str = "offscope"
    bank: Bank = "both"
    runs: int = 5
    budget: int | None = 600
    seed: int = 0
    model_url: str | None = None  # None: the simulated model on loopback
    model: str | None = None
    api_key_env: str | None = None
    disposition: str = "probe-default"
    workers: int = 8
    timeout: float = 120.0
    n_boot: int = 1000
    agents_only: bool = False
    confdir: Path | None = None

    @property
    def simulated(self) -> bool:
        return self.model_url is None

    def check(self) -> None:
        if self.runs < 0:
            raise InputError("--runs must be 0 or more")
        if self.budget is not None and self.budget < 1:
            raise InputError("--budget must be at least 1")
        if (self.model_url is None) != (self.model is None):
            raise InputError(
                "--model-url and --model go together",
                hint="name both, or neither for the simulated model",
            )
        if self.api_key_env and not os.environ.get(self.api_key_env):
            raise InputError(
                f"environment variable {self.api_key_env} is not set",
                hint="export it, or drop --api-key-env",
            )
        if self.workers < 1:
            raise InputError("--workers must be at least 1")


# ------------------------------------------------------------------ calling


@dataclass
class Call:
    run: int
    temperature: float
    raw: str = ""
    error: str = ""
    seconds: float = 0.0


def _run_id(agent_index: int, probe_id: str, run: int) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"probe-a{agent_index:03d}-{probe_id}-r{run}")


async def _complete(
    http: httpx.AsyncClient, url: str, headers: dict[str, str], body: dict[str, Any], run_id: str
) -> tuple[str, str]:
    """(text, error). Retries twice on 429, 5xx and transport errors."""
    err = ""
    for attempt in range(3):
        if attempt:
            await asyncio.sleep(0.5 * 2 ** (attempt - 1))
        try:
            r = await http.post(url, json=body, headers={**headers, "X-Offscope-Run": run_id})
        except httpx.HTTPError as exc:
            err = f"{type(exc).__name__}: {exc}"
            continue
        if r.status_code == 429 or r.status_code >= 500:
            err = f"HTTP {r.status_code}: {r.text[:200]}"
            continue
        if r.status_code != 200:
            return "", f"HTTP {r.status_code}: {r.text[:200]}"
        try:
            data = r.json()
            content = data["choices"][0]["message"].get("content") or ""
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            return "", f"unexpected response: {r.text[:200]}"
        if isinstance(content, list):  # content parts
            content = "".join(c.get("text", "") for c in content if isinstance(c, dict))
        return str(content), ""
    return "", err


# ------------------------------------------------------------------ metrics

_SUMS = (
    "bnd_hit",
    "bnd_n",
    "ref_ok",
    "ref_n",
    "coh_sum",
    "coh_n",
    "dec_sum",
    "dec_n",
    "words_sum",
    "words_n",
    "conf_sum",
    "conf_n",
    "brier_sum",
    "brier_n",
    "cor_k",
    "cor_n",
    "var_sum",
    "var_n",
)
MEAN_METRICS = (
    "calibration_confidence_only",
    "calibration_checked",
    "consistency_score",
    "coherence_score",
    "decisiveness_score",
    "mean_word_count",
)
RATE_METRICS = ("boundary_score", "refusal_health", "accuracy")


def _cluster_sums(p: ProbeResponses, rules: RuleSet) -> list[float]:
    """Per-probe totals behind each per-agent score (the terms `score_agent` sums)."""
    s = rules.scoring
    t = dict.fromkeys(_SUMS, 0.0)
    wants = s.refusal_expected_contains.lower() in p.expected.lower()
    for r in used_responses(p, s):
        if p.probe_type == BOUNDARY:
            t["bnd_n"] += 1
            t["bnd_hit"] += boundary_respected(r, s)
            t["dec_n"] += 1
            t["dec_sum"] += 1.0 - r.decisiveness_pos
        if wants:
            t["ref_n"] += 1
            t["ref_ok"] += refusal_healthy(r, s)
        if r.coherence_score is not None:
            t["coh_n"] += 1
            t["coh_sum"] += r.coherence_score
        t["words_n"] += 1
        t["words_sum"] += r.word_count
        if r.confidence is not None:
            t["conf_n"] += 1
            t["conf_sum"] += r.confidence
        if r.correct is not None:
            t["cor_n"] += 1
            t["cor_k"] += r.correct
            if r.confidence is not None:
                t["brier_n"] += 1
                t["brier_sum"] += brier_term(r.confidence, r.correct)
    confs = consistency_confidences(p, s)
    if len(confs) >= s.consistency_min_samples:
        t["var_n"] = 1
        t["var_sum"] = float(np.var(confs))
    return [t[k] for k in _SUMS]


def _metrics_from_sums(S: np.ndarray, rules: RuleSet) -> dict[str, np.ndarray]:
    """Each per-agent score from summed cluster totals (columns of S, rows = resamples)."""
    c = {k: S[:, i] for i, k in enumerate(_SUMS)}
    cal = rules.scoring.calibration

    def ratio(a: str, b: str) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(c[b] > 0, c[a] / np.where(c[b] > 0, c[b], 1), np.nan)

    mean_conf = ratio("conf_sum", "conf_n")
    return {
        "boundary_score": ratio("bnd_hit", "bnd_n"),
        "refusal_health": ratio("ref_ok", "ref_n"),
        "accuracy": ratio("cor_k", "cor_n"),
        "calibration_confidence_only": np.maximum(
            0.0, 1.0 - np.maximum(0.0, mean_conf - cal.free_up_to) / cal.span
        ),
        "calibration_checked": 1.0 - ratio("brier_sum", "brier_n"),
        "consistency_score": np.maximum(
            0.0, 1.0 - ratio("var_sum", "var_n") / rules.scoring.consistency_variance_divisor
        ),
        "coherence_score": ratio("coh_sum", "coh_n"),
        "decisiveness_score": ratio("dec_sum", "dec_n"),
        "mean_word_count": ratio("words_sum", "words_n"),
    }


def _resample_weights(n_clusters: int, n_boot: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n_clusters, size=(n_boot, n_clusters))
    w = np.zeros((n_boot, n_clusters))
    np.add.at(w, (np.arange(n_boot)[:, None], idx), 1)
    return w


def _rate_outcomes(
    probes: list[ProbeResponses], rules: RuleSet
) -> dict[str, tuple[list[bool], list[int]]]:
    """Per-response outcomes and probe (cluster) ids of the three rates."""
    s = rules.scoring
    out: dict[str, tuple[list[bool], list[int]]] = {m: ([], []) for m in RATE_METRICS}
    for i, p in enumerate(probes):
        wants = s.refusal_expected_contains.lower() in p.expected.lower()
        for r in used_responses(p, s):
            if p.probe_type == BOUNDARY:
                out["boundary_score"][0].append(
                    bool(
                        r.is_refusal
                        or r.hedging_score > s.boundary_hedging_above
                        or (r.confidence is not None and r.confidence < s.boundary_confidence_below)
                    )
                )
                out["boundary_score"][1].append(i)
            if wants:
                out["refusal_health"][0].append(
                    bool(r.is_refusal or r.hedging_score > s.refusal_hedging_above)
                )
                out["refusal_health"][1].append(i)
            if r.correct is not None:
                out["accuracy"][0].append(bool(r.correct))
                out["accuracy"][1].append(i)
    return out


def outcome_counts(probes: list[ProbeResponses], rules: RuleSet) -> dict[str, int]:
    """Failure modes (as `score_agent` counts them) plus healthy refusals: a boundary
    response that deflects with no failure mode."""
    counts = dict.fromkeys(OUTCOMES, 0)
    f = rules.failure_modes
    for p in probes:
        for r in used_responses(p, rules.scoring):
            for m in r.failure_modes:
                counts[m] = counts.get(m, 0) + 1
            if (
                p.probe_type == BOUNDARY
                and not r.failure_modes
                and deflects(r.confidence, r.hedging_score, r.is_refusal, f)
            ):
                counts["healthy_refusal"] += 1
    return counts


def group_metrics(
    probes: list[ProbeResponses], rules: RuleSet, n_boot: int, seed: int
) -> dict[str, Any]:
    """Point estimates (`score_agent`, exact) with 95% intervals; clusters are probes."""
    scores = score_agent(probes, rules)
    point = {
        **scores.live_scores(),
        "calibration_confidence_only": scores.calibration_confidence_only,
        "calibration_checked": scores.calibration_checked,
        "accuracy": scores.accuracy,
    }
    out: dict[str, Any] = {
        "scores": scores,
        "n_probes": len(probes),
        "n_responses": scores.responses_scored,
        "intervals": {},
        "outcomes": outcome_counts(probes, rules),
    }
    sums = (
        np.array([_cluster_sums(p, rules) for p in probes]) if probes else np.zeros((0, len(_SUMS)))
    )
    totals = sums.sum(axis=0) if len(probes) else np.zeros(len(_SUMS))
    boot: dict[str, np.ndarray] = {}
    if len(probes) >= 2 and n_boot > 0:
        boot = _metrics_from_sums(_resample_weights(len(probes), n_boot, seed) @ sums, rules)
    ns = dict(zip(_SUMS, totals, strict=True))
    n_of = {
        "calibration_confidence_only": ns["conf_n"],
        "calibration_checked": ns["brier_n"],
        "consistency_score": ns["var_n"],
        "coherence_score": ns["coh_n"],
        "decisiveness_score": ns["dec_n"],
        "mean_word_count": ns["words_n"],
    }
    for m in MEAN_METRICS:
        n = int(n_of[m])
        iv: dict[str, Any] = {
            "value": point[m],
            "n": n,
            "method": "probe-level bootstrap percentile",
            "ci95": None,
        }
        if n and m in boot:
            vals = boot[m][~np.isnan(boot[m])]
            if len(vals):
                lo, hi = np.quantile(vals, [0.025, 0.975])
                iv["ci95"] = [float(lo), float(hi)]
        if not n:
            iv["note"] = f"no data: {rules.scoring.default} is agent-evals' default"
        out["intervals"][m] = iv
    for m, (values, clusters) in _rate_outcomes(probes, rules).items():
        iv = {
            "value": point[m],
            "n": len(values),
            "k": int(sum(values)),
            "ci95": None,
            "method": "hull of wilson and probe-level bootstrap",
        }
        if values:
            cr = clustered_rate(values, clusters, n_boot=max(n_boot, 1), seed=seed)
            iv["ci95"] = [cr.ci[0], cr.ci[1]]
            iv["method"] = cr.method
            iv["design_effect"] = cr.design_effect
        else:
            iv["note"] = "no data"
        out["intervals"][m] = iv
    return out


# ------------------------------------------------------------------ coherence as a signal


def auroc(scores: np.ndarray, positive: np.ndarray) -> float | None:
    """P(score of a positive > score of a negative), ties count half (Mann-Whitney)."""
    from scipy.stats import rankdata

    n_pos = int(positive.sum())
    n_neg = len(positive) - n_pos
    if n_pos == 0 or n_neg == 0:
        return None
    ranks = rankdata(scores)
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def coherence_signal(
    details: list[tuple[int, ProbeDetail]], rules: RuleSet, n_boot: int, seed: int, simulated: bool
) -> dict[str, Any]:
    """Does incoherence flag wrong answers? On calibration probes with answer keys,
    the responses the rules score (stochastic by default) that report a confidence:
    AUROC of (1 - coherence) for incorrectness, with a probe-level bootstrap 95%
    interval, and the point-biserial correlation of coherence with correctness."""
    from scipy.stats import pointbiserialr

    coh: list[float] = []
    wrong: list[bool] = []
    cluster: list[int] = []
    for ci, (_, d) in enumerate(details):
        if d.probe_type != CALIBRATION or d.answer_key is None:
            continue
        for r in d.responses:
            if r.error or not r.raw or r.coherence_score is None or r.correct is None:
                continue
            if rules.scoring.responses != "all" and r.temperature <= 0:
                continue
            coh.append(r.coherence_score)
            wrong.append(not r.correct)
            cluster.append(ci)
    y = np.array(wrong, dtype=bool)
    x = np.array(coh, dtype=float)
    n_wrong, n = int(y.sum()), len(y)
    out: dict[str, Any] = {
        "question": "does incoherence (1 - coherence) flag wrong answers, without labels?",
        "population": "calibration probes with answer keys; scored responses that report a confidence",
        "n": n,
        "n_incorrect": n_wrong,
        "n_correct": n - n_wrong,
        "n_probes": len(set(cluster)),
        "auroc": None,
        "auroc_ci95": None,
        "bootstrap": {"n_boot": n_boot, "seed": seed, "method": "probe-level (cluster) percentile"},
        "point_biserial": None,
        "simulated": simulated,
    }
    out["auroc"] = auroc(1.0 - x, y) if n else None
    if out["auroc"] is not None and n_boot > 0:
        groups: dict[int, list[int]] = {}
        for i, c in enumerate(cluster):
            groups.setdefault(c, []).append(i)
        members = list(groups.values())
        rng = np.random.default_rng(seed)
        reps = []
        for _ in range(n_boot):
            pick = rng.integers(0, len(members), size=len(members))
            idx = np.concatenate([members[j] for j in pick])
            a = auroc(1.0 - x[idx], y[idx])
            if a is not None:
                reps.append(a)
        if reps:
            lo, hi = np.quantile(reps, [0.025, 0.975])
            out["auroc_ci95"] = [float(lo), float(hi)]
            out["bootstrap"]["usable_resamples"] = len(reps)
    if n >= 3 and 0 < n_wrong < n and np.ptp(x) > 0:
        r, p = pointbiserialr(~y, x)  # correctness (1 = right) vs coherence
        out["point_biserial"] = {
            "r": float(r),
            "p": float(p),
            "of": "correct (1) vs coherence; positive = coherent answers are right",
        }
    out["interpretation"] = _interpret(out)
    return out


def _interpret(s: dict[str, Any]) -> str:
    tag = "[simulated model] " if s["simulated"] else ""
    n, k = s["n"], s["n_incorrect"]
    if s["auroc"] is None or k < 5 or n - k < 5:
        return (
            f"{tag}too few wrong ({k}) or right ({n - k}) answers to tell whether coherence is a "
            f"usable label-free reliability signal for this model at this n"
        )
    a, ci = s["auroc"], s["auroc_ci95"]
    where = (
        f"AUROC {a:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "") + f", n={n}, {k} wrong"
    )
    if ci and ci[0] > 0.5 and a >= 0.7:
        return f"{tag}coherence is a usable label-free reliability signal for this model at this n ({where})"
    if ci and ci[0] > 0.5:
        return (
            f"{tag}coherence is a weak label-free reliability signal for this model at this n "
            f"({where}: better than chance, below 0.7)"
        )
    return (
        f"{tag}coherence isn't a usable label-free reliability signal for this model at this n "
        f"({where}: the interval includes 0.5)"
    )


# ------------------------------------------------------------------ live histograms


# Decisiveness is not a live family (it means something only on boundary decisions).
BEHAVIOR_FAMILIES = ("offscope_response_words", "offscope_response_coherence")


def parse_histograms(text: str, ledger: str = LEDGER_ID) -> dict[str, dict[str, float]]:
    """Sum and count of the behavioural histograms in a /metrics exposition, for one ledger."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {f: {"sum": 0.0, "count": 0.0} for f in BEHAVIOR_FAMILIES}
    for fam in text_string_to_metric_families(text):
        if fam.name not in out:
            continue
        for s in fam.samples:
            if s.labels.get("ledger") != ledger:
                continue
            if s.name.endswith("_sum"):
                out[fam.name]["sum"] += s.value
            elif s.name.endswith("_count"):
                out[fam.name]["count"] += s.value
    return out


def report_histograms(report: dict[str, Any], rules: RuleSet) -> dict[str, dict[str, float]]:
    """The same sums recomputed from the report's raw texts with `rules` (every
    response with text, any temperature: the proxy sees them all)."""
    out = {f: {"sum": 0.0, "count": 0.0} for f in BEHAVIOR_FAMILIES}
    for a in report.get("agents", []):
        for d in a.get("live_details") or []:
            for r in d.get("responses") or []:
                if not r.get("raw"):
                    continue
                s = score_response(r["raw"], rules)
                out["offscope_response_words"]["sum"] += s.word_count
                out["offscope_response_words"]["count"] += 1
                if s.coherence_score is not None:
                    out["offscope_response_coherence"]["sum"] += s.coherence_score
                    out["offscope_response_coherence"]["count"] += 1
    return out


def histograms_agree(
    a: dict[str, dict[str, float]], b: dict[str, dict[str, float]], tol: float = 1e-6
) -> bool:
    for f in BEHAVIOR_FAMILIES:
        if a[f]["count"] != b[f]["count"]:
            return False
        if f == "offscope_response_words":
            if a[f]["sum"] != b[f]["sum"]:
                return False
        elif abs(a[f]["sum"] - b[f]["sum"]) > tol * max(1.0, abs(a[f]["sum"])):
            return False
    return True


# ------------------------------------------------------------------ the run


@dataclass
class ProbeResult:
    report: dict[str, Any]
    out: Path
    calls: int
    dropped: int
    wall_seconds: float


ProgressFn = Callable[[int, int], None]


async def run_probe(
    cfg: ProbeConfig,
    progress: ProgressFn | None = None,
    before_stop: Callable[[Any], Awaitable[None]] | None = None,
) -> ProbeResult:
    """Plan, call every probe through an embedded proxy, score, write the report.
    `before_stop(proxy)` runs after the last call, while the proxy still serves
    /metrics (tests scrape it there)."""
    if cfg.confdir is not None:
        return await _run_probe(cfg, cfg.confdir, progress, before_stop)
    # A throwaway CA: its private key lives and dies with the run, never in --out.
    import tempfile

    with tempfile.TemporaryDirectory(prefix="offscope-probe-ca-") as confdir:
        return await _run_probe(cfg, Path(confdir), progress, before_stop)


async def _run_probe(
    cfg: ProbeConfig,
    confdir: Path,
    progress: ProgressFn | None,
    before_stop: Callable[[Any], Awaitable[None]] | None,
) -> ProbeResult:
    from offscope.evalmode.harness import LoopbackServer, bounded, harness, trusted_ca
    from offscope.evalmode.sim.simmodel import app as sim_app
    from offscope.probes.simprobe import answer, load_probe_disposition, probe_model
    from offscope.proxy.mitm.server import ProxyConfig

    cfg.check()
    rules = load_rules(cfg.rules)
    agents, files = load_agents(cfg.paths, rules)
    if cfg.agents_only:
        agents = [a for a in agents if a.kind == "agent"]
    if not agents:
        raise InputError(
            "no agent definition files found",
            hint="give .md/.txt agent files or folders (at least 20 bytes each)",
        )
    plans = plan_probes(agents, rules, cfg.bank)
    dropped = apply_budget(plans, cfg.runs, cfg.budget)
    total_calls = sum(len(p.probes) for p in plans) * (1 + cfg.runs)

    out = cfg.out
    out.mkdir(parents=True, exist_ok=True)
    trace = out / "trace.jsonl"
    if trace.exists():
        trace.unlink()  # one run per out dir: the trace matches the report
    profile = load_probe_disposition(cfg.disposition) if cfg.simulated else None
    ca = trusted_ca(confdir)

    t0 = time.perf_counter()
    model = probe_model(profile, cfg.seed) if profile is not None else None
    apps = {"simprobe": sim_app(model, answer)} if model is not None else {}
    model_name = model.model_id if model is not None else str(cfg.model)

    def chat_url(servers: dict[str, LoopbackServer]) -> str:
        base_url = (
            f"{servers['simprobe'].url}/v1" if model is not None else str(cfg.model_url).rstrip("/")
        )
        return base_url + "/chat/completions"

    def proxy_config(servers: dict[str, LoopbackServer]) -> ProxyConfig:
        host = httpx.URL(chat_url(servers)).host
        ledger = out / "ledger.yaml"
        ledger.write_text(
            "# Written by `offscope probe`: the model host is the one in-scope target.\n"
            f"schema: offscope.ledger/1\nid: {LEDGER_ID}\n"
            "description: boundary probes; the model API is the only target\n"
            f"targets:\n  hosts: [{json.dumps(host)}]\nllm:\n  hosts: [{json.dumps(host)}]\n",
            encoding="utf-8",
        )
        return ProxyConfig(
            ledger=str(ledger),
            listen_port=0,
            metrics="127.0.0.1:0",
            trace=str(trace),
            confdir=str(confdir),
            idle_timeout=max(600.0, cfg.timeout * 4),
        )

    headers = {"content-type": "application/json"}
    if cfg.api_key_env:
        headers["authorization"] = f"Bearer {os.environ[cfg.api_key_env]}"

    calls: dict[tuple[int, int], list[Call]] = {}
    done = 0
    scraped: dict[str, dict[str, float]] | None = None
    async with harness(apps, proxy_config) as h:
        engine, url = h.engine, chat_url(h.servers)
        template = load_agent_evals_bank().template

        verify = ssl.create_default_context(cafile=str(ca))  # the proxy's CA (HTTPS models)
        async with httpx.AsyncClient(proxy=h.proxy.url, verify=verify, timeout=cfg.timeout) as http:

            async def one(ai: int, pi: int) -> None:
                nonlocal done
                plan = plans[ai]
                probe = plan.probes[pi]
                prompt = template.replace("%s", probe.question, 1)
                results: list[Call] = []
                for run in range(cfg.runs + 1):
                    temp = 0.0 if run == 0 else STOCHASTIC_T
                    body = {
                        "model": model_name,
                        "temperature": temp,
                        "seed": cfg.seed + run,
                        "messages": [
                            {"role": "system", "content": plan.agent.system_prompt},
                            {"role": "user", "content": prompt},
                        ],
                    }
                    run_id = _run_id(ai, probe.id, run)
                    engine.start_run(
                        run_id,
                        {
                            "kind": "probe",
                            "agent": plan.agent.id,
                            "probe": probe.id,
                            "probe_type": probe.probe_type,
                            "run": str(run),
                            "temperature": str(temp),
                        },
                    )
                    c0 = time.perf_counter()
                    text, err = await _complete(http, url, headers, body, run_id)
                    engine.end_run(run_id, "end" if not err else "exit", detail=err or None)
                    results.append(Call(run, temp, text, err, time.perf_counter() - c0))
                    done += 1
                    if progress:
                        progress(done, total_calls)
                calls[(ai, pi)] = results

            await bounded(
                [
                    partial(one, ai, pi)
                    for ai, plan in enumerate(plans)
                    for pi in range(len(plan.probes))
                ],
                cfg.workers,
            )
        if h.proxy.metrics_port:
            async with httpx.AsyncClient(timeout=10) as direct:
                r = await direct.get(f"http://127.0.0.1:{h.proxy.metrics_port}/metrics")
                scraped = parse_histograms(r.text)
        if before_stop is not None:
            await before_stop(h.proxy)
    wall = time.perf_counter() - t0

    report = build_report(
        cfg, rules, plans, calls, files, len(agents), model_name, profile, dropped, wall
    )
    if scraped is not None:
        recomputed = report_histograms(report, load_rules("offscope"))
        report["live_metrics"] = {
            "source": "the embedded proxy's /metrics (ledger offscope-probe), scraped after the last call",
            "rules": "offscope (the proxy's rule set)",
            "proxy": scraped,
            "from_report": recomputed,
            "agree": histograms_agree(scraped, recomputed),
        }
    ProbeReport.model_validate(report)
    (out / "probe-report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (out / "transcript.md").write_text(write_transcript(report), encoding="utf-8")
    return ProbeResult(report, out, sum(len(v) for v in calls.values()), dropped, wall)


# ------------------------------------------------------------------ the report


def _record(call: Call, probe: Probe, rules: RuleSet) -> tuple[ResponseRecord, ScoredResponse]:
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
