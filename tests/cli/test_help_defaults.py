"""Every option's help says its default: a user reading `--help` never guesses."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from offscope.cli import build_parser

FLAGS = (
    argparse._HelpAction,
    argparse._VersionAction,
    argparse._StoreTrueAction,
    argparse._StoreFalseAction,
    argparse._CountAction,
)


def options(parser: argparse.ArgumentParser, name: str) -> Iterator[tuple[str, argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child_name, child in action.choices.items():
                yield from options(child, f"{name} {child_name}")
        elif action.option_strings and action.help != argparse.SUPPRESS:
            yield name, action


def test_every_option_with_a_default_names_it_in_its_help() -> None:
    missing = [
        f"{name} {action.option_strings[-1]} (default {action.default!r})"
        for name, action in options(build_parser(), "offscope")
        if not isinstance(action, FLAGS)
        # `is`, not `in`: 0 == False, and a default of 0 (--seed) must be shown too
        and not any(action.default is x for x in (None, False, argparse.SUPPRESS))
        and action.default not in ([], "")
        and "default" not in (action.help or "").lower()
    ]
    assert not missing, "options whose --help hides the default:\n" + "\n".join(missing)
