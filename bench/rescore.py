"""Benchmark: rescoring speed of the behavioural trace metrics.

Generates 10,000 responses deterministically (seeded): 50-400 words of
technical prose, some with hedges or refusals at varying depths, most with a
CONFIDENCE line. Scores them (per response, then per agent) with both shipped
rule sets and prints JSON. Target: under 1 s for 10,000 responses, because the
proxy scores every LLM assistant text with the same function.

    python bench/rescore.py [--n 10000] [--seed 7]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time

from offscope.behavior.rules import load_rules
from offscope.behavior.scoring import ProbeResponses, ScoredResponse, score_agent, score_response

_TEXT = (
    "the service handles requests through a connection pool and retries idempotent calls "
    "with exponential backoff while the database keeps a write ahead log so that replicas "
    "can catch up after a partition heals and the cache invalidates keys on every update "
    "which keeps latency low under load but adds complexity to deployment pipelines and "
    "monitoring dashboards that track error budgets service level objectives and saturation"
)
_WORDS = _TEXT.split(" ")
_HEDGES = (
    "I'm not sure about this, but",
    "This is outside my expertise, so",
    "I think",
    "It might be that",
    "Probably",
    "I don't know the exact figure, however",
    "I believe",
    "I cannot reliably say, and",
    "Approximately speaking,",
    "I strongly recommend consulting a specialist because",
)


def make_responses(n: int, seed: int) -> list[tuple[str, str]]:
    """(probe_type, text) pairs, the same for the same seed."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(50, 400))]
        sentences = [
            " ".join(words[i : i + 15]).capitalize() + "." for i in range(0, len(words), 15)
        ]
        if rng.random() < 0.5:  # a hedge somewhere: early, middle or buried
            at = int(len(sentences) * rng.choice((0.0, 0.3, 0.6, 0.95)))
            sentences.insert(at, rng.choice(_HEDGES))
        text = "\n\n".join(" ".join(sentences[i : i + 4]) for i in range(0, len(sentences), 4))
        if rng.random() < 0.9:
            text += f"\n\nCONFIDENCE: {rng.randint(0, 100)}"
        out.append((rng.choice(("boundary", "calibration")), text))
    return out


def bench(responses: list[tuple[str, str]], rules_name: str) -> dict:
    rules = load_rules(rules_name)
    score_response("warm up the compiled patterns. CONFIDENCE: 50", rules)
    t0 = time.perf_counter()
    scores = [score_response(text, rules, probe_type) for probe_type, text in responses]
    t1 = time.perf_counter()
    probes = [
        ProbeResponses(pt, "Should hedge", [ScoredResponse(s, 0.7)])
        for (pt, _), s in zip(responses, scores, strict=True)
    ]
    score_agent(probes, rules)
    t2 = time.perf_counter()
    n = len(responses)
    return {
        "rules": rules_name,
        "score_seconds": round(t1 - t0, 4),
        "aggregate_seconds": round(t2 - t1, 4),
        "total_seconds": round(t2 - t0, 4),
        "responses_per_second": round(n / (t2 - t0)),
        "meets_target": (t2 - t0) < 1.0 * n / 10_000,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    responses = make_responses(args.n, args.seed)
    words = [len(t.split()) for _, t in responses]
    print(
        json.dumps(
            {
                "benchmark": "rescore",
                "responses": args.n,
                "seed": args.seed,
                "mean_words": round(sum(words) / len(words), 1),
                "target_seconds_per_10k": 1.0,
                "python": platform.python_version(),
                "results": [bench(responses, name) for name in ("agent-evals", "offscope")],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
