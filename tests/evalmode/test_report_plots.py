"""report.html's Kaplan-Meier plot, read back from the SVG matplotlib rendered.

Every vertex of every curve (and every censoring mark) must lie inside the clip
rectangle of its own panel, and the panels must not overlap: a curve cannot run
into the next panel. Mapped back through the axes' limits, the curve's corners
must be the Kaplan-Meier estimates `stats.kaplan_meier` computes from the runs,
at the data's event steps, and the curve must end at the cell's last observed
step at the last estimate: never extended to 0% where the data has no such point.
"""

from __future__ import annotations

import asyncio
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from offscope.evalmode import stats
from offscope.evalmode.case import BUNDLED, load_cases
from offscope.evalmode.grid import Grid, GridConfig, parse_cells
from offscope.evalmode.report.plots import Curve, Panel, km_svg
from offscope.evalmode.report.render import render_html
from offscope.evalmode.report.results import build_results
from offscope.evalmode.report.results_model import Results

NS = {"svg": "http://www.w3.org/2000/svg", "xlink": "http://www.w3.org/1999/xlink"}
SVG = "{http://www.w3.org/2000/svg}"
EPS = 1e-6  # pixels
TOL = 1e-4  # survival / steps, after mapping pixels back to data


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> Results:
    out = tmp_path_factory.mktemp("km-grid")
    cfg = GridConfig(
        cases=load_cases([BUNDLED])[:4],
        cells=parse_cells("all"),
        reps=1,
        out=out,
        seed=5,
        workers=8,
    )
    asyncio.run(Grid(cfg).run())
    return build_results(out)


# -- reading the SVG back ----------------------------------------------------------


