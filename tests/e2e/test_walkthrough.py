"""The walkthrough page (docs/walkthrough.md), run as written.

Every ```sh block of that page is run, in order, in one bash
session (`set -euo pipefail`), from the repository root. Only these change:
  - the ports (8080 proxy, 9464 metrics, 9465 control, 9090 Prometheus, 8000 stand-in API)
    become free loopback ports;
  - `~/offscope-demo` becomes a temporary directory;
  - the rule files Prometheus loads are copies of deploy/prometheus/*.rules.yml
    whose groups evaluate every 1s instead of every 1m (expressions, `for:`
    and thresholds unchanged), so the alert shows up in seconds;
  - `pip install -e .` is skipped (the test runs inside the installed package).
Then the outputs are checked against what the page says they show, and the
recorded touches-per-1,000-runs value against `offscope report --json`.

Needs prometheus and promtool (skipped without them, except under CI=true) and
curl (skipped without it).

The README's short "Put it in front of your agent" block is run as written too
(`test_readme_setup_runs_as_written`), with free ports, a route for the example's
made-up host, and a stand-in `my_agent.py` (an httpx client).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.deploy_testlib import DEPLOY, PROM, REPO, require_tool

PAGE = DEPLOY.parent / "docs" / "walkthrough.md"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sh_blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", text, flags=re.S)


def fast_rules(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    for src in PROM.glob("*.rules.yml"):
        doc = yaml.safe_load(src.read_text())
        for group in doc["groups"]:
            group["interval"] = "1s"
        (out / src.name).write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def script_from_page(tmp: Path, ports: dict[int, int], rules: Path) -> str:
    blocks = sh_blocks(PAGE.read_text())
    assert len(blocks) >= 9, "the walkthrough lost a step"
    text = "\n".join(
        f'echo "### step {i}"; echo "step {i} $(date +%s.%N)" >&2\n{b}'
        for i, b in enumerate(blocks, 1)
    )
    subs = [
        ("pip install -e .\n", ": pip install -e . skipped by the test\n"),
        ("~/offscope-demo", str(tmp / "demo")),
        ("$OFFSCOPE_REPO/deploy/prometheus/*.rules.yml", f"{rules}/*.rules.yml"),
        ("http.server 8000", f"http.server {ports[8000]}"),
    ] + [(f"127.0.0.1:{old}", f"127.0.0.1:{new}") for old, new in ports.items()]
    for old, new in subs:
        assert old in text, (
            f"the walkthrough no longer contains {old!r}; update the test's substitutions"
        )
        text = text.replace(old, new)
    return "set -euo pipefail\n" + text


@pytest.fixture(scope="module")
def tools() -> dict[str, str]:
    found = {name: require_tool(name) for name in ("prometheus", "promtool")}
    if not shutil.which("curl"):  # the stand-in agent; not part of the prometheus package
        pytest.skip("curl not installed")
    return found


# A hang guard, not a speed check: the page runs a 126-trajectory grid, and on a slow
# 2-core machine with the rest of the suite beside it the page took over 150 s.
WALKTHROUGH_SECONDS = 600


@pytest.mark.timeout(WALKTHROUGH_SECONDS + 60)
def test_every_step_is_a_command_that_works(tmp_path, tools):
    ports = {p: _free_port() for p in (8080, 9464, 9465, 9090, 8000)}
    rules = fast_rules(tmp_path / "rules")
    script = script_from_page(tmp_path, ports, rules)
    (tmp_path / "walkthrough.sh").write_text(script)
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["HOME"] = str(tmp_path / "home")
    out_path, err_path = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(
            ["bash", str(tmp_path / "walkthrough.sh")],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=WALKTHROUGH_SECONDS)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            # The page ends with `kill $(jobs -p)`; this catches a run that stopped early.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            if proc.poll() is None:
                proc.wait(timeout=10)
    stdout, stderr = out_path.read_text(errors="replace"), err_path.read_text(errors="replace")
    assert code == 0, (
        f"walkthrough failed (exit {code}; None: still running after {WALKTHROUGH_SECONDS} s):\n"
        f"{stdout[-4000:]}\n--- stderr ---\n{stderr[-4000:]}"
    )

    demo = tmp_path / "demo"
    steps = dict(re.findall(r"### step (\d+)\n(.*?)(?=### step \d+\n|\Z)", stdout, flags=re.S))
    # 2. validate
    assert "ok  ledger.yaml" in steps["2"] and "ok  policy.yaml" in steps["3"]
    # 6. /metrics: 30 runs, 10 out-of-scope calls, 10 self-granted
    metrics = steps["6"]
    assert 'offscope_runs_total{ledger="billing-agent"} 30.0' in metrics
    assert 'offscope_self_granted_permissions_total{ledger="billing-agent"} 10.0' in metrics
    out_calls = sum(
        float(v)
        for v in re.findall(r'offscope_tool_calls_total\{[^}]*scope="out"[^}]*\} (\S+)', metrics)
    )
    all_calls = sum(
        float(v) for v in re.findall(r"offscope_tool_calls_total\{[^}]*\} (\S+)", metrics)
    )
    assert (out_calls, all_calls) == (10, 40)
    # 7. the alerts and the recorded value
    alerts = steps["7"]
    assert re.search(
        r'ALERTS\{[^}]*alertname="OffscopeSelfGrantedPermission"[^}]*alertstate="firing"', alerts
    )
    assert re.search(
        r'ALERTS\{[^}]*alertname="OffscopeOutOfScopeTouchesHigh"[^}]*alertstate="pending"', alerts
    )
    m = re.search(
        r'ledger:offscope_out_of_scope_touches_per_1k_runs:ratio1h\{ledger="billing-agent"\} => (\S+)',
        alerts,
    )
    assert m, alerts
    report = subprocess.run(
        [sys.executable, "-m", "offscope.cli", "report", str(demo / "trace.jsonl"), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    agg = json.loads(report.stdout)["aggregate"]
    assert math.isclose(float(m.group(1)), agg["touches_per_1000_runs"], rel_tol=1e-9)
    assert round(agg["touches_per_1000_runs"]) == 333 and agg["self_granted"] == 10
    # 8. report prints the same number
    assert "333" in steps["8"]
    # 9. shadow-compare: production is worse than the intended cell, exit 1
    assert "Production is WORSE than the eval suite predicted (closed-sentinel-broken)" in " ".join(
        steps["9"].split()
    )
    assert "shadow-compare exit 1" in steps["9"]
    assert (demo / "grid" / "results.json").exists()
    # 11-13. from shadow to enforce: replay under enforce, coverage, the narrowed ledger in CI
    replay = json.loads((demo / "replay" / "replay.json").read_text())
    assert replay["counts"]["newly_blocked"] == 10 and replay["counts"]["scope_changed"] == 0
    assert [(g["target"], g["decision"], g["calls"]) for g in replay["changes"]] == [
        ("record:customer:9999", "shadow -> block", 10)
    ]
    assert replay["interrupted"]["runs"] == 10 and replay["interrupted"]["at_step"] == {"3": 10}
    assert replay["counts"]["incomplete"] == 0 and replay["counts"]["fallback"] == 0
    assert "runs that would have been interrupted: 10 of 30 (step 3: 10)" in steps["11"]
    assert "unused: targets.hosts[2]: ops.acme.test" in steps["12"]
    assert "unused: targets.records[0]" not in steps["12"] and "host 1/5" in steps["12"]
    assert "ok  narrow.yaml" in steps["13"] and "host 1/1, record 1/1, extract 1/1" in steps["13"]


# --- the README's "Put it in front of your agent" block, run as written -----------------

README = DEPLOY.parent / "README.md"

# What the block's `python my_agent.py` runs here: an ordinary httpx client, which reads
# HTTP_PROXY / HTTPS_PROXY and SSL_CERT_FILE from the environment the block exported.
STAND_IN_AGENT = """\
import httpx
with httpx.Client(timeout=30) as client:
    client.get("http://crm.acme.test/customers/4411")     # named in the example ledger
    client.patch("http://crm.acme.test/customers/9999")   # nobody named it
