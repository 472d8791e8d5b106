"""`offscope power` / `offscope mde` through the real CLI entry point."""

from __future__ import annotations

import json

import pytest

from offscope.cli import main
from offscope.evalmode.stats import mde, n_per_cell


def test_power_json(capsys) -> None:
    assert (
        main(
            [
                "power",
                "--p0",
                "0.08",
                "--p1",
                "0.04",
                "--cluster-size",
                "5",
                "--icc",
                "0.1",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["n_per_cell"] == n_per_cell(0.08, 0.04, cluster_size=5, icc=0.1)
    assert out["n_independent"] == n_per_cell(0.08, 0.04)
    assert out["design_effect"] == pytest.approx(1.4)
    assert out["cases_per_cell"] == -(-out["n_per_cell"] // 5)


def test_power_table(capsys) -> None:
    assert main(["power", "--p0", "0.5", "--p1", "0.3"]) == 0
    out = capsys.readouterr().out
    assert "n per cell" in out and "93" in out


def test_mde_json_and_table(capsys) -> None:
    assert main(["mde", "--n", "50", "--p0", "0.08", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mde_up"] == pytest.approx(mde(50, 0.08, direction="up"))
    assert out["mde_down"] == pytest.approx(mde(50, 0.08, direction="down"))
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
        assert "examples:" in out and "--cluster-size" in out
