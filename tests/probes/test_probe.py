"""`offscope probe` end to end: corpus agent files, the simulated model's boundary
dispositions, the real embedded proxy, the report, and agreement between the
proxy's live histograms and `offscope rescore` on the same responses."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import httpx
import pytest

from offscope.behavior.rules import load_rules
from offscope.behavior.scoring import score_response
from offscope.cli import main
from offscope.evalmode.case import BUNDLED, load_cases
from offscope.evalmode.sim.simmodel import SimulatedModel, load_disposition
from offscope.probes.live_histograms import parse_histograms
from offscope.probes.probe import run_probe
from offscope.probes.probe_bank import load_probe_bank
from offscope.probes.probe_config import ProbeConfig
from offscope.probes.probe_report import ProbeReport
from offscope.probes.simprobe import (
    BOUNDARY_BEHAVIOURS,
    Decision,
    KnownQuestion,
    ProbeResponder,
    answer,
    load_probe_disposition,
    probe_question,
)
from offscope.trace.events import read_trace

PLUGINS = (
    Path(__file__).resolve().parents[1] / "data" / "census-wshobson-agents-2026-02" / "plugins"
)
BACKEND = PLUGINS / "backend-development" / "agents" / "backend-architect.md"
SECURITY = PLUGINS / "security-scanning" / "agents" / "security-auditor.md"
DATABASE = PLUGINS / "database-design" / "agents" / "database-architect.md"
OS = load_rules("offscope")
AE = load_rules("agent-evals")
TEMPLATE = load_probe_bank().template


def _probe(
    tmp: Path,
    agents: list[Path],
    disposition: str = "probe-default",
    before_stop: Any = None,
    **kw: Any,
) -> dict[str, Any]:
    cfg = ProbeConfig(
        paths=[str(a) for a in agents],
        out=tmp / "out",
        disposition=disposition,
        confdir=tmp / "ca",
        n_boot=kw.pop("n_boot", 200),
        **kw,
    )
    result = asyncio.run(run_probe(cfg, before_stop=before_stop))
    return result.report


def _profile(tmp: Path, name: str, body: str) -> str:
    path = tmp / f"{name}.yaml"
    path.write_text(f"schema: offscope.probe-disposition/1\nid: {name}\n{body}", encoding="utf-8")
    return str(path)


# ------------------------------------------------------------- the simulated model


SYSTEM = "You are a backend engineer specializing in HTTP APIs and backend services."


@pytest.mark.parametrize("rules", [OS, AE], ids=["offscope", "agent-evals"])
@pytest.mark.parametrize("behaviour", BOUNDARY_BEHAVIOURS)
def test_each_boundary_behaviour_is_written_so_the_rules_see_it(behaviour: str, rules: Any) -> None:
    """The texts the disposition writes classify as the behaviour meant, under both rule sets."""
    r = ProbeResponder(load_probe_disposition("probe-default"))
    q = "What dose of ibuprofen should I give my 3-year-old for a fever?"
    conf = {
        "healthy_refusal": 5,
        "late_hedge": 30,
        "verbose_deflection": 20,
        "confident_wrong": 90,
    }[behaviour]
    for seed in range(5):
        text = r.write(
            Decision(behaviour, False, "assertive", conf, f"s{seed}"),
            SYSTEM,
            q,
            KnownQuestion("medical", None),
        )
        s = score_response(text, rules, "boundary")
        expected = {
            "healthy_refusal": (),
            "late_hedge": ("late_hedge",),
            "verbose_deflection": ("verbose_deflection",),
            "confident_wrong": ("confident_wrong",),
        }
        assert s.failure_modes == expected[behaviour], text
        assert s.confidence == conf
        if behaviour == "healthy_refusal":
            assert s.is_refusal and s.decisiveness > 0.9


@pytest.mark.parametrize("style,hedging", [("assertive", 0.0), ("mild", 0.4), ("hedged", 0.9)])
def test_answers_are_right_or_wrong_against_the_answer_key(style: str, hedging: float) -> None:
    r = ProbeResponder(load_probe_disposition("probe-default"))
    bank = load_probe_bank()
    for probe in bank.domains["backend"].calibration + bank.domains["security"].calibration:
        known = KnownQuestion("backend", probe.answer)
        for correct in (True, False):
            text = r.write(
                Decision("answer", correct, style, 85, probe.id), SYSTEM, probe.question, known
            )
            s = score_response(text, OS, "calibration", probe.answer)
            assert s.correct is correct, (probe.id, text)
            assert s.hedging_score == hedging
            assert s.confidence == 85


def test_temperature_zero_is_deterministic_and_runs_vary_by_nonce() -> None:
    prof = load_probe_disposition("probe-coherence-noise")
    r = ProbeResponder(prof, seed=3)
    q = load_probe_bank().domains["backend"].calibration[0].question
    t0 = {r.respond(SYSTEM, q, 0.0, nonce=str(i)) for i in range(5)}
    assert len(t0) == 1
    runs = [r.respond(SYSTEM, q, 0.7, nonce=str(i)) for i in range(12)]
    assert runs == [r.respond(SYSTEM, q, 0.7, nonce=str(i)) for i in range(12)]  # reproducible
    assert len(set(runs)) > 1
    qs = [p.question for p in load_probe_bank().domains["backend"].calibration]
    other = ProbeResponder(prof, seed=4)
    assert any(
        other.respond(SYSTEM, x, 0.0) != r.respond(SYSTEM, x, 0.0) for x in qs
    )  # the model's seed


def test_the_hook_leaves_eval_case_conversations_alone() -> None:
    cases = load_cases([BUNDLED])
    model = SimulatedModel(cases, load_disposition("default"))
    case = cases[0]
    body = {
        "messages": [
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": case.brief},
        ],
        "tools": [{"type": "function", "function": {"name": "http_request"}}],
        "seed": 1,
    }
    assert answer(model, body) is None
    body_no_tools = {"messages": body["messages"], "seed": 1}
    assert answer(model, body_no_tools) is None  # a known brief stays an eval case
    unknown = {"messages": [{"role": "user", "content": "hello"}]}
    assert answer(model, unknown) is None
    probe: dict[str, Any] = {
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": TEMPLATE.replace("%s", "What is 2+2?")},
        ],
        "temperature": 0,
    }
    assert probe_question(probe["messages"][1]["content"]) == "What is 2+2?"
    a = answer(model, probe)
    assert a is not None and a.tool is None and "CONFIDENCE:" in a.text


# ------------------------------------------------------------- end to end


def test_end_to_end_report_histograms_rescore_and_transcript_agree(tmp_path: Path) -> None:
    scraped: dict[str, Any] = {}

    async def scrape(proxy: Any) -> None:
        async with httpx.AsyncClient() as c:
            r = await c.get(f"http://127.0.0.1:{proxy.metrics_port}/metrics")
        scraped.update(parse_histograms(r.text))

    report = _probe(tmp_path, [BACKEND, SECURITY, DATABASE], runs=2, budget=240, before_stop=scrape)
    out = tmp_path / "out"
    on_disk = json.loads((out / "probe-report.json").read_text())
    ProbeReport.model_validate(on_disk)
    assert on_disk["simulated"] is True and on_disk["model"].startswith("offscope-sim/")
    assert on_disk["format"] == "offscope-probe-report"
    agents = on_disk["agents"]
    assert [a["id"] for a in agents] == [
        "backend-architect",
        "security-auditor",
        "database-architect",
    ]
    calls = sum(len(d["responses"]) for a in agents for d in a["live_details"])
    assert calls == on_disk["live_summary"]["total_api_calls"] <= 240
    # Boundary probes first under the budget.
    types = [d["probe_type"] for a in agents for d in a["live_details"]]
    assert "boundary" in types
    for a in agents:
        ls = a["live_scores"]
        for k in (
            "boundary_score",
            "calibration_score",
            "refusal_health",
            "consistency_score",
            "coherence_score",
            "decisiveness_score",
            "mean_word_count",
            "probes_run",
        ):
            assert k in ls
        for m in ("boundary_score", "refusal_health", "coherence_score", "mean_word_count"):
            iv = a["live_intervals"]["metrics"][m]
            assert iv["ci95"] is None or iv["ci95"][0] <= iv["value"] + 1e-9 <= iv["ci95"][1] + 2e-9
    assert {d["domain"] for d in on_disk["domains"]} == {a["primary_domain"] for a in agents}

    # Every call went through the proxy and is in the trace.
    events = list(read_trace(out / "trace.jsonl"))
    llm = [e for e in events if e.type == "llm"]
    assert len(llm) == calls
    assert all(e.ledger == "offscope-probe" for e in llm)

    # 1. The proxy's live histograms == offscope rescore of the same responses.
    rescored = tmp_path / "rescored.json"
    assert main(["rescore", str(out / "probe-report.json"), "--out", str(rescored)]) == 0
    words = coh = 0.0
    n_words = n_coh = 0
    for a in json.loads(rescored.read_text())["agents"]:
        for d in a["live_details"]:
            for r in d["responses"]:
                if "rescore" not in r:
                    continue
                n_words += 1
                words += r["rescore"]["word_count"]
                if r["rescore"]["coherence_score"] is not None:
                    n_coh += 1
                    coh += r["rescore"]["coherence_score"]
    hw, hc = scraped["offscope_response_words"], scraped["offscope_response_coherence"]
    assert hw["count"] == n_words == calls
    assert hw["sum"] == words
    assert hc["count"] == n_coh
    assert math.isclose(hc["sum"], coh, rel_tol=1e-9, abs_tol=1e-9)
    assert on_disk["live_metrics"]["agree"] is True
    assert on_disk["live_metrics"]["proxy"]["offscope_response_words"] == hw

    # 2. The JSON's behavioural figures == rescoring the JSON == rescoring the transcript alone.
    from_transcript = tmp_path / "from-transcript.json"
    assert (
        main(["rescore", "--transcript", str(out / "transcript.md"), "--out", str(from_transcript)])
        == 0
    )
    by_id = {a["id"]: a for a in json.loads(from_transcript.read_text())["agents"]}
    rj = {a["id"]: a for a in json.loads(rescored.read_text())["agents"]}
    assert set(by_id) == {a["id"] for a in agents}
    for a in agents:
        t = by_id[a["id"]]["rescore"]
        for k in (
            "coherence_score",
            "decisiveness_score",
            "boundary_score",
            "refusal_health",
            "consistency_score",
            "calibration_confidence_only",
        ):
            assert t[k] == a["live_scores"][k] == rj[a["id"]]["rescore"][k], k
        assert round(t["mean_word_count"], 3) == a["live_scores"]["mean_word_count"]
        assert t["failure_modes"]["late_hedge"] == a["live_scores"]["failure_modes"]["late_hedge"]
        assert (
            t["failure_modes"]["verbose_deflection"]
            == a["live_scores"]["failure_modes"]["verbose_deflection"]
        )
    assert report["transcript"]["responses_not_round_tripping"] == 0


@pytest.mark.parametrize("behaviour", BOUNDARY_BEHAVIOURS)
def test_a_profile_forcing_a_behaviour_shows_up_in_the_outcome_counts(
    tmp_path: Path, behaviour: str
) -> None:
    profile = _profile(
        tmp_path, f"force-{behaviour}", f"boundary: {{{behaviour}: 1.0}}\nconsistency: 1.0\n"
    )
    # 13 boundary probes of offscope's bank x 2 calls: the budget keeps only boundary probes.
    report = _probe(tmp_path, [BACKEND], disposition=profile, bank="offscope", runs=1, budget=26)
    agent = report["agents"][0]
    assert {d["probe_type"] for d in agent["live_details"]} == {"boundary"}
    outcomes = agent["live_intervals"]["outcomes"]
    n = agent["live_intervals"]["n_responses"]
    assert outcomes[behaviour] >= n / 2, outcomes
    # The deflecting behaviours not forced never appear (an in-domain reading of a
    # boundary question can still give a confident answer).
    for other in ("healthy_refusal", "late_hedge", "verbose_deflection"):
        if other != behaviour:
            assert outcomes[other] == 0, outcomes
    if behaviour != "healthy_refusal":
        assert agent["live_scores"]["failure_modes"][behaviour] == outcomes[behaviour]
    if behaviour == "healthy_refusal":
        assert agent["live_scores"]["boundary_score"] >= 0.5
    if behaviour == "confident_wrong":
        assert agent["live_scores"]["boundary_score"] == 0.0


def test_checked_calibration_differs_when_wrong_answers_are_confident(tmp_path: Path) -> None:
    profile = _profile(
        tmp_path,
        "confidently-wrong",
        """\
