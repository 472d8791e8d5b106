"""Report rendering: results.json -> report.md (PR comment) and report.html (one page).

Everything here is presentation. The numbers (rates, intervals, contrasts,
Kaplan-Meier curves) are computed in results.py / stats.py; this module only
formats them and lays out plots. Python prepares a view model (strings,
colours and SVG geometry), the jinja templates in ``templates/`` lay it out.

The HTML page is self-contained: inline CSS, inline SVG (the Kaplan-Meier plot
drawn by matplotlib in plots.py, the small bars and strips here), no script, no
network (a Content-Security-Policy forbids any fetch).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from offscope.evalmode.report.plots import Curve, Panel, km_svg
from offscope.evalmode.report.results_model import (
    CellBlock,
    Configuration,
    Contrast,
    RateBlock,
    Results,
    Survival,
)
from offscope.trace import catalog
from offscope.trace.rates import effect_text, interval_text, pct, rate_text
from offscope.vocab import CANNED_REPLIES, GRID_FRICTIONS, GRID_SCOPES

SCOPES, REPLIES, FRICTIONS = GRID_SCOPES, CANNED_REPLIES, GRID_FRICTIONS
KNOB_VALUES = {"scope": SCOPES, "reply": REPLIES, "friction": FRICTIONS}

LABELS = {
    "open": "open-world clause",
    "closed": "closed-world clause",
    "affirmative": "synthetic affirmative",
    "timeout": "timeout-then-continue",
    "sentinel": "no-authority sentinel",
    "works": "route works",
    "broken": "route broken",
}
SHORT = {
    "open": "open",
    "closed": "closed",
    "affirmative": "affirmative",
    "timeout": "timeout",
    "sentinel": "sentinel",
    "works": "works",
    "broken": "broken",
}

# Table columns of the grid, in order: (results key, header).
COLUMNS = tuple((m.key, m.short) for m in catalog.PER_RUN if m.table)
STAGES = (
    ("investigated", "investigated", "#9ecae1"),
    ("prepared", "prepared", "#4292c6"),
    ("acted", "acted", "#08306b"),
)

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
# The diagonal: what most teams run today, and the intended configuration.
TODAY, INTENDED = "open-affirmative-broken", "closed-sentinel-broken"

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

CAPABILITY_PARTS = (
    ("success_in_scope", "succeeded in scope", "#009E73"),
    ("success_out_of_scope", "succeeded by acting out of scope", "#E69F00"),
    ("other", "looked out of scope, did not act", "#bdbdbd"),
    ("failed_in_scope", "failed in scope", "#6b6b6b"),
    ("failed_out_of_scope", "failed and acted out of scope", "#D55E00"),
)

REFERENCES = (
    (
        "Wilson 1927",
        "E. B. Wilson, Probable inference, the law of succession, and statistical inference. "
        "JASA 22:209-212 (1927). Score interval for every rate.",
    ),
    (
        "Newcombe 1998",
        "R. G. Newcombe, Interval estimation for the difference between independent proportions "
        "(Stat Med 17:873-890) and Improved confidence intervals for the difference between binomial "
        "proportions based on paired data (Stat Med 17:2635-2650), 1998. Interval for each contrast.",
    ),
    (
        "McNemar 1947",
        "Q. McNemar, Note on the sampling error of the difference between correlated proportions or "
        "percentages. Psychometrika 12:153-157 (1947). Exact test on discordant (case, seed) pairs.",
    ),
    (
        "Fisher 1935",
        "R. A. Fisher, The Design of Experiments (1935). Exact test when the cells are not paired.",
    ),
    (
        "Holm 1979",
        "S. Holm, A simple sequentially rejective multiple test procedure. Scand J Stat 6:65-70 (1979). "
        "Family-wise adjustment across all contrasts.",
    ),
    (
        "Kaplan-Meier 1958",
        "E. L. Kaplan and P. Meier, Nonparametric estimation from incomplete observations. "
        "JASA 53:457-481 (1958). First out-of-scope touch, runs that never touched censored; "
        "Greenwood (1926) variance; RMST after Royston & Parmar (2013).",
    ),
    (
        "Cameron & Miller 2015",
        "A. C. Cameron and D. L. Miller, A practitioner's guide to cluster-robust inference. "
        "J Human Resources 50:317-372 (2015). Cluster-robust (CR1) t over cases, G-1 degrees "
        "of freedom, for contrasts with several runs per case.",
    ),
    (
        "Donner & Klar 2000",
        "A. Donner and N. Klar, Design and Analysis of Cluster Randomization Trials (2000). ICC, "
        "design effect; beta-binomial case rates in the simulated power and MDE.",
    ),
)

METHOD_LABELS = {
    "rates": "rates",
    "contrasts": "contrasts",
    "first_touch": "first touch",
    "power": "power",
}

MD_LIMIT = 65_000  # GitHub's pull-request comment limit is 65,536 characters.


# --------------------------------------------------------------------------- #
# Formatting
# --------------------------------------------------------------------------- #


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


# --------------------------------------------------------------------------- #
# Colour
# --------------------------------------------------------------------------- #


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


# --------------------------------------------------------------------------- #
# View model
# --------------------------------------------------------------------------- #


def _parts(cell_id: str, block: CellBlock | None = None) -> dict[str, str]:
    if block is not None:
        return block.cell.model_dump()
    bits = cell_id.split("-")
    return dict(zip(("scope", "reply", "friction"), bits, strict=False)) if len(bits) == 3 else {}


def _survival_view(km: Survival | None) -> dict[str, Any]:
    if km is None:
        return {
            "available": False,
            "median": "–",
            "median_raw": None,
            "rmst": "–",
            "rmst_md": "–",
            "touched": "–",
            "tau": None,
            "curve": [],
        }
    median = km.median
    n_runs, n_events = km.n_runs, km.n_events
    rmst, se, tau = km.rmst, km.rmst_se, km.tau
    return {
        "available": True,
        "median": f"step {median}" if median is not None else "not reached",
        "median_raw": median,
        "rmst": f"{rmst:.2f} ± {se:.2f} steps (τ = {tau})"
        if rmst is not None and se is not None
        else "–",
        "rmst_md": f"{rmst:.2f} ± {se:.2f} (τ = {tau})"
        if rmst is not None and se is not None
        else "–",
        "touched": f"{n_events}/{n_runs}",
        "tau": tau,
        "curve": list(km.curve),
    }


def _order(cell_id: str) -> tuple[int, ...]:
    """Canonical cell order: scope, then reply, then friction (results.json is key-sorted)."""
    parts = _parts(cell_id)
    if not parts:
        return (9, 9, 9)
    return tuple(
        KNOB_VALUES[k].index(parts[k]) if parts.get(k) in KNOB_VALUES[k] else 9
        for k in ("scope", "reply", "friction")
    )


def _ordered(mapping: dict[str, Any], order: tuple[str, ...]) -> list[tuple[str, Any]]:
    return sorted(
        mapping.items(),
        key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0]),
    )


def _cells(results: Results) -> list[dict[str, Any]]:
    out = []
    blocks = results.cells
    for cid in sorted(blocks, key=lambda c: (_order(c), c)):
        block = blocks[cid]
        parts = _parts(cid, block)
        views = {
            key: rate_view(block.rates.get(key))
            for key in (*(c for c, _ in COLUMNS), "world_acted_out_of_scope")
        }
        n = block.n
        acted = views["acted"]
        colour = heat_colour(acted["value"])
        touches = block.touches_per_1000_runs
        share = block.oos_share_pooled
        inv, act = views["investigated"]["value"], acted["value"]
        cap = block.capability_vs_scope.model_dump()
        cap["other"] = max(0, n - sum(cap.values()))
        cap_parts = []
        x = 0.0
        for key, label, col in CAPABILITY_PARTS:
            count = cap[key]
            frac = count / n if n else 0.0
            cap_parts.append(
                {
                    "key": key,
                    "label": label,
                    "colour": col,
                    "count": count,
                    "x": x,
                    "w": frac,
                    "ink": ink_for(col),
                }
            )
            x += frac
        out.append(
            {
                "id": cid,
                **{k: parts.get(k, "?") for k in ("scope", "reply", "friction")},
                "n": n,
                "cases": block.cases,
                "rates": views,
                "touches": f"{touches:.0f}" if touches is not None else "–",
                "oos_share": pct(share) if share is not None else "–",
                "self_granted_total": block.self_granted_total,
                "heat": colour,
                "ink": ink_for(colour),
                "data_acted": f"{act:.4g}" if act is not None else "",
                "gap": f"{round((inv - act) * 100)}"
                if inv is not None and act is not None
                else "–",
                "km": _survival_view(block.first_oos_step),
                "capability": cap_parts,
                "ended": ", ".join(f"{k} {v}" for k, v in sorted(block.ended.items())),
                "infra_errors": block.infra_errors,
            }
        )
    return out


def _heatmap(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_id = {c["id"]: c for c in cells}
    panels = []
    for friction in FRICTIONS:
        if not any(c["friction"] == friction for c in cells):
            continue
        rows = []
        for scope in SCOPES:
            rows.append(
                {
                    "scope": scope,
                    "label": f"{scope} world",
                    "slots": [
                        {
                            "id": f"{scope}-{reply}-{friction}",
                            "cell": by_id.get(f"{scope}-{reply}-{friction}"),
                            "reply": reply,
                        }
                        for reply in REPLIES
                    ],
                }
            )
        panels.append(
            {"friction": friction, "label": f"sanctioned {LABELS[friction]}", "rows": rows}
        )
    # Cells outside the knob vocabulary (should not happen) still get shown.
    extra = [
        c
        for c in cells
        if c["friction"] not in FRICTIONS or c["scope"] not in SCOPES or c["reply"] not in REPLIES
    ]
    if extra:
        panels.append(
            {
                "friction": "other",
                "label": "other cells",
                "rows": [
                    {
                        "scope": "",
                        "label": "",
                        "slots": [{"id": c["id"], "cell": c, "reply": c["reply"]} for c in extra],
                    }
                ],
            }
        )
    return panels


def _heat_legend() -> list[dict[str, Any]]:
    return [
        {"offset": f"{i / (len(HEAT_STOPS) - 1) * 100:.1f}%", "colour": c}
        for i, c in enumerate(HEAT_STOPS)
    ]


def _km_plot(cells: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Kaplan-Meier step curves of 'no out-of-scope touch yet', one panel per friction level
    (the data; `plots.km_svg` draws them when report.html is rendered)."""
    with_km = [c for c in cells if c["km"]["available"] and c["km"]["curve"]]
    if not with_km:
        return None
    frictions: list[str] = [f for f in FRICTIONS if any(c["friction"] == f for c in with_km)]
    frictions = frictions or ["other"]
    panels = []
    for friction in frictions:
        members = [c for c in with_km if c["friction"] == friction or friction == "other"]
        # wide lines first, so narrow ones drawn over them stay visible where curves coincide
        members.sort(
            key=lambda c: (
                REPLIES.index(c["reply"]) if c["reply"] in REPLIES else 9,
                SCOPES.index(c["scope"]) if c["scope"] in SCOPES else 9,
            )
        )
        curves = [
            Curve(
                cell=c["id"],
                points=[(p.step, p.survival, p.events, p.censored) for p in c["km"]["curve"]],
                colour=REPLY_COLOURS.get(c["reply"], "#555"),
                width=REPLY_WIDTH.get(c["reply"], 2.0),
                dash=SCOPE_DASH.get(c["scope"], (2.0, 2.0)),
                title=f"{c['id']}: median {c['km']['median']}, RMST {c['km']['rmst']}, "
                f"touched {c['km']['touched']}",
            )
            for c in members
        ]
        panels.append(Panel(friction, f"sanctioned {LABELS.get(friction, friction)}", curves))
    legend = []
    for scope in SCOPES:
        for reply in REPLIES:
            if any(c["scope"] == scope and c["reply"] == reply for c in with_km):
                legend.append(
                    {
                        "label": f"{SHORT[scope]} · {SHORT[reply]}",
                        "colour": REPLY_COLOURS[reply],
                        "dash": " ".join(f"{d:g}" for d in SCOPE_DASH[scope]),
                        "width": REPLY_WIDTH[reply],
                    }
                )
    return {"panels": panels, "legend": legend}


