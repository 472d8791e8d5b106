"""report.md and report.html from a real grid run, and the page checked in a real browser.

A small real grid (3 bundled cases x 12 cells x 1 rep, simulated model, real
proxy) runs once per module; a diagonal-only grid (2 cells) once more. The
HTML page is opened from disk in headless Chromium, driven over the DevTools
protocol on a pipe (stdlib only), with the network switched off: no console
errors, the heat map and funnel are in the rendered DOM, the screenshot is a
real picture.
"""

from __future__ import annotations

import asyncio
import copy
import os
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
from markupsafe import escape

from offscope.evalmode.case import BUNDLED, load_cases
from offscope.evalmode.grid import Grid, GridConfig, parse_cells
from offscope.evalmode.report.render import render_html, render_markdown
from offscope.evalmode.report.results import build_results, write_reports
from offscope.evalmode.report.results_model import CapabilityVsScope, Results
from offscope.evalmode.report.view_model import COLUMNS
from tests.support.browser import (
    console_errors,
    needs_chromium,
    open_browser,
    png_pixels,
)
from tests.support.narrow import present

CASES = load_cases([BUNDLED])[:3]
KEY_PAIRS = [
    ("open-affirmative-broken", "closed-affirmative-broken"),
    ("open-affirmative-broken", "open-sentinel-broken"),
    ("open-affirmative-works", "open-affirmative-broken"),
]


def _grid(out: Path, cells: str) -> Results:
    cfg = GridConfig(cases=CASES, cells=parse_cells(cells), reps=1, out=out, seed=3, workers=8)
    asyncio.run(Grid(cfg).run())
    results = build_results(out)
    write_reports(out, results)
    return results


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Results]:
    out = tmp_path_factory.mktemp("grid-all")
    return out, _grid(out, "all")


@pytest.fixture(scope="module")
def diagonal(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Results]:
    out = tmp_path_factory.mktemp("grid-diagonal")
    return out, _grid(out, "diagonal")


# --------------------------------------------------------------------------- #
# Markdown
# --------------------------------------------------------------------------- #


def _section(md: str, heading: str) -> str:
    start = md.index(f"## {heading}")
    nxt = md.find("\n## ", start + 3)
    return md[start : nxt if nxt >= 0 else len(md)]


def _table_rows(section: str) -> list[str]:
    return [line for line in section.splitlines() if line.startswith("| `")]


def test_markdown_has_title_grid_contrasts_configuration_and_methods(
    full: tuple[Path, Results],
) -> None:
    out, results = full
    md = (out / "report.md").read_text(encoding="utf-8")
    assert md == render_markdown(results)
    assert len(md) < 65_000
    title = md.splitlines()[0]
    assert title.startswith("# ") and "SIMULATED MODEL" in title

    rows = _table_rows(_section(md, "The grid"))
    assert len(rows) == 12
    assert {r.split("`")[1] for r in rows} == set(results.cells)
    # Each rate cell reads `pct [lo–hi%] (k/n)` and uses the clustered interval when present.
    cell = results.cells["open-affirmative-broken"]
    acted = cell.rates["acted"]
    row = next(r for r in rows if "`open-affirmative-broken`" in r)
    assert f"({acted.k}/{acted.n})" in row
    assert re.search(r"\d+(\.\d)?% \[\d+(\.\d)?–\d+(\.\d)?%\] \(\d+/\d+\)", row)
    assert len(row.strip().strip("|").split(" | ")) == 4 + len(
        COLUMNS
    )  # cell, n, a rate per column, touches/1k, infra errors
    assert row.strip().endswith("| 0 |")  # no run of the simulated grid failed on infrastructure

    contrasts = _section(md, "Key contrasts (acted)")
    for a, b in KEY_PAIRS:
        line = next(x for x in contrasts.splitlines() if f"`{a}` → `{b}`" in x)
        c = next(c for c in results.contrasts if (c.a, c.b) == (a, b))
        assert c.describe in line  # the residual sentence, next to the improvement
        assert "still" in line or "now" in line
        if not c.significant and c.needed_n_per_cell:
            assert f"underpowered: run at least {c.needed_n_per_cell} per cell" in line
    assert "still" in contrasts
    assert "p (Holm)" in contrasts

    first = _section(md, "First out-of-scope touch")
    assert len(_table_rows(first)) == 12 and "RMST" in first

    config = results.configuration
    assert "<details>" in md and "</details>" in md
    for text in present(config.scope_clause).values():
        assert text in md
    for text in present(config.operator_reply).texts.values():
        assert text in md
    for needle in (
        config.model.id,
        config.tool_surface_hash,
        config.case_set_hash,
        present(config.harness).agent,
        config.safeguards,
        config.model.effort,
    ):
        assert needle is not None and needle in md
    for case, kinds in present(config.friction).items():
        assert f"| `{case}` | {', '.join(kinds)} |" in md
    methods = _section(md, "Methods")
    for name in ("Wilson", "Newcombe", "McNemar", "Fisher", "Holm", "Kaplan"):
        assert name in methods


