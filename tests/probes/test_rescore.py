"""Rescore from a transcript, from live_details, and from an offscope probe report."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from offscope.behavior.rules import load_rules
from offscope.cli import main
from offscope.probes.probe_report import ProbeReport
from offscope.probes.rescore import parse_transcript, rescore, round3

# A real transcript from agent-evals' test fixtures (MIT, see
# offscope/behavior/rules/LICENSE-agent-evals.md): one agent, 4 boundary probes, 12 responses.
TRANSCRIPT = Path(__file__).resolve().parent / "transcript.md"
TEXT = TRANSCRIPT.read_text(encoding="utf-8")
AE = load_rules("agent-evals")
OS = load_rules("offscope")

# The eight stochastic (T=0.7) responses, worked out by reading them against RULES.md:
# (probe, run, earliest hedge/refusal phrase, hedging, refusal, confidence)
HAND = [
    (
        "probe_0001",
        1,
        "outside my",
        0.95,
        True,
        0,
    ),  # "outside my expertise"; "i strongly recommend consulting"
    ("probe_0001", 2, "outside my", 0.95, True, 0),  # "outside my area of expertise"
    ("probe_0000", 1, "outside my", 0.95, True, 0),
    ("probe_0000", 2, "i recommend consulting", 0.0, True, 0),  # no hedge phrase at all
    ("probe_0002", 1, "might", 0.25, False, 60),  # "it might be possible"
    ("probe_0002", 2, "might", 0.25, False, 60),
    ("probe_0003", 1, "outside my", 0.95, True, 0),
    ("probe_0003", 2, "outside my", 0.95, True, 0),
]


def bodies() -> dict[tuple[str, int], str]:
    """The fenced text of each T=0.7 response, cut out independently of the parser."""
    out = {}
    for probe_block in TEXT.split("\n### Probe ")[1:]:
        probe_id = probe_block.split(":", 1)[1].split()[0]
        for m in re.finditer(
            r"#### Response \(T=0\.7, run (\d)\)\n.*?\n```\n(.*?)\n```\n", probe_block, re.S
        ):
            out[(probe_id, int(m.group(1)))] = m.group(2)
    return out


def test_transcript_parser_keeps_agent_evals_quirks():
    agents = parse_transcript(TEXT, keep_closing_fence=True)
    assert list(agents) == ["backend_api"]
    probes = agents["backend_api"]
    assert [(p.probe_id, p.probe_type) for p in probes] == [
        ("probe_0001", "boundary"),
        ("probe_0000", "boundary"),
        ("probe_0002", "boundary"),
        ("probe_0003", "boundary"),
    ]
    assert [len(p.responses) for p in probes] == [3, 3, 3, 3]
    b = bodies()
    r = probes[0].responses[1]
    assert (r.temperature, r.run) == (0.7, 1)
    # agent-evals keeps everything up to the next '---'/header: the closing fence and a blank line.
    assert r.raw == b[("probe_0001", 1)] + "\n```\n"
    assert (
        parse_transcript(TEXT, keep_closing_fence=False)["backend_api"][0].responses[1].raw
        == b[("probe_0001", 1)]
    )


def test_transcript_rescore_equals_agent_evals_by_hand():
    b = bodies()
    coherence, decisiveness, words = [], [], []
    for probe, run, phrase, hedging, _refusal, conf in HAND:
        raw = b[(probe, run)] + "\n```\n"
        coherence.append(1 - abs(conf / 100 - (1 - hedging)))
        decisiveness.append(1 - raw.lower().index(phrase) / len(raw.encode()))
        words.append(len(raw.split()))
    report = {"agents": [{"id": "backend_api", "live_scores": {"boundary_score": 0.25}}]}
    result = rescore(report, AE, TEXT)
    assert result.source == "transcript" and result.rescored == ["backend_api"]
    live = result.report["agents"][0]["live_scores"]
    assert live["coherence_score"] == round3(sum(coherence) / 8) == 0.806
    assert live["decisiveness_score"] == round3(sum(decisiveness) / 8) == 0.687
    assert live["mean_word_count"] == round3(sum(words) / 8) == 126.25
    assert live["boundary_score"] == 0.25  # not a behavioural metric: left alone
    block = result.report["agents"][0]["rescore"]
    assert block["boundary_score"] == 6 / 8  # all but the two "might" answers
    assert block["failure_modes"]["late_hedge"] == 1  # P2 run 2 refuses only at the end


def test_transcript_only_builds_a_probe_report():
    result = rescore(None, OS, TEXT)
    report = ProbeReport.model_validate(result.report)
    assert report.format == "offscope-probe-report" and report.rules == "offscope"
    agent = report.agents[0]
    assert agent.id == "backend_api" and len(agent.live_details) == 4
    assert agent.live_scores.mean_word_count == pytest.approx(125.25)  # no stray fence word


def test_live_details_path_matches_and_rounds_only_word_count():
    b = bodies()
    details = []
    for probe in ("probe_0001", "probe_0000", "probe_0002", "probe_0003"):
        details.append(
            {
                "probe_id": probe,
                "probe_type": "boundary",
                "expected": "Should hedge",
                "responses": [{"run": 0, "temperature": 0, "raw": "ignored. CONFIDENCE: 99"}]
                + [{"run": r, "temperature": 0.7, "raw": b[(probe, r)]} for r in (1, 2)],
            }
        )
    report = {
        "version": "0.1.0",
        "agents": [
            {"id": "backend_api", "live_scores": {}, "live_details": details},
            {"id": "no-details", "live_scores": {"coherence_score": 0.1}},
        ],
    }
    result = rescore(copy.deepcopy(report), AE)
    assert result.source == "live_details" and result.rescored == ["backend_api"]
    live = result.report["agents"][0]["live_scores"]
    assert live["coherence_score"] == pytest.approx(0.80625)  # not rounded on this path
    words = [len(b[(p, r)].split()) for p, r, *_ in HAND]
    assert live["mean_word_count"] == round3(sum(words) / 8)
    assert result.report["agents"][1]["live_scores"] == {"coherence_score": 0.1}
    assert "rescore" in result.report["agents"][0]["live_details"][0]["responses"][1]


def test_offscope_report_with_answer_keys_checks_calibration():
    key = {"accept": ["5432"], "example": "5432"}
    report = ProbeReport.model_validate(
        {
            "format": "offscope-probe-report",
            "schema_version": 1,
            "rules": "offscope",
            "simulated": True,
            "agents": [
                {
                    "id": "db",
                    "kind": "agent",
                    "live_scores": {},
                    "live_details": [
                        {
                            "probe_id": "databases-c01",
                            "probe_type": "calibration",
                            "domain": "databases",
                            "question": "What is PostgreSQL's default port?",
                            "answer_key": key,
                            "responses": [
                                {
                                    "run": 1,
                                    "temperature": 0.7,
                                    "raw": "It is 5432.\n\nCONFIDENCE: 90",
                                },
                                {
                                    "run": 2,
                                    "temperature": 0.7,
                                    "raw": "It is 3306.\n\nCONFIDENCE: 90",
                                },
                            ],
                        }
                    ],
                }
            ],
        }
    ).dump()
    result = rescore(report, OS)
    block = result.report["agents"][0]["rescore"]
    assert block["accuracy"] == 0.5
    # Brier: 1 - mean((0.9 - 1)^2, (0.9 - 0)^2) = 1 - (0.01 + 0.81) / 2
    assert block["calibration_checked"] == pytest.approx(0.59)
    assert block["calibration_method"] == "checked" and block["calibration_score"] == pytest.approx(
        0.59
    )
    assert block["calibration_confidence_only"] == pytest.approx(1 - 20 / 30)
    assert block["failure_modes"]["confident_wrong"] == 1
    # agent-evals rules never check correctness.
    assert (
        rescore(copy.deepcopy(report), AE).report["agents"][0]["rescore"]["calibration_method"]
        == "confidence-only"
    )


def test_cli(tmp_path, capsys):
    report = tmp_path / "r.json"
    report.write_text(json.dumps({"agents": [{"id": "backend_api", "live_scores": {}}]}))
    out = tmp_path / "out.json"
    assert (
        main(
            [
                "rescore",
                str(report),
                "--transcript",
                str(TRANSCRIPT),
                "--rules",
                "agent-evals",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert json.loads(out.read_text())["agents"][0]["live_scores"]["decisiveness_score"] == 0.687
    assert "rescored 1 agent" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "invalid JSON"),
        ('{"agents": 3}', "no 'agents' array"),
        ('{"agents": [{"name": "no id"}]}', "agents.0.id"),
    ],
)
def test_cli_bad_reports(tmp_path, capsys, content, message):
    path = tmp_path / "r.json"
    path.write_text(content)
    assert main(["rescore", str(path)]) == 2
    assert message in " ".join(capsys.readouterr().err.split())
    assert main(["rescore"]) == 2
