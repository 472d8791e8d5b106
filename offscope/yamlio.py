"""Load YAML into pydantic models with errors that name the file and line.

Every offscope file format (ledger, policy, case, rule set) goes through
`load_model`, so they all report bad input the same way: `file:line: what is
wrong (what to fix)`, exit code 2, never a traceback.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Hashable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from offscope.errors import InputError

M = TypeVar("M", bound=BaseModel)


# Deeper than this is not a configuration file; PyYAML's composer recurses per
# level, so a 10,000-deep `[[[...` would otherwise end in a RecursionError.
MAX_DEPTH = 100
# Aliases can make a small file expand to billions of values ("billion laughs");
# a 100,000-target ledger is about 100,000 values.
MAX_EXPANDED_NODES = 5_000_000


class InputErrors(InputError):
    """Every problem found in a file (or in several): `str()` lists one per line,
    each with its file and line. The attributes of the first describe the whole."""

    def __init__(self, errors: list[InputError]) -> None:
        first = errors[0]
        super().__init__(first.message, path=first.path, line=first.line, hint=first.hint)
        self.errors = errors

    def __str__(self) -> str:
        return "\n".join(InputError.__str__(e) for e in self.errors)


try:  # libyaml's event parser, when PyYAML was built with it: ~5x faster on a big file
    from yaml._yaml import CParser as _LibyamlParser
except ImportError:  # pragma: no cover - a PyYAML without libyaml
    _LibyamlParser = None  # type: ignore[misc,assignment]

_Composer = yaml.composer.Composer


class _StrictComposer(_Composer):
    """PyYAML's composer, refusing nesting deeper than MAX_DEPTH (before it recurses)
    and noting whether the document has aliases (`_check_expansion` then runs)."""

    _depth = 0
    saw_alias = False

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):  # type: ignore[attr-defined]
            self.saw_alias = True
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[attr-defined]
                raise InputError(
                    f"nesting deeper than {MAX_DEPTH} levels",
                    line=mark.line + 1,
                    hint="flatten the structure; no offscope file nests this deep",
                )
            return _Composer.compose_node(self, parent, index)
        finally:
            self._depth -= 1


def _construct_mapping(loader: Any, node: yaml.MappingNode, deep: bool = False):
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if not isinstance(key, Hashable):
            continue  # construct_mapping reports it, with its line
        if key in seen:
            raise InputError(
                f"duplicate key {key!r} (first defined on line {seen[key]})",
                line=key_node.start_mark.line + 1,
                hint="each key may appear once in a mapping",
            )
        seen[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep=deep)


class _StrictConstructor(yaml.constructor.SafeConstructor):
    """SafeConstructor that refuses duplicate mapping keys (YAML silently keeps the last)."""


_StrictConstructor.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping
)


class _PythonStrictLoader(
    yaml.reader.Reader,
    yaml.scanner.Scanner,
    yaml.parser.Parser,
    _StrictComposer,
    _StrictConstructor,
    yaml.resolver.Resolver,
):
    """The strict loader on PyYAML's pure-Python reader, scanner and parser."""

    def __init__(self, stream: str) -> None:
        yaml.reader.Reader.__init__(self, stream)  # checks for forbidden characters
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        _StrictComposer.__init__(self)
        _StrictConstructor.__init__(self)
        yaml.resolver.Resolver.__init__(self)


_StrictLoader: type[Any] = _PythonStrictLoader
if _LibyamlParser is not None:

    class _LibyamlStrictLoader(
        _LibyamlParser, _StrictComposer, _StrictConstructor, yaml.resolver.Resolver
    ):
        """The strict loader on libyaml's events. The composer stays the Python one
        above: libyaml's own recurses in C and crashes the process on a
        100,000-deep `[[[...`, before any check could refuse it."""

        def __init__(self, stream: str) -> None:
            _LibyamlParser.__init__(self, stream)
            _StrictComposer.__init__(self)
            _StrictConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)

        # CParser has composing methods of its own; the Python composer's must win.
        get_single_node = _StrictComposer.get_single_node
        compose_document = _StrictComposer.compose_document
        compose_node = _StrictComposer.compose_node
        check_node = _StrictComposer.check_node
        get_node = _StrictComposer.get_node

    _StrictLoader = _LibyamlStrictLoader


def dump_yaml(data: Any) -> str:
    """`data` as block YAML, keys in their order: what `yaml.safe_dump` writes, on
    libyaml's emitter when there is one (a 300-grant overlay: 60 ms -> 15 ms)."""
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(data, Dumper=dumper, sort_keys=False)


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


