"""A page that says something is not supported (or not implemented, not available)
must not name a command or an option that exists: such sentences go stale first."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from offscope.cli import build_parser

DOCS = Path(__file__).resolve().parent.parent / "docs"
CLAIM = re.compile(r"not (?:yet )?(?:supported|implemented|available)|unsupported", re.I)


def _existing() -> set[str]:
    names: set[str] = set()

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    names.add(f"{prefix} {name}".strip())
                    walk(child, f"{prefix} {name}")
            names.update(f for f in action.option_strings if f.startswith("--") and f != "--help")

    walk(build_parser(), "offscope")
    return names


def test_no_not_supported_sentence_names_something_that_exists() -> None:
    existing = _existing()
    stale = []
    for page in sorted(DOCS.glob("*.md")):
        if page.name == "cli.md":
            continue
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for sentence in re.split(r"(?<=[.;])\s+", line):
                if not CLAIM.search(sentence):
                    continue
                named = set(
                    re.findall(r"`(offscope [a-z-]+(?: [a-z-]+)?|--[a-z][a-z0-9-]*)`", sentence)
                )
                if found := sorted(n for n in named if n in existing):
                    stale.append(f"docs/{page.name}:{number}: {found}: {sentence.strip()}")
    assert not stale, "\n".join(stale)