def _vertices(d: str) -> list[tuple[float, float]]:
    """Absolute M/L path data (what matplotlib writes for lines) -> vertices."""
    assert re.fullmatch(r"[\sML0-9.eE+-]*z?\s*", d), f"unexpected path commands: {d[:80]}"
    nums = [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?", d)]
    return list(zip(nums[::2], nums[1::2], strict=True))


def _clip_rects(root: ET.Element) -> dict[str, tuple[float, float, float, float]]:
    rects = {}
    for clip in root.iter(f"{SVG}clipPath"):
        r = clip.find("svg:rect", NS)
        assert r is not None
        rects[clip.get("id", "")] = tuple(
            float(r.get(k, "0")) for k in ("x", "y", "width", "height")
        )
    return rects  # type: ignore[return-value]


def _clip_of(el: ET.Element, rects: dict[str, tuple[float, float, float, float]]):
    m = re.fullmatch(r"url\(#(.+)\)", el.get("clip-path", ""))
    assert m, "every curve element is clipped to its axes"
    return rects[m.group(1)]


def _inside(x: float, y: float, rect: tuple[float, float, float, float]) -> bool:
    rx, ry, rw, rh = rect
    return rx - EPS <= x <= rx + rw + EPS and ry - EPS <= y <= ry + rh + EPS


def _to_data(
    px: float,
    py: float,
    rect: tuple[float, float, float, float],
    xlim: list[float],
    ylim: list[float],
) -> tuple[float, float]:
    rx, ry, rw, rh = rect
    return (
        xlim[0] + (px - rx) / rw * (xlim[1] - xlim[0]),
        ylim[0] + (ry + rh - py) / rh * (ylim[1] - ylim[0]),
    )


def read_plot(svg: str) -> dict[str, dict]:
    """cell -> {"panel", "rect", "curve" (data coordinates), "marks" (data coordinates)}."""
    root = ET.fromstring(svg)
    rects = _clip_rects(root)
    out: dict[str, dict] = {}
    panel_rects = []
    for panel in root.iter(f"{SVG}g"):
        if panel.get("class") != "km-panel":
            continue
        xlim = [float(v) for v in panel.get("data-xlim", "").split()]
        ylim = [float(v) for v in panel.get("data-ylim", "").split()]
        own: set[tuple[float, ...]] = set()
        for g in panel.iter(f"{SVG}g"):
            kind, cell = g.get("class"), g.get("data-cell", "")
            if kind == "km-curve":
                (path,) = g.findall("svg:path", NS)
                rect = _clip_of(path, rects)
                own.add(rect)
                pixels = _vertices(path.get("d", ""))
                outside = [p for p in pixels if not _inside(*p, rect)]
                assert not outside, f"{cell}: vertices outside its panel: {outside}"
                entry = out.setdefault(cell, {"marks": []})
                entry.update(
                    panel=panel.get("data-friction"),
                    rect=rect,
                    curve=[_to_data(*p, rect, xlim, ylim) for p in pixels],
                )
            elif kind == "km-censor":
                clipped = [x for x in g.iter(f"{SVG}g") if x.get("clip-path")]
                assert clipped, f"{cell}: censoring marks are clipped to the axes"
                for holder in clipped:
                    rect = _clip_of(holder, rects)
                    own.add(rect)
                    for use in holder.iter(f"{SVG}use"):
                        x, y = float(use.get("x", "nan")), float(use.get("y", "nan"))
                        assert _inside(x, y, rect), f"{cell}: censoring mark outside its panel"
                        out.setdefault(cell, {"marks": []})["marks"].append(
                            _to_data(x, y, rect, xlim, ylim)
                        )
        assert len(own) == 1, "one clip rectangle (the axes) per panel"
        panel_rects.append(own.pop())
    for i, a in enumerate(panel_rects):
        for b in panel_rects[i + 1 :]:
            assert a[0] + a[2] <= b[0] or b[0] + b[2] <= a[0], "panels overlap"
    return out


def _km_svg_of(page: str) -> str:
    m = re.search(r'<svg [^>]*id="first-touch".*?</svg>', page, re.S)
    assert m, "report.html has no first-touch plot"
    return m.group(0)


def _close(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> bool:
    return len(a) == len(b) and all(
        abs(x - u) < TOL and abs(y - v) < TOL for (x, y), (u, v) in zip(a, b, strict=True)
    )


def assert_curve_is_km(curve: list[tuple[float, float]], km: stats.Survival, cell: str) -> None:
    """The drawn step function is the estimate: 100% at step 0, S(t) after each
    event step t, flat in between, ending at the last observed step."""
    assert _close(curve[:1], [(0.0, 1.0)]), cell
    level = 1.0
    for p in km.curve:
        if p.events:
            assert any(abs(x - p.step) < TOL and abs(y - p.survival) < TOL for x, y in curve), (
                f"{cell}: no corner at step {p.step}, S = {p.survival}"
            )
            assert any(abs(x - p.step) < TOL and abs(y - level) < TOL for x, y in curve), cell
            level = p.survival
    last = km.curve[-1]
    assert _close(curve[-1:], [(last.step, last.survival)]), cell
    assert max(x for x, _ in curve) == pytest.approx(last.step, abs=TOL), cell
    assert min(y for _, y in curve) == pytest.approx(last.survival, abs=TOL), (
        f"{cell}: the curve drops below the last estimate"
    )
    # every horizontal run sits at an estimate the data has
    levels = {1.0, *(p.survival for p in km.curve)}
    for _, y in curve:
        assert any(abs(y - s) < TOL for s in levels), f"{cell}: level {y} is no KM estimate"


# -- the report's own data -----------------------------------------------------------


def test_report_km_curves_stay_in_their_panel_and_equal_the_estimates(grid: Results) -> None:
    page = render_html(grid)
    assert page == render_html(grid), "report.html is byte-stable for the same data"
    plot = read_plot(_km_svg_of(page))
    assert set(plot) == set(grid.cells)
    rows = grid.runs_by_cell()
    beyond_tau = 0
    for cell, block in grid.cells.items():
        km = stats.kaplan_meier(stats.first_touch_runs(rows[cell]))
        assert_curve_is_km(plot[cell]["curve"], km, cell)
        assert plot[cell]["panel"] == block.cell.friction
        censored = [(float(p.step), p.survival) for p in km.curve if p.censored and not p.events]
        assert _close(sorted(plot[cell]["marks"]), sorted(censored)), cell
        assert block.first_oos_step is not None
        beyond_tau += km.curve[-1].step > block.first_oos_step.tau
    # The data reaches past the common RMST horizon in some cell: the hand-placed plot sized its
    # axis by that horizon and drew those curves into the next panel.
    assert beyond_tau


def test_report_html_stays_self_contained(grid: Results) -> None:
    page = render_html(grid)
    # namespace names are not references; nothing else may name a URL
    stripped = re.sub(r'\sxmlns(:\w+)?="[^"]*"', "", page)
    assert not re.search(r"https?:", stripped), re.findall(r".{40}https?:.{40}", stripped)
    for attr in re.findall(r'(?:href|src)="([^"]*)"', page):
        assert attr.startswith(("#", "runs.html#")), attr  # in-page, or the viewer beside it
    assert "<script" not in page and "@import" not in page and "<metadata" not in page
    # matplotlib's stylesheet (`*{...}`) is scoped to the plot: inline, it would restyle the page
    styles = re.findall(r"<style[^>]*>(.*?)</style>", _km_svg_of(page), re.S)
    assert styles
    for css in styles:
        for selector in re.findall(r"([^{}]+)\{", css):
            assert selector.strip().startswith("#first-touch"), selector


# -- hostile shapes ----------------------------------------------------------------


def _panel(key: str, runs_by_cell: dict[str, list[tuple[int | None, int]]]) -> Panel:
    curves = []
    for cell, runs in runs_by_cell.items():
        km = stats.kaplan_meier(runs)
        pts = [(p.step, p.survival, p.events, p.censored) for p in km.curve]
        curves.append(Curve(cell, pts, "#D55E00", 7.0, (7.0, 4.0)))
    return Panel(key, key, curves)


def test_curves_of_very_different_length_each_stay_in_their_own_panel() -> None:
    data: dict[str, list[tuple[int | None, int]]] = {
        "short": [(1, 3), (2, 3), (None, 3), (None, 2)],  # ends at step 3, censored runs
        "long": [(5, 80), (40, 80), (None, 80), (None, 61), (70, 75)],  # reaches step 80
        "all-touch": [(1, 1), (1, 1), (2, 2)],  # S really reaches 0 at step 2
        "never": [(None, 4), (None, 9)],  # no event: flat at 100%, marks only
    }
    panels = [
        _panel("works", {k: data[k] for k in ("short", "long")}),
        _panel("broken", {k: data[k] for k in ("all-touch", "never")}),
    ]
    plot = read_plot(km_svg(panels))
    assert {c: v["panel"] for c, v in plot.items()} == {
        "short": "works",
        "long": "works",
        "all-touch": "broken",
        "never": "broken",
    }
    for cell, runs in data.items():
        assert_curve_is_km(plot[cell]["curve"], stats.kaplan_meier(runs), cell)
    assert _close(plot["never"]["curve"], [(0.0, 1.0), (9.0, 1.0)])
    assert min(y for _, y in plot["short"]["curve"]) > 0.3  # never extrapolated down to 0%
    assert min(y for _, y in plot["all-touch"]["curve"]) == pytest.approx(0.0, abs=TOL)
    assert _close(sorted(plot["never"]["marks"]), [(4.0, 1.0), (9.0, 1.0)])


def test_the_plot_is_not_drawn_for_markdown(grid: Results, tmp_path: Path) -> None:
    """report.md does not pay for matplotlib: the plot is made only when report.html is."""
    import subprocess
    import sys

    code = (
        "import sys, json\n"
        "from offscope.evalmode.report.results_model import load_results\n"
        "from offscope.evalmode.report.render import render_markdown\n"
        "render_markdown(load_results(sys.argv[1]))\n"
        "print(json.dumps('matplotlib' in sys.modules))\n"
    )
    path = tmp_path / "results.json"
    path.write_text(grid.to_json(), encoding="utf-8")
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "false"


def test_the_small_marks_stay_inside_their_own_svg(grid: Results) -> None:
    """The rest of report.html's marks (rate bars and whiskers, interval strips, outcome
    bars, the colour scale) are single values in [0, 1] scaled into a fixed-width SVG each:
    every coordinate must fall inside that SVG's own box."""
    page = render_html(grid)
    small = [m.group(0) for m in re.finditer(r"<svg (?![^>]*first-touch).*?</svg>", page, re.S)]
    assert len(small) > 12 * 3  # the funnel alone has three bars per cell
    for text in small:
        svg = ET.fromstring(text)
        w, h = float(svg.get("width", "nan")), float(svg.get("height", "nan"))
        for el in svg.iter():
            tag = el.tag.rsplit("}", 1)[-1]
            a = {k: float(v) for k, v in el.attrib.items() if re.fullmatch(r"-?[\d.]+", v)}
            if tag == "rect":
                assert a.get("x", 0) >= 0 and a.get("x", 0) + a["width"] <= w + EPS, text
                assert a.get("y", 0) >= 0 and a.get("y", 0) + a["height"] <= h + EPS, text
            elif tag == "line":
                assert all(0 <= a[k] <= w + EPS for k in ("x1", "x2")), text
                assert all(0 <= a[k] <= h + EPS for k in ("y1", "y2")), text
            elif tag == "circle":
                assert 0 <= a["cx"] <= w and 0 <= a["cy"] <= h, text
