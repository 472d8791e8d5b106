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
from offscope.yamlio import InputErrors, load_model

HEAD = "schema: offscope.ledger/1\nid: bad\n"

# (name, yaml after HEAD, expected 1-based line, text the message must contain)
BAD = [
    (
        "unknown key",
        "targets:\n  hosts: [a.test]\n  hostz: [b.test]\n",
        5,
        "unknown key 'targets.hostz'",
    ),
    ("unknown top key", "target:\n  hosts: [a.test]\n", 3, "unknown key 'target'"),
    ("wrong type", "targets:\n  hosts: 5\n", 4, "valid list, got 5"),
    ("wrong stage", "stages:\n  - match: {method: POST}\n    stage: mutate\n", 5, "stages.0.stage"),
    ("bad glob", "targets:\n  hosts: [a.test]\n  paths: ['/srv/[abc']\n", 5, "unclosed '['"),
    ("bad host glob", "targets:\n  hosts:\n    - ok.test\n    - 'a]b.test'\n", 6, "unmatched ']'"),
    (
        "bad path in match",
        "stages:\n  - match: {path: 'x/y'}\n    stage: act\n",
        4,
        "must start with '/'",
    ),
    ("bad record", "targets:\n  records: ['cust*:1']\n", 4, "literal type"),
    ("bad repository", "targets:\n  repositories: [acme]\n", 4, "must be 'owner/name'"),
    (
        "duplicate rule",
        "stages:\n  - match: {method: POST}\n    stage: prepare\n  - match: {method: POST}\n    stage: prepare\n",
        6,
        "duplicate rule: stages[1] repeats stages[0]",
    ),
    (
        "duplicate operator",
        "operator:\n  - {tool: ask}\n  - {tool: x}\n  - {tool: ask}\n",
        6,
        "duplicate rule: operator[2] repeats operator[0]",
    ),
    (
        "duplicate key",
        "targets:\n  hosts: [a.test]\n  hosts: [b.test]\n",
        5,
        "duplicate key 'hosts' (first defined on line 4)",
    ),
    (
        "duplicate target",
        "targets:\n  hosts:\n    - a.test\n    - b.test\n    - A.test\n",
        7,
        "duplicate target 'a.test'",
    ),
    (
        "capture not in path",
        "extract:\n  - match: {path: '/x/{id}'}\n    targets: {record: 'c:{idd}'}\n",
        4,
        "{idd} is not a capture",
    ),
    (
        "unknown namespace",
        "extract:\n  - match: {path: '/x/{id}'}\n    targets: {record: 'c:{foo.bar}'}\n",
        4,
        "unknown reference {foo.bar}",
    ),
    ("literal template", "extract:\n  - targets: {record: 'c:1'}\n", 4, "references nothing"),
    (
        "capture twice",
        "extract:\n  - match: {path: '/{a}/{a}'}\n    targets: {record: 'c:{a}'}\n",
        4,
        "appears twice",
    ),
    (
        "bad expiry",
        "grants:\n  - {id: g, target: 'host:x.test', approver: me, expires: soon}\n",
        4,
        "not an ISO 8601 timestamp",
    ),
    (
        "bad grant target",
        "grants:\n  - {id: g, target: 'x.test', approver: me, expires: '2030-01-01'}\n",
        4,
        "must be 'kind:value'",
    ),
    ("bad id", "", 2, "String should match pattern"),
    ("invalid yaml", "targets: [\n", 4, "invalid YAML"),
    # Inputs that used to escape as tracebacks (re.error, RecursionError, TypeError).
    (
        "reversed class range",
        "targets:\n  paths: ['/srv/ok/**', '/srv/[z-a]/x']\n",
        4,
        "bad character range z-a in glob '/srv/[z-a]/x' (write the lower character first: [a-z])",
    ),
    (
        "reversed range in a rule",
        "stages:\n  - match: {path: '/x/[9-0]'}\n    stage: act\n",
        4,
        "bad character range 9-0",
    ),
    (
        "reversed range in a host",
        "targets:\n  hosts: ['api[z-a].test']\n",
        4,
        "bad character range z-a",
    ),
    (
        "deep flow nesting",
        "description: " + "[" * 10_000 + "]" * 10_000 + "\n",
        3,
        "nesting deeper than 100 levels",
    ),
    (
        "deep block nesting",
        "description:\n" + "".join("  " * i + "a:\n" for i in range(1, 3000)),
        102,
        "nesting deeper than 100 levels",
    ),
    ("unhashable key", "? [a, b]\n: 1\n", 3, "unhashable key"),
    ("control character", 'description: "a\x00b"\n', 3, "is not allowed"),
    (
        "invalid IDN host",
        "targets:\n  hosts: [a.test, 'x_\u00e9.test']\n",
        4,
        "not a valid international domain name",
    ),
    (
        "alias bomb",
        "x0: &a0 [a, a, a, a, a, a, a, a, a]\n"
        + "".join(f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10))
        + "targets: {hosts: *a9}\n",
        9,
        "aliases expand to more than 5,000,000 values",
    ),  # x6: 9^7 values and their lists
    (
        "recursive alias",
        "description: &a [*a]\n",
        3,
        "an alias refers to the node that contains it",
    ),
    (
        "wildcard in IDN label",
        "targets:\n  hosts: ['b\u00fc*.test']\n",
        4,
        "write that label in punycode",
    ),
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


