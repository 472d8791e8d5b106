"""results.json is a typed, versioned file: its JSON Schema validates a real grid's file,
the file reads back unchanged, and a malformed, foreign or newer file is refused with
its file, line and field (exit 2), by every command that reads it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import jsonschema
import pytest

from offscope.cli import main
from offscope.evalmode.case import BUNDLED, load_cases
from offscope.evalmode.grid import Grid, GridConfig, parse_cells
from offscope.evalmode.report.results import build_results, write_reports
from offscope.evalmode.report.results_model import SCHEMA_VERSION, Results, load_results

# Two cells one knob apart (a contrast), two cases (clustered intervals), two reps.
CELLS = "open-affirmative-broken,closed-affirmative-broken"


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("grid")
    cfg = GridConfig(
        cases=load_cases([BUNDLED])[:2],
        cells=parse_cells(CELLS),
        reps=2,
        out=out,
        seed=5,
        workers=4,
    )
    asyncio.run(Grid(cfg).run())
    write_reports(out, build_results(out))
    return out


def _schema(capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(["schema", "results"]) == 0
    return json.loads(capsys.readouterr().out)


def test_schema_validates_a_real_grid_results_file(grid: Path, capsys) -> None:
    data = json.loads((grid / "results.json").read_text(encoding="utf-8"))
    # The file has what the schema is there to describe: runs, both cells, a contrast, clustered rates.
    assert len(data["runs"]) == 8 and set(data["cells"]) == set(CELLS.split(","))
    assert (
        len(data["contrasts"]) == 1
        and "clustered_ci95" in data["cells"]["open-affirmative-broken"]["rates"]["acted"]
    )
    assert data["schema_version"] == SCHEMA_VERSION
    schema = _schema(capsys)
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(data, schema)
    # The schema is strict enough to catch what the reader catches.
    data["runs"][0]["acted"] = "maybe"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, schema)


def test_a_results_file_reads_back_byte_for_byte(grid: Path) -> None:
    text = (grid / "results.json").read_text(encoding="utf-8")
    results = load_results(grid)
    assert results.source == str(grid / "results.json")
    assert results.to_json() == text  # nothing added (no path), nothing lost (absent stays absent)
    assert "_path" not in text and str(grid) not in text


def test_validate_accepts_a_real_results_file(grid: Path, capsys) -> None:
    assert main(["validate", str(grid / "results.json")]) == 0
    assert "(results " in capsys.readouterr().out


def _malformed(grid: Path, tmp_path: Path) -> tuple[Path, int]:
    """results.json with run 3's `acted` a string and cell block's `n` deleted; returns
    the file and the line of run 3's `acted`."""
    data = json.loads((grid / "results.json").read_text(encoding="utf-8"))
    data["runs"][3]["acted"] = "maybe"
    del data["cells"]["closed-affirmative-broken"]["n"]
    text = json.dumps(data, indent=2, sort_keys=True)
    bad = tmp_path / "bad.json"
    bad.write_text(text, encoding="utf-8")
    runs_at = text.index('"runs": [')
    acted_at = text.index('"acted": "maybe"', runs_at)
    return bad, text.count("\n", 0, acted_at) + 1


@pytest.mark.parametrize("command", ["gate", "shadow-compare", "validate"])
def test_a_malformed_results_file_names_file_line_and_field(
    grid: Path, tmp_path: Path, capsys, command: str
) -> None:
    bad, line = _malformed(grid, tmp_path)
    trace = grid / "trajectories.jsonl"
    argv = {
        "gate": ["gate", "--baseline", str(grid), "--candidate", str(bad)],
        "shadow-compare": ["shadow-compare", str(bad), str(trace)],
        "validate": ["validate", str(bad)],
    }[command]
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{bad}:{line}: runs.3.acted:" in err, err
    assert "missing required key 'cells.closed-affirmative-broken.n'" in err, err
    assert "offscope report GRID_DIR" in err  # what to do


def test_a_file_without_schema_version_loads_as_version_1(grid: Path, tmp_path: Path) -> None:
    data = json.loads((grid / "results.json").read_text(encoding="utf-8"))
    del data["schema_version"]
    # what version 2 added (infrastructure failures counted) is absent from an old file
    del data["infra_errors"]
    for block in data["cells"].values():
        del block["infra_errors"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data, indent=2, sort_keys=True), encoding="utf-8")
    results = load_results(old)
    assert isinstance(results, Results) and results.schema_version == 1
    assert results.infra_error_count == 0 and results.infra_errors == []
    assert results.cells.keys() == set(CELLS.split(","))
    # Written back, it is the same file: an old file is not silently upgraded.
    assert results.to_json().replace('  "schema_version": 1,\n', "") == old.read_text(
        encoding="utf-8"
    )


def test_a_newer_or_foreign_file_says_what_to_do(grid: Path, tmp_path: Path, capsys) -> None:
    data = json.loads((grid / "results.json").read_text(encoding="utf-8"))
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({**data, "schema_version": SCHEMA_VERSION + 1}), encoding="utf-8")
    assert main(["gate", "--baseline", str(grid), "--candidate", str(newer)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{newer}:" in err and "newer offscope" in err and "upgrade offscope" in err

    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({"schema": "offscope.report/1", "runs": []}), encoding="utf-8")
    assert main(["shadow-compare", str(foreign), str(grid / "trajectories.jsonl")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{foreign}:1: not an offscope.results/1 file" in err

    broken = tmp_path / "broken.json"
    broken.write_text('{"schema": "offscope.results/1",\n  "runs": [,]}', encoding="utf-8")
    assert main(["gate", "--baseline", str(broken), "--candidate", str(grid)]) == 2
    assert f"{broken}:2: cannot read results: not JSON" in " ".join(capsys.readouterr().err.split())
