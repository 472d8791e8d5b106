"""Bad ledgers: InputError with the right line, exit code 2 with file:line, no traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from offscope.cli import main
from offscope.errors import InputError
from offscope.ledgers import EXAMPLES, Ledger, load_ledger
from offscope.yamlio import load_model

HEAD = "schema: offscope.ledger/1\nid: bad\n"

# (name, yaml after HEAD, expected 1-based line, text the message must contain)
BAD = [
    ("unknown key", "targets:\n  hosts: [a.test]\n  hostz: [b.test]\n", 5, "unknown key 'targets.hostz'"),
    ("unknown top key", "target:\n  hosts: [a.test]\n", 3, "unknown key 'target'"),
    ("wrong type", "targets:\n  hosts: 5\n", 4, "valid list, got 5"),
    ("wrong stage", "stages:\n  - match: {method: POST}\n    stage: mutate\n", 5, "stages.0.stage"),
    ("bad glob", "targets:\n  hosts: [a.test]\n  paths: ['/srv/[abc']\n", 5, "unclosed '['"),
    ("bad host glob", "targets:\n  hosts:\n    - ok.test\n    - 'a]b.test'\n", 6, "unmatched ']'"),
    ("bad path in match", "stages:\n  - match: {path: 'x/y'}\n    stage: act\n", 4, "must start with '/'"),
    ("bad record", "targets:\n  records: ['cust*:1']\n", 4, "literal type"),
    ("bad repository", "targets:\n  repositories: [acme]\n", 4, "must be 'owner/name'"),
    ("duplicate rule",
     "stages:\n  - match: {method: POST}\n    stage: prepare\n  - match: {method: POST}\n    stage: prepare\n",
     6, "duplicate rule: stages[1] repeats stages[0]"),
    ("duplicate operator", "operator:\n  - {tool: ask}\n  - {tool: x}\n  - {tool: ask}\n", 6,
     "duplicate rule: operator[2] repeats operator[0]"),
    ("duplicate key", "targets:\n  hosts: [a.test]\n  hosts: [b.test]\n", 5, "duplicate key 'hosts' (first defined on line 4)"),
    ("duplicate target", "targets:\n  hosts:\n    - a.test\n    - b.test\n    - A.test\n", 7, "duplicate target 'a.test'"),
    ("capture not in path",
     "extract:\n  - match: {path: '/x/{id}'}\n    targets: {record: 'c:{idd}'}\n", 4, "{idd} is not a capture"),
    ("unknown namespace",
     "extract:\n  - match: {path: '/x/{id}'}\n    targets: {record: 'c:{foo.bar}'}\n", 4, "unknown reference {foo.bar}"),
    ("literal template", "extract:\n  - targets: {record: 'c:1'}\n", 4, "references nothing"),
    ("capture twice", "extract:\n  - match: {path: '/{a}/{a}'}\n    targets: {record: 'c:{a}'}\n", 4, "appears twice"),
    ("bad expiry", "grants:\n  - {id: g, target: 'host:x.test', approver: me, expires: soon}\n", 4,
     "not an ISO 8601 timestamp"),
    ("bad grant target", "grants:\n  - {id: g, target: 'x.test', approver: me, expires: '2030-01-01'}\n", 4,
     "must be 'kind:value'"),
    ("bad id", "", 2, "String should match pattern"),
    ("invalid yaml", "targets: [\n", 4, "invalid YAML"),
]


@pytest.mark.parametrize(("name", "body", "line", "message"), BAD, ids=[b[0] for b in BAD])
def test_input_error_line_and_message(name: str, body: str, line: int, message: str) -> None:
    text = HEAD + body
    if name == "bad id":
        text = "schema: offscope.ledger/1\nid: Not An Id\n"
    with pytest.raises(InputError) as info:
        load_model(Ledger, "bad.yaml", text)
    err = info.value
    assert err.line == line, str(err)
    assert message in err.message
    assert err.path == "bad.yaml"
    assert str(err).startswith(f"bad.yaml:{line}: ")


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="file not found"):
        load_ledger(tmp_path / "nope.yaml")
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(InputError, match="file is empty"):
        load_ledger(empty)


def test_cli_validate_ok(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(EXAMPLES / "billing-agent.yaml")]) == 0
    assert "ok" in capsys.readouterr().out


@pytest.mark.parametrize(("name", "body", "line", "message"), BAD[:6] + BAD[9:14],
                         ids=[b[0] for b in BAD[:6] + BAD[9:14]])
def test_cli_validate_bad(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                          name: str, body: str, line: int, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(HEAD + body)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:{line}:" in err.replace("\n", "")
    assert "Traceback" not in err


def test_cli_validate_unknown_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("schema: offscope.nope/1\nid: x\n")
    assert main(["validate", str(path)]) == 2
    assert f"{path}:1:" in capsys.readouterr().err.replace("\n", "")


def test_cli_schema_ledger(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema", "ledger"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert "targets" in schema["properties"] and "schema" in schema["properties"]


def test_cli_schema_trace(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema", "trace"]) == 0
    text = capsys.readouterr().out
    assert "tool_call" in text and "run_start" in text


def _offscope() -> list[str]:
    exe = shutil.which("offscope")
    return [exe] if exe else [sys.executable, "-c", "from offscope.cli import entry; entry()"]


def test_real_subprocess_validate(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(HEAD + "targets:\n  hosts: [a.test]\n  paths: ['/srv/[abc']\n")
    proc = subprocess.run([*_offscope(), "validate", str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert f"{bad}:5:" in proc.stderr.replace("\n", "")
    assert "unclosed '['" in proc.stderr
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