def _explain(err: ErrorDetails, model: type[BaseModel] | None = None) -> str:
    loc = ".".join(
        str(p) for p in err["loc"] if not isinstance(p, str) or not p.startswith("function-")
    )
    kind = err["type"]
    msg = err["msg"]
    value = err.get("input")
    if kind == "extra_forbidden":
        key = str(err["loc"][-1])
        keys = _keys_at(model, tuple(err["loc"][:-1])) if model else []
        return f"unknown key {loc!r}{_did_you_mean(key, keys)}" + (
            f" (keys here: {', '.join(keys)})"
            if keys
            else " (check the spelling; `offscope schema` lists the keys)"
        )
    if kind == "missing":
        return f"missing required key {loc!r}"
    prefix = f"{loc}: " if loc else ""
    if kind in ("literal_error", "enum"):
        allowed = re.findall(r"'((?:[^'\\]|\\.)*)'", str(err.get("ctx", {}).get("expected", "")))
        return (
            f"{prefix}{value!r} is not one of {', '.join(allowed)}"
            f"{_did_you_mean(str(value), allowed)}"
        )
    if kind == "value_error":  # our validators' messages stand alone
        msg = msg.removeprefix("Value error, ")
    if kind.endswith("_type") and value is not None and not isinstance(value, dict | list):
        return f"{prefix}{msg}, got {value!r}"
    return f"{prefix}{msg}"


def _did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _keys_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys a mapping at `loc` may have, by walking the model's field types
    (list indexes and dict keys pass through; unions offer the first model)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        here = _model_of(current)
        fields = here.model_fields if here is not None else {}
        field = fields.get(str(part)) or next((f for f in fields.values() if f.alias == part), None)
        if field is None:
            continue  # a dict key or a union's tag: the type stays the same
        current = field.annotation
    found = _model_of(current)
    if found is None:
        return []
    return sorted(f.alias or name for name, f in found.model_fields.items())


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside `X`, `X | None`, `list[X]`, `dict[str, X]`, `Annotated[X, ...]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin is None and not isinstance(annotation, types.UnionType):
        return None
    args = typing.get_args(annotation)
    if origin is dict:
        args = args[1:]
    for arg in args:
        if (found := _model_of(arg)) is not None:
            return found
    return None


def _check_expansion(root: yaml.Node) -> None:
    """Refuse alias graphs that expand past MAX_EXPANDED_NODES or refer to themselves."""
    sizes: dict[int, int] = {}

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            if sizes[key] < 0:
                raise InputError(
                    "an alias refers to the node that contains it",
                    line=node.start_mark.line + 1,
                    hint="remove the recursive alias",
                )
            return sizes[key]
        sizes[key] = -1
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        if total > MAX_EXPANDED_NODES:
            raise InputError(
                f"aliases expand to more than {MAX_EXPANDED_NODES:,} values",
                line=node.start_mark.line + 1,
                hint="write the values out, or use fewer aliases",
            )
        sizes[key] = total
        return total

    size(root)


def parse_yaml(text: str, path: str) -> tuple[Any, yaml.Node | None]:
    """Parse YAML text, returning (data, root node). Raises InputError on syntax errors."""
    loader: Any = None
    try:
        loader = _StrictLoader(text)
        node = loader.get_single_node()
        if node is not None and loader.saw_alias:
            _check_expansion(node)
        data = loader.construct_document(node) if node is not None else None
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
    except yaml.reader.ReaderError as exc:  # a control character the YAML spec forbids
        line = text.count("\n", 0, exc.position) + 1
        raise InputError(
            f"invalid YAML: character U+{exc.character:04X} is not allowed",
            path=path,
            line=line,
            hint='remove it or quote it as an escape, e.g. "\\x00"',
        ) from None
    except yaml.YAMLError as exc:
        raise InputError(f"invalid YAML: {exc}", path=path) from None
    except RecursionError:
        raise InputError("structure too deeply nested", path=path, hint="flatten it") from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, node


def problems(
    model: type[M], data: Any, node: yaml.Node | None, path: str
) -> tuple[M | None, list[InputError]]:
    """Validate parsed data against a model: (the object or None, every problem found)."""
    try:
        obj = model.model_validate(data)
    except ValidationError as exc:
        return None, [
            InputError(_explain(err, model), path=path, line=_line_of(node, tuple(err["loc"])))
            for err in exc.errors(include_url=False)
        ]
    except RecursionError:
        return None, [InputError("structure too deeply nested", path=path, hint="flatten it")]
    # Models may check what pydantic cannot see field by field (duplicates across
    # a list); they return (location, message) pairs so the line can be found.
    check = getattr(obj, "semantic_problems", None)
    found = [
        InputError(message, path=path, line=_line_of(node, loc))
        for loc, message in (check() if check else [])
    ]
    return obj, found


def validate(model: type[M], data: Any, node: yaml.Node | None, path: str) -> M:
    """Validate parsed data against a model; every problem goes into one InputErrors."""
    obj, found = problems(model, data, node, path)
    if found:
        raise InputErrors(found) if len(found) > 1 else found[0]
    assert obj is not None
    return obj


def read_text(path: str | Path) -> str:
    """A user's file as UTF-8 text; a missing, unreadable or non-UTF-8 file is an InputError."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise InputError("file not found", path=str(path)) from None
    except OSError as exc:
        raise InputError(f"cannot read file: {exc.strerror or exc}", path=str(path)) from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise InputError(
            f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at column {column} cannot be decoded",
            path=str(path),
            line=line,
            hint="save the file as UTF-8",
        ) from None


def load_model(model: type[M], path: str | Path, text: str | None = None) -> M:
    """Read `path` (or the given text) as YAML and validate it as `model`."""
    path = str(path)
    if text is None:
        text = read_text(path)
    data, node = parse_yaml(text, path)
    if data is None:
        raise InputError("file is empty", path=path)
    return validate(model, data, node, path)
