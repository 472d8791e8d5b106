"""What `offscope gate` and `offscope shadow-compare` print alike: the table of
the four changes (what moved between two configuration blocks), in markdown and
on the terminal, and the escaping of a markdown table cell. A rate, an interval
or a percentage has its one formatter in `offscope.trace.rates`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from offscope.rollout.gate.changes import Change

if TYPE_CHECKING:
    from rich.console import JustifyMethod
    from rich.table import Table


def md_cell(text: str) -> str:
    """Text for a markdown table cell: a pipe escaped, a newline a space."""
    return text.replace("|", "\\|").replace("\n", " ")


def changes_markdown(
    changes: Iterable[Change], moved: str, detail: Callable[[str], str] = md_cell
) -> list[str]:
    """The changes as the lines of a markdown table: `moved` heads the column that
    says whether each moved (a moved one in bold), `detail` fits its detail to a cell."""
    return [
        f"| change | {moved} | detail |",
        "|---|---|---|",
        *(
            f"| {c.name} | {'**yes**' if c.moved else c.shown} | {detail(c.detail)} |"
            for c in changes
        ),
    ]


def changes_table(
    changes: Iterable[Change],
    title: str,
    moved: str,
    detail: Callable[[str], str] = str,
    title_justify: JustifyMethod = "center",
) -> Table:
    """The changes as a terminal table, the columns named as in `changes_markdown`."""
    from rich.table import Table

    table = Table(title=title, title_justify=title_justify)
    for col in ("change", moved, "detail"):
        table.add_column(col)
    for c in changes:
        table.add_row(c.name, c.shown, detail(c.detail))
    return table
