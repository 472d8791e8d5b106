"""Docs examples that must stay what the code accepts and answers:

- every grants file shown in docs/ (a YAML block with a top-level `grants:`
  list that is not a ledger) declares `schema: offscope.grants/1` and passes
  `offscope validate`;
- docs/runs.md's table of `GET /runs/RUN` keys is the key set a real proxy
  answers with (a registered run under a policy with budgets, after a call),
  and the keys it calls conditional are absent when their condition is;
- docs/stdio-mcp.md's account of registered runs: the proxy's `offscope runs`
  starts them, and `offscope mcp` takes no run credential.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import yaml

from offscope.cli import build_parser
from tests.support.sidecar_kit import LEDGER_YAML, EchoUpstream, ProxyProcess
from tests.test_docs_links import DOCS, PAGES, code_blocks

LEDGER_KEYS = {"targets", "extract", "stages", "operator", "llm", "runs"}


def _grants_examples() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for i, block in enumerate(code_blocks(page.read_text(), ("yaml", "yml"))):
            try:
                data = yaml.safe_load(block)
            except yaml.YAMLError:
                continue  # fragments with placeholders: not a file
            is_grants = isinstance(data, dict) and isinstance(data.get("grants"), list)
            if (
                is_grants
                and not LEDGER_KEYS & set(data)
                and data.get("schema") != "offscope.ledger/1"
            ):
                found.append((f"{page.name} block {i}", block))
    return found


def test_every_grants_file_in_the_docs_validates(tmp_path: Path) -> None:
    examples = _grants_examples()
    assert examples, "docs/approvals.md shows a grants file"
    files = []
    for n, (where, block) in enumerate(examples):
        assert re.search(r"^schema: offscope\.grants/1$", block, re.M), (
            f"{where}: a grants file starts with `schema: offscope.grants/1`"
        )
        files.append(tmp_path / f"grants-{n}.yaml")
        files[-1].write_text(block, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "offscope.cli", "validate", *map(str, files)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _documented_summary_keys() -> tuple[set[str], set[str]]:
    """(every key of the runs.md summary table, the keys it says appear only sometimes)."""
    text = (DOCS / "runs.md").read_text(encoding="utf-8")
    section = text.split("### A run's summary", 1)[1].split("\n\n|", 1)[1].split("\n\n", 1)[0]
    keys: set[str] = set()
    conditional: set[str] = set()
    for row in section.splitlines()[2:]:
        cells = row.split("|")
        names = set(re.findall(r"`([a-z_]+)`", cells[1]))
        keys |= names
        if cells[2].strip().startswith("only"):
            conditional |= names
    return keys, conditional


def test_runs_summary_keys_are_what_the_proxy_answers(tmp_path: Path, confdir: str) -> None:
    documented, conditional = _documented_summary_keys()
    ledger = tmp_path / "ledger.yaml"
    ledger.write_text(LEDGER_YAML, encoding="utf-8")
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "schema: offscope.policy/1\nid: budgeted\nmode: enforce\nbudgets: {max_tool_calls: 5}\n",
        encoding="utf-8",
    )
    up = EchoUpstream().start()
    try:
        with ProxyProcess(
            tmp_path, ledger=str(ledger), policy=str(policy), routes=up.routes(), confdir=confdir
        ) as proxy:
            started = proxy.control("POST", "/runs", json={"agent": "billing-bot"}).json()
            run, credential = started["run"], started["credential"]
            with httpx.Client(
                proxy=f"http://{run}:{credential}@127.0.0.1:{proxy.port}", trust_env=False
            ) as client:
                assert client.get("http://crm.acme.test/customers/4411").status_code == 200
            with httpx.Client(proxy=proxy.proxy_url("plain-run"), trust_env=False) as client:
                client.get("http://crm.acme.test/customers/4411")
            registered = proxy.control("GET", f"/runs/{run}").json()
            plain = proxy.control("GET", "/runs/plain-run").json()
    finally:
        up.stop()
    assert set(registered) == documented
    assert conditional == {"spent", "registered", "agent", "expires", "credential_valid"}
    assert set(plain) == documented - conditional | {"spent"}  # unregistered, same budgets
    assert registered["spent"] == {"tool_calls": 1}


def test_stdio_mcp_docs_on_registered_runs() -> None:
    text = (DOCS / "stdio-mcp.md").read_text(encoding="utf-8")
    assert "not implemented" not in text
    subcommands = {
        name: parser
        for action in build_parser()._subparsers._group_actions  # type: ignore[union-attr]
        for name, parser in getattr(action, "choices", {}).items()
    }
    mcp_flags = {s for a in subcommands["mcp"]._actions for s in a.option_strings}
    assert not {f for f in mcp_flags if "credential" in f}, "the docs say the wrapper takes none"
    assert {"--run"} <= mcp_flags
    runs = subcommands["runs"].format_help()
    assert "start" in runs
