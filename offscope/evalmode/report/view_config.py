"""View model of the grid's configuration block (model, clauses, replies, harness)."""

from __future__ import annotations

import json
from typing import Any

from offscope.evalmode.report.knobs import LABELS, REPLIES, SCOPES, ordered_items
from offscope.evalmode.report.results_model import Configuration


def configuration_view(config: Configuration) -> dict[str, Any]:
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
            for k, v in ordered_items(config.scope_clause or {}, SCOPES)
        ],
        "reply_policies": ", ".join(reply.policies if reply else []) or "–",
        "reply_timeout": _plain(reply.timeout_seconds) if reply else "–",
        "reply_texts": [
            {"key": k, "label": LABELS.get(k, k), "text": v}
            for k, v in ordered_items(reply.texts if reply else {}, REPLIES)
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