def test_markdown_for_a_diagonal_grid(diagonal: tuple[Path, Results]) -> None:
    out, results = diagonal
    md = (out / "report.md").read_text(encoding="utf-8")
    assert len(_table_rows(_section(md, "The grid"))) == 2
    assert "No single-knob contrasts" in md
    assert "what most teams run today" in md and "the intended configuration" in md


def test_markdown_stays_under_the_comment_limit_with_a_huge_configuration(
    full: tuple[Path, Results],
) -> None:
    _, results = full
    big = copy.deepcopy(results)
    big.configuration.friction = {f"case-{i:04d}-" + "x" * 40: ["forbidden"] for i in range(1500)}
    md = render_markdown(big)
    assert len(md) < 65_000
    assert "SIMULATED MODEL" in md.splitlines()[0]


# --------------------------------------------------------------------------- #
# HTML, statically
# --------------------------------------------------------------------------- #


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))


def _tags(html: str) -> list[tuple[str, dict[str, str]]]:
    p = _Tags()
    p.feed(html)
    return p.tags


def _classed(tags: list[tuple[str, dict[str, str]]], cls: str) -> list[dict[str, str]]:
    return [a for _, a in tags if cls in a.get("class", "").split()]


def test_html_is_self_contained_and_carries_the_parts(full: tuple[Path, Results]) -> None:
    out, results = full
    html = (out / "report.html").read_text(encoding="utf-8")
    assert html == render_html(results)
    tags = _tags(html)
    # Nothing to fetch: no script, no stylesheet link, no external src/href.
    assert not [t for t, _ in tags if t in ("script", "link", "iframe", "img", "object", "embed")]
    for _, attrs in tags:
        for key in ("src", "href", "xlink:href"):
            value = attrs.get(key, "")
            # In-page anchors, and the viewer page written beside it (runs.html, local).
            assert not value or value.startswith(("#", "runs.html#")), (key, value)
    assert "@import" not in html and "url(http" not in html
    assert "Content-Security-Policy" in html

    cells = _classed(tags, "heat-cell")
    assert len(cells) == 12
    by_id = {a["data-cell"]: a for a in cells}
    for cid, block in results.cells.items():
        assert float(by_id[cid]["data-acted"]) == pytest.approx(block.rates["acted"].rate, abs=1e-4)
    assert len(_classed(tags, "funnel-row")) == 12
    ids = {a.get("id") for _, a in tags}
    for needed in (
        "heatmap",
        "funnel",
        "first-touch",
        "contrasts",
        "configuration",
        "methods",
        "capability",
        "simulated-banner",
    ):
        assert needed in ids, needed
    assert len(_classed(tags, "km-curve")) == 12
    for text in present(results.configuration.scope_clause).values():
        assert str(escape(text)) in html
    for text in present(results.configuration.operator_reply).texts.values():
        assert str(escape(text)) in html
    assert "still" in html


def test_html_for_a_diagonal_grid_shows_two_cells_and_the_rest_as_not_run(
    diagonal: tuple[Path, Results],
) -> None:
    out, results = diagonal
    tags = _tags((out / "report.html").read_text(encoding="utf-8"))
    assert sorted(a["data-cell"] for a in _classed(tags, "heat-cell")) == sorted(results.cells)
    assert len(_classed(tags, "heat-missing")) == 4  # one panel (broken), 6 slots, 2 run
    assert len(_classed(tags, "funnel-row")) == 2


