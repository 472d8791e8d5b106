"""The `offscope` command line.

Each module in this package is one subcommand (or a small group of them) and
exposes `register(subparsers)`, which adds its parser and sets
`func=<callable(args) -> int>`. Modules are discovered, so adding a command is
adding a file. Exit codes: 0 ok, 1 finding (gate failed, regression), 2 usage
or input error (with file and line).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from rich.console import Console
from rich.markup import escape

from offscope import __version__
from offscope.errors import InputError

_EPILOG = """\
Start here:
  offscope demo                      run the 12-cell scope grid on the bundled cases
  offscope proxy --ledger L.yaml     put the enforcement proxy in front of an agent
  offscope report TRACE.jsonl        metrics from a trace (eval or production)
  offscope validate FILE...          check ledgers, policies and cases

Exit codes: 0 ok, 1 finding (gate failed, regression), 2 usage or input error.
"""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; given `command`, only the module of that name is read
    when it registers the command (importing every command module costs ~0.2 s of
    CPU, paid by every `offscope` process: a sidecar's start, each CI step)."""
    parser = argparse.ArgumentParser(
        prog="offscope",
        description="Runtime scope enforcement for LLM agents, with a built-in eval mode.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"offscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
    guess = command.replace("-", "_") if command else None
    for name in [guess] if guess in names else names:
        module = importlib.import_module(f"{__name__}.{name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    if guess in names and command not in sub.choices:  # a module of another command's name
        return build_parser()
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv[0] if argv and not argv[0].startswith("-") else None)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except InputError as exc:
        Console(stderr=True, highlight=False, soft_wrap=True).print(
            f"[bold red]offscope: error:[/] {escape(str(exc))}"
        )
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `offscope ... | head`: the reader left; that is not an error of ours.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def entry() -> None:  # pragma: no cover - console script shim
    sys.exit(main())
