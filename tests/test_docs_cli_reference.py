"""docs/cli.md is every command's --help as the parser prints it, and every option
a command takes is on that page: the reference cannot drift from the code."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from offscope.cli import build_parser
from offscope.cli._reference import render

PAGE = Path(__file__).resolve().parent.parent / "docs" / "cli.md"


def test_the_reference_page_is_what_the_parser_prints() -> None:
    assert PAGE.read_text(encoding="utf-8") == render(), (
        "docs/cli.md is out of date: python -m offscope.cli._reference > docs/cli.md"
    )


def test_every_option_of_every_command_is_in_its_section() -> None:
    sections = dict(
        re.findall(r"^## (offscope [a-z -]+)\n(.*?)(?=^## |\Z)", PAGE.read_text(), re.M | re.S)
    )
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for name, command in sub.choices.items():
        text = "".join(
            v
            for k, v in sections.items()
            if k == f"offscope {name}" or k.startswith(f"offscope {name} ")
        )
        for action in command._actions:
            for flag in action.option_strings:
                if flag.startswith("--") and flag not in text:
                    missing.append(f"offscope {name} {flag}")
    assert not missing, missing
