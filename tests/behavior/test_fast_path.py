"""The fast path (literal pre-checks, `\\b` rewrite) must give exactly what a plain
regex scan of the rule patterns gives, for both rule sets."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from offscope.behavior.rules import load_rules
from offscope.behavior.scoring import score_response

FRAGMENTS = [
    "I don't know",
    "i dont know",
    "I'm not sure",
    "Im not sure",
    "I’m not sure",
    "outside my",
    "beyond my",
    "I believe",
    "I think",
    "approximately",
    "probably",
    "might",
    "mighty",
    "mightier",
    "I thinking",
    "outside my area of expertise",
    "not within my domain",
    "isn't my scope",
    "I cannot provide",
    "I can't reliably",
    "please consult a",
    "please consult the",
    "I strongly recommend consulting",
    "I'm not qualified",
    "i am not sure",
    "out of scope",
    "to the best of my knowledge",
    "CONFIDENCE: 85",
    "confidence:7",
    "Confidence 1234",
    "CONFIDENCE:\n 42",
    "**Confidence:** 60",
    "CONFİDENCE: 50",
    "Ça",
    "é",
    "ß",
    "\x1c",
    "_",
    "-",
    " ",
    "\n",
    "\t",
    ".",
    ",",
    "x",
    "I",
    "MIGHT",
]


def reference(text: str, rules):
    """Plain, slow reading of RULES.md: every pattern searched on its own."""
    r = rules.response
    flags = re.ASCII if r.ascii else 0
    conf = None
    for c in r.confidence:
        ms = list(re.finditer(c.pattern, text, flags))
        if ms:
            chosen = ms[0] if c.occurrence == "first" else ms[-1]
            conf = min(float(chosen.group(1)), r.confidence_cap)
            break
    lower = text.lower()
    hedging, starts, refusal = 0.0, [], False
    for h in r.hedges:
        if m := re.search(h.pattern, lower, flags):
            hedging = max(hedging, h.weight)
            starts.append(m.start())
    for p in r.refusals:
        if m := re.search(p, lower, flags):
            refusal = True
            starts.append(m.start())
    if starts:
        first = min(starts)
        pos = (
            len(lower[:first].encode()) / len(text.encode())
            if r.position_unit == "bytes"
            else first / len(text)
        )
    else:
        pos = 0.0 if conf is not None and conf >= r.no_signal_confident_at else 1.0
    return conf, hedging, refusal, pos


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.sampled_from(FRAGMENTS), max_size=25), st.sampled_from(["agent-evals", "offscope"])
)
def test_fast_path_equals_plain_regex(parts, name):
    rules = load_rules(name)
    text = " ".join(parts) if len(parts) % 2 else "".join(parts)
    s = score_response(text, rules, "boundary")
    assert (s.confidence, s.hedging_score, s.is_refusal, s.decisiveness_pos) == reference(
        text, rules
    )
