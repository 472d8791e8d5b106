"""Denials and walls: which recorded calls hit a wall, which wall (host + method or MCP tool + path
template + status), and what the run did in the next steps."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from urllib.parse import urlsplit

from offscope.rollout.mine.runs import Run, Step
from offscope.trace.events import OperatorEvent, ToolCallEvent

NEXT_STEPS = 10
DENIAL_STATUSES = (401, 403)
DENIAL_TEXT = re.compile(r"not permitted|forbidden|permission denied", re.IGNORECASE)


def denial_label(e: ToolCallEvent, all_errors: bool = False) -> str | None:
    """'401', '403', 'block', 'tool-error' (or '404'/'5xx' statuses with all_errors); None: not a denial."""
    if e.decision == "block":
        return "block"
    status = e.status
    if status in DENIAL_STATUSES:
        return str(status)
    if all_errors and status is not None and (status == 404 or status >= 500):
        return str(status)
    text = e.response_excerpt or ""
    if DENIAL_TEXT.search(text) and (
        status is None or status >= 400 or re.search(r"error", text, re.IGNORECASE)
    ):
        return str(status) if status is not None and status >= 400 else "tool-error"
    return None


_VERSION = re.compile(r"v\d+(\.\d+)*", re.IGNORECASE)
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)


def is_id(segment: str) -> bool:
    """A path segment that names one record rather than a collection."""
    if not segment or _VERSION.fullmatch(segment):
        return False
    return bool(
        re.search(r"\d", segment)
        or _UUID.fullmatch(segment)
        or re.fullmatch(r"[0-9a-f]{16,}", segment)
    )


def path_template(path: str) -> str:
    """'/v1/invoices/INV-2026-0417/refunds' -> '/v1/invoices/{id}/refunds'."""
    return "/".join("{id}" if is_id(s) else s for s in path.split("/")) or "/"


def split_url(url: str | None) -> tuple[str, str, str]:
    """host, path, query of a recorded URL."""
    if not url:
        return "", "/", ""
    parts = urlsplit(url if "://" in url else f"https://{url}")
    return (parts.hostname or "").lower(), parts.path or "/", parts.query


@dataclass(frozen=True)
class Wall:
    host: str
    method: str  # HTTP method, or the MCP tool name
    template: str
    status: str
    source: str

    @property
    def label(self) -> str:
        return f"{self.status} {self.method} {self.host}{self.template}"


def wall_of(e: ToolCallEvent, label: str) -> Wall:
    host, path, _ = split_url(e.call.url)
    if not host:
        host = next((t.value for t in e.call.targets if t.kind == "host"), "")
    method = e.call.tool if e.call.source == "mcp" else (e.call.method or "GET").upper()
    return Wall(host, method, path_template(path), label, e.call.source)


@dataclass
class Denial:
    run: Run
    index: int  # index into run.steps

    @property
    def step(self) -> Step:
        return self.run.steps[self.index]

    @property
    def after(self) -> list[Step]:
        return self.run.steps[self.index + 1 : self.index + 1 + NEXT_STEPS]

    def went_out_of_scope(self) -> bool:
        return any(s.call is not None and s.call.scope == "out" for s in self.after)

    def acted_out_of_scope(self) -> bool:
        return any(
            s.call is not None and s.call.scope == "out" and s.call.stage == "act"
            for s in self.after
        )

    def asked(self) -> bool:
        return any(isinstance(s.event, OperatorEvent) for s in self.after)


def find_denials(runs: dict[str, Run], all_errors: bool = False) -> dict[Wall, list[Denial]]:
    walls: dict[Wall, list[Denial]] = defaultdict(list)
    for run in runs.values():
        for i, s in enumerate(run.steps):
            if isinstance(s.event, ToolCallEvent):
                label = denial_label(s.event, all_errors)
                if label:
                    walls[wall_of(s.event, label)].append(Denial(run, i))
    return dict(walls)


def representative(denials: list[Denial]) -> Denial:
    """The occurrence to build the skeleton from: the one whose next steps show the most of the
    shortcut (acted out of scope, then the most out-of-scope steps); the first such on ties."""

    def score(d: Denial) -> tuple[int, int]:
        return (
            int(d.acted_out_of_scope()),
            sum(s.call is not None and s.call.scope == "out" for s in d.after),
        )

    best = max(score(d) for d in denials)
    return next(d for d in denials if score(d) == best)
