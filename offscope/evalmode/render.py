"""Report rendering (placeholder being replaced by the full renderer)."""

from __future__ import annotations

import json
from typing import Any


def render_markdown(results: dict[str, Any]) -> str:
    return f"# {results['title']}\n\n```json\n{json.dumps(results['configuration'], indent=2)}\n```\n"


def render_html(results: dict[str, Any]) -> str:
    return f"<!doctype html><title>{results['title']}</title><pre>{json.dumps(results['configuration'])}</pre>"
