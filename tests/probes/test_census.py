"""Static census: the boundary-probe study's figures reproduced on the bundled corpus, loader rules pinned."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from offscope.behavior.rules import load_rules
from offscope.cli import main
from offscope.probes.census import domain_relevance, kind_of, load_agents
from offscope.probes.census_report import run_census

CORPUS = Path(__file__).resolve().parents[1] / "data" / "census-wshobson-agents-2026-02"
PLUGINS = CORPUS / "plugins"
AE = load_rules("agent-evals")
OS = load_rules("offscope")


@pytest.fixture(scope="module")
def ae_report():
    return run_census([PLUGINS], AE)


def test_agent_evals_reproduces_the_seed_figures(ae_report):
    r = ae_report
    assert (r["files_scanned"], r["unique"], r["duplicates_collapsed"]) == (496, 428, 68)
    a = r["aggregate"]["all"]
    assert [
        f"{a[m]['mean']:.2f}"
        for m in ("scope_clarity", "boundary_definition", "uncertainty_guidance")
    ] == ["0.84", "0.59", "0.35"]
    assert [
        f"{a[m]['median']:.2f}"
        for m in ("scope_clarity", "boundary_definition", "uncertainty_guidance")
    ] == ["1.00", "0.70", "0.30"]
    assert (
        f"{a['share_boundary_language']:.0%}" == "72%"
    )  # "72% of agents include boundary language"


def test_dedup_and_kinds_match_the_manifest(ae_report):
    with open(CORPUS / "DEDUP-MANIFEST.tsv", encoding="utf-8") as f:
        rows = {r["relpath"]: r for r in csv.DictReader(f, delimiter="\t")}
    assert len(rows) == 428
    for a in ae_report["agents"]:
        row = rows["plugins/" + a["source"]]
        assert a["content_hash"] == row["body_sha256"]
        assert a["kind"] == row["kind"]
        assert sorted("plugins/" + p for p in a["also_found_in"]) == sorted(
            filter(None, row["also_found_in"].split(","))
        )
    assert ae_report["kinds"] == {"agent": 119, "skill": 206, "command": 81, "other": 22}
    assert ae_report["aggregate"]["agents"]["n"] == 119


def test_offscope_rules_word_bounded_scope_clarity():
    r = run_census([PLUGINS], OS)
    assert (r["files_scanned"], r["unique"]) == (496, 428)
    # RULES.md: "word-bounded matching gives 0.72, not 0.84".
    assert f"{r['aggregate']['all']['scope_clarity']['mean']:.2f}" == "0.72"
    # Boundary language that really limits scope is much rarer than "avoid"/"limit".
    assert r["aggregate"]["all"]["share_boundary_language"] < 0.2


def test_cli_prints_the_figures(capsys):
    assert main(["census", str(PLUGINS), "--rules", "agent-evals"]) == 0
    out = capsys.readouterr().out
    assert "496 files scanned, 428 unique" in out
    for figure in ("0.84", "0.59", "0.35", "1.00", "0.70", "0.30"):
        assert figure in out


def test_cli_json_agents_only(capsys):
    assert main(["census", str(PLUGINS), "--rules", "agent-evals", "--json", "--agents-only"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["agents_only"] and len(data["agents"]) == 119
    assert {a["kind"] for a in data["agents"]} == {"agent"}
    assert len(data["domains"]) == 18


def test_cli_csv(capsys, tmp_path):
    (tmp_path / "a.md").write_text("You are a PostgreSQL database expert. Avoid guessing.\n")
    assert main(["census", str(tmp_path / "a.md"), "--csv", "--rules", "agent-evals"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 1 and rows[0]["boundary_definition"] == "0.7"


def test_cli_bad_input(capsys, tmp_path):
    assert main(["census", str(tmp_path / "missing")]) == 2
    assert "no such file or folder" in " ".join(capsys.readouterr().err.split())
    bad = tmp_path / "rules.yaml"
    bad.write_text("name: x\nresponse:\n  hedges: []\n")
    assert main(["census", str(tmp_path), "--rules", str(bad)]) == 2
    assert "rules.yaml:2" in " ".join(capsys.readouterr().err.split())


def test_loader_rules(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "a").mkdir()
    body = "You are a backend API engineer. Design REST endpoints."
    (tmp_path / "b" / "agents").mkdir()
    (tmp_path / "b" / "agents" / "x.md").write_text(f"---\nname: X\nmodel: sonnet\n---\n\n{body}\n")
    (tmp_path / "a" / "x.md").write_text(body)  # same prompt, no frontmatter
    (tmp_path / ".hidden" / "y.md").write_text("Hidden agents are never loaded by the walk.")
    (tmp_path / "short.md").write_text("too short")  # < 20 bytes
    (tmp_path / "notes.json").write_text('{"system_prompt": "json is not loaded here"}')
    (tmp_path / "bad-fm.md").write_text("---\n- a list\n---\nThe whole file is the prompt then.")
    agents, files = load_agents([tmp_path], AE)
    assert files == 3
    # Lexical walk: a/x.md comes first, so it represents the duplicate.
    assert [a.source for a in agents] == ["a/x.md", "bad-fm.md"]
    assert agents[0].also_found_in == ["b/agents/x.md"]
    assert agents[0].id == "x"
    assert agents[1].system_prompt.startswith("---\n- a list")  # frontmatter not a mapping
    assert kind_of("b/agents/x.md") == "agent" and kind_of("p/skills/s/SKILL.md") == "skill"
    assert kind_of("p/commands/c.md") == "command" and kind_of("p/README.md") == "other"


def test_frontmatter_domains_and_skills(tmp_path):
    (tmp_path / "a.md").write_text(
        "---\nname: A\ndomains: [medical]\nskills: [kubernetes, docker]\n---\n"
        "You help with everything under the sun, politely."
    )
    agents, _ = load_agents([tmp_path / "a.md"], AE)
    rel = domain_relevance(agents[0].full_context(), AE, agents[0].claimed_domains)
    assert rel["medical"] == 1.0
    assert rel["devops"] == pytest.approx(2 / 8)  # kubernetes + docker, 16 keywords x 0.5
