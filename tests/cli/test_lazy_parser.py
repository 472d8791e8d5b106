"""`offscope COMMAND` reads only COMMAND's module when it can: the parser it builds
must be the one the whole command line has for COMMAND, help and errors alike."""

from __future__ import annotations

import argparse

import pytest

from offscope.cli import build_parser

FULL = build_parser()
COMMANDS = sorted(
    next(a for a in FULL._actions if isinstance(a, argparse._SubParsersAction)).choices
)


def test_every_module_is_found() -> None:
    assert {"grid", "proxy", "report", "mde", "power", "shadow-compare"} <= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_the_parser_for_one_command_is_the_full_ones(command: str, capsys) -> None:
    def help_of(parser: argparse.ArgumentParser) -> str:
        with pytest.raises(SystemExit):
            parser.parse_args([command, "--help"])
        return capsys.readouterr().out

    def error_of(parser: argparse.ArgumentParser) -> str:
        with pytest.raises(SystemExit):
            parser.parse_args([command, "--no-such-option"])
        return capsys.readouterr().err

    lazy = build_parser(command)
    assert help_of(lazy) == help_of(FULL)
    assert error_of(lazy) == error_of(FULL)


def test_an_unknown_command_gets_the_full_list() -> None:
    parser = build_parser("nope")
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert sorted(sub.choices) == COMMANDS
