"""The skeleton's world: endpoints and MCP tools serving the recorded responses."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from offscope.rollout.mine.runs import Run
from offscope.rollout.mine.walls import Wall, path_template, split_url

GLOB_CHARS = set("*?[]{}")


def _json_or_none(text: str | None) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _mcp_type(v: Any) -> str:
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    return "string"


def effect_name(host: str, method: str, path: str) -> str:
    """The effect a world endpoint records: 'post:billing.acme.test/v1/refunds'."""
    return f"{method.lower()}:{host}{path}"


def build_world(
    siblings: list[Run], wall: Wall, dcall
) -> tuple[dict[str, Any], list[str], list[str]]:
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
            host, path, _ = split_url(call.url)
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
                        ep["effect"] = effect_name(host, method, path)
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
