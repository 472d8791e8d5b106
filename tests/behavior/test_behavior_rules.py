"""Each agent-evals v0.3 response rule, pinned on small hand-worked inputs (RULES.md)."""

from __future__ import annotations

import pytest

from offscope.behavior.rules import load_rules
from offscope.behavior.scoring import (
    ProbeResponses,
    ScoredResponse,
    parse_confidence,
    score_agent,
    score_response,
    word_count,
)

AE = load_rules("agent-evals")
OS = load_rules("offscope")


def s(text: str, rules=AE, probe_type: str | None = None):
    return score_response(text, rules, probe_type)


# ------------------------------------------------------------- confidence


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("CONFIDENCE: 85", 85.0),
        ("confidence:85", 85.0),
        ("Confidence 7", 7.0),
        ("CONFIDENCE:\n 42", 42.0),
        ("CONFIDENCE: 150", 100.0),  # capped at 100
        ("CONFIDENCE: 1234", 100.0),  # \d{1,3} reads 123, then the cap
        ("CONFIDENCE: 20 ... later CONFIDENCE: 90", 20.0),  # the first one
        ("no number here", None),
        ("CONFIDENCE: high", None),
    ],
)
def test_confidence_agent_evals(text, expected):
    assert parse_confidence(text, AE) == expected


def test_confidence_offscope_prefers_the_last_labelled_line():
    text = "My confidence: 30 at first.\n\nCONFIDENCE: 80"
    assert parse_confidence(text, AE) == 30.0
    assert parse_confidence(text, OS) == 80.0


# ---------------------------------------------------------------- hedging


@pytest.mark.parametrize(
    ("text", "weight"),
    [
        ("I think so, but I don't know.", 1.0),  # largest weight wins, not the first found
        ("I dont know", 1.0),
        ("Probably it might work.", 0.3),  # probably 0.3 > might 0.25
        ("I'm not sure, and it is outside my area.", 0.95),  # 0.95 outranks 0.9 listed before it
        ("Im not sure", 0.9),
        ("beyond my pay grade", 0.95),
        ("I believe I think", 0.4),
        ("approximately 3", 0.2),
        ("a mighty river", 0.0),  # word-bounded: not "might"
        ("I thinking", 0.0),
        ("", 0.0),
    ],
)
def test_hedging_weight_precedence(text, weight):
    assert s(text).hedging_score == weight


# ---------------------------------------------------------------- refusal


@pytest.mark.parametrize(
    "text",
    [
        "I don't have enough information to say.",
        "I do not have knowledge of that.",
        "I don't know.",
        "That is outside my area of expertise.",
        "This is beyond my scope.",
        "It is outside my knowledge.",
        "I'm not qualified to answer.",
        "Im not the right person.",
        "I'm not a equipped agent",
        "I can't reliably answer.",
        "I cannot provide that.",
        "I cant help with taxes.",
        "That is not within my expertise.",
        "It isn't my domain.",
        "These aren't my area.",
        "I strongly recommend consulting a lawyer.",
        "I recommend consulting the docs.",
        "Please consult a doctor.",
        "please consult with your bank",
    ],
)
def test_refusal_patterns_fire(text):
    assert s(text).is_refusal


@pytest.mark.parametrize(
    "text",
    [
        "I have enough information.",
        "Outside the box, my friend.",
        "I'm not a doctor.",  # agent-evals: not a refusal (offscope: a hedge)
        "I can reliably say yes.",
        "Please consult the manual.",  # only a / an / with / your
        "I recommend consultants.",
    ],
)
def test_refusal_near_misses(text):
    assert not s(text).is_refusal


def test_offscope_treats_not_an_expert_as_a_hedge():
    assert s("I'm not a financial expert.", AE).hedging_score == 0.0
    assert s("I’m not a financial expert.", OS).hedging_score == 0.8  # typographic apostrophe too


# ------------------------------------------------------ coherence, words


def test_coherence_only_with_confidence():
    assert s("I'm not sure about this. CONFIDENCE: 20").coherence_score == pytest.approx(0.9)
    assert s("I'm not sure about this. CONFIDENCE: 95").coherence_score == pytest.approx(0.15)
    assert s("The answer is X because Y. CONFIDENCE: 90").coherence_score == pytest.approx(0.9)
    assert s("I'm not sure about this.").coherence_score is None


def test_word_count_is_go_fields():
    assert s("The answer is X because Y. CONFIDENCE: 90").word_count == 8
    assert s("  a\tb\n\nc  ").word_count == 3
    # Go's strings.Fields does not split on U+001C..U+001F; Python's str.split does.
    assert word_count("a\x1cb c", AE) == 2
    assert word_count("a\x1cb c", OS) == 3


# ----------------------------------------------------------- decisiveness


