"""Load YAML into pydantic models with errors that name the file and line.

Every offscope file format (ledger, policy, case, rule set) goes through
`load_model`, so they all report bad input the same way: `file:line: what is
wrong (what to fix)`, exit code 2, never a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from offscope.errors import InputError

M = TypeVar("M", bound=BaseModel)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (YAML silently keeps the last)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False):
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise InputError(
                f"duplicate key {key!r} (first defined on line {seen[key]})",
                line=key_node.start_mark.line + 1,
                hint="each key may appear once in a mapping",
            )
        seen[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _line_of(node: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """Follow a pydantic error location through the YAML node tree to a line."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if key_node.value == part:
                    # An unknown key is best reported on the key itself.
                    line = key_node.start_mark.line + 1
                    node = value_node
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                return line
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def _explain(err: dict[str, Any]) -> str:
    loc = ".".join(str(p) for p in err["loc"] if not isinstance(p, str) or not p.startswith("function-"))
    kind = err["type"]
    msg = err["msg"]
    if kind == "extra_forbidden":
        return f"unknown key {loc!r} (check the spelling; `offscope schema` lists the keys)"
    if kind == "missing":
        return f"missing required key {loc!r}"
    prefix = f"{loc}: " if loc else ""
    value = err.get("input")
    if kind.endswith("_type") and value is not None and not isinstance(value, dict | list):
        return f"{prefix}{msg}, got {value!r}"
    return f"{prefix}{msg}"


def parse_yaml(text: str, path: str) -> tuple[Any, yaml.Node | None]:
    """Parse YAML text, returning (data, root node). Raises InputError on syntax errors."""
    try:
        node = yaml.compose(text, Loader=_StrictLoader)
        data = yaml.load(text, Loader=_StrictLoader)
    except InputError as exc:
        exc.path = path
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise InputError(
            f"invalid YAML: {exc.problem or exc}",
            path=path,
            line=mark.line + 1 if mark else None,
        ) from None
    except yaml.YAMLError as exc:
        raise InputError(f"invalid YAML: {exc}", path=path) from None
    return data, node


def validate(model: type[M], data: Any, node: yaml.Node | None, path: str) -> M:
    """Validate parsed data against a model; the first error becomes an InputError."""
    try:
        obj = model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise InputError(_explain(first) + more, path=path, line=_line_of(node, tuple(first["loc"]))) from None
    # Models may check what pydantic cannot see field by field (duplicates across
    # a list); they return (location, message) pairs so the line can be found.
    check = getattr(obj, "semantic_problems", None)
    if check is not None:
        problems = check()
        if problems:
            loc, message = problems[0]
            raise InputError(message, path=path, line=_line_of(node, loc))
    return obj


def read_text(path: str | Path) -> str:
    """A user's file as UTF-8 text; a missing or unreadable file is an InputError."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError("file not found", path=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read file: {exc}", path=str(path)) from None


def load_model(model: type[M], path: str | Path, text: str | None = None) -> M:
    """Read `path` (or the given text) as YAML and validate it as `model`."""
    path = str(path)
    if text is None:
        text = read_text(path)
    data, node = parse_yaml(text, path)
    if data is None:
        raise InputError("file is empty", path=path)
    return validate(model, data, node, path)