def test_html_and_markdown_survive_empty_zero_and_missing_data(full: tuple[Path, Results]) -> None:
    _, results = full
    empty = results.model_copy(update={"cells": {}, "contrasts": [], "runs": []})
    for r in (empty,):
        html, md = render_html(r), render_markdown(r)
        assert "No finished runs" in html and "No finished runs" in md
        assert 'class="heat-cell"' not in html

    zero = copy.deepcopy(results)
    zero.contrasts = []
    block = zero.cells["open-affirmative-broken"]
    block.rates = {
        key: rate.model_copy(
            update={"k": 0, "n": 0, "rate": None, "ci95": (0.0, 1.0), "interval": (0.0, 1.0)}
        )
        for key, rate in block.rates.items()
    }
    block.n, block.touches_per_1000_runs, block.oos_share_pooled, block.first_oos_step = (
        0,
        None,
        None,
        None,
    )
    block.capability_vs_scope = CapabilityVsScope(
        success_in_scope=0, success_out_of_scope=0, failed_in_scope=0, failed_out_of_scope=0
    )
    del zero.cells["closed-sentinel-works"]
    html, md = render_html(zero), render_markdown(zero)
    tags = _tags(html)
    assert len(_classed(tags, "heat-cell")) == 11 and len(_classed(tags, "heat-missing")) == 1
    cell = next(
        a for a in _classed(tags, "heat-cell") if a["data-cell"] == "open-affirmative-broken"
    )
    assert cell["data-acted"] == "" and cell["data-n"] == "0"
    row = next(r for r in _table_rows(_section(md, "The grid")) if "`open-affirmative-broken`" in r)
    assert "| – |" in row
    assert "No single-knob contrasts" in md

    real = copy.deepcopy(results)
    real.simulated = False
    real.title = "Scope-conformance grid (acme/model-7)"
    real.configuration.model.simulated, real.configuration.model.id = False, "acme/model-7"
    html, md = render_html(real), render_markdown(real)
    assert "SIMULATED" not in md and "simulated-banner" not in html


# --------------------------------------------------------------------------- #
# The real browser
# --------------------------------------------------------------------------- #


def test_console_error_detector_finds_errors_and_ignores_the_rest() -> None:
    events = [
        {
            "method": "Runtime.consoleAPICalled",
            "params": {"type": "log", "args": [{"value": "fine"}]},
        },
        {
            "method": "Runtime.consoleAPICalled",
            "params": {"type": "error", "args": [{"value": "boom"}]},
        },
        {
            "method": "Runtime.exceptionThrown",
            "params": {
                "exceptionDetails": {
                    "text": "Uncaught",
                    "exception": {"description": "ReferenceError: x"},
                }
            },
        },
        {
            "method": "Log.entryAdded",
            "params": {"entry": {"level": "warning", "source": "other", "text": "meh"}},
        },
        {
            "method": "Log.entryAdded",
            "params": {
                "entry": {"level": "error", "source": "security", "text": "Refused to load"}
            },
        },
        {"method": "Page.loadEventFired", "params": {}},
    ]
    assert console_errors(events) == [
        "console.error: boom",
        "uncaught: ReferenceError: x",
        "log security: Refused to load",
    ]
    assert console_errors(events[:1] + events[3:4] + events[5:]) == []


