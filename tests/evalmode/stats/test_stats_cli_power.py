"""`offscope power` / `offscope mde` through the real CLI entry point."""

from __future__ import annotations

import json

import pytest

from offscope.cli import main
from offscope.evalmode.stats import mde, n_per_cell


def test_power_json(capsys) -> None:
    argv = [
        "power",
        "--p0",
        "0.3",
        "--p1",
        "0.1",
        "--cluster-size",
        "3",
        "--icc",
        "0.1",
        "--draws",
        "500",
        "--json",
    ]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    plan = n_per_cell(0.3, 0.1, cluster_size=3, icc=0.1, draws=500)
    assert plan is not None
    assert out["n_per_cell"] == plan.n_per_cell and out["cases_per_cell"] == plan.n_per_cell // 3
    assert out["achieved_power"] == pytest.approx(plan.power) and out["achieved_power"] >= 0.8
    assert out["design_effect"] == pytest.approx(1.2)
    assert out["draws"] == 500 and out["random_state"] == 0
    assert "simulated, 500 draws, random state 0" in out["method"]


def test_power_table_prints_n_power_and_method(capsys) -> None:
    """52% -> 8%: the old normal approximation said 15; the applied tests need 20."""
    assert main(["power", "--p0", "0.52", "--p1", "0.08"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    plan = n_per_cell(0.52, 0.08)
    assert plan is not None and plan.n_per_cell == 20
    assert "n per cell │ 20" in out
    assert f"{plan.power:.3f}" in out and "Fisher" in out and "McNemar" in out
    assert "exact: every outcome enumerated" in out


def test_mde_json_and_table(capsys) -> None:
    assert main(["mde", "--n", "50", "--p0", "0.08", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    up = mde(50, 0.08, direction="up")
    assert up is not None and out["mde_up"] == pytest.approx(up.effect)
    assert out["power_up"] >= 0.8
    assert out["mde_down"] is None and out["p1_down"] is None  # no drop from 8% is detectable at 50
    assert main(["mde", "--n", "20", "--p0", "0.02"]) == 0
    assert "not detectable" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["power", "--p0", "0", "--p1", "0.1"],
        ["power", "--p0", "1", "--p1", "0.1"],
        ["power", "--p0", "1.5", "--p1", "0.1"],
        ["power", "--p0", "-0.2", "--p1", "0.1"],
        ["power", "--p0", "0.2", "--p1", "0.2"],
        ["power", "--p0", "0.2", "--p1", "2"],
        ["power", "--p0", "0.2", "--p1", "0.1", "--icc", "0.1"],
        ["power", "--p0", "0.2", "--p1", "0.1", "--alpha", "0.9", "--power", "0.8"],
        ["mde", "--n", "50", "--p0", "0"],
        ["mde", "--n", "50", "--p0", "1.2"],
        ["mde", "--n", "0", "--p0", "0.1"],
        ["mde", "--n", "50", "--p0", "0.1", "--cluster-size", "0"],
        ["mde", "--n", "5", "--p0", "0.1", "--cluster-size", "3", "--icc", "0.1"],
        ["power", "--p0", "0.2", "--p1", "0.1", "--cluster-size", "3", "--draws", "5"],
    ],
)
def test_bad_input_exits_2_with_a_hint(argv, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error" in err and "(" in err  # message plus the hint in parentheses


def test_help_reads_well(capsys) -> None:
    for cmd in ("power", "mde"):
        with pytest.raises(SystemExit) as exc:
            main([cmd, "--help"])
        assert exc.value.code == 0
        out = capsys.readouterr().out
        assert "examples:" in out and "--cluster-size" in out and "Method:" in out
