"""Rule sets: loading, bad input with file:line, and where offscope differs from agent-evals."""

from __future__ import annotations

import pytest

from offscope.behavior.rules import RULES_DIR, default_rules, load_rules
from offscope.errors import InputError
from offscope.probes.census import AgentFile, domain_relevance, score_agent_static

AE = load_rules("agent-evals")
OS = load_rules("offscope")


def static(prompt: str, rules):
    return score_agent_static(
        AgentFile(id="a", name="A", source="a.md", kind="agent", system_prompt=prompt), rules
    )


def test_builtin_rule_sets_load_and_are_cached():
    assert load_rules("agent-evals") is AE
    assert default_rules() is OS
    assert len(AE.domains) == len(OS.domains) == 18


@pytest.mark.parametrize(
    ("text", "domain", "keyword"),
    [
        ("increase test coverage", "ml_ai", "rag"),
        ("fix the syntax error", "financial", "tax"),
        ("write test scenarios", "mobile", "ios"),
    ],
)
def test_substring_quirks_only_in_agent_evals(text, domain, keyword):
    assert domain_relevance(text, AE).get(domain, 0) > 0
    assert domain_relevance(text, OS).get(domain, 0) == 0
    assert domain_relevance(f"we use {keyword} here", OS).get(domain, 0) > 0


def test_words_separated_by_underscore_count_in_offscope():
    assert domain_relevance("the test_runner", OS).get("testing", 0) > 0


@pytest.mark.parametrize(
    "prompt",
    [
        "Avoid long functions.",
        "Implement rate limiting on every endpoint.",
        "Use the scope of a variable wisely.",
    ],
)
def test_ordinary_words_are_boundary_language_only_for_agent_evals(prompt):
    assert static(prompt, AE).has_boundary_language
    assert not static(prompt, OS).has_boundary_language


@pytest.mark.parametrize(
    "prompt",
    [
        "If a request is outside your scope, say so and stop.",
        "Database work is out of scope: defer to database-architect.",
        "Only handle Terraform questions.",
        "Refer legal questions to a qualified professional.",
        "## Boundaries\nYou do not write frontend code.",
    ],
)
def test_scope_limiting_language_counts_for_offscope(prompt):
    s = static(prompt, OS)
    assert s.has_boundary_language and s.boundary_definition == 0.7


def test_uncertainty_guidance_difference():
    assert static("Report your confidence level and flag assumptions.", OS).has_uncertainty_guidance
    assert static("Build confidence in the release.", AE).has_uncertainty_guidance  # substring
    assert not static("Build confidence in the release.", OS).has_uncertainty_guidance


def test_user_rule_file(tmp_path):
    text = (RULES_DIR / "agent-evals.yaml").read_text().replace("name: agent-evals", "name: mine")
    text = text.replace("present: 0.7", "present: 0.9")
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    (tmp_path / "domains.yaml").write_text("domains:\n  only:\n  - widget\n")
    rules = load_rules(path)
    assert rules.name == "mine" and list(rules.domains) == ["only"]  # domains file next to it
    assert static("Avoid it.", rules).boundary_definition == 0.9


@pytest.mark.parametrize(
    ("yaml_text", "line", "words"),
    [
        (
            "name: x\nresponse:\n  confidence: []\n  hedges: []\n  refusals: []\ncensus: {}\n",
            3,
            "confidence",
        ),
        (
            "name: x\nresponse:\n  confidence:\n  - pattern: 'CONF (\\d+'\n  hedges: []\n  refusals: []\n",
            4,
            "invalid regular expression",
        ),
    ],
)
def test_bad_rule_files_name_file_and_line(tmp_path, yaml_text, line, words):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml_text)
    with pytest.raises(InputError) as e:
        load_rules(path)
    assert e.value.line == line and words in str(e.value)


def test_unknown_key_in_rule_file(tmp_path):
    text = (RULES_DIR / "offscope.yaml").read_text()
    path = tmp_path / "bad.yaml"
    path.write_text(text + "bogus: 1\n")
    with pytest.raises(InputError) as e:
        load_rules(path)
    assert e.value.line == text.count("\n") + 1 and "unknown key" in str(e.value)


def test_unknown_rule_name():
    with pytest.raises(InputError, match="no rule set"):
        load_rules("nope")
