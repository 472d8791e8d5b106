"""The package's layers only point down.

Each module may import its own package and the layers below it, never a layer
above nor a peer on its level (the bottom utilities excepted). The order, bottom first:

    utilities (errors, yamlio, logs, vocab, friction, jsonl, heap, the package root) <- ledgers <- policies
    <- trace <- behavior <- proxy <- evalmode <- rollout, probes <- cli

Every import counts, including those inside functions and `TYPE_CHECKING` blocks:
a lazy import still ties the lower layer to the upper one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import offscope

PACKAGE = Path(offscope.__file__).resolve().parent

# Top-level modules or packages of offscope, one level per entry, bottom first.
LAYERS: list[set[str]] = [
    {"", "errors", "yamlio", "logs", "vocab", "friction", "jsonl", "heap"},
    {"ledgers"},
    {"policies"},
    {"trace"},
    {"state"},  # stores that outlive a process: below the proxy that uses them
    {"behavior"},
    {"proxy"},
    {"evalmode"},
    {"rollout", "probes"},
    {"cli"},
]
LEVEL = {name: i for i, names in enumerate(LAYERS) for name in names}

# Imports that break the order today, each to be deleted here when it goes.
PENDING: set[tuple[str, str]] = set()


def top_of(module: str) -> str:
    """'offscope.proxy.mitm.server' -> 'proxy'; 'offscope' -> ''."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_of(rel: Path) -> str:
    """offscope/proxy/mitm/server.py -> 'proxy'; offscope/errors.py -> 'errors'; offscope/__init__.py -> ''."""
    if len(rel.parts) > 1:
        return rel.parts[0]
    return "" if rel.stem == "__init__" else rel.stem


def imported_modules(path: Path, root: Path = PACKAGE) -> list[tuple[int, str]]:
    """(line, absolute module name) of every offscope import in `path`, in line order."""
    # A relative import starts from the module's package (for __init__.py, the package itself).
    package = ["offscope", *path.relative_to(root).parts[:-1]]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [
                (node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "offscope"
            ]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module == "offscope":  # `from offscope import logs` imports the module offscope.logs
                found += [
                    (node.lineno, f"offscope.{a.name}" if a.name in LEVEL else module)
                    for a in node.names
                ]
            elif module.split(".")[0] == "offscope":
                found.append((node.lineno, module))
    return sorted(found)


def violations(root: Path = PACKAGE) -> list[str]:
    bad: list[str] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        own = layer_of(rel)
        assert own in LEVEL, f"offscope/{rel}: {own!r} has no place in LAYERS; add it there"
        for line, module in imported_modules(path, root):
            target = top_of(module)
            if target == own or (rel.as_posix(), module) in PENDING:
                continue
            assert target in LEVEL, (
                f"offscope/{rel}:{line}: {module} is in no layer; add it to LAYERS"
            )
            if (
                LEVEL[own] == LEVEL[target] == 0
            ):  # the utilities may use each other (yamlio raises errors')
                continue
            if LEVEL[target] >= LEVEL[own]:
                where = "a higher layer" if LEVEL[target] > LEVEL[own] else "a peer layer"
                bad.append(
                    f"offscope/{rel}:{line}: imports {module} ({where}: {target} over {own or 'offscope'})"
                )
    return bad


def test_layers_only_point_down() -> None:
    bad = violations()
    assert not bad, "imports that point up the layers:\n" + "\n".join(bad)


def test_nothing_imports_cli() -> None:
    users = [
        f"offscope/{p.relative_to(PACKAGE)}:{line}: imports {m}"
        for p in sorted(PACKAGE.rglob("*.py"))
        if layer_of(p.relative_to(PACKAGE)) != "cli"
        for line, m in imported_modules(p)
        if top_of(m) == "cli"
    ]
    assert not users, "\n".join(users)


def test_the_check_finds_upward_imports(tmp_path: Path) -> None:
    """Lazy, relative and `from offscope import X` imports are all seen, with file:line."""
    root = tmp_path / "offscope"
    (root / "trace").mkdir(parents=True)
    (root / "rollout").mkdir()
    (root / "trace" / "events.py").write_text(
        "def f():\n    from offscope.proxy import server\n"
        "from ..cli import ca\nfrom offscope import logs\nfrom . import rates\n",
        encoding="utf-8",
    )
    (root / "rollout" / "gate.py").write_text(
        "import offscope.probes.probe\nfrom ..evalmode import grid\n", encoding="utf-8"
    )
    assert imported_modules(root / "trace" / "events.py", root) == [
        (2, "offscope.proxy"),
        (3, "offscope.cli"),
        (4, "offscope.logs"),
        (5, "offscope.trace"),
    ]
    assert violations(root) == [
        "offscope/rollout/gate.py:1: imports offscope.probes.probe (a peer layer: probes over rollout)",
        "offscope/trace/events.py:2: imports offscope.proxy (a higher layer: proxy over trace)",
        "offscope/trace/events.py:3: imports offscope.cli (a higher layer: cli over trace)",
    ]


# The mitmproxy adapter: the one package that may import mitmproxy. The engine and its
# handlers are transport-neutral (`offscope mcp` drives them over stdio, without it).
ADAPTER = "proxy/mitm/"


def mitmproxy_importers(root: Path = PACKAGE) -> list[str]:
    """offscope/... files with any import of mitmproxy (lazy and TYPE_CHECKING included)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            if any(n.split(".")[0] == "mitmproxy" for n in names):
                found.append(path.relative_to(root).as_posix())
                break
    return found


def test_only_the_adapter_imports_mitmproxy() -> None:
    outside = [f for f in mitmproxy_importers() if not f.startswith(ADAPTER)]
    assert not outside, f"mitmproxy imported outside offscope/{ADAPTER}: {outside}"
    assert mitmproxy_importers(), "the check saw no importer at all: is it still looking?"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([root.name, *parts])


def import_cycles(root: Path = PACKAGE) -> list[frozenset[str]]:
    """Sets of modules that import each other, directly or around a loop (Tarjan's
    strongly connected components over every import, TYPE_CHECKING included)."""
    modules = {_module_name(p, root): p for p in root.rglob("*.py")}

    def resolve(name: str) -> str | None:  # `from pkg import submodule` names the package
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {
        name: {r for _, m in imported_modules(path, root) if (r := resolve(m)) and r != name}
        for name, path in modules.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = {stack.pop()}
            while v not in component:
                component.add(stack.pop())
            if len(component) > 1:
                cycles.append(frozenset(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return cycles


def test_no_import_cycles() -> None:
    cycles = [sorted(c) for c in import_cycles()]
    assert not cycles, f"modules that import each other: {cycles}"


def test_the_cycle_check_finds_a_type_checking_cycle(tmp_path: Path) -> None:
    root = tmp_path / "offscope"
    (root / "proxy" / "handlers").mkdir(parents=True)
    (root / "proxy" / "__init__.py").write_text("", encoding="utf-8")
    (root / "proxy" / "engine.py").write_text(
        "from offscope.proxy.handlers.mcp import decide\n", encoding="utf-8"
    )
    (root / "proxy" / "handlers" / "__init__.py").write_text("", encoding="utf-8")
    (root / "proxy" / "handlers" / "mcp.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from offscope.proxy.engine import Engine\n",
        encoding="utf-8",
    )
    assert import_cycles(root) == [
        frozenset({"offscope.proxy.engine", "offscope.proxy.handlers.mcp"})
    ]
    (root / "proxy" / "uses_mitm.py").write_text("import mitmproxy.http\n", encoding="utf-8")
    assert mitmproxy_importers(root) == ["proxy/uses_mitm.py"]
