"""Every name a bench imports from the package exists.

The benches are run by hand, not by the suite, and several import inside a function
(after their own argument parsing), so a module moved in the package broke
bench/proxy_overhead.py without any test noticing. This reads each bench's imports of
`offscope` as written (at any indentation) and resolves them."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("offscope"):
            out.append((node.module or "", [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name.startswith("offscope")]
    return out


@pytest.mark.parametrize("bench", sorted(BENCH.glob("*.py")), ids=lambda p: p.name)
def test_every_package_import_of_a_bench_resolves(bench: Path) -> None:
    for module, names in _imports(bench):
        imported = importlib.import_module(module)
        for name in names:
            if not hasattr(imported, name):  # a submodule imported by name
                importlib.import_module(f"{module}.{name}")
