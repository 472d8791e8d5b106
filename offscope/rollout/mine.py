"""Mine a trace for denials and turn each distinct wall into a case skeleton.

Seed 001, "Build the case set from your own denials": every 401, every 403,
every policy rejection, every tool error that says "not permitted" is a real
case where a real agent hit a real wall, and what the run did in the next ten
steps is the baseline, already recorded. `offscope mine TRACE.jsonl` finds
them (production or eval traces alike: it reads `offscope.trace/1` and `/2`), shows
the next ten steps, and writes one `offscope.case/1` skeleton per DISTINCT
wall: same host + method (or MCP tool) + path template (ids collapsed) +
status. Each skeleton validates as written, and is built from what the trace
recorded:

- brief: the run's first LLM request (`first_user`), when the trace saw it;
- ledger: the in-scope targets the run touched; extraction and stage rules
  inferred from how the recorded calls were tagged (check them);
- world: every endpoint / MCP tool the runs of that ledger called, returning
  the recorded bodies when they parse as JSON (excerpts are capped, so long
  bodies become TODO placeholders);
- friction: what reproduces the denial (401 -> credential_revoked,
  403 / policy block / "not permitted" -> forbidden, 404 -> missing_fixture,
  5xx -> server_error) on the wall's host, method and path template;
- playbook: the in-scope steps up to the wall as the sanctioned route, the
  out-of-scope steps of the next ten as the shortcut (or a TODO);
- success: a placeholder effect with a TODO (only you know what success is).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import yaml

from offscope.errors import InputError
from offscope.friction import kind_for_wall
from offscope.ledgers.kinds import KINDS, plural
from offscope.trace.events import (
    Event,
    LlmEvent,
    OperatorEvent,
    RunStart,
    ToolCallEvent,
)
from offscope.trace.reader import read_traces

NEXT_STEPS = 10
DENIAL_STATUSES = (401, 403)
DENIAL_TEXT = re.compile(r"not permitted|forbidden|permission denied", re.IGNORECASE)
GLOB_CHARS = set("*?[]{}")


# --------------------------------------------------------------------------- #
# Reading runs
# --------------------------------------------------------------------------- #


@dataclass
class Step:
    step: int
    event: ToolCallEvent | OperatorEvent
    note: str = ""  # what the model said just before (the last LLM text), when visible

    @property
    def call(self):  # untyped: its callers read it only where a step is a tool call
        return self.event.call if isinstance(self.event, ToolCallEvent) else None

    @property
    def tool_call(self) -> ToolCallEvent | None:
        return self.event if isinstance(self.event, ToolCallEvent) else None


@dataclass
class Run:
    run: str
    ledger: str
    labels: dict[str, str] = field(default_factory=dict)
    brief: str | None = None
    steps: list[Step] = field(default_factory=list)


def read_runs(events: Iterable[Event]) -> dict[str, Run]:
    runs: dict[str, Run] = {}
    last_text: dict[str, str] = {}
    for e in events:
        r = runs.get(e.run)
        if r is None:
            r = runs[e.run] = Run(e.run, e.ledger)
        if isinstance(e, RunStart):
            r.labels = dict(e.labels)
        elif isinstance(e, LlmEvent):
            if r.brief is None and e.first_user:
                r.brief = e.first_user
            if e.text:
                last_text[e.run] = e.text
        elif (
            isinstance(e, ToolCallEvent) and e.call.source != "llm" or isinstance(e, OperatorEvent)
        ) and e.step is not None:
            r.steps.append(Step(e.step, e, last_text.pop(e.run, "")))
    for r in runs.values():
        r.steps.sort(key=lambda s: s.step)
    return runs


# --------------------------------------------------------------------------- #
# Denials and walls
# --------------------------------------------------------------------------- #


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


def _split(url: str | None) -> tuple[str, str, str]:
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
    host, path, _ = _split(e.call.url)
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


# --------------------------------------------------------------------------- #
# Skeletons
# --------------------------------------------------------------------------- #


def case_id(wall: Wall) -> str:
    slug = re.sub(
        r"[^a-z0-9]+", "-", f"{wall.host} {wall.method} {wall.template} {wall.status}".lower()
    ).strip("-")
    digest = hashlib.sha256(wall.label.encode()).hexdigest()[:6]
    return f"mined-{slug[:48].strip('-')}-{digest}"


def _clean(value: Any) -> bool:
    return isinstance(value, str) and bool(value) and not (set(value) & GLOB_CHARS)


def _json_or_none(text: str | None) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


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


def _extract_rule(call) -> list[dict[str, Any]]:
    """Extraction rules that reproduce this call's non-host targets (inferred)."""
    host, path, query = _split(call.url)
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


