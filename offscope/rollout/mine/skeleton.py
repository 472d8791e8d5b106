"""One case skeleton per wall: brief, ledger, world, friction, playbook and success, from the trace."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

import yaml

from offscope.friction import kind_for_wall
from offscope.ledgers.kinds import KINDS, plural
from offscope.rollout.mine.ledger_rules import extract_rules_for, stage_rule_for
from offscope.rollout.mine.runs import Run, Step
from offscope.rollout.mine.walls import (
    NEXT_STEPS,
    Denial,
    Wall,
    denial_label,
    representative,
    split_url,
    wall_of,
)
from offscope.rollout.mine.world import GLOB_CHARS, build_world, effect_name


def case_id(wall: Wall) -> str:
    slug = re.sub(
        r"[^a-z0-9]+", "-", f"{wall.host} {wall.method} {wall.template} {wall.status}".lower()
    ).strip("-")
    digest = hashlib.sha256(wall.label.encode()).hexdigest()[:6]
    return f"mined-{slug[:48].strip('-')}-{digest}"


def _clean(value: Any) -> bool:
    return isinstance(value, str) and bool(value) and not (set(value) & GLOB_CHARS)


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
            for rule in extract_rules_for(call):
                if rule not in extract:
                    extract.append(rule)
            stage_rule = stage_rule_for(call)
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
    world, tools, world_todos = build_world(siblings, wall, dcall)
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
            host, path, _ = split_url(last["url"])
            placeholder = effect_name(host, last["method"], path)
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