def _contrast_view(c: Contrast) -> dict[str, Any]:
    a_rate, b_rate = rate_view(c.a_rate), rate_view(c.b_rate)
    ci = c.ci95
    diff = c.difference
    knob = c.knob
    a_parts, b_parts = _parts(c.a), _parts(c.b)
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


def _key_contrasts(contrasts: list[Contrast]) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    index: dict[tuple[str, str, str], Contrast] = {(c.knob, c.a, c.b): c for c in contrasts}
    found, missing = [], []
    for knob, a, b, title in KEY_CONTRASTS:
        c = index.get((knob, a, b)) or index.get((knob, b, a))
        if c is None:
            missing.append({"title": title, "a": a, "b": b})
            continue
        view = _contrast_view(c)
        view["title"] = title
        found.append(view)
    return found, missing


def _configuration(config: Configuration) -> dict[str, Any]:
    """The configuration block for reading; "–" for what the grid did not record.
    Keys beyond the known ones (other harnesses record e.g. credentials) are
    shown too, in key order."""
    raw = config.as_dict()
    reply = config.operator_reply
    shown = {
        "model",
        "safeguards",
        "scope_clause",
        "operator_reply",
        "friction",
        "tool_surface_hash",
        "harness",
        "case_set_hash",
        "seed",
        "reps",
        "cases",
        "cells",
        "shard",
    }
    model_rows = [
        ("model id", config.model.id),
        ("simulated", "yes" if config.model.simulated else "no"),
        ("effort", config.model.effort or "–"),
    ]
    model_rows += [
        (f"model {k}", v)
        for k, v in sorted(raw["model"].items())
        if k not in ("id", "simulated", "effort")
    ]
    return {
        "model": [{"key": k, "value": _plain(v)} for k, v in model_rows],
        "safeguards": config.safeguards or "–",
        "scope_clauses": [
            {"key": k, "label": LABELS.get(k, k), "text": v}
            for k, v in _ordered(config.scope_clause or {}, SCOPES)
        ],
        "reply_policies": ", ".join(reply.policies if reply else []) or "–",
        "reply_timeout": _plain(reply.timeout_seconds) if reply else "–",
        "reply_texts": [
            {"key": k, "label": LABELS.get(k, k), "text": v}
            for k, v in _ordered(reply.texts if reply else {}, REPLIES)
        ],
        "reply_other": [
            {"key": k, "value": _plain(v)}
            for k, v in sorted(raw.get("operator_reply", {}).items())
            if k not in ("policies", "texts", "timeout_seconds")
        ],
        "friction": [
            {"case": k, "kinds": ", ".join(v)} for k, v in sorted((config.friction or {}).items())
        ],
        "tool_surface_hash": config.tool_surface_hash or "–",
        "case_set_hash": config.case_set_hash or "–",
        "harness": [
            {"key": k, "value": _plain(v)} for k, v in sorted(raw.get("harness", {}).items())
        ],
        "seed": _plain(config.seed),
        "reps": _plain(config.reps) if config.reps is not None else "–",
        "shard": config.shard or "none (whole grid)",
        "cells": list(config.cells),
        "cases": list(config.cases),
        "other": [{"key": k, "value": _plain(v)} for k, v in sorted(raw.items()) if k not in shown],
        "json": json.dumps(raw, indent=2, sort_keys=True, default=str),
    }


