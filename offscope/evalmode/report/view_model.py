"""The view model: everything the templates need, built from `Results` as plain
strings, numbers, colours and geometry (`build_view`). The contrasts and the
configuration block have their own modules (view_contrasts.py, view_config.py).
"""

from __future__ import annotations

from typing import Any

from offscope.evalmode.report.colours import (
    REPLY_COLOURS,
    REPLY_WIDTH,
    SCOPE_DASH,
    heat_colour,
    heat_legend,
    ink_for,
)
from offscope.evalmode.report.formats import rate_view
from offscope.evalmode.report.knobs import (
    FRICTIONS,
    LABELS,
    REPLIES,
    SCOPES,
    SHORT,
    cell_knobs,
    cell_order,
    ordered_items,
)
from offscope.evalmode.report.plots import Curve, Panel
from offscope.evalmode.report.results_model import Results, Survival
from offscope.evalmode.report.view_config import configuration_view
from offscope.evalmode.report.view_contrasts import contrast_view, key_contrasts
from offscope.trace import catalog
from offscope.trace.rates import pct

# Table columns of the grid, in order: (results key, header).
COLUMNS = tuple((m.key, m.short) for m in catalog.PER_RUN if m.table)
STAGES = (
    ("investigated", "investigated", "#9ecae1"),
    ("prepared", "prepared", "#4292c6"),
    ("acted", "acted", "#08306b"),
)
# The diagonal: what most teams run today, and the intended configuration.
TODAY, INTENDED = "open-affirmative-broken", "closed-sentinel-broken"

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


def _cells(results: Results) -> list[dict[str, Any]]:
    out = []
    blocks = results.cells
    for cid in sorted(blocks, key=lambda c: (cell_order(c), c)):
        block = blocks[cid]
        parts = cell_knobs(cid, block)
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


def build_view(results: Results) -> dict[str, Any]:
    """Everything the templates need, as plain strings, numbers and geometry."""
    config = results.configuration
    cells = _cells(results)
    by_id = {c["id"]: c for c in cells}
    contrasts = sorted(
        results.contrasts,
        key=lambda c: (
            ("scope", "reply", "friction").index(c.knob),
            cell_order(c.a),
            cell_order(c.b),
        ),
    )
    key, key_missing = key_contrasts(contrasts)
    key_pairs = {(k["a"], k["b"]) for k in key}
    all_views = [contrast_view(c) for c in contrasts]
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
        "heat_legend": heat_legend(),
        "km": _km_plot(cells),
        "key_contrasts": key,
        "key_missing": key_missing,
        "other_contrasts": others,
        "n_contrasts": len(contrasts),
        "n_significant": sum(1 for v in all_views if v["significant"]),
        "diagonal": diagonal,
        "capability_parts": CAPABILITY_PARTS,
        "config": configuration_view(config),
        "methods": [
            {"key": METHOD_LABELS.get(k, k), "text": str(v)}
            for k, v in ordered_items(methods, tuple(METHOD_LABELS))
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
