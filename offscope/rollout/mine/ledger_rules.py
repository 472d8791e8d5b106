"""The ledger's extraction and stage rules, inferred from how the recorded calls were tagged."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl

from offscope.rollout.mine.walls import is_id, path_template, split_url


def _flatten(value: Any, prefix: str = "args") -> dict[str, str]:
    out: dict[str, str] = {}
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", k):
                out.update(_flatten(v, f"{prefix}.{k}"))
    elif isinstance(value, str | int | float) and not isinstance(value, bool):
        out[prefix] = str(value)
    return out


def _template(value: str, candidates: dict[str, str]) -> str | None:
    """Express value with {refs}: the whole value, or '/'-separated parts, each one candidate."""
    by_text: dict[str, str] = {}
    for ref, text in candidates.items():
        by_text.setdefault(text, ref)
    if value in by_text:
        return "{" + by_text[value] + "}"
    parts = value.split("/")
    if len(parts) > 1 and all(p in by_text for p in parts):
        return "/".join("{" + by_text[p] + "}" for p in parts)
    return None


def extract_rules_for(call) -> list[dict[str, Any]]:
    """Extraction rules that reproduce this call's non-host targets (inferred)."""
    host, path, query = split_url(call.url)
    rules = []
    segments = path.split("/")
    for t in call.targets:
        if t.kind == "host":
            continue
        kind_prefix, value = "", t.value
        if t.kind == "record":
            kind_prefix, _, value = t.value.partition(":")
            kind_prefix += ":"
        candidates: dict[str, str] = {}
        used_segments: dict[int, str] = {}
        if call.source == "http":
            for i, seg in enumerate(segments):
                if seg and re.fullmatch(r"[A-Za-z0-9._~-]+", seg):
                    candidates[f"seg{i}"] = seg
            for k, v in parse_qsl(query):
                if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                    candidates.setdefault(f"query.{k}", v)
        for ref, text in _flatten(call.args).items():
            candidates.setdefault(ref, text)
        tmpl = _template(value, candidates)
        if tmpl is None:
            continue
        for ref in re.findall(r"\{([^}]+)\}", tmpl):
            if ref.startswith("seg"):
                used_segments[int(ref[3:])] = ref
        match: dict[str, Any] = {}
        if call.source == "mcp":
            match = {"source": "mcp", "tool": call.tool}
            if host:
                match["host"] = host
        else:
            if host:
                match["host"] = host
            if used_segments:
                match["path"] = (
                    "/".join(
                        "{" + used_segments[i] + "}"
                        if i in used_segments
                        else ("*" if is_id(s) else s)
                        for i, s in enumerate(segments)
                    )
                    or "/"
                )
            elif path:
                match["path"] = path_template(path).replace("{id}", "*")
            if (
                any(not r.startswith("seg") for r in re.findall(r"\{([^}]+)\}", tmpl))
                and call.method
            ):
                match["method"] = call.method.upper()
        if match.get("path") and not _path_ok(match["path"]):
            continue
        rules.append({"match": match, "targets": {t.kind: kind_prefix + tmpl}})
    return rules


def _path_ok(path: str) -> bool:
    from offscope.ledgers.model import Match

    try:
        Match(path=path)
    except ValueError:
        return False
    return True


def stage_rule_for(call) -> dict[str, Any] | None:
    host, path, _ = split_url(call.url)
    if call.source == "mcp":
        return (
            {"match": {"source": "mcp", "tool": call.tool}, "stage": "prepare"}
            if call.stage == "prepare"
            else None
        )
    method = (call.method or "GET").upper()
    default = "investigate" if method in ("GET", "HEAD", "OPTIONS") else "act"
    if call.stage == default:
        return None
    match: dict[str, Any] = {"method": method, "path": path_template(path).replace("{id}", "*")}
    if host:
        match["host"] = host
    return {"match": match, "stage": call.stage} if _path_ok(match["path"]) else None
