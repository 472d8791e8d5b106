"""What the commands' parsers share: how a command is added, and the options that
several commands take with the same meaning.

Kept in one place so that a shared option reads (and `--help` prints) the same in
every command that takes it, and a new command is added the way the others are.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

C = TypeVar("C", bound="DataclassInstance")


def add_command(
    subparsers: argparse._SubParsersAction,
    name: str,
    *,
    help: str,
    description: str,
    epilog: str | None = None,
    parents: Sequence[argparse.ArgumentParser] = (),
) -> argparse.ArgumentParser:
    """Add the command `name`. Its description and epilog are printed as written (line
    breaks kept): the epilogs hold examples and tables that argparse would re-wrap."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name,
        help=help,
        description=description,
        epilog=epilog,
        parents=list(parents),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser


def config_from_args(cls: type[C], args: argparse.Namespace, **given: Any) -> C:
    """The dataclass `cls` with every field that has an option of the same name read from
    `args`, and `given` for the fields an option does not hold as is (parsed, renamed or
    derived). A config that mirrors its command's options then lists only what differs."""
    names = {f.name for f in dataclasses.fields(cls)} & vars(args).keys()
    return cls(**{name: getattr(args, name) for name in names - given.keys()}, **given)


def add_output_option(parser: argparse.ArgumentParser, flag: str, help: str) -> None:
    """An option that prints its output when given alone and writes it to FILE when given
    one (`--json` prints, `--json out.json` writes); "-" stands for stdout. The comparison
    commands offer their JSON and Markdown reports this way."""
    parser.add_argument(flag, nargs="?", const="-", default=None, metavar="FILE", help=help)


def add_rules_option(parser: argparse.ArgumentParser) -> None:
    """`--rules`: the behavioural rule set the prompt-scoring commands score with."""
    parser.add_argument(
        "--rules",
        default="offscope",
        metavar="NAME|PATH",
        help="rule set: offscope (default), agent-evals, or a YAML file",
    )


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """`--model-url`, `--model`, `--api-key-env`: the real model the commands that run an
    agent or ask a model (grid, probe) use instead of the simulated one."""
    for flag, metavar, text in (
        (
            "--model-url",
            "URL",
            "OpenAI-compatible base URL, e.g. https://api.openai.com/v1 (default: simulated model)",
        ),
        ("--model", "NAME", "model name at --model-url"),
        ("--api-key-env", "VAR", "environment variable holding the API key"),
    ):
        parser.add_argument(flag, default=None, metavar=metavar, help=text)