@pytest.mark.parametrize(
    ("name", "body", "line", "message"),
    BAD[:6] + BAD[9:14],
    ids=[b[0] for b in BAD[:6] + BAD[9:14]],
)
def test_cli_validate_bad(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    body: str,
    line: int,
    message: str,
) -> None:
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
    proc = subprocess.run(
        [*_offscope(), "validate", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert f"{bad}:5:" in proc.stderr.replace("\n", "")
    assert "unclosed '['" in proc.stderr
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout


# --- every problem, not the first one ----------------------------------------------

MANY = (
    HEAD
    + """targets:
  hosts: [a.test]
  paths: ['/srv/[z-a]']
  hostz: [b.test]
stages:
  - match: {method: POST}
    stage: mutate
"""
)


def test_every_problem_is_reported_with_its_line() -> None:
    with pytest.raises(InputErrors) as info:
        load_model(Ledger, "many.yaml", MANY)
    got = [(e.line, e.message) for e in info.value.errors]
    assert [line for line, _ in got] == [5, 6, 9]
    assert (
        "bad character range z-a" in got[0][1]
        and "hostz" in got[1][1]
        and "stages.0.stage" in got[2][1]
    )
    text = str(info.value)
    assert text.splitlines() == [f"many.yaml:{line}: {message}" for line, message in got]
    assert "more)" not in text


def test_cli_validate_prints_every_problem_of_every_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    many = tmp_path / "many.yaml"
    many.write_text(MANY)
    dup = tmp_path / "dup.yaml"
    dup.write_text(HEAD + "operator:\n  - {tool: ask}\n  - {tool: ask}\n")
    assert main(["validate", str(many), str(EXAMPLES / "billing-agent.yaml"), str(dup)]) == 2
    out = capsys.readouterr()
    err = " ".join(out.err.split())
    for where in (f"{many}:5:", f"{many}:6:", f"{many}:9:", f"{dup}:5:"):
        assert where in err, out.err
    assert "more)" not in err and "Traceback" not in err
    assert "4 problems in 2 of 3 file(s)" in err
    assert "ok" in out.out and "billing-agent" in out.out  # the good file is still checked


def test_non_utf8_file_names_line_and_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"schema: offscope.ledger/1\nid: latin\ndescription: caf\xe9\n")
    with pytest.raises(InputError) as info:
        load_ledger(bad)
    assert (
        info.value.line == 3
        and "not UTF-8" in info.value.message
        and info.value.hint == "save the file as UTF-8"
    )
    assert main(["validate", str(bad)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert (
        f"{bad}:3: not UTF-8 text: byte 0xe9 at column 17" in err
        and "save the file as UTF-8" in err
    )


def test_a_utf8_bom_is_accepted(tmp_path: Path) -> None:
    bom = tmp_path / "bom.yaml"
    bom.write_bytes(b"\xef\xbb\xbf" + (EXAMPLES / "billing-agent.yaml").read_bytes())
    assert load_ledger(bom).id == "billing-agent"


def test_port_in_a_host_target_is_a_warning_and_ignored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "port.yaml"
    path.write_text(HEAD + "targets:\n  hosts:\n    - api.acme.test:8443\n    - '*.acme.test:80'\n")
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr()
    err = " ".join(out.err.split())
    assert f"warning: {path}:5: host 'api.acme.test:8443' has a port, which is ignored" in err
    assert f"warning: {path}:6:" in err and "ok" in out.out
    led = load_ledger(path)
    assert led.ledger.targets.hosts == ["api.acme.test", "*.acme.test"]
    for host in ("api.acme.test", "api.acme.test:8443", "api.acme.test:1", "x.acme.test:443"):
        assert led.contains("host", host), host


BROKEN_FILES = {  # name -> (bytes, the line the error must name)
    "reversed-range.yaml": ((HEAD + "targets:\n  paths: ['/srv/[z-a]']\n").encode(), 4),
    "deep.yaml": ((HEAD + "description: " + "[" * 10_000 + "]" * 10_000 + "\n").encode(), 3),
    "latin1.yaml": (HEAD.encode() + b"description: caf\xe9\n", 3),
}


@pytest.mark.parametrize("name", sorted(BROKEN_FILES))
def test_proxy_start_up_refuses_with_exit_2(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    data, line = BROKEN_FILES[name]
    path.write_bytes(data)
    proc = subprocess.run(
        [
            *_offscope(),
            "proxy",
            "--ledger",
            str(path),
            "--listen",
            "127.0.0.1:0",
            "--control-listen",
            "",
            "--trace",
            str(tmp_path / "t.jsonl"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert f"{path}:{line}:" in proc.stderr.replace("\n", "")
    assert "Traceback" not in proc.stderr
