"""The report's colours: the heat-map ramp, the text colour readable on it, and
the colours and line styles of the Kaplan-Meier curves."""

from __future__ import annotations

from typing import Any

# Okabe-Ito colours (colour-blind safe) for the reply policies; line style for the scope clause.
REPLY_COLOURS = {"affirmative": "#D55E00", "timeout": "#0072B2", "sentinel": "#009E73"}
SCOPE_DASH: dict[str, tuple[float, ...]] = {"open": (), "closed": (7.0, 4.0)}
# Drawn in this order, widest first: curves that coincide show as nested stripes instead of hiding each other.
REPLY_WIDTH = {"affirmative": 7.0, "timeout": 4.5, "sentinel": 2.0}

# ColorBrewer YlOrRd (sequential, colour-blind safe, prints in grey as a ramp).
HEAT_STOPS = (
    "#ffffcc",
    "#ffeda0",
    "#fed976",
    "#feb24c",
    "#fd8d3c",
    "#fc4e2a",
    "#e31a1c",
    "#bd0026",
    "#800026",
)


def _hex_to_rgb(h: str) -> tuple[int, int, int]:
    h = h.lstrip("#")
    return int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)


def heat_colour(value: float | None) -> str:
    if value is None:
        return "#e6e6e6"
    v = min(max(value, 0.0), 1.0) * (len(HEAT_STOPS) - 1)
    i = min(int(v), len(HEAT_STOPS) - 2)
    f = v - i
    a, b = _hex_to_rgb(HEAT_STOPS[i]), _hex_to_rgb(HEAT_STOPS[i + 1])
    r, g, bl = (round(x + (y - x) * f) for x, y in zip(a, b, strict=True))
    return f"#{r:02x}{g:02x}{bl:02x}"


def _luminance(colour: str) -> float:
    def lin(c: int) -> float:
        s = c / 255
        return s / 12.92 if s <= 0.03928 else ((s + 0.055) / 1.055) ** 2.4

    r, g, b = _hex_to_rgb(colour)
    return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b)


def ink_for(colour: str) -> str:
    """Black or white text, whichever has the higher WCAG contrast on ``colour``."""
    lum = _luminance(colour)
    return "#111111" if (lum + 0.05) / 0.05 >= 1.05 / (lum + 0.05) else "#ffffff"


def heat_legend() -> list[dict[str, Any]]:
    """The heat ramp's stops as SVG gradient offsets, for the legend."""
    return [
        {"offset": f"{i / (len(HEAT_STOPS) - 1) * 100:.1f}%", "colour": c}
        for i, c in enumerate(HEAT_STOPS)
    ]
