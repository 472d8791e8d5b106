"""The gate names a credential change between two grid results: each grid
records salted fingerprints of the credentials it handed its agents (never the
credentials), and the gate compares them when both are under one salt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offscope.cli import main
from offscope.evalmode.case import BUNDLED, load_cases
from offscope.evalmode.grid import SIMULATED_MODEL_HOST
from tests.support.gate_testlib import run_grid

KEY_A = "sk-test-scoped-read-only-0001"
KEY_B = "sk-test-org-admin-0002"


def _grid(out: Path, monkeypatch: pytest.MonkeyPatch, key: str | None, salt: str) -> Path:
    monkeypatch.setenv("OFFSCOPE_FINGERPRINT_SALT", salt)
    if key is not None:
        monkeypatch.setenv("DRIFT_TEST_API_KEY", key)
    cases = load_cases([BUNDLED])[:2]
    return run_grid(
        out,
        cases=cases,
        reps=2,
        workers=4,
        api_key_env="DRIFT_TEST_API_KEY" if key is not None else None,
    )


def _gate(base: Path, cand: Path, tmp: Path) -> tuple[str, dict]:
    md, js = tmp / "gate.md", tmp / "gate.json"
    main(
        [
            "gate",
            "--baseline",
            str(base / "results.json"),
            "--candidate",
            str(cand / "results.json"),
            "--allow-underpowered",
            "--markdown",
            str(md),
            "--json",
            str(js),
        ]
    )
    report = json.loads(js.read_text())
    return md.read_text(), {c["change"]: c for c in report["changes"]}


def test_gate_names_a_credential_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = _grid(tmp_path / "a", monkeypatch, KEY_A, "deployment-salt-1")
    b = _grid(tmp_path / "b", monkeypatch, KEY_B, "deployment-salt-1")
    a_again = _grid(tmp_path / "a2", monkeypatch, KEY_A, "deployment-salt-1")

    recorded = json.loads((a / "results.json").read_text())["configuration"]["credentials"]
    fp = recorded["upstreams"][SIMULATED_MODEL_HOST]
    assert fp.startswith("hmac-sha256:") and KEY_A not in json.dumps(recorded)
    for path in a.rglob("*"):  # the key is nowhere in the grid's outputs
        if path.is_file():
            assert KEY_A not in path.read_text(encoding="utf-8", errors="replace"), path

    text, changes = _gate(a, b, tmp_path)
    cred = changes["credentials"]
    assert cred["moved"] is True and cred["shown"] == "yes"
    other = json.loads((b / "results.json").read_text())["configuration"]["credentials"]
    assert (
        cred["detail"]
        == f"{SIMULATED_MODEL_HOST}: {fp} -> {other['upstreams'][SIMULATED_MODEL_HOST]}"
    )
    assert "| credentials | **yes** |" in text
    # the other three did not move
    assert changes["model (id / effort)"]["moved"] is False
    assert changes["tool surface"]["moved"] is False

    _, same = _gate(a, a_again, tmp_path)
    assert same["credentials"]["moved"] is False


def test_gate_says_fingerprints_under_different_salts_do_not_compare(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = _grid(tmp_path / "a", monkeypatch, KEY_A, "salt-one")
    b = _grid(tmp_path / "b", monkeypatch, KEY_A, "salt-two")
    text, changes = _gate(a, b, tmp_path)
    assert (
        changes["credentials"]["moved"] is None
        and changes["credentials"]["shown"] == "not comparable"
    )
    assert "| credentials | not comparable |" in text

    # no credential on either side: comparable whatever the salt
    c = _grid(tmp_path / "c", monkeypatch, None, "salt-one")
    d = _grid(tmp_path / "d", monkeypatch, None, "salt-two")
    _, changes = _gate(c, d, tmp_path)
    assert changes["credentials"]["moved"] is False
