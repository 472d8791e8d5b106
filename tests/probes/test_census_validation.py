"""Boundary-language validation: the hand labels, the confusion-table arithmetic, the
stored figures and the CLI that prints them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml
from statsmodels.stats.proportion import proportion_confint

from offscope.behavior.rules import RULES_DIR, load_rules
from offscope.cli import main
from offscope.errors import InputError
from offscope.probes import census_validation as cv
from offscope.probes.census import load_agents

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
    assert len({item.content_hash for item in labels}) == len(labels)  # no prompt twice
    by_hash = {a.content_hash: a for a in agents}
    for item in labels:
        # The hash is the sha256 of the prompt text the census scores, recomputed here.
        prompt = by_hash[item.content_hash].system_prompt
        assert (
            hashlib.sha256(prompt.encode("utf-8", "surrogateescape")).hexdigest()
            == item.content_hash
        )
        assert by_hash[item.content_hash].source == item.source
        assert by_hash[item.content_hash].kind == item.kind


def test_random_draw_is_the_seeded_sample_and_split(labels, agents):
    drawn = [a.content_hash for a in cv.draw_random(agents)]
    rnd = [i for i in labels if i.draw == "random"]
    assert [i.content_hash for i in rnd] == drawn
    assert len(drawn) >= 150
    test = cv.held_out()
    assert [i.split for i in rnd] == ["test" if k in test else "dev" for k in range(len(rnd))]
    assert {i.split for i in labels if i.draw != "random"} <= {
        "dev",
        "fresh",
    }  # never in the held-out half


def test_every_prompt_the_offscope_rules_flag_is_labelled(labels, agents):
    from offscope.probes.census import score_agent_static

    rules = load_rules("offscope")
    flagged = {a.content_hash for a in agents if score_agent_static(a, rules).has_boundary_language}
    assert flagged <= {i.content_hash for i in labels}
    # the fresh draw is exactly what the current patterns flag outside the earlier draws
    earlier = {i.content_hash for i in labels if i.draw != "flagged-offscope"}
    assert {i.content_hash for i in labels if i.draw == "flagged-offscope"} == flagged - earlier


def test_confusion_matches_a_hand_computed_table():
    labels = [True, True, True, False, False, False, False, True, False, False]
    flagged = [True, False, True, True, False, False, False, False, False, False]
    # by hand: TP = items 1,3; FP = 4; FN = 2,8; TN = 5,6,7,9,10
    c = cv.Confusion.of(labels, flagged)
    assert (c.tp, c.fp, c.fn, c.tn) == (2, 1, 2, 5)
    assert (c.precision.k, c.precision.n) == (2, 3)  # TP / (TP + FP)
    assert (c.recall.k, c.recall.n) == (2, 4)  # TP / (TP + FN)
    assert (c.labelled_share.k, c.labelled_share.n) == (4, 10)
    assert (c.flagged_share.k, c.flagged_share.n) == (3, 10)
    assert c.f1 == pytest.approx(4 / 7)  # 2PR / (P + R), P = 2/3, R = 1/2
    for rate in (c.precision, c.recall, c.labelled_share):
        ref = proportion_confint(rate.k, rate.n, alpha=0.05, method="wilson")
        assert rate.interval == pytest.approx(ref, abs=1e-12)
    assert cv.Confusion.of([False], [False]).f1 is None  # no positives: undefined


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
        for part, n in (
            ("random_draw", len(rnd)),
            ("held_out", sum(i.split == "test" for i in rnd)),
        ):
            b = v["rule_sets"][name][part]
            conf = b["confusion"]
            assert sum(conf.values()) == n
            assert b["precision"]["n"] == conf["tp"] + conf["fp"]
            assert b["recall"]["n"] == conf["tp"] + conf["fn"]
    assert "precision_fresh" in v["rule_sets"]["offscope"]
    assert "precision_fresh" not in v["rule_sets"]["agent-evals"]  # not chosen by its flags


def test_user_patterns_are_reported_as_unvalidated(tmp_path):
    data = yaml.safe_load((RULES_DIR / "offscope.yaml").read_text())
    data["census"]["boundary"]["patterns"].append("never")
    data["census"]["domains"] = str(RULES_DIR / "domains.yaml")
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data))
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


def test_cli_prints_the_figures_with_offscope_rules(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "240")  # one table row per line
    assert main(["census", str(PLUGINS), "--rules", "offscope"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # undo rich's line wrapping
    assert "rules: offscope" in out and "validated as 'offscope'" in out
    v = cv.boundary_validation(load_rules("offscope"))
    for name in ("offscope", "agent-evals"):
        for part in ("held_out", "random_draw"):
            for metric in ("precision", "recall"):
                rate = v["rule_sets"][name][part][metric]
                # the counts come from the stored confusion table, the interval from wilson
                assert rate["method"] == "wilson"
                assert _printed_rate(rate) in out
    for key in ("precision_all_flagged", "precision_fresh"):
        assert _printed_rate(v["rule_sets"]["offscope"][key]) in out


def test_cli_json_carries_the_figures(capsys):
    assert main(["census", str(PLUGINS), "--json", "--agents-only", "--rules", "agent-evals"]) == 0
    data = json.loads(capsys.readouterr().out)
    block = data["boundary_validation"]
    assert block["validated_as"] == "agent-evals"
    assert set(block["rule_sets"]) == {"offscope", "agent-evals"}
    for b in block["rule_sets"].values():
        assert b["held_out"]["precision"]["method"] == b["held_out"]["recall"]["method"] == "wilson"


def test_default_is_the_better_rule_set_on_the_held_out_labels():
    # The CLI default must be whichever built-in has the higher F1 on the held-out half.
    import argparse

    from offscope.cli import census as cli_census

    parser = argparse.ArgumentParser()
    cli_census.register(parser.add_subparsers())
    default = parser.parse_args(["census", "x"]).rules
    figures = cv.boundary_validation(load_rules(default))["rule_sets"]
    assert figures[default]["held_out"]["f1"] == max(b["held_out"]["f1"] for b in figures.values())


def test_docs_quote_the_stored_held_out_figures():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "probes.md").read_text()
    v = cv.boundary_validation(load_rules("offscope"))
    for name in ("offscope", "agent-evals"):
        for metric in ("precision", "recall"):
            assert _printed_rate(v["rule_sets"][name]["held_out"][metric]) in docs
