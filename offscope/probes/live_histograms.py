"""The live behavioural histograms of a probe run: what the embedded proxy's /metrics
counted, the same recomputed from the report's raw texts, and whether they agree."""

from __future__ import annotations

from typing import Any

from offscope.behavior.rules import RuleSet
from offscope.behavior.scoring import score_response
from offscope.probes.probe_config import LEDGER_ID

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
