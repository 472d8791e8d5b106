"""The statistics of a probe run: each score of a group of probes (an agent, a
domain, all) with a 95% interval (clustered rates for boundary respect, refusal
health and accuracy; a probe-level bootstrap for the means), the outcome counts,
and the study's open question: does incoherence flag wrong answers (AUROC of
1 - coherence, point-biserial correlation)?"""

from __future__ import annotations

from typing import Any

import numpy as np

from offscope.behavior.rules import RuleSet
from offscope.behavior.scoring import (
    BOUNDARY,
    CALIBRATION,
    FAILURE_MODES,
    ProbeResponses,
    boundary_respected,
    brier_term,
    consistency_confidences,
    deflects,
    refusal_healthy,
    score_agent,
    used_responses,
)
from offscope.evalmode.stats import clustered_rate
from offscope.probes.probe_report import ProbeDetail

OUTCOMES = ("healthy_refusal", *FAILURE_MODES)


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
