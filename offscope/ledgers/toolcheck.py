"""Which MCP tool arguments look like targets that no extract rule reads.

A ledger tags a call by what its extract rules read. A tool whose input schema
has a path- or id-like argument that no rule for the tool reads can act on
targets the ledger never sees: `move_file(source, destination)` under a ledger
that reads only `{args.path}`. Under an enforce policy such a call, when no
rule finds any target in it, is `unknown` and refused (the policy's
`unknown_target`); `offscope validate --tools` finds the gap before a run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from offscope.errors import InputError
from offscope.ledgers.globs import compile_glob
from offscope.ledgers.model import ExtractRule, Ledger

# Argument names that usually name what a call touches.
TARGET_NAMES = frozenset(
    {
        "path",
        "paths",
        "file",
        "files",
        "filename",
        "filepath",
        "source",
        "destination",
        "dest",
        "repo",
        "repository",
        "repo_path",
        "directory",
        "dir",
        "root",
        "cwd",
        "url",
        "uri",
        "host",
        "id",
        "ids",
    }
)
_SUFFIXES = "id|ids|path|paths|file|files|dir|url|uri"
# snake_case `customer_id`, or camelCase `repoPath` (not `valid`: no word boundary).
_TARGET_SUFFIX = re.compile(rf"(?i:_(?:{_SUFFIXES}))$|[a-z0-9](?:{_SUFFIXES.title()})$", re.ASCII)
_ARG_REF = re.compile(r"\{(?:args|body)\.([^{}]+)\}")


@dataclass(frozen=True, slots=True)
class UnreadField:
    tool: str
    field: str  # dotted, as a template would read it ({args.FIELD})


def target_like(name: str) -> bool:
    """`source`, `paths`, `customer_id`, `repoPath`: an argument that names a target."""
    lower = name.lower()
    return lower in TARGET_NAMES or bool(_TARGET_SUFFIX.search(name.replace("-", "_")))


def schema_fields(schema: Any, prefix: str = "") -> Iterator[str]:
    """Dotted names of an input schema's properties, nested objects included
    (an array's elements are read with the array: `{args.paths}`)."""
    if not isinstance(schema, dict):
        return
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return
    for name, sub in properties.items():
        dotted = f"{prefix}{name}"
        yield dotted
        if isinstance(sub, dict) and sub.get("type") == "object":
            yield from schema_fields(sub, dotted + ".")


def _applies_to(rule: ExtractRule, tool: str) -> bool:
    """Whether the rule can fire on a call of this MCP tool (its host, path and
    argument conditions depend on where and how it is called: assumed met)."""
    m = rule.match
    if m.source not in (None, "mcp"):
        return False
    if m.tool is None:
        return True
    globs = [m.tool] if isinstance(m.tool, str) else m.tool
    return any(compile_glob(g, None).match(tool) for g in globs)


def fields_read(ledger: Ledger, tool: str) -> set[str]:
    """The argument fields the extract rules for this tool read in their templates."""
    read: set[str] = set()
    for rule in ledger.extract:
        if not _applies_to(rule, tool):
            continue
        for texts in rule.targets.values():
            for text in [texts] if isinstance(texts, str) else texts:
                read.update(_ARG_REF.findall(text))
    return read


def declared_targetless(ledger: Ledger, tool: str) -> bool:
    """A rule naming the tool says it names no target (`targets: {}`)."""
    return any(
        rule.match.tool is not None and not rule.targets and _applies_to(rule, tool)
        for rule in ledger.extract
    )


def unread_fields(ledger: Ledger, tools: list[dict[str, Any]]) -> list[UnreadField]:
    """Target-like arguments of the offered tools that no extract rule reads."""
    out = []
    for tool in tools:
        name = tool.get("name")
        if not isinstance(name, str) or declared_targetless(ledger, name):
            continue
        read = fields_read(ledger, name)
        for dotted in schema_fields(tool.get("inputSchema")):
            covered = dotted in read or any(dotted.startswith(r + ".") for r in read)
            if target_like(dotted.rsplit(".", 1)[-1]) and not covered:
                out.append(UnreadField(name, dotted))
    return out


def read_tools(path: str | Path) -> list[dict[str, Any]]:
    """The tools of a recorded `tools/list` answer: a JSON file holding the
    result (`{"tools": [...]}`), the JSON-RPC response around it, or a JSON
    lines transcript of a session (every tools/list result in it)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeError) as exc:
        raise InputError(f"cannot read tools: {exc}", path=str(path)) from None
    try:
        documents = [json.loads(text)]
    except ValueError:
        documents = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                documents.append(json.loads(line))
            except ValueError:
                raise InputError(
                    "not JSON, nor JSON lines",
                    path=str(path),
                    line=number,
                    hint="give the result of a tools/list request, e.g. saved from the "
                    "MCP Inspector (`--cli --method tools/list`)",
                ) from None
    tools = [t for doc in documents for t in _tools_in(doc)]
    if not tools:
        raise InputError(
            "no tools/list result in it",
            path=str(path),
            hint='expected {"tools": [{"name": ..., "inputSchema": ...}]} or a JSON-RPC '
            "response holding one",
        )
    return tools


def _tools_in(doc: Any) -> list[dict[str, Any]]:
    if isinstance(doc, list):
        if all(isinstance(t, dict) and "name" in t for t in doc):
            return doc
        return [t for item in doc for t in _tools_in(item)]
    if not isinstance(doc, dict):
        return []
    if isinstance(doc.get("result"), dict):
        doc = doc["result"]
    tools = doc.get("tools")
    return [t for t in tools if isinstance(t, dict)] if isinstance(tools, list) else []