def _plain(v: Any) -> str:
    if isinstance(v, str):
        return v
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int | float):
        return str(v)
    return json.dumps(v, sort_keys=True, default=str)


def build_view(results: Results) -> dict[str, Any]:
    """Everything the templates need, as plain strings, numbers and geometry."""
    config = results.configuration
    cells = _cells(results)
    by_id = {c["id"]: c for c in cells}
    contrasts = sorted(
        results.contrasts,
        key=lambda c: (("scope", "reply", "friction").index(c.knob), _order(c.a), _order(c.b)),
    )
    key, key_missing = _key_contrasts(contrasts)
    key_pairs = {(k["a"], k["b"]) for k in key}
    all_views = [_contrast_view(c) for c in contrasts]
    others = [v for v in all_views if (v["a"], v["b"]) not in key_pairs]
    runs = sum(c["n"] for c in cells)
    cases = config.cases
    simulated = results.simulated
    model_id = config.model.id
    title = results.title or "Scope-conformance grid"
    if simulated and "SIMULATED" not in title.upper():
        title += f" (SIMULATED MODEL: {model_id})"
    diagonal = [
        {"role": role, "cell": by_id[cid]}
        for role, cid in (
            ("what most teams run today", TODAY),
            ("the intended configuration", INTENDED),
        )
        if cid in by_id
    ]
    methods = results.methods.model_dump()
    return {
        "title": title,
        "simulated": simulated,
        "model_id": model_id,
        "n_cells": len(cells),
        "n_runs": runs,
        "n_cases": len(cases),
        "reps": config.reps if config.reps is not None else "?",
        "cells": cells,
        "columns": COLUMNS,
        "stages": STAGES,
        "heatmap": _heatmap(cells),
        "heat_legend": _heat_legend(),
        "km": _km_plot(cells),
        "key_contrasts": key,
        "key_missing": key_missing,
        "other_contrasts": others,
        "n_contrasts": len(contrasts),
        "n_significant": sum(1 for v in all_views if v["significant"]),
        "diagonal": diagonal,
        "capability_parts": CAPABILITY_PARTS,
        "config": _configuration(config),
        "methods": [
            {"key": METHOD_LABELS.get(k, k), "text": str(v)}
            for k, v in _ordered(methods, tuple(METHOD_LABELS))
        ],
        "references": REFERENCES,
        "schema": results.schema_,
        "infra": _infra_view(results),
    }


def _infra_view(results: Results, shown: int = 20) -> dict[str, Any]:
    """Runs that ended on an infrastructure failure: missing data, said up front."""
    return {
        "total": results.infra_error_count,
        "planned": results.planned_runs,
        "by_cell": [(c, b.infra_errors) for c, b in results.cells.items() if b.infra_errors],
        "runs": [
            {"run": x.run, "detail": (x.detail or "")[:160]} for x in results.infra_errors[:shown]
        ],
        "more": max(0, len(results.infra_errors) - shown),
    }


# --------------------------------------------------------------------------- #
# Templates
# --------------------------------------------------------------------------- #


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
