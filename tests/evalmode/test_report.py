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
import base64
import copy
import fcntl
import json
import os
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from markupsafe import escape

from offscope.evalmode.case import BUNDLED, load_cases
from offscope.evalmode.grid import Grid, GridConfig, parse_cells
from offscope.evalmode.report.render import COLUMNS, render_html, render_markdown
from offscope.evalmode.report.results import build_results, write_reports
from offscope.evalmode.report.results_model import CapabilityVsScope, Results

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
    for text in config.scope_clause.values():
        assert text in md
    for text in config.operator_reply.texts.values():
        assert text in md
    for needle in (
        config.model.id,
        config.tool_surface_hash,
        config.case_set_hash,
        config.harness.agent,
        config.safeguards,
        config.model.effort,
    ):
        assert needle in md
    for case, kinds in config.friction.items():
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
            assert not value or value.startswith("#"), (key, value)
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
    for text in results.configuration.scope_clause.values():
        assert str(escape(text)) in html
    for text in results.configuration.operator_reply.texts.values():
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


def _chromium() -> str | None:
    for name in (os.environ.get("CHROMIUM", ""), "chromium", "chromium-browser", "google-chrome"):
        if name and (path := shutil.which(name)):
            return path
    return None


CHROMIUM = _chromium()
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None and os.environ.get("CI") != "true",
    reason="headless Chromium not installed (the test is mandatory when CI=true)",
)

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--mute-audio",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
    # No network at all: every host name fails to resolve (file:// is unaffected).
    "--host-resolver-rules=MAP * ~NOTFOUND",
]


def console_errors(events: list[dict[str, Any]]) -> list[str]:
    """Console errors in a list of DevTools events: uncaught exceptions,
    console.error/assert calls, and browser-side error log entries (CSP
    violations, failed loads)."""
    found = []
    for e in events:
        method, params = e.get("method"), e.get("params") or {}
        if method == "Runtime.exceptionThrown":
            d = params.get("exceptionDetails") or {}
            desc = (d.get("exception") or {}).get("description") or d.get("text", "exception")
            found.append(f"uncaught: {desc}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = " ".join(
                str(a.get("value", a.get("description", ""))) for a in params.get("args") or []
            )
            found.append(f"console.{params['type']}: {args}")
        elif method == "Log.entryAdded" and (params.get("entry") or {}).get("level") == "error":
            entry = params["entry"]
            found.append(f"log {entry.get('source', '')}: {entry.get('text', '')}")
    return found


def _above(fd: int, low: int) -> int:
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, low)
    os.close(fd)
    return moved


class Browser:
    """Headless Chromium over the DevTools protocol on a pipe (--remote-debugging-pipe:
    the browser reads NUL-terminated JSON on fd 3 and writes on fd 4)."""

    def __init__(self, executable: str) -> None:
        self.profile = tempfile.mkdtemp(prefix="offscope-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # Move the child's ends above fd 4 so that dup2 onto 3/4 cannot clobber one with the other.
        to_child_r, from_child_w = (_above(fd, 10) for fd in (to_child_r, from_child_w))
        argv = [executable, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", "about:blank"]
        # Put the pipe ends on fd 3/4 and exec the browser (its launcher may be a shell script);
        # a tiny Python trampoline, since dash cannot redirect fds above 9.
        trampoline = (
            f"import os, sys; os.dup2({to_child_r}, 3); os.dup2({from_child_w}, 4); "
            "os.execv(sys.argv[1], sys.argv[1:])"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", trampoline, *argv],
            pass_fds=(to_child_r, from_child_w),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None

    def send(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        session: bool = True,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            reply = None
            # Keep every message of the chunk: events can arrive in the same read as the reply.
            for m in self._read(0.5):
                if m.get("id") == self._id:
                    reply = m
                else:
                    self.events.append(m)
            if reply is not None:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result") or {}
        raise TimeoutError(method)

    def _read(self, timeout: float) -> list[dict[str, Any]]:
        ready, _, _ = select.select([self._from_child], [], [], timeout)
        if not ready:
            return []
        chunk = os.read(self._from_child, 1 << 20)
        if not chunk:
            raise EOFError("chromium closed the DevTools pipe")
        self._buf += chunk
        out = []
        while b"\0" in self._buf:
            raw, self._buf = self._buf.split(b"\0", 1)
            out.append(json.loads(raw))
        return out

    def wait_for(self, method: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(e.get("method") == method for e in self.events):
                return
            self.events.extend(self._read(0.5))
        raise TimeoutError(method)

    def open(self, url: str, width: int = 1280, height: int = 2000) -> None:
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)
        self.session = self.send(
            "Target.attachToTarget",
            {"targetId": target["targetId"], "flatten": True},
            session=False,
        )["sessionId"]
        for domain in ("Runtime.enable", "Log.enable", "Page.enable", "Network.enable"):
            self.send(domain)
        self.send(
            "Network.emulateNetworkConditions",
            {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
        )
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        self.events.clear()
        self.send("Page.navigate", {"url": url})
        self.wait_for("Page.loadEventFired")
        self.eval("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")

    def eval(self, expression: str) -> Any:
        res = self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in res:
            raise RuntimeError(res["exceptionDetails"])
        return res.get("result", {}).get("value")

    def screenshot(self, path: Path, scale: float = 1.0) -> Path:
        w, h = self.eval("[innerWidth, innerHeight]")
        data = self.send(
            "Page.captureScreenshot",
            {"format": "png", "clip": {"x": 0, "y": 0, "width": w, "height": h, "scale": scale}},
        )["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def network_requests(self) -> list[str]:
        urls = [
            e["params"]["request"]["url"]
            for e in self.events
            if e.get("method") == "Network.requestWillBeSent"
        ]
        return [u for u in urls if not u.startswith(("file:", "data:", "about:"))]

    def close(self) -> None:
        try:
            self.send("Browser.close", session=False, timeout=5)
            self.proc.wait(timeout=10)
        except Exception:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the session this test started
                self.proc.wait(timeout=10)
        finally:
            os.close(self._to_child)
            os.close(self._from_child)
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _browser() -> Browser:
    if CHROMIUM is None:
        pytest.fail("CI=true but no chromium executable found (set CHROMIUM=/path/to/chromium)")
    return Browser(CHROMIUM)


def png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit RGB/RGBA non-interlaced PNG (what Chromium writes) with zlib: (w, h, rows)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert header is not None
    w, h, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = w * bpp
    assert len(raw) == h * (stride + 1)
    rows, prev = [], bytearray(stride)
    for y in range(h):
        ftype, line = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            if ftype == 1:
                line[i] = (line[i] + a) & 0xFF
            elif ftype == 2:
                line[i] = (line[i] + b) & 0xFF
            elif ftype == 3:
                line[i] = (line[i] + ((a + b) >> 1)) & 0xFF
            elif ftype == 4:
                c = prev[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append(bytes(line[j] for j in range(stride) if j % bpp < 3))  # drop alpha
        prev = line
    return w, h, rows


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
    with _browser() as browser:
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
    with _browser() as browser:
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
        for text in results.configuration.scope_clause.values():
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
