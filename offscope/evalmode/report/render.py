"""Report rendering: results.json -> report.md (PR comment) and report.html (one page).

Everything here is presentation. The numbers (rates, intervals, contrasts,
Kaplan-Meier curves) are computed in results.py / stats.py; the report only
formats them and lays out plots. Python prepares a view model (strings,
colours and SVG geometry: view_model.py, with view_contrasts.py,
view_config.py, knobs.py, formats.py and colours.py), the jinja templates in
``templates/`` lay it out; this module holds the jinja environment and the two
renderers.

The HTML page is self-contained: inline CSS, inline SVG (the Kaplan-Meier plot
drawn by matplotlib in plots.py, the small bars and strips by the templates), no
script, no network (a Content-Security-Policy forbids any fetch).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from offscope.evalmode.report.formats import md_code, md_escape, md_fence
from offscope.evalmode.report.plots import km_svg
from offscope.evalmode.report.results_model import Results
from offscope.evalmode.report.view_model import build_view
from offscope.trace.rates import pct

MD_LIMIT = 65_000  # GitHub's pull-request comment limit is 65,536 characters.


@lru_cache(maxsize=1)
def _env() -> Environment:
    env = Environment(
        loader=FileSystemLoader(str(Path(__file__).parent / "templates")),
        autoescape=select_autoescape(
            enabled_extensions=("html", "html.j2", "svg.j2"),
            default_for_string=False,
            default=False,
        ),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(md=md_escape, code=md_code, fence=md_fence, pct=pct)
    return env


def render_markdown(results: Results) -> str:
    """report.md: fits a pull-request comment (< 65,000 characters)."""
    view = build_view(results)
    template = _env().get_template("report.md.j2")
    text = template.render(v=view, compact=False)
    if len(text) > MD_LIMIT:
        text = template.render(v=view, compact=True)
    if len(text) > MD_LIMIT:
        cut = text[: MD_LIMIT - 200]
        text = (
            cut[: cut.rfind("\n")]
            + "\n\n_Report truncated to fit a pull-request comment; see report.html and results.json._\n"
        )
    return text


def render_html(results: Results) -> str:
    """report.html: one self-contained page (inline CSS and SVG, no script, no network)."""
    view = build_view(results)
    if view["km"]:
        view["km"]["svg"] = Markup(km_svg(view["km"]["panels"]))
    return _env().get_template("report.html.j2").render(v=view)
