"""The CI workflows call `gate` and `merge` with flags that exist."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from offscope.cli import build_parser

CI = Path(__file__).parents[2] / "deploy" / "ci"


def _commands(workflow: Path) -> list[list[str]]:
    doc = yaml.safe_load(workflow.read_text())
    env = {k: str(v) for k, v in (doc.get("env") or {}).items()}
    out = []
    for job in doc["jobs"].values():
        for step in job["steps"]:
            script = step.get("run", "")
            script = re.sub(r"\\\n\s*", " ", script)  # join continuation lines
            for line in script.splitlines():
                line = line.strip()
                if line.startswith("offscope "):
                    line = line.replace('"${budget[@]}"', "--budget eval/budget.yaml")
                    line = re.sub(r"\$\{\{[^}]*\}\}", "0", line)
                    line = re.sub(r"\$([A-Z_]+)", lambda m: env.get(m.group(1), m.group(0)), line)
                    out.append(shlex.split(line.split(">")[0])[1:])
    return out


@pytest.mark.parametrize("name", ["scope-gate.yml", "scope-gate-sharded.yml"])
def test_workflow_commands_parse(name: str) -> None:
    commands = _commands(CI / name)
    used = {c[0] for c in commands}
    assert "gate" in used and "grid" in used
    if "sharded" in name:
        assert "merge" in used
    parser = build_parser()
    for argv in commands:
        args = parser.parse_args(argv)
        if argv[0] == "gate":
            assert args.markdown == "gate.md"  # the PR comment body the next step posts
