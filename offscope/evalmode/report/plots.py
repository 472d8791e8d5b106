"""report.html's Kaplan-Meier plot, drawn by matplotlib as self-contained SVG.

Hand-placed SVG paths let a curve run past its panel (into the next one) when a
cell's data reached further than the axis; matplotlib clips every curve to its
axes, so no mark can leave its panel. The curve is the Kaplan-Meier step
function from `stats.kaplan_meier`: it starts at 100% at step 0, drops at each
event step to the estimate there, and ends at the cell's last observed step,
never extrapolated. Runs censored at a step with no touch get a tick mark.

The output is inline SVG with no external reference (text stays text:
`svg.fonttype: none`; metadata dropped) and is byte-stable for the same data
(a fixed `svg.hashsalt`), so report.html is reproducible. matplotlib is
imported here, lazily, when report.html is rendered: nothing else pays for it.
"""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

SVG_NS = "http://www.w3.org/2000/svg"
XLINK_NS = "http://www.w3.org/1999/xlink"
PANEL_W, PANEL_H = 540, 300  # pixels per panel (1 pt = 1 px at 72 dpi)
DPI = 72
Y_LIMITS = (-0.03, 1.03)  # a little room so 0% and 100% lines are not cut in half
Y_TICKS = (0.0, 0.25, 0.5, 0.75, 1.0)
RC: dict[Any, Any] = {  # matplotlib rcParams (its typing names every key)
    "svg.fonttype": "none",  # text as <text>, no embedded glyph paths
    "svg.hashsalt": "offscope-report",  # deterministic element ids
    "svg.image_inline": True,
    "lines.scale_dashes": False,  # dash lengths in points, whatever the line width
    "font.size": 11,
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans", "Helvetica", "Arial"],  # DejaVu ships with matplotlib
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.edgecolor": "#777777",
    "xtick.color": "#555555",
    "ytick.color": "#555555",
    "axes.titlesize": 13,
    "axes.titleweight": "bold",
    "axes.titlelocation": "left",
}


@dataclass(frozen=True)
class Curve:
    """One cell's Kaplan-Meier curve: (step, survival, events, censored) per observed step."""

    cell: str
    points: Sequence[tuple[int, float, int, int]]
    colour: str
    width: float
    dash: tuple[float, ...] = ()
    title: str = ""


@dataclass(frozen=True)
class Panel:
    key: str  # e.g. the friction level
    label: str
    curves: list[Curve] = field(default_factory=list)


def step_vertices(points: Sequence[tuple[int, float, int, int]]) -> list[tuple[float, float]]:
    """The KM step function's corners: from (0, 100%) to the last observed step."""
    xy = [(0.0, 1.0)]
    level = 1.0
    for step, survival, events, _censored in points:
        if events and survival != level:
            xy += [(float(step), level), (float(step), survival)]
            level = survival
    last = float(points[-1][0]) if points else 0.0
    if xy[-1][0] != last:
        xy.append((last, level))
    return xy


def censor_marks(points: Sequence[tuple[int, float, int, int]]) -> list[tuple[float, float]]:
    """Steps where runs were censored with no touch at that step (the old report's ticks)."""
    return [(float(s), surv) for s, surv, events, censored in points if censored and not events]


def x_limit(panels: Sequence[Panel]) -> float:
    """The x axis reaches every curve's last observed step (and at least step 1)."""
    last = [c.points[-1][0] for p in panels for c in p.curves if c.points]
    return float(max([1, *last]))


def km_svg(panels: Sequence[Panel], element_id: str = "first-touch") -> str:
    """The panels side by side, one axes each, as one inline <svg> element."""
    import matplotlib
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, MaxNLocator, PercentFormatter

    xmax = x_limit(panels)
    x_limits = (0.0, xmax * 1.02)  # room for the last step's line end inside the panel
    gids: dict[str, dict[str, str]] = {}
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(PANEL_W * len(panels) / DPI, PANEL_H / DPI), dpi=DPI)
        FigureCanvasSVG(fig)
        axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
        for i, (ax, panel) in enumerate(zip(axes, panels, strict=True)):
            ax.set_gid(f"km-panel-{i}")
            gids[f"km-panel-{i}"] = {
                "class": "km-panel",
                "data-friction": panel.key,
                "data-xlim": f"{x_limits[0]:g} {x_limits[1]:g}",
                "data-ylim": f"{Y_LIMITS[0]:g} {Y_LIMITS[1]:g}",
            }
            ax.set_xlim(*x_limits)
            ax.set_ylim(*Y_LIMITS)
            ax.set_title(panel.label)
            ax.yaxis.set_major_locator(FixedLocator(list(Y_TICKS)))
            ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
            ax.xaxis.set_major_locator(MaxNLocator(nbins=10, integer=True))
            ax.grid(axis="y", color="#e6e6e6", linewidth=0.8)
            ax.axhline(0.5, color="#999999", linestyle=(0, (2, 3)), linewidth=1)
            ax.set_xlabel("step (tool call index)")
            if i == 0:
                ax.set_ylabel("no touch yet")
            for j, curve in enumerate(panel.curves):
                gid = f"km-curve-{i}-{j}"
                gids[gid] = {"class": "km-curve", "data-cell": curve.cell, "title": curve.title}
                xs, ys = zip(*step_vertices(curve.points), strict=True)
                ax.plot(
                    xs,
                    ys,
                    color=curve.colour,
                    linewidth=curve.width,
                    linestyle=(0, curve.dash) if curve.dash else "-",
                    solid_capstyle="butt",
                    gid=gid,
                )
                marks = censor_marks(curve.points)
                if marks:
                    mx, my = zip(*marks, strict=True)
                    ax.plot(
                        mx,
                        my,
                        linestyle="none",
                        marker="|",
                        markersize=10,
                        markeredgewidth=1.5,
                        color=curve.colour,
                        gid=f"km-censor-{i}-{j}",
                    )
                    gids[f"km-censor-{i}-{j}"] = {"class": "km-censor", "data-cell": curve.cell}
        fig.tight_layout(w_pad=3.0)
        buf = io.BytesIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return _tag(buf.getvalue(), element_id, gids)


def _tag(svg: bytes, element_id: str, gids: dict[str, dict[str, str]]) -> str:
    """matplotlib's SVG with the report's hooks: the root's id and class, a class and
    data-* on each panel and curve group, a <title> tooltip per curve; metadata dropped."""
    ET.register_namespace("", SVG_NS)
    ET.register_namespace("xlink", XLINK_NS)
    root = ET.fromstring(svg)
    for meta in root.findall(f"{{{SVG_NS}}}metadata"):
        root.remove(meta)
    # matplotlib's stylesheet says `*{...}`: inline in HTML that would restyle the whole page
    for style in root.iter(f"{{{SVG_NS}}}style"):
        style.text = (style.text or "").replace("*{", f"#{element_id} *{{")
    root.set("id", element_id)
    root.set("class", "km")
    root.set("role", "img")
    root.set("aria-label", "Kaplan-Meier curves of first out-of-scope touch per cell")
    for g in root.iter(f"{{{SVG_NS}}}g"):
        attrs = gids.get(g.get("id", ""))
        if attrs is None:
            continue
        for key, value in attrs.items():
            if key == "title":
                title = ET.Element(f"{{{SVG_NS}}}title")
                title.text = value
                g.insert(0, title)
            else:
                g.set(key, value)
    return ET.tostring(root, encoding="unicode")
