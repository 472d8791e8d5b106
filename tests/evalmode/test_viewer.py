"""The trajectory viewer (runs.html, `offscope view`) on a real grid and a real proxy trace.

A small real grid (simulated model, real proxy) and a real `offscope proxy`
subprocess with the sentinel reply policy produce the traces; the pages are
opened in headless Chromium with the network off: a run is found by its
filters, its steps are in order, the operator reply is the text the agent
received, and the page fits a 390 px screen.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from offscope.evalmode.case import BUNDLED, load_cases
from offscope.evalmode.grid import Grid, GridConfig, parse_cells
from offscope.evalmode.report.results import build_results, write_reports
from offscope.evalmode.report.viewer import collect_runs
from offscope.trace.events import read_trace
from offscope.trace.metrics import fold
from tests.support.browser import console_errors, needs_chromium, open_browser
from tests.support.sidecar_kit import (
    FRICTION_POLICY_YAML,
    LEDGER_YAML,
    EchoUpstream,
    ProxyProcess,
    events,
)

CASES = load_cases([BUNDLED])[:3]
CELL = "open-affirmative-broken"


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("viewer-grid")
    cfg = GridConfig(cases=CASES, cells=parse_cells("diagonal"), reps=2, out=out, seed=3, workers=8)
    asyncio.run(Grid(cfg).run())
    write_reports(out, build_results(out))
    return out


@pytest.fixture(scope="module")
def proxy_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A production trace: one run asks the operator (answered by the sentinel), then
    reads its customer and updates one nobody named."""
    tmp = tmp_path_factory.mktemp("viewer-proxy")
    (tmp / "ledger.yaml").write_text(LEDGER_YAML)
    (tmp / "policy.yaml").write_text(FRICTION_POLICY_YAML)
    echo = EchoUpstream().start()
    try:
        with ProxyProcess(
            tmp,
            ledger=str(tmp / "ledger.yaml"),
            policy=str(tmp / "policy.yaml"),
            routes=echo.routes(),
            confdir=str(tmp / "ca"),
        ) as proxy:
            start = proxy.control(
                "POST", "/runs", json={"labels": {"ticket": "T-7", "queue": "billing"}}
            ).json()
            url = f"http://{start['run']}:{start['credential']}@127.0.0.1:{proxy.port}"
            with httpx.Client(proxy=url, timeout=30) as client:
                client.post("http://ops.acme.test/ask", json={"question": "may I update 9999?"})
                client.get("http://crm.acme.test/customers/4411")
                client.patch("http://crm.acme.test/customers/9999", json={"plan": "gold"})
            proxy.control("POST", f"/runs/{start['run']}/end", json={"reason": "end"})
    finally:
        echo.stop()
    return proxy.trace


def test_every_grid_run_is_in_the_viewer_with_the_folds_outcomes(grid: Path) -> None:
    runs = collect_runs(read_trace(grid / "trajectories.jsonl"))
    states = fold(read_trace(grid / "trajectories.jsonl"))
    assert [r["key"] for r in runs] == list(states)
    for record in runs:
        state = states[record["key"]]
        assert ("acted" in record["outcomes"]) == state.acted
        assert ("self-granted" in record["outcomes"]) == (state.self_granted > 0)
        assert record["cell"] == state.labels["cell"] and record["case"] == state.labels["case"]
        numbered = [s["step"] for s in record["steps"] if s["step"] is not None]
        assert numbered == sorted(numbered) == list(range(1, state.steps + 1))


def test_report_html_links_each_cell_to_its_runs(grid: Path) -> None:
    html = (grid / "report.html").read_text()
    assert f'href="runs.html#cell={CELL}"' in html
    assert (grid / "runs.html").exists()


def _listed(browser: Any) -> list[str]:
    return browser.eval("[...document.querySelectorAll('#list button')].map(b => b.dataset.run)")


@needs_chromium
@pytest.mark.timeout(300)
def test_a_run_found_by_filter_shows_its_steps_in_order(grid: Path) -> None:
    states = fold(read_trace(grid / "trajectories.jsonl"))
    acted = [k for k, s in states.items() if s.labels["cell"] == CELL and s.acted]
    assert acted, "the fixture grid has no acted run in the cell (change the seed)"
    page = (grid / "runs.html").as_uri()
    with open_browser() as browser:
        browser.open(f"{page}#cell={CELL}&outcome=acted")
        assert console_errors(browser.events) == [] and browser.network_requests() == []
        assert _listed(browser) == acted
        # Open the run as a person would: click it in the list.
        browser.eval(f"document.querySelector('#list button[data-run=\"{acted[0]}\"]').click()")
        shown = browser.eval(
            "[...document.querySelectorAll('#detail ol.steps > li[data-step]')]"
            ".map(li => Number(li.dataset.step))"
        )
        assert shown == list(range(1, states[acted[0]].steps + 1))
        assert f"run={acted[0]}" in browser.eval("location.hash")
        # Free-text search narrows the list to runs whose steps mention the text.
        browser.open(f"{page}#q={acted[0]}")
        assert _listed(browser) == [acted[0]]


@needs_chromium
@pytest.mark.timeout(300)
def test_production_trace_shows_the_sentinel_reply_as_the_agent_saw_it(
    proxy_trace: Path, tmp_path: Path
) -> None:
    page = tmp_path / "review.html"
    done = subprocess.run(
        [sys.executable, "-m", "offscope.cli", "view", str(proxy_trace), "--out", str(page)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    (reply,) = [e["reply"] for e in events(proxy_trace) if e["type"] == "operator"]
    assert "no human" in reply.lower() or "not" in reply.lower()  # the sentinel, not approval
    with open_browser() as browser:
        for width in (390, 1280):
            browser.open(page.as_uri() + "#q=T-7", width=width, height=900)
            assert console_errors(browser.events) == []
            (key,) = _listed(browser)
            browser.eval(f"document.querySelector('#list button[data-run=\"{key}\"]').click()")
            detail = browser.eval(
                "({reply: document.querySelector('#detail pre.reply').textContent,"
                " steps: [...document.querySelectorAll('#detail li[data-step]')]"
                ".map(li => li.className + ':' + li.dataset.step),"
                " labels: document.querySelector('#detail dl').innerText,"
                " overflow: document.documentElement.scrollWidth - innerWidth})"
            )
            assert detail["reply"] == reply
            assert detail["steps"] == ["operator:1", "tool in:2", "tool out:3"]
            assert "ticket=T-7" in detail["labels"]
            assert detail["overflow"] <= 0, f"horizontal overflow at {width} px"


def test_view_serves_on_loopback_and_refuses_an_empty_trace(
    proxy_trace: Path, tmp_path: Path
) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    refused = subprocess.run(
        [sys.executable, "-m", "offscope.cli", "view", str(empty)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "no run" in refused.stderr
    proc = subprocess.Popen(
        [sys.executable, "-m", "offscope.cli", "view", str(proxy_trace), "--serve"]
        + ["--out", str(tmp_path / "served.html")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        assert line.startswith("serving http://127.0.0.1:"), line + proc.stderr.read()
        url = line.split()[1]
        body = httpx.get(url, timeout=10).text
        data = body.split('<script id="runs-data" type="application/json">', 1)[1]
        runs = json.loads(data.split("</script>", 1)[0])["runs"]
        assert [r["labels"].get("ticket") for r in runs] == ["T-7"]
    finally:
        proc.terminate()
        proc.wait(timeout=20)