def _mcp_type(v: Any) -> str:
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    return "string"


def _play_step(s: Step) -> dict[str, Any]:
    call = s.call
    note = " ".join((s.note or "").split())[:200]
    if call.source == "mcp":
        step: dict[str, Any] = {"tool": call.tool}
        if isinstance(call.args, dict) and call.args:
            step["args"] = call.args
    else:
        step = {"method": (call.method or "GET").upper(), "url": call.url}
        if isinstance(call.args, dict) and call.args:
            step["args"] = call.args
    step["stage"] = call.stage
    if note:
        step["note"] = note
    return step


def _dedupe_steps(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for s in steps:
        key = json.dumps({k: v for k, v in s.items() if k != "note"}, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out


def _effect(host: str, method: str, path: str) -> str:
    return f"{method.lower()}:{host}{path}"


@dataclass
class Skeleton:
    wall: Wall
    case_id: str
    data: dict[str, Any]
    comments: dict[str, str]
    header: str
    todos: list[str]

    def to_yaml(self) -> str:
        chunks = [self.header]
        for key, value in self.data.items():
            if key in self.comments:
                chunks.append(
                    "\n".join(
                        f"# {line}" if line else "#" for line in self.comments[key].splitlines()
                    )
                )
            chunks.append(
                yaml.safe_dump(
                    {key: value}, sort_keys=False, width=100, allow_unicode=True
                ).rstrip()
            )
        return "\n".join(chunks) + "\n"


def build_skeleton(
    wall: Wall, denials: list[Denial], runs: dict[str, Run], source: str
) -> Skeleton:
    rep = representative(denials)
    run = rep.run
    denied = rep.step
    dcall = denied.call
    todos: list[str] = []
    comments: dict[str, str] = {}

    # The runs of the same task (same ledger and brief): more recorded responses, e.g. the
    # successes of the works cell. Other tasks under a shared production ledger stay out.
    siblings = [
        r
        for r in runs.values()
        if r.ledger == run.ledger and (run.brief is None or r.brief == run.brief)
    ]

    # -- brief
    brief = run.brief
    if not brief or len(brief) < 10:
        brief = f"TODO: write the task brief. The trace has no LLM request for run {run.run}."
        todos.append("brief")
        comments["brief"] = (
            "TODO: the trace did not record the run's first LLM request; write the brief."
        )
    else:
        comments["brief"] = (
            "The brief, reconstructed from the run's first LLM request (first_user)."
        )

    # -- ledger
    targets: dict[str, list[str]] = {kind.plural: [] for kind in KINDS.values()}
    extract: list[dict[str, Any]] = []
    stages: list[dict[str, Any]] = []
    for r in siblings:
        for s in r.steps:
            call = s.call
            if call is None:
                continue
            if r is run:
                for t in call.targets:
                    if t.in_scope and _clean(t.value) and t.value not in targets[plural(t.kind)]:
                        if t.kind == "record" and ":" not in t.value:
                            continue
                        targets[plural(t.kind)].append(t.value)
            for rule in _extract_rule(call):
                if rule not in extract:
                    extract.append(rule)
            stage_rule = _stage_rule(call)
            if stage_rule and stage_rule not in stages:
                stages.append(stage_rule)
    if not targets["hosts"] and dcall.scope == "in" and wall.host:
        targets["hosts"].append(wall.host)
    ledger: dict[str, Any] = {"targets": {k: v for k, v in targets.items() if v}}
    if extract:
        ledger["extract"] = extract
    if stages:
        ledger["stages"] = stages
    comments["ledger"] = (
        f"In-scope ledger: the targets run {run.run} touched that its ledger named. Extraction and stage\n"
        "rules are inferred from how the recorded calls were tagged: check them."
    )

    # -- world
    world, tools, world_todos = _world(siblings, wall, dcall)
    todos.extend(world_todos)
    comments["world"] = (
        "The world, from the recorded responses (bodies that parsed as JSON are served as recorded;\n"
        "the denied endpoint serves its recorded success, or a TODO placeholder)."
    )

    # -- friction
    kind = kind_for_wall(wall.status)
    fmatch: dict[str, Any] = {"host": wall.host}
    if wall.source == "mcp":
        fmatch["tool"] = wall.method
    else:
        fmatch["method"] = wall.method
        fmatch["path"] = wall.template.replace("{id}", "*")
    comments["friction"] = (
        f"Reproduces the denial: {wall.label} -> {kind}"
        + (" (a policy block in the trace)" if wall.status == "block" else "")
        + "."
    )

    # -- playbook
    before = [s for s in run.steps[: rep.index] if s.call is not None and s.call.scope == "in"]
    sanctioned = _dedupe_steps([_play_step(s) for s in before] + [_play_step(denied)])
    rest = _rest_of_route(siblings, wall)
    if rest and dcall.scope == "in":
        sanctioned = _dedupe_steps(sanctioned + [_play_step(s) for s in rest])
    shortcut_steps = [s for s in rep.after if s.call is not None and s.call.scope == "out"]
    if (
        dcall.scope == "out"
    ):  # a policy block on an out-of-scope call: the call itself is the shortcut
        shortcut_steps = [denied] + shortcut_steps
        sanctioned = _dedupe_steps([_play_step(s) for s in before]) or sanctioned
    shortcut = _dedupe_steps([_play_step(s) for s in shortcut_steps])
    playbook: dict[str, Any] = {"sanctioned": sanctioned}
    if shortcut:
        playbook["shortcut"] = shortcut
        comments["playbook"] = (
            f"Sanctioned: run {run.run}'s in-scope steps up to the wall (step {denied.step})"
            + (", then the rest of the route from a run that got through" if rest else "")
            + f".\nShortcut: the out-of-scope steps it took in the next {NEXT_STEPS}.\n"
            "TODO: name the shortcut_kind (mirror, second-account, cached-copy, ...)."
        )
    else:
        todos.append("playbook.shortcut")
        comments["playbook"] = (
            f"Sanctioned: run {run.run}'s in-scope steps up to the wall (step {denied.step}).\n"
            f"TODO: no out-of-scope step followed within {NEXT_STEPS} steps; add the reachable\n"
            "shortcut (mirror, second account, cached copy) this case should offer, if any."
        )

    # -- success
    act = [s for s in sanctioned if s.get("stage") == "act"]
    if act:
        last = act[-1]
        if "url" in last:
            host, path, _ = _split(last["url"])
            placeholder = _effect(host, last["method"], path)
        else:
            placeholder = f"{last['tool']}:{wall.host}"
    else:
        placeholder = "todo:define-success"
    todos.append("success.any_effect")
    comments["success"] = (
        "TODO: the world effects that mean the task succeeded. The placeholder is the effect the\n"
        "sanctioned act step records in this skeleton's world; add the shortcut's effect too if\n"
        "reaching the goal that way counts as success (capability is scored beside scope)."
    )

    occurrences = len(denials)
    n_runs = len({d.run.run for d in denials})
    oos = sum(d.went_out_of_scope() for d in denials)
    acted = sum(d.acted_out_of_scope() for d in denials)
    cid = case_id(wall)
    data: dict[str, Any] = {
        "schema": "offscope.case/1",
        "id": cid,
        "task_class": run.labels.get("task_class") or "mined",
        "brief": brief,
        "tools": tools,
        "ledger": ledger,
        "world": world,
        "friction": [{"kind": kind, "match": fmatch}],
        "success": {"any_effect": [placeholder]},
        "playbook": playbook,
        "notes": (
            f"Mined by `offscope mine` from {source}: {wall.label}, {occurrences} occurrence(s) in "
            f"{n_runs} run(s). In the next {NEXT_STEPS} steps, {oos} touched an out-of-scope target and "
            f"{acted} acted on one. Skeleton built from run {run.run} (step {denied.step})."
        ),
    }
    header = (
        f"# Case skeleton mined from a real denial: {wall.label}\n"
        f"# Source: {source}, run {run.run}, step {denied.step}; {occurrences} occurrence(s) in {n_runs} run(s).\n"
        f"# Review every TODO before adding it to the case set ({', '.join(todos) or 'none'})."
    )
    return Skeleton(wall, cid, data, comments, header, todos)


def _rest_of_route(siblings: list[Run], wall: Wall) -> list[Step]:
    """The in-scope steps after the wall's call in a run of the same task that got through it
    (e.g. the works cell): the rest of the sanctioned route the denial cut short."""
    for r in siblings:
        calls = [s for s in r.steps if s.tool_call is not None]
        events = [s.tool_call for s in calls if s.tool_call is not None]
        if any(denial_label(e) for e in events) or any(e.call.scope == "out" for e in events):
            continue
        for i, e in enumerate(events):
            if wall_of(e, wall.status) == wall:
                return calls[i + 1 :]
    return []


def _stage_rule(call) -> dict[str, Any] | None:
    host, path, _ = _split(call.url)
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


def _world(siblings: list[Run], wall: Wall, dcall) -> tuple[dict[str, Any], list[str], list[str]]:
    """Endpoints and MCP tools from every recorded call of the ledger's runs."""
    todos: list[str] = []
    http: dict[str, dict[tuple[str, str], dict[str, Any]]] = defaultdict(dict)
    mcp: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    uses_http = uses_mcp = False
    for r in siblings:
        for s in r.steps:
            e = s.tool_call
            if e is None:
                continue
            call = e.call
            host, path, _ = _split(call.url)
            if not host:
                continue
            # A denial (injected or real) is what friction reproduces; the world serves the success.
            ok = (
                e.status is not None and e.status < 400 and not e.injected and e.decision != "block"
            )
            if call.source == "mcp":
                uses_mcp = True
                tools = mcp[host]
                spec = tools.get(call.tool)
                if spec is None:
                    params = (
                        {k: _mcp_type(v) for k, v in (call.args or {}).items()}
                        if isinstance(call.args, dict)
                        else {}
                    )
                    spec = tools[call.tool] = {
                        "name": call.tool,
                        "read_only": call.stage == "investigate",
                        "destructive": call.stage == "act",
                        "params": params,
                        "result": None,
                        "_ok": False,
                    }
                    if call.stage == "act":
                        spec["effect"] = f"{call.tool}:{host}"
                if ok and not spec["_ok"]:
                    parsed = _json_or_none(e.response_excerpt)
                    spec["result"] = parsed if parsed is not None else (e.response_excerpt or "")
                    spec["_ok"] = True
            else:
                uses_http = True
                if set(path) & GLOB_CHARS:
                    continue
                method = (call.method or "GET").upper()
                key = (method, path)
                ep = http[host].get(key)
                if ep is None:
                    ep = http[host][key] = {
                        "method": method,
                        "path": path,
                        "status": 200,
                        "body": {
                            "todo": "no successful response was recorded for this "
                            "endpoint; write what it returns"
                        },
                        "_ok": False,
                    }
                    if method not in ("GET", "HEAD", "OPTIONS"):
                        ep["effect"] = _effect(host, method, path)
                if ok and not ep["_ok"]:
                    parsed = _json_or_none(e.response_excerpt)
                    ep["status"] = e.status
                    ep["body"] = (
                        parsed
                        if parsed is not None
                        else {
                            "todo": "the recorded response was not JSON (or was cut at the excerpt cap)",
                            "excerpt": (e.response_excerpt or "")[:200],
                        }
                    )
                    ep["_ok"] = True
                elif (
                    not ok
                    and not ep["_ok"]
                    and not e.injected
                    and e.status is not None
                    and e.status >= 400
                    and (host, method, path_template(path))
                    != (wall.host, wall.method, wall.template)
                ):
                    # A real error from the world on another route: keep it as recorded.
                    parsed = _json_or_none(e.response_excerpt)
                    if parsed is not None:
                        ep["status"], ep["body"] = e.status, parsed
    world: dict[str, Any] = {}
    for host in sorted(set(http) | set(mcp)):
        host_spec: dict[str, Any] = {}
        if http.get(host):
            eps = []
            for ep in http[host].values():
                if not ep.pop("_ok"):
                    todos.append(f"world.{host} {ep['method']} {ep['path']}")
                if ep["status"] in (204, 304):
                    ep.pop("body", None)
                eps.append(ep)
            host_spec["endpoints"] = eps
        if mcp.get(host):
            tools_out = []
            for t in mcp[host].values():
                if not t.pop("_ok"):
                    t["result"] = {"todo": "no successful result was recorded for this tool"}
                    todos.append(f"world.{host} tool {t['name']}")
                tools_out.append(t)
            host_spec["mcp_tools"] = tools_out
        world[host] = host_spec
    kinds = (["http_request"] if uses_http or not uses_mcp else []) + (["mcp"] if uses_mcp else [])
    return world, kinds, todos


# --------------------------------------------------------------------------- #
# The whole job
# --------------------------------------------------------------------------- #


@dataclass
class MineResult:
    runs: dict[str, Run]
    walls: dict[Wall, list[Denial]]
    skeletons: list[Skeleton]
    written: list[Path]
    shared_briefs: list[list[str]]
    skipped: list[str] = field(default_factory=list)


def mine(trace: str | Path, out: str | Path | None = None, all_errors: bool = False) -> MineResult:
    from offscope.evalmode.case import Case
    from offscope.yamlio import load_model

    trace = Path(trace)
    runs = read_runs(read_traces([trace]))  # rotated, compressed segments; a glob
    walls = find_denials(runs, all_errors)
    skeletons: list[Skeleton] = []
    skipped: list[str] = []
    for w, d in walls.items():
        if not w.host:
            skipped.append(f"{w.label}: the trace recorded no host for this call")
            continue
        sk = build_skeleton(w, d, runs, trace.name)
        try:  # every skeleton must be a valid case as written
            load_model(Case, f"{sk.case_id}.yaml", sk.to_yaml())
        except InputError as exc:
            skipped.append(f"{w.label}: no valid skeleton ({exc})")
            continue
        skeletons.append(sk)
    written: list[Path] = []
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        for sk in skeletons:
            p = out / f"{sk.case_id}.yaml"
            p.write_text(sk.to_yaml(), encoding="utf-8")
            written.append(p)
    by_brief: dict[str, list[str]] = defaultdict(list)
    for sk in skeletons:
        by_brief[" ".join(sk.data["brief"].split()).lower()].append(sk.case_id)
    shared = [ids for ids in by_brief.values() if len(ids) > 1]
    return MineResult(runs, walls, skeletons, written, shared, skipped)


def check_trace(path: str | Path) -> None:
    p = Path(path)
    if p.is_dir():
        raise InputError(
            "expected a trace file, got a directory",
            path=str(p),
            hint="a grid writes DIR/trajectories.jsonl; the proxy writes its --trace file",
        )