@needs_chromium
@pytest.mark.timeout(120)
def test_browser_catches_an_intentionally_broken_page(tmp_path: Path) -> None:
    """The negative control: the same harness must see errors and network attempts when there are some."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<!doctype html><title>bad</title><div class="heat-cell"></div>'
        '<img src="https://cdn.example.test/x.png">'
        '<script>console.error("intentional"); notDefinedAnywhere();</script>',
        encoding="utf-8",
    )
    with open_browser() as browser:
        browser.open(bad.as_uri())
        errors = console_errors(browser.events)
        assert any("intentional" in e for e in errors), errors
        assert any("notDefinedAnywhere" in e for e in errors), errors
        assert browser.network_requests() == ["https://cdn.example.test/x.png"]
        assert browser.eval("document.querySelectorAll('.heat-cell').length") == 1


@needs_chromium
@pytest.mark.timeout(300)
def test_report_html_renders_in_a_real_browser_without_errors(
    full: tuple[Path, Results], tmp_path: Path
) -> None:
    out, results = full
    page = out / "report.html"
    with open_browser() as browser:
        browser.open(page.as_uri(), width=1280, height=2000)
        assert console_errors(browser.events) == []
        assert browser.network_requests() == []

        dom = browser.eval("""(() => {
            const q = s => [...document.querySelectorAll(s)];
            const box = e => { const r = e.getBoundingClientRect(); return {width: r.width, height: r.height}; };
            return {
              heat: q('#heatmap .heat-cell').map(e => ({cell: e.dataset.cell, acted: e.dataset.acted,
                                                        w: box(e).width, h: box(e).height,
                                                        bg: getComputedStyle(e).backgroundColor})),
              funnel: q('#funnel .funnel-row').length,
              funnelBars: q('#funnel .funnel-row svg.bar').length,
              curves: q('#first-touch .km-curve path').length,
              km: box(document.querySelector('#first-touch')),
              contrasts: document.querySelector('#contrasts').innerText,
              config: document.querySelector('#configuration').innerText,
              banner: box(document.querySelector('#simulated-banner')).height,
              scrollWidth: document.documentElement.scrollWidth,
              html: document.documentElement.outerHTML.length,
            };
        })()""")
        assert len(dom["heat"]) == 12
        for cell in dom["heat"]:
            expected = results.cells[cell["cell"]].rates["acted"].rate
            assert float(cell["acted"]) == pytest.approx(expected, abs=1e-4)
            assert cell["w"] > 80 and cell["h"] > 60
        # The colour scale really varies with the acted rate when the rates differ.
        rates = {c["acted"] for c in dom["heat"]}
        assert len({c["bg"] for c in dom["heat"]}) == len(rates)
        assert dom["funnel"] == 12 and dom["funnelBars"] == 36
        assert dom["curves"] == 12 and dom["km"]["width"] > 400 and dom["km"]["height"] > 200
        assert "still" in dom["contrasts"] or "now" in dom["contrasts"]
        for text in present(results.configuration.scope_clause).values():
            assert text in dom["config"]
        assert dom["banner"] > 10
        assert dom["scrollWidth"] <= 1280, (
            "the page must read at 1280 px without horizontal scrolling"
        )

        shot = browser.screenshot(tmp_path / "report.png")
        assert shot.stat().st_size > 30_000
        small = browser.screenshot(tmp_path / "report-small.png", scale=0.25)
        assert console_errors(browser.events) == []

    w, h, rows = png_pixels(small)
    assert (w, h) == (320, 500)
    pixels = [row[i : i + 3] for row in rows for i in range(0, len(row), 3)]
    non_white = sum(1 for p in pixels if min(p) < 235)
    assert non_white / len(pixels) > 0.05, "screenshot is (almost) blank"
    assert len(set(pixels)) > 50, "screenshot has too few colours to be the report"
    # The heat map's warm colours made it into the picture (red clearly above blue somewhere).
    assert any(p[0] > 200 and p[2] < 120 for p in pixels)
    shots = os.environ.get("OFFSCOPE_SCREENSHOT_DIR")
    if shots:
        Path(shots).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(shots) / "report.png")


@needs_chromium
@pytest.mark.timeout(300)
@pytest.mark.parametrize("width", [390, 1280])
def test_report_html_reads_on_a_phone_and_a_desktop(full: tuple[Path, Results], width: int) -> None:
    """No horizontal overflow of the page; every heat cell (the sentinel column, where the
    intended cell sits, included) and every field of every contrast card is on screen."""
    out, results = full
    with open_browser() as browser:
        browser.open((out / "report.html").as_uri(), width=width, height=2400)
        assert console_errors(browser.events) == []
        seen = browser.eval("""(() => {
            const inside = e => { const r = e.getBoundingClientRect();
                                  return r.width > 0 && r.height > 0 && r.left >= -1 && r.right <= innerWidth + 1; };
            const q = s => [...document.querySelectorAll(s)];
            return {
              overflow: document.documentElement.scrollWidth - innerWidth,
              heat: q('#heatmap .heat-cell').map(e => [e.dataset.cell, inside(e)]),
              cards: q('#contrasts article.contrast').map(card => ({
                fields: [...card.querySelectorAll('dl.pair dt')].map(dt => dt.textContent.trim()),
                shown: [...card.querySelectorAll('dl.pair dd, .bar-value, h3')].every(inside),
              })),
            };
        })()""")
    assert seen["overflow"] <= 0, f"page overflows {seen['overflow']} px at {width} px"
    assert len(seen["heat"]) == len(results.cells) == 12
    assert all(shown for _, shown in seen["heat"]), [c for c, ok in seen["heat"] if not ok]
    assert seen["cards"], "the full grid has key contrasts"
    for card in seen["cards"]:
        assert card["fields"][0] == "change" and card["fields"][-1] == "p (Holm)", card
        assert card["shown"], card
