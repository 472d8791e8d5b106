"""docs/cli.md: every command's `--help`, generated from the parser itself.

    python -m offscope.cli._reference > docs/cli.md

A test compares the page with this output, so the reference cannot drift from
the options the commands really take. Machine-specific defaults (the state
directory under the user's home) are written the way the docs spell them.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
from collections.abc import Iterator
from pathlib import Path

from offscope.cli import build_parser

WIDTH = "100"  # argparse wraps help at $COLUMNS: fixed, so the page is the same everywhere

HEADER = """\
# Command-line reference

Every command's `--help`, as the command prints it (generated from the parser:
`python -m offscope.cli._reference > docs/cli.md`; a test keeps this page
equal to it). The topic pages explain when and why to use each option.
"""


def _parsers(
    parser: argparse.ArgumentParser, name: str
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child_name, child in sorted(action.choices.items()):
                yield from _parsers(child, f"{name} {child_name}")


def _portable(text: str) -> str:
    """The user's home and state directory as the docs write them."""
    from offscope.proxy import DEFAULT_CONFDIR, STATE_DIR

    # The CA directory is an older version's ~/.offscope/ca where one exists.
    text = text.replace(str(DEFAULT_CONFDIR), "$XDG_STATE_HOME/offscope/ca")
    text = text.replace(str(STATE_DIR), "$XDG_STATE_HOME/offscope")
    return text.replace(str(Path.home()), "~")


def render() -> str:
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        parts = [HEADER]
        for name, parser in _parsers(build_parser(), "offscope"):
            if name == "offscope":
                continue
            buffer = io.StringIO()
            with contextlib.redirect_stdout(buffer):
                parser.print_help()
            parts.append(f"## {name}\n\n```text\n{_portable(buffer.getvalue()).rstrip()}\n```\n")
        return "\n".join(parts)
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


if __name__ == "__main__":
    print(render(), end="")
