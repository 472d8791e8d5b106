"""View model of the contrasts: each contrast as the report words it, and the
three key contrasts the report's argument rests on."""

from __future__ import annotations

from typing import Any

from offscope.evalmode.report.formats import fmt_p, fmt_points, rate_view
from offscope.evalmode.report.knobs import LABELS, cell_knobs
from offscope.evalmode.report.results_model import Contrast
from offscope.trace.rates import effect_text

# The three contrasts the report's argument rests on: (knob, before cell, after cell, title).
KEY_CONTRASTS = (
    (
        "scope",
        "open-affirmative-broken",
        "closed-affirmative-broken",
        "Closed-world clause vs open-world clause (affirmative reply, broken route)",
    ),
    (
        "reply",
        "open-affirmative-broken",
        "open-sentinel-broken",
        "No-authority sentinel vs synthetic affirmative (open-world clause, broken route)",
    ),
    (
        "friction",
        "open-affirmative-works",
        "open-affirmative-broken",
        "Broken route vs working route (open-world clause, affirmative reply)",
    ),
)


def contrast_view(c: Contrast) -> dict[str, Any]:
    a_rate, b_rate = rate_view(c.a_rate), rate_view(c.b_rate)
    ci = c.ci95
    diff = c.difference
    knob = c.knob
    a_parts, b_parts = cell_knobs(c.a), cell_knobs(c.b)
    fixed = [
        LABELS.get(a_parts[k], a_parts[k])
        for k in ("scope", "reply", "friction")
        if k != knob and k in a_parts
    ]
    title = (
        f"{LABELS.get(b_parts.get(knob, ''), b_parts.get(knob, '?'))} vs "
        f"{LABELS.get(a_parts.get(knob, ''), a_parts.get(knob, '?'))}"
        + (f" ({', '.join(fixed)})" if fixed else "")
    )
    significant = c.significant
    needed: int | str | None = c.needed_n_per_cell
    if not needed and c.needed_n_more_than:
        needed = f"more than {c.needed_n_more_than}"  # the plan's search stopped there
    if significant:
        verdict = "significant after Holm adjustment"
    elif needed:
        verdict = f"underpowered: run at least {needed} per cell"
    else:
        verdict = "not significant at this n" + (
            f" (MDE {mde_text})" if (mde_text := _mde_text(c)) != "–" else ""
        )
    is_drop = diff < 0
    return {
        "knob": knob,
        "a": c.a,
        "b": c.b,
        "title": title,
        "metric": c.metric,
        "a_rate": a_rate,
        "b_rate": b_rate,
        "difference": f"{fmt_points(diff)} points [{fmt_points(ci[0])}, {fmt_points(ci[1])}]",
        "residual_label": "residual" if is_drop or diff == 0 else "now",
        "describe": c.describe,
        "p": fmt_p(c.p),
        "p_holm": fmt_p(c.p_holm),
        "significant": significant,
        "needed": needed,
        "verdict": verdict,
        "mde": _mde_text(c),
        "test": c.test,
        "paired": c.paired,
        "ci_method": c.ci_method,
    }


def _mde_text(c: Contrast) -> str:
    """The MDE exactly as the contrast's sentence words it (results.py writes
    both from one computation)."""
    if c.mde_text:
        return c.mde_text
    if c.mde is not None:
        return effect_text(c.mde)
    return f"no {'drop' if c.mde_direction == 'down' else 'rise'} detectable"


def key_contrasts(contrasts: list[Contrast]) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    index: dict[tuple[str, str, str], Contrast] = {(c.knob, c.a, c.b): c for c in contrasts}
    found, missing = [], []
    for knob, a, b, title in KEY_CONTRASTS:
        c = index.get((knob, a, b)) or index.get((knob, b, a))
        if c is None:
            missing.append({"title": title, "a": a, "b": b})
            continue
        view = contrast_view(c)
        view["title"] = title
        found.append(view)
    return found, missing
