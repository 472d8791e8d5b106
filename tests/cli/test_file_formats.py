"""Every file format has a JSON Schema, and every bundled file validates against its format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import offscope
from offscope.cli import main
from offscope.cli.validate import KINDS

PACKAGE = Path(offscope.__file__).parent
BUNDLED = sorted(
    p
    for p in PACKAGE.rglob("*.yaml")
    if p.read_text(encoding="utf-8").find("schema: offscope.") != -1
)


@pytest.mark.parametrize(
    "kind",
    [
        "ledger",
        "policy",
        "case",
        "trace",
        "grants",
        "budget",
        "disposition",
        "probe-disposition",
        "rules",
        "results",
    ],
)
def test_schema_export_is_json_schema(kind: str, capsys) -> None:
    assert main(["schema", kind]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert (
        schema.get("type") == "object"
        or "oneOf" in schema
        or "anyOf" in schema
        or "$defs" in schema
    )


def test_every_bundled_file_validates(capsys) -> None:
    assert len(BUNDLED) > 30  # ledgers, policies, 21 cases, dispositions
    assert main(["validate", *map(str, BUNDLED)]) == 0
    out = capsys.readouterr().out
    assert out.count("ok  ") == len(BUNDLED)
    seen = {line.split("(")[1].split()[0] for line in out.splitlines()}
    assert (
        {"ledger", "policy", "case", "disposition", "probe-disposition"}
        <= seen
        <= set(KINDS.values())
    )


def test_unknown_schema_key_names_the_file_and_the_known_kinds(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema: offscope.nope/1\nid: x\n")
    assert main(["validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:1:" in err and "offscope.ledger/1" in err