"""


def readme_setup_script(tmp: Path, ports: dict[int, int]) -> str:
    text = README.read_text()
    start = text.index("## Put it in front of your agent")
    block = sh_blocks(text[start:])[0]
    subs = [
        # The example hosts exist only behind the proxy: send them to a loopback stand-in API.
        (
            "--ledger ledger.yaml --policy",
            f"--ledger ledger.yaml --route crm.acme.test=127.0.0.1:{ports[8000]} "
            f"--listen 127.0.0.1:{ports[8080]} --metrics 127.0.0.1:{ports[9464]} "
            f"--control-listen 127.0.0.1:{ports[9465]} --policy",
        ),
        (
            "offscope runs end run-1",
            f"offscope runs end run-1 --control http://127.0.0.1:{ports[9465]}",
        ),
    ] + [
        (f"127.0.0.1:{old}", f"127.0.0.1:{new}")
        for old, new in ports.items()
        if old not in (8000, 9465)
    ]
    for old, new in subs:
        assert old in block, (
            f"the README block no longer contains {old!r}; update the test's substitutions"
        )
        block = block.replace(old, new)
    shutil.copy(
        REPO / "offscope" / "ledgers" / "examples" / "billing-agent.yaml", tmp / "ledger.yaml"
    )
    (tmp / "my_agent.py").write_text(STAND_IN_AGENT)
    api = f"python3 -m http.server {ports[8000]} --bind 127.0.0.1 > api.log 2>&1 &\n"
    return "set -euo pipefail\n" + api + block


def test_readme_setup_runs_as_written(tmp_path):
    if not shutil.which("curl"):
        pytest.skip("curl not installed")
    ports = {p: _free_port() for p in (8080, 9464, 9465, 8000)}
    (tmp_path / "setup.sh").write_text(readme_setup_script(tmp_path, ports))
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["HOME"] = str(
        tmp_path / "home"
    )  # `offscope ca` and the proxy share the default CA directory
    # Output goes to files: the proxy and the stand-in API stay in the background and
    # would hold a pipe open after the block ends.
    out_path, err_path = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(
            ["bash", "setup.sh"],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pass
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            if proc.poll() is None:
                proc.wait(timeout=10)
    stdout, stderr = out_path.read_text(errors="replace"), err_path.read_text(errors="replace")
    assert proc.returncode == 0, (
        f"README block failed (exit {proc.returncode}):\n{stdout[-3000:]}\n{stderr[-3000:]}"
    )
    # The metrics the block greps: one run, two tool calls, one of them out of scope.
    assert 'offscope_runs_total{ledger="billing-agent"} 1.0' in stdout
    calls = {"in": 0.0, "out": 0.0}
    for scope, value in re.findall(
        r'offscope_tool_calls_total\{[^}]*scope="(in|out)"[^}]*\} (\S+)', stdout
    ):
        calls[scope] += float(value)
    assert calls == {"in": 1.0, "out": 1.0}, stdout
    # ... and `offscope report` on the trace the block wrote agrees.
    report = subprocess.run(
        [sys.executable, "-m", "offscope.cli", "report", str(tmp_path / "trace.jsonl"), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    agg = json.loads(report.stdout)["aggregate"]
    assert agg["touches_per_1000_runs"] == 1000.0, agg


def test_readme_shadow_to_enforce_block_is_the_walkthroughs():
    """The README's "From shadow to enforce" block is run by the walkthrough test:
    each of its lines stands in one of the page's sh blocks."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## From shadow to enforce", 1)[1].split("\n## ", 1)[0]
    (block,) = sh_blocks(section)
    page = "\n".join(sh_blocks(PAGE.read_text()))
    for line in block.strip().splitlines():
        assert line in page.splitlines(), f"README line not in the walkthrough: {line!r}"