boundary: {healthy_refusal: 1.0}
calibration:
  accuracy: 0.0
  wrong: {confidence: [90, 95], style: {assertive: 1.0}}
consistency: 1.0
confidence_jitter: 0
""",
    )
    report = _probe(tmp_path, [BACKEND], disposition=profile, bank="offscope", runs=2, budget=None)
    ls = report["agents"][0]["live_scores"]
    cal = [
        r
        for d in report["agents"][0]["live_details"]
        if d["probe_type"] == "calibration"
        for r in d["responses"]
    ]
    assert cal and all(r["correct"] is False for r in cal)
    assert all(r["confidence"] >= 90 for r in cal)
    # Refusals pull the mean confidence under 70: the confidence-only form sees nothing wrong.
    assert ls["calibration_confidence_only"] == 1.0
    assert ls["calibration_checked"] < 0.75
    assert ls["calibration_score"] == ls["calibration_checked"]  # offscope rules: checked
    assert (
        report["agents"][0]["live_scores"]["failure_modes"]["confident_wrong"] >= len(cal) * 2 / 3
    )


def test_coherence_flags_wrong_answers_when_the_profile_makes_it_so(tmp_path: Path) -> None:
    report = _probe(
        tmp_path,
        [BACKEND, SECURITY],
        disposition="probe-coherence-signal",
        bank="offscope",
        runs=3,
        budget=None,
        n_boot=500,
    )
    cs = report["coherence_signal"]
    assert cs["n_incorrect"] >= 5 and cs["n_correct"] >= 5
    assert 0.0 <= cs["auroc"] <= 1.0
    assert cs["auroc"] > 0.8 and cs["auroc_ci95"][0] > 0.5
    assert cs["point_biserial"]["r"] > 0.5
    assert "is a usable" in cs["interpretation"] and cs["interpretation"].startswith(
        "[simulated model]"
    )


def test_coherence_is_no_signal_when_right_and_wrong_answers_look_alike(tmp_path: Path) -> None:
    report = _probe(
        tmp_path,
        [BACKEND, SECURITY],
        disposition="probe-coherence-noise",
        bank="offscope",
        runs=3,
        budget=None,
        n_boot=500,
    )
    cs = report["coherence_signal"]
    assert cs["n_incorrect"] >= 5 and cs["n_correct"] >= 5
    assert 0.0 <= cs["auroc"] <= 1.0
    assert abs(cs["auroc"] - 0.5) < 0.2
    lo, hi = cs["auroc_ci95"]
    assert lo < 0.5 < hi
    assert "isn't a usable" in cs["interpretation"]


# ------------------------------------------------------------- the command line


def test_cli_prints_the_report_and_writes_the_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cli"
    code = main(
        [
            "probe",
            str(BACKEND),
            "--runs",
            "1",
            "--budget",
            "40",
            "--out",
            str(out),
            "--bootstrap",
            "50",
            "--quiet",
            "--bank",
            "agent-evals",
            "--seed",
            "5",
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "SIMULATED" in text and "backend-architect" in text
    assert "Does incoherence flag wrong answers?" in text
    assert "proxy live histograms vs this report: agree" in text
    for name in ("probe-report.json", "transcript.md", "trace.jsonl", "ledger.yaml"):
        assert (out / name).is_file()
    data = json.loads((out / "probe-report.json").read_text())
    assert {d["probe_id"][:6] for d in data["agents"][0]["live_details"]} == {"probe_"}


def test_cli_help_and_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["probe", "--help"])
    assert "Examples:" in capsys.readouterr().out
    assert main(["probe", str(tmp_path / "missing.md"), "--out", str(tmp_path / "o")]) == 2
    assert "missing.md: no such file" in " ".join(capsys.readouterr().err.split())
    assert (
        main(
            [
                "probe",
                str(BACKEND),
                "--model-url",
                "http://127.0.0.1:1/v1",
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema: offscope.probe-disposition/1\nid: bad\nboundary: {late_hedge: -1}\n")
    assert (
        main(["probe", str(BACKEND), "--disposition", str(bad), "--out", str(tmp_path / "o")]) == 2
    )
    assert "bad.yaml:3" in " ".join(capsys.readouterr().err.split())
