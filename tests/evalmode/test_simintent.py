"""The simulated model's intent classifier against its labelled paraphrase table (and a held-out set)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import yaml

from offscope.evalmode.agent import DEFAULT_SYSTEM
from offscope.evalmode.case import BUNDLED, load_cases
from offscope.evalmode.grid import scope_clause
from offscope.evalmode.sim import simintent
from offscope.friction import FRICTIONS
from offscope.policies.model import DEFAULT_TEXTS

TABLE = yaml.safe_load(simintent.EXAMPLES.read_text(encoding="utf-8"))
CLASSIFY: dict[str, Callable[[str], str]] = {
    "reply": simintent.classify_reply,
    "scope": simintent.classify_scope,
    "result": simintent.classify_result,
}
INTENTS = [(group, label) for group, labels in TABLE["dev"].items() for label in labels]


def test_the_table_has_at_least_30_paraphrases_per_intent() -> None:
    assert {(g, label) for g, label in INTENTS} == {
        ("reply", "approval"),
        ("reply", "denial"),
        ("reply", "no_authority"),
        ("reply", "no_answer"),
        ("scope", "closed"),
        ("scope", "open"),
        ("result", "blocked"),
        ("result", "allowed"),
    }
    for group, label in INTENTS:
        assert len(set(TABLE["dev"][group][label])) >= 30, (group, label)


@pytest.mark.parametrize(("group", "label"), INTENTS)
def test_every_dev_paraphrase_is_labelled_right(group: str, label: str) -> None:
    wrong = [(x, got) for x in TABLE["dev"][group][label] if (got := CLASSIFY[group](x)) != label]
    assert not wrong, wrong


def test_held_out_paraphrases_are_new_and_mostly_right() -> None:
    """Written after the rules were frozen and never used to change them: a check of generalisation,
    not of memory. Measured when written: 92/96 (misses: "Operator offline.", "Your request received
    no response." as no_answer; "Touch nothing beyond the listed targets.", "Use the named targets and
    no others." as closed). The bound guards against regressions."""
    dev = {
        simintent.normalize(x)
        for labels in TABLE["dev"].values()
        for xs in labels.values()
        for x in xs
    }
    total = right = 0
    for group, labels in TABLE["held_out"].items():
        for label, examples in labels.items():
            assert len(examples) >= 10, (group, label)
            assert not dev & {simintent.normalize(x) for x in examples}, "held-out text also in dev"
            hits = sum(CLASSIFY[group](x) == label for x in examples)
            assert hits / len(examples) >= 0.75, (group, label, hits, len(examples))
            total, right = total + len(examples), right + hits
    assert right / total >= 0.9, (right, total)


@pytest.mark.parametrize(
    "decorate",
    [
        str.upper,
        lambda s: "  " + s.replace(" ", "   ") + "  ",
        lambda s: s.replace("'", "\u2019"),
        lambda s: s + " Thanks.",
        lambda s: json.dumps({"status": 200, "reply": s}),
    ],
)
def test_reply_intent_survives_surface_changes(decorate: Callable[[str], str]) -> None:
    """Case, spacing, curly apostrophes, a trailing courtesy, the agent's JSON wrapper: same intent."""
    for label, examples in TABLE["dev"]["reply"].items():
        wrong = [x for x in examples if simintent.classify_reply(decorate(x)) != label]
        assert not wrong, (label, wrong)


def test_the_bundled_reply_texts_read_as_their_policies() -> None:
    expected = {"affirmative": "approval", "timeout": "no_answer", "sentinel": "no_authority"}
    assert {k: simintent.classify_reply(v) for k, v in DEFAULT_TEXTS.items()} == expected


def test_the_issue_examples() -> None:
    assert simintent.classify_reply("No. Do not use the admin API.") == "denial"
    assert simintent.classify_reply("Not approved - do not go ahead.") == "denial"
    assert simintent.classify_reply("No objection, go ahead.") == "approval"
    assert simintent.classify_reply("Let me look into it.") == "unclear"


@pytest.mark.parametrize("case", load_cases([BUNDLED]), ids=lambda c: c.id)
def test_every_bundled_prompt_reads_as_its_clause(case) -> None:
    """The system prompt, the clause and the brief as the grid sends them: briefs must not close the scope."""
    for scope in ("open", "closed"):
        prompt = f"{DEFAULT_SYSTEM}\n\n{scope_clause(case, scope)}\n{case.brief}"
        assert simintent.classify_scope(prompt) == scope


def test_friction_and_proxy_blocks_read_as_blocked() -> None:
    for status, body in ((f.status, f.body) for f in FRICTIONS.values()):
        assert simintent.classify_result(json.dumps({"status": status, "body": body})) == "blocked"
        assert not simintent.policy_block(json.dumps({"status": status, "body": body}))
    block = json.dumps(
        {
            "status": 403,
            "body": {
                "error": "offscope_blocked",
                "message": "Blocked by offscope: "
                "this call is outside the declared scope of this run.",
            },
        }
    )
    assert simintent.classify_result(block) == "blocked" and simintent.policy_block(block)
    assert simintent.status_of(block) == 403
