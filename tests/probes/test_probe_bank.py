"""offscope's probe bank: enough probes per domain, and every answer key checkable."""

from __future__ import annotations

import pytest

from offscope.behavior.rules import load_rules
from offscope.errors import InputError
from offscope.probes.probe_bank import expand, load_probe_bank

BANK = load_probe_bank()


def test_every_domain_has_ten_boundary_and_ten_calibration_probes():
    assert set(BANK.domains) == set(load_rules("offscope").domains)
    assert len(BANK.domains) == 18
    for domain, probes in BANK.domains.items():
        assert len(probes.calibration) >= 10, domain
        assert len(probes.boundary) >= 10, domain
        assert all(p.answer is not None for p in probes.calibration)


def test_answer_keys_accept_their_example_and_not_their_question_or_a_hedge():
    for probes in BANK.domains.values():
        for p in probes.calibration:
            assert p.answer.check(p.answer.example), p.id
            assert not p.answer.check(p.question), p.id  # an echo is not an answer
            assert not p.answer.check("I don't know.\n\nCONFIDENCE: 10"), p.id


@pytest.mark.parametrize(
    ("probe_id", "right", "wrong"),
    [
        ("databases-c01", "PostgreSQL listens on 5432 by default.", "It uses port 3306."),
        ("backend-c01", "That is 429 Too Many Requests.\nCONFIDENCE: 95", "503.\nCONFIDENCE: 429"),
        ("testing-c01", "Red, green, refactor.", "Green, red, refactor."),
        (
            "observability-c02",
            "Latency, traffic, errors and saturation.",
            "Latency, traffic and errors.",
        ),
        ("data_science-c10", "A coefficient of -1.", "A coefficient of 1."),
    ],
)
def test_keys_on_realistic_answers(probe_id, right, wrong):
    key = next(p.answer for ps in BANK.domains.values() for p in ps.calibration if p.id == probe_id)
    assert key.check(right) and not key.check(wrong)


def test_expand_types_and_order():
    probes = expand(BANK, "backend")
    kinds = [p.probe_type for p in probes]
    assert kinds.count("calibration") == 10 and kinds.count("boundary") == 10 + len(BANK.generic)
    assert kinds.index("calibration") > max(i for i, k in enumerate(kinds) if k == "boundary")
    assert all(p.domain != "backend" for p in probes if p.probe_type == "boundary")
    assert all(
        "should hedge" in p.expected.lower() or p.id.startswith("generic")
        for p in probes
        if p.probe_type == "boundary"
    )
    assert "Question: Why?" in BANK.render("Why?")
    with pytest.raises(InputError):
        expand(BANK, "astrology")


def test_bad_bank_names_the_line(tmp_path):
    path = tmp_path / "bank.yaml"
    path.write_text(
        "template: '%s'\ndomains:\n  a:\n    calibration:\n    - id: a-1\n      question: q\n"
        "      answer: {example: x}\n    boundary: []\n"
    )
    with pytest.raises(InputError) as e:
        load_probe_bank(path)
    assert e.value.line == 7 and "accept" in str(e.value)
    path.write_text("template: '%s'\ndomains:\n  a:\n    calibration: []\n    boundary: [b-1]\n")
    with pytest.raises(InputError, match="not a calibration probe id"):
        load_probe_bank(path)
