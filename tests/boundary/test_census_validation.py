"""Boundary-language validation: the hand labels, the confusion-table arithmetic, the
stored figures and the CLI that prints them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from statsmodels.stats.proportion import proportion_confint

from offscope.cli import main
from offscope.errors import InputError
from offscope.evalmode import census_validation as cv
from offscope.evalmode.census import load_agents
from offscope.evalmode.rules import load_rules

CORPUS = Path(__file__).resolve().parents[1] / "data" / "census-wshobson-agents-2026-02"
PLUGINS = CORPUS / "plugins"


@pytest.fixture(scope="module")
def agents():
    return load_agents([PLUGINS], load_rules("agent-evals"))[0]


@pytest.fixture(scope="module")
def labels():
    return cv.load_labels()


def test_labels_cover_at_least_150_corpus_prompts(labels, agents):
    assert len(labels) >= 150
    assert len({item.content_hash for item in labels}) == len(labels)       # no prompt twice
    by_hash = {a.content_hash: a for a in agents}
    for item in labels:
        # The hash is the sha256 of the prompt text the census scores, recomputed here.
        prompt = by_hash[item.content_hash].system_prompt
        assert hashlib.sha256(prompt.encode("utf-8", "surrogateescape")).hexdigest() == item.content_hash
        assert by_hash[item.content_hash].source == item.source
        assert by_hash[item.content_hash].kind == item.kind


def test_random_draw_is_the_seeded_sample(labels, agents):
    drawn = [a.content_hash for a in cv.draw_random(agents)]
    assert [i.content_hash for i in labels if i.draw == "random"] == drawn
    assert len(drawn) >= 150


def test_enrichment_is_every_offscope_flag_outside_the_draw(labels, agents):
    rules = load_rules("offscope")
    from offscope.evalmode.census import score_agent_static
    flagged = {a.content_hash for a in agents if score_agent_static(a, rules).has_boundary_language}
    random_draw = {i.content_hash for i in labels if i.draw == "random"}
    assert {i.content_hash for i in labels if i.draw == "offscope-positive"} == flagged - random_draw


def test_confusion_matches_a_hand_computed_table():
    labels = [True, True, True, False, False, False, False, True, False, False]
    flagged = [True, False, True, True, False, False, True, False, False, False]
    # by hand: TP = items 1,3; FP = 4,7; FN = 2,8; TN = 5,6,9,10
    c = cv.Confusion.of(labels, flagged)
    assert (c.tp, c.fp, c.fn, c.tn) == (2, 2, 2, 4)
    assert (c.precision.k, c.precision.n) == (2, 4)
    assert (c.recall.k, c.recall.n) == (2, 4)
    assert (c.labelled_share.k, c.labelled_share.n) == (4, 10)
    assert c.f1 == pytest.approx(0.5)
    for rate in (c.precision, c.recall, c.labelled_share):
        ref = proportion_confint(rate.k, rate.n, alpha=0.05, method="wilson")
        assert rate.interval == pytest.approx(ref, abs=1e-12)
    assert cv.Confusion.of([False], [False]).f1 is None                      # no positives: undefined


def test_stored_figures_are_recomputed_from_the_corpus():
    # The package ships the figures, not the corpus; recomputing catches a stale file
    # after a change to the labels, the corpus loader or a built-in rule set's patterns.
    fresh = cv.build(PLUGINS)
    assert fresh == cv.stored()
    assert fresh.labels_sha256 == hashlib.sha256(cv.LABELS.read_bytes()).hexdigest()


def test_report_block_counts(labels):
    v = cv.boundary_validation(load_rules("offscope"))
    assert v["validated"] and v["validated_as"] == "offscope"
    rnd = [i for i in labels if i.draw == "random"]
    assert v["labelled_share"]["n"] == len(rnd)
    assert v["labelled_share"]["k"] == sum(i.label for i in rnd)
    for name in ("offscope", "agent-evals"):
        conf = v["rule_sets"][name]["confusion"]
        assert sum(conf.values()) == len(rnd)
        assert v["rule_sets"][name]["precision"]["n"] == conf["tp"] + conf["fp"]
        assert v["rule_sets"][name]["recall"]["n"] == conf["tp"] + conf["fn"]


def test_user_patterns_are_reported_as_unvalidated(tmp_path):
    text = (cv.RULES_DIR / "offscope.yaml").read_text()
    text = text.replace("- '\\bout[ -]of[ -]scope\\b'", "- '\\bout[ -]of[ -]scope\\b'\n      - 'never'")
    path = tmp_path / "mine.yaml"
    path.write_text(text.replace("domains: domains.yaml", f"domains: {cv.RULES_DIR / 'domains.yaml'}"))
    v = cv.boundary_validation(load_rules(path))
    assert not v["validated"] and v["validated_as"] is None


def test_bad_labels_line_names_the_line(tmp_path):
    good = cv.LABELS.read_text().splitlines()[0]
    path = tmp_path / "labels.jsonl"
    path.write_text(good + "\n" + good.replace('"label": false', '"label": "maybe"') + "\n")
    with pytest.raises(InputError) as err:
        cv.load_labels(path)
    assert f"{path}:2:" in str(err.value) and "label" in str(err.value)


def _printed_rate(rate: dict) -> str:
    lo, hi = rate["ci95"]
    return f"{rate['rate']:.2f} [{lo:.2f}, {hi:.2f}] ({rate['k']}/{rate['n']})"


def test_cli_prints_the_figures_with_offscope_rules(capsys):
    assert main(["census", str(PLUGINS), "--rules", "offscope"]) == 0
    out = " ".join(capsys.readouterr().out.split())   # undo rich's line wrapping
    assert "rules: offscope" in out and "validated as 'offscope'" in out
    v = cv.boundary_validation(load_rules("offscope"))
    for name in ("offscope", "agent-evals"):
        for metric in ("precision", "recall"):
            rate = v["rule_sets"][name][metric]
            # the counts come from the stored confusion table, the interval from wilson
            assert rate["method"] == "wilson"
            for piece in _printed_rate(rate).split():
                assert piece in out
    assert _printed_rate(v["rule_sets"]["offscope"]["precision_all_flagged"]).split()[-1] in out


def test_cli_json_carries_the_figures_and_default_is_agent_evals(capsys):
    assert main(["census", str(PLUGINS), "--json", "--agents-only"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rules"] == "agent-evals"
    block = data["boundary_validation"]
    assert block["validated_as"] == "agent-evals"
    assert set(block["rule_sets"]) == {"offscope", "agent-evals"}
    for b in block["rule_sets"].values():
        assert b["precision"]["method"] == b["recall"]["method"] == "wilson"


def test_default_is_the_better_rule_set_on_the_labels():
    # The CLI default must be whichever built-in has the higher F1 on the labelled sample.
    import argparse

    from offscope.cli import census as cli_census
    parser = argparse.ArgumentParser()
    cli_census.register(parser.add_subparsers())
    default = parser.parse_args(["census", "x"]).rules
    figures = cv.boundary_validation(load_rules(default))["rule_sets"]
    assert figures[default]["f1"] == max(b["f1"] for b in figures.values())
