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


def test_a_sharded_grid_job_is_rerun_without_a_409_and_resumes() -> None:
    doc = yaml.safe_load((CI / "scope-gate-sharded.yml").read_text())
    steps = doc["jobs"]["grid"]["steps"]
    uses = [(i, s) for i, s in enumerate(steps) if str(s.get("uses", "")).startswith("actions/")]
    (grid_at,) = [i for i, s in enumerate(steps) if s.get("id") == "grid"]
    uploads = [(i, s) for i, s in uses if "upload-artifact@v4" in s["uses"]]
    downloads = [(i, s) for i, s in uses if "download-artifact@v4" in s["uses"]]
    (up_at, up), (down_at, down) = uploads[0], downloads[0]
    shard_name = "grid-${{ matrix.side }}-${{ matrix.shard }}"
    # One artifact name per shard, replaced by every attempt: no 409 on a re-run, and the
    # merge job's pattern still finds exactly one artifact per shard.
    assert up["with"]["name"] == shard_name and up["with"]["overwrite"] is True
    # Uploaded whatever the grid's exit code (a shard stopped by infra errors is resumed).
    assert up_at > grid_at and "always()" in up["if"]
    # A re-run first downloads what the earlier attempt uploaded, into the same --out.
    assert down_at < grid_at and down["with"]["name"] == shard_name
    assert "run_attempt" in down["if"] and down["continue-on-error"] is True
    assert down["with"]["path"] == up["with"]["path"]
    assert f"--out {up['with']['path']}" in " ".join(steps[grid_at]["run"].split())
    merge_steps = doc["jobs"]["merge-and-gate"]["steps"]
    (fetch,) = [s for s in merge_steps if "download-artifact" in str(s.get("uses", ""))]
    assert fetch["with"]["pattern"] == "grid-*"
