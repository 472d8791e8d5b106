"""Narrow what the agent is offered (policy `filter_tools`).

Two places offer tools to an agent: an MCP server's `tools/list` result, and
the `tools` array an agent's harness sends with each LLM request. A tool whose
every call would be out of scope by the ledger's rules
(`CompiledLedger.never_in_scope`) is removed from both, so the model never
sees it; what was removed is recorded in the trace (`tools_filtered`).

Kept apart from the exchange handlers on purpose: the tool-surface hashing
(drift) reads the same responses and requests, before this filter runs.
"""

from __future__ import annotations

from typing import Any

from offscope.ledgers.matcher import CallInput, CompiledLedger
from offscope.proxy.extract.llm.base import Dialect

MAX_TOOLS = 4096  # a list longer than this is filtered up to here and the rest kept as sent


def _name(tool: Any) -> str | None:
    """A tool declaration's name: MCP, Anthropic and Responses put it on the
    tool, Chat Completions on its `function`, Bedrock Converse on its `toolSpec`."""
    if not isinstance(tool, dict):
        return None
    inner = tool.get("function") or tool.get("toolSpec")
    name = inner.get("name") if isinstance(inner, dict) else tool.get("name")
    return name if isinstance(name, str) else None


def _why(
    ledger: CompiledLedger, name: str, source: str, host: str | None, path: str | None
) -> str | None:
    return ledger.never_in_scope(CallInput(source=source, tool=name, host=host, path=path))  # type: ignore[arg-type]


def filter_tools_result(
    message: Any, ledger: CompiledLedger, host: str | None, path: str | None
) -> list[tuple[str, str]]:
    """Remove the never-in-scope tools from one MCP `tools/list` response
    message (in place). Returns (name, reason) of each removed tool."""
    result = message.get("result") if isinstance(message, dict) else None
    if not isinstance(result, dict) or not isinstance(result.get("tools"), list):
        return []
    kept: list[Any] = []
    removed: list[tuple[str, str]] = []
    for i, tool in enumerate(result["tools"]):
        name = _name(tool)
        why = _why(ledger, name, "mcp", host, path) if name is not None and i < MAX_TOOLS else None
        if name is None or why is None:
            kept.append(tool)
        else:
            removed.append((name, why))
    if removed:
        result["tools"] = kept
    return removed


def filter_request_tools(
    body: Any, ledger: CompiledLedger, api: Dialect | None = None
) -> tuple[list[tuple[str, str]], int]:
    """Remove the never-in-scope tools from an LLM request body (in place), from
    the list its dialect keeps them in (`Dialect.tool_array`; without a dialect,
    the top-level `tools` array): OpenAI Chat Completions, the Responses API,
    Anthropic Messages, Gemini's `tools[].functionDeclarations`, Bedrock's
    `toolConfig.tools`. A `tool_choice` naming a removed tool is dropped (the API
    would reject it), and so is an emptied list (`Dialect.drop_tools`).
    Returns (name, reason) of each removed tool, and how many were offered."""
    api = api or Dialect()
    tools = api.tool_array(body) if isinstance(body, dict) else None
    if tools is None:
        return [], 0
    removed: list[tuple[str, str]] = []
    offered = 0
    kept: list[Any] = []
    for tool in tools:
        decls_key = _declarations_key(tool)
        if decls_key is not None:  # Gemini: one tool object holds many declarations
            decls = tool[decls_key]
            offered += len(decls)
            left = [d for d in decls if not _drop(d, ledger, removed)]
            if left or len(tool) > 1:
                kept.append({**tool, decls_key: left} if len(left) != len(decls) else tool)
            continue
        if _name(tool) is not None:
            offered += 1
        if not _drop(tool, ledger, removed):
            kept.append(tool)  # built-in tools (web search, ...) have no name and are kept
    if not removed:
        return [], offered
    gone = {name for name, _ in removed}
    if kept:
        tools[:] = kept  # in place: wherever the dialect keeps them
    else:
        api.drop_tools(body)
    choice = body.get("tool_choice")
    if (isinstance(choice, dict) and _name(choice) in gone) or (not kept and choice is not None):
        body.pop("tool_choice", None)
    _gemini_allowed(body, gone)
    api.forget_tools(body, gone)
    return removed, offered


def _declarations_key(tool: Any) -> str | None:
    if not isinstance(tool, dict):
        return None
    for key in ("functionDeclarations", "function_declarations"):
        if isinstance(tool.get(key), list):
            return key
    return None


def _drop(tool: Any, ledger: CompiledLedger, removed: list[tuple[str, str]]) -> bool:
    name = _name(tool)
    if name is None or len(removed) >= MAX_TOOLS:
        return False
    why = _why(ledger, name, "llm", None, None)
    if why is not None:
        removed.append((name, why))
    return why is not None


def _gemini_allowed(body: dict[str, Any], gone: set[str]) -> None:
    """Gemini's `toolConfig.functionCallingConfig.allowedFunctionNames` may
    name only declared functions."""
    config = body.get("toolConfig") or body.get("tool_config")
    calling = (
        config.get("functionCallingConfig") or config.get("function_calling_config")
        if isinstance(config, dict)
        else None
    )
    if not isinstance(calling, dict):
        return
    for key in ("allowedFunctionNames", "allowed_function_names"):
        names = calling.get(key)
        if isinstance(names, list):
            calling[key] = [n for n in names if n not in gone]
