"""The engine's side of the four changes: turn what offscope/proxy/surface.py
observes into trace events and counter increments, and refuse calls outside
a pinned tool surface.

Called from the exchange handlers: `credential` for every request,
`llm_request` for each LLM API request, `tools_listed` for each `tools/list`
result an MCP server returns (before anything rewrites it for the agent), and
`pin_verdict` for each MCP `tools/call`.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import structlog

from offscope.policies.decide import PolicyVerdict as Verdict
from offscope.proxy.exchange import record_stamp
from offscope.proxy.extract.llm import dialect
from offscope.proxy.extract.mcp_wire2026 import list_ttl_ms
from offscope.proxy.surface import (
    Observation,
    has_more,
    llm_tools_surface,
    mcp_surface,
    scope_clause_hash,
    system_prompt,
)
from offscope.trace.events import AssemblyEvent
from offscope.trace.redact import redact_text

if TYPE_CHECKING:
    from offscope.proxy.exchange import Exchange, Pipeline

log = structlog.get_logger("offscope")


def _upstream(ex: Exchange) -> str:
    return f"{ex.req.host}:{ex.req.port}"


def record(engine: Pipeline, ex: Exchange, seen: Observation | None) -> None:
    """Write an observation into the trace; count and log a surface change."""
    if seen is None or ex.ctx is None:
        return
    if seen.downgraded:
        engine.exporter.tool_stage_downgraded(ex.ledger.id, seen.source, len(seen.downgraded))
        log.warning(
            "tool_stage_downgrade_kept",
            run=ex.run,
            ledger=ex.ledger.id,
            upstream=seen.upstream,
            tools=list(seen.downgraded),
        )
    if seen.drift:
        engine.exporter.tool_surface_changed(ex.ledger.id, seen.source)
        log.warning(
            "tool_surface_changed",
            run=ex.run,
            ledger=ex.ledger.id,
            source=seen.source,
            upstream=seen.upstream,
            previous=seen.previous,
            value=seen.value,
            added=list(seen.added),
            removed=list(seen.removed),
            changed=list(seen.changed),
            within_ttl=seen.within_ttl,
        )
    names = (
        [redact_text(n, 200) for n in seen.added],
        [redact_text(n, 200) for n in seen.removed],
        [redact_text(n, 200) for n in seen.changed],
    )
    engine.emit(
        ex.ctx,
        AssemblyEvent(
            **record_stamp(ex, engine.clock()),
            component=seen.component,
            source=seen.source,
            upstream=seen.upstream,
            value=seen.value,
            previous=seen.previous,
            tools=seen.tools,
            added=names[0],
            removed=names[1],
            changed=names[2],
            drift=seen.drift,
            salt_id=seen.salt_id,
            downgraded=[redact_text(n, 200) for n in seen.downgraded],
            clients=seen.clients,
            within_ttl=seen.within_ttl or None,
        ),
    )


def credential(engine: Pipeline, ex: Exchange, source: str) -> None:
    record(engine, ex, engine.drift.credential(ex.run, source, _upstream(ex), ex.req.headers))


def llm_request(engine: Pipeline, ex: Exchange, model: str | None, body: Any) -> None:
    """The model id, the tools and the scope clause of one LLM request."""
    upstream = _upstream(ex)
    if model:
        record(
            engine,
            ex,
            engine.drift.observe(ex.run, "model", "llm", upstream, redact_text(model, 200)),
        )
    api = dialect(ex.state.api) if isinstance(body, dict) else None
    if api is not None and api.declares_tools(body):  # where the tools are is the dialect's
        surface = llm_tools_surface(api.tools(body, limit=None))
        record(engine, ex, engine.drift.llm_surface(ex.run, upstream, surface))
    clause = ex.ledger.ledger.scope_clause
    if clause is not None:
        value = scope_clause_hash(system_prompt(body), _compiled(clause.marker))
        record(engine, ex, engine.drift.observe(ex.run, "scope_clause", "llm", upstream, value))


@lru_cache(maxsize=64)
def _compiled(marker: str) -> re.Pattern[str]:
    return re.compile(marker)


def tools_listed(
    engine: Pipeline,
    ex: Exchange,
    server: str,
    message: dict[str, Any],
    session: str | None = None,
) -> None:
    surface = mcp_surface(message)
    if surface is not None:
        surface = engine.drift.page(server, surface, has_more(message), session)
    if surface is not None:
        pins = ex.policy.policy.pin_tool_surface
        seen = engine.drift.mcp_surface(
            ex.run, server, surface, pins, session, engine.clock(), list_ttl_ms(message)
        )
        record(engine, ex, seen)


def pin_verdict(
    engine: Pipeline,
    ex: Exchange,
    server: str,
    tool: str,
    verdict: Verdict,
    session: str | None = None,
) -> Verdict:
    """The verdict for a call to `tool` on `server` under the policy's pins:
    outside the pinned surface, enforce blocks it and shadow records what it
    would have done; a call the policy already blocks stays blocked."""
    policy = ex.policy.policy
    if not policy.pin_tool_surface or verdict.decision == "block":
        return verdict
    why = engine.drift.unpinned(server, tool, policy.pin_tool_surface, session)
    if why is None:
        return verdict
    if policy.mode != "enforce":
        return Verdict("shadow", reason=why)
    return Verdict(
        "block",
        403,
        {
            "error": "offscope_tool_not_pinned",
            "message": "offscope refused this call: the tool is not in the MCP server's pinned "
            "tool surface (a tool that appeared or changed after the pin).",
            "reason": why,
            "tool": tool,
        },
        reason=why,
    )