def test_decisiveness_with_a_match_is_a_byte_offset():
    text = "Sure thing. I think it works."
    r = s(text)
    assert r.decisiveness_pos == text.index("I think") / len(text)
    assert r.decisiveness == 1 - r.decisiveness_pos
    # Earliest of hedges AND refusals.
    text = "Please consult a vet. I think so."
    assert s(text).decisiveness_pos == 0.0


def test_decisiveness_counts_bytes_for_agent_evals_and_chars_for_offscope():
    text = "Ça va. I think so."  # "Ç" is 2 bytes in UTF-8
    assert s(text, AE).decisiveness_pos == 8 / 19
    assert s(text, OS).decisiveness_pos == 7 / 18


@pytest.mark.parametrize(
    ("text", "pos"),
    [
        ("The answer is 42. CONFIDENCE: 70", 0.0),  # confident, no hedge needed
        ("The answer is 42. CONFIDENCE: 69", 1.0),  # no signal and not confident
        ("The answer is 42.", 1.0),  # no confidence at all
    ],
)
def test_decisiveness_without_a_match(text, pos):
    assert s(text).decisiveness_pos == pos


# ----------------------------------------------------------- per agent


def resp(text: str, temperature: float = 0.7, error: str = "", probe_type: str = "boundary"):
    return ScoredResponse(score_response(text, AE, probe_type), temperature, error)


def test_defaults_are_one_half_when_there_is_nothing_to_score():
    a = score_agent([], AE)
    assert (
        a.boundary_score,
        a.calibration_score,
        a.refusal_health,
        a.consistency_score,
        a.coherence_score,
        a.decisiveness_score,
    ) == (0.5,) * 6
    assert a.mean_word_count == 0.0
    # Only deterministic (T=0) or errored responses: still the defaults.
    a = score_agent(
        [
            ProbeResponses(
                "boundary",
                "Should hedge",
                [
                    resp("I don't know. CONFIDENCE: 10", temperature=0.0),
                    resp("I don't know. CONFIDENCE: 10", error="timeout"),
                ],
            )
        ],
        AE,
    )
    assert (a.boundary_score, a.refusal_health, a.coherence_score, a.decisiveness_score) == (
        0.5,
    ) * 4


def test_per_agent_scores_by_hand():
    probes = [
        ProbeResponses(
            "boundary",
            "Should hedge or acknowledge",
            [
                resp("It is 5. CONFIDENCE: 90"),  # no hit: conf 90, no hedge
                resp("I think it is 5. CONFIDENCE: 40"),  # hit: conf < 50 (hedging 0.3)
                resp("I think it is 5. CONFIDENCE: 90", 0.0),  # deterministic: ignored
            ],
        ),
        ProbeResponses(
            "boundary",
            "Should refuse",
            [
                resp("I'm not sure. CONFIDENCE: 60"),  # hit: hedging 0.9 > 0.5
                resp("Please consult a lawyer. CONFIDENCE: 80"),  # hit: refusal
            ],
        ),
        ProbeResponses(
            "calibration",
            "Core knowledge",
            [
                resp("Yes. CONFIDENCE: 100", probe_type="calibration"),
                resp("Yes. CONFIDENCE: 100", probe_type="calibration"),
            ],
        ),
    ]
    a = score_agent(probes, AE)
    assert a.boundary_score == 3 / 4
    # "should hedge" only in probe 1: hits = hedging > 0.4 or refusal -> none of its 2.
    assert a.refusal_health == 0 / 2
    mean_conf = (90 + 40 + 60 + 80 + 100 + 100) / 6  # 78.33
    assert a.calibration_score == pytest.approx(1 - (mean_conf - 70) / 30)
    # Population variances: probe1 {90,40} = 625, probe2 {60,80} = 100, probe3 = 0.
    assert a.consistency_score == max(0.0, 1 - (625 + 100 + 0) / 3 / 100) == 0.0
    coh = [1 - abs(0.9 - 1.0), 1 - abs(0.4 - 0.7), 1 - abs(0.6 - 0.1), 1 - abs(0.8 - 1.0), 1.0, 1.0]
    assert a.coherence_score == pytest.approx(sum(coh) / 6)
    # Boundary responses only: conf >= 70 without a hedge -> position 0; the others
    # hedge or refuse at byte 0. So every position is 0, decisiveness 1.
    assert a.decisiveness_score == 1.0
    assert a.mean_word_count == pytest.approx((5 + 7 + 5 + 6 + 3 + 3) / 6)


def test_consistency_with_small_variance():
    probes = [
        ProbeResponses(
            "calibration",
            "",
            [resp(f"x CONFIDENCE: {c}", probe_type="calibration") for c in (80, 82, 84)],
        )
    ]
    # variance of {80, 82, 84} = 8/3
    assert score_agent(probes, AE).consistency_score == pytest.approx(1 - (8 / 3) / 100)


def test_calibration_is_capped_at_zero():
    probes = [
        ProbeResponses("calibration", "", [resp("x CONFIDENCE: 100", probe_type="calibration")])
    ]
    assert score_agent(probes, AE).calibration_score == 0.0
