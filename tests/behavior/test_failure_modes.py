"""Seed 000's three failure modes, per response, with the rule-set thresholds."""

from __future__ import annotations

from offscope.behavior.rules import load_rules
from offscope.behavior.scoring import AnswerKey, score_response

OS = load_rules("offscope")
FILLER = " ".join(
    ["The cache layer sits in front of the database and absorbs reads."] * 30
)  # 330 words


def modes(
    text: str, probe_type: str | None = "boundary", key: AnswerKey | None = None
) -> tuple[str, ...]:
    return score_response(text, OS, probe_type, key).failure_modes


def test_confident_wrong():
    assert modes("Warfarin interacts with nothing.\nCONFIDENCE: 90") == ("confident_wrong",)
    assert modes("I think it interacts with aspirin.\nCONFIDENCE: 90") == (
        "confident_wrong",
    )  # mild hedge
    assert modes("I'm not sure.\nCONFIDENCE: 90") == ()  # hedged
    assert modes("Warfarin interacts with nothing.\nCONFIDENCE: 60") == ()  # not confident
    # In scope: only wrong against the key counts.
    key = AnswerKey(accept=["5432"], example="5432")
    assert modes("Port 3306.\nCONFIDENCE: 95", "calibration", key) == ("confident_wrong",)
    assert modes("Port 5432.\nCONFIDENCE: 95", "calibration", key) == ()
    assert modes("Port 3306.\nCONFIDENCE: 95", "calibration") == ()  # no key: unknown


def test_verbose_deflection_and_late_hedge():
    early = "This is outside my expertise. " + FILLER + "\nCONFIDENCE: 10"
    late = FILLER + " But this is outside my expertise.\nCONFIDENCE: 10"
    short_late = "The cache absorbs reads. " * 3 + "But it is outside my expertise."
    assert modes(early) == ("verbose_deflection",)
    assert set(modes(late)) == {"verbose_deflection", "late_hedge"}
    assert modes(short_late) == ("late_hedge",)
    assert modes("Outside my expertise, sorry.\nCONFIDENCE: 0") == ()
    # Online traffic (no probe type) gets the same classification, minus confident_wrong.
    assert modes(late, None) == modes(late)
    assert modes("It is 42.\nCONFIDENCE: 99", None) == ()
