"""The libyaml-backed strict loader reads every file as the pure-Python one does:
the same data, and the same refusals on the same lines (it only parses faster)."""

from __future__ import annotations

import pytest

from offscope import yamlio
from offscope.errors import InputError

LOADERS: list[type] = [yamlio._PythonStrictLoader, yamlio._StrictLoader]

CASES = {
    "ledger": "schema: offscope.ledger/1\nid: a\ntargets:\n  hosts: [x.test, 'y.test']\n",
    "anchors": "base: &b {k: 1}\nother: *b\nlist: [*b, *b]\n",
    "scalars": "a: 1\nb: 1.5\nc: true\nd: null\ne: 2026-12-04\nf: '007'\ng: |\n  two\n  lines\n",
    "duplicate key": "a: 1\nb:\n  c: 2\n  c: 3\n",
    "too deep": "a:\n" + "".join("  " * i + "- \n" for i in range(1, 120)) + "  " * 120 + "x\n",
    "deep flow bomb": "[" * 100_000 + "]" * 100_000,
    "alias bomb": "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    + "".join(
        f"{c}: &{c} [" + ", ".join([f"*{p}"] * 10) + "]\n"
        for p, c in zip("abcdef", "bcdefg", strict=True)
    )
    + "h: [*g, *g, *g, *g, *g, *g, *g, *g, *g, *g]\n",
    "control character": "a: 1\nb: \x01\n",
    "unclosed flow": "a: 1\nb: [1,\n",
    "bad indent": "a:\n  b: 1\n c: 2\n",
}


def _read(loader: type, text: str, monkeypatch: pytest.MonkeyPatch) -> tuple[str, object]:
    monkeypatch.setattr(yamlio, "_StrictLoader", loader)
    try:
        data, _ = yamlio.parse_yaml(text, "f.yaml")
    except InputError as exc:
        return "refused", (exc.line, exc.message.split(":")[0])
    return "read", data


def test_libyaml_is_the_loader_in_use() -> None:
    assert yamlio._StrictLoader.__name__ == "_LibyamlStrictLoader"


@pytest.mark.parametrize("name", sorted(CASES))
def test_both_loaders_agree(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    python, libyaml = (_read(loader, CASES[name], monkeypatch) for loader in LOADERS)
    assert python == libyaml
    if name in ("ledger", "anchors", "scalars"):
        assert python[0] == "read"
    else:
        assert python[0] == "refused", python
