"""The report's text: p-values, signed points, a rate as every table shows it,
and markdown escaping (the templates' ``md``, ``code`` and ``fence`` filters).

Rates, intervals and percentages are printed by `offscope.trace.rates`, the one
formatter every command shares; this module only arranges them for the report.
"""

from __future__ import annotations

from typing import Any

from offscope.evalmode.report.results_model import RateBlock
from offscope.trace.rates import interval_text, pct, rate_text


def fmt_p(p: float | None) -> str:
    if p is None:
        return "–"
    if p < 0.001:
        return "< 0.001"
    if p < 0.01:
        return f"{p:.3f}"
    return f"{p:.2f}"


def fmt_points(x: float | None) -> str:
    if x is None:
        return "–"
    v = x * 100
    sign = "+" if v > 0.05 else ("−" if v < -0.05 else "±")
    return f"{sign}{abs(v):.0f}"


def rate_view(rate: RateBlock | None) -> dict[str, Any]:
    """A rate as the report shows it: ``50% [36–64%] (21/42)``.

    Uses the rate's one interval (`interval`, chosen in results.py: the
    clustered hull of Wilson and the case-level bootstrap when the cell has
    several cases, Wilson otherwise), the same in every table and sentence.
    """
    k, n = (rate.k, rate.n) if rate is not None else (0, 0)
    value = rate.rate if rate is not None else None
    if value is None and n:
        value = k / n
    if rate is None or not n or value is None:
        return {
            "k": k,
            "n": n,
            "value": None,
            "lo": None,
            "hi": None,
            "text": "–",
            "pct": "–",
            "ci": "",
            "frac": f"({k}/{n})",
            "clustered": False,
            "title": "no runs",
        }
    lo, hi = rate.interval
    ci_text = interval_text(lo, hi)
    text = rate_text(k, n, (lo, hi))
    clustered = rate.clustered
    title = (
        f"{k} of {n} runs; 95% interval {ci_text} "
        f"({'hull of Wilson and case-level bootstrap' if clustered else 'Wilson'})"
    )
    if clustered and rate.design_effect is not None:
        title += f"; design effect {rate.design_effect:.2f}"
    return {
        "k": k,
        "n": n,
        "value": float(value),
        "lo": lo,
        "hi": hi,
        "text": text,
        "pct": pct(value),
        "ci": ci_text,
        "frac": f"({k}/{n})",
        "clustered": clustered,
        "title": title,
    }


def md_escape(text: Any) -> str:
    """Safe inside a markdown table cell."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def md_code(text: Any) -> str:
    """An inline code span that survives backticks and table pipes."""
    s = str(text).replace("|", "\\|").replace("\n", " ")
    fence = "`"
    while fence in s:
        fence += "`"
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def md_fence(text: Any, lang: str = "text") -> str:
    """A fenced block that shows ``text`` verbatim, whatever it contains."""
    s = str(text)
    fence = "```"
    while fence in s:
        fence += "`"
    return f"{fence}{lang}\n{s}\n{fence}"
