"""Tables that hide nothing: no identifier or header is ever cut.

A table is printed as a table when it fits the terminal (cells and headers wrap
at spaces, a long word folds; never an ellipsis). When even its narrowest form
does not fit, it is printed another way: one block per row on a terminal, and
tab-separated values in a pipe or a file, where a reader is a program or a CI
log that must not see a table hard-wrapped across lines.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table


def emit(
    console: Console,
    title: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    right: Sequence[str] = (),
) -> None:
    """Print `rows` (plain text, no markup) under `headers` without cutting any of it."""
    table = Table(title=escape(title))
    for header in headers:
        table.add_column(
            escape(header), justify="right" if header in right else "left", overflow="fold"
        )
    for row in rows:
        table.add_row(*(escape(cell) for cell in row))
    if _narrowest(headers, rows) <= console.width:
        console.print(table)
    elif console.is_terminal:
        _blocks(console, title, headers, rows)
    else:
        _tsv(console, title, headers, rows)


def _narrowest(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> int:
    """The table's width with every column as narrow as its longest word: narrower
    than that, a word (a run id, a header) would have to be cut."""
    columns = zip(headers, *rows, strict=True) if rows else ([h] for h in headers)
    words = [max((len(w) for cell in col for w in cell.split()), default=1) for col in columns]
    return sum(words) + 3 * len(words) + 1  # "│ " + cell + " " per column, and the last "│"


def _blocks(
    console: Console, title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]
) -> None:
    console.print(f"[bold]{escape(title)}[/]", highlight=False)
    label = max((len(h) for h in headers), default=0)
    for row in rows:
        console.print("")
        for header, cell in zip(headers, row, strict=True):
            console.print(f"{header:>{label}}  {escape(cell)}", soft_wrap=True, highlight=False)


def _tsv(
    console: Console, title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]
) -> None:
    def line(cells: Sequence[str]) -> str:
        return "\t".join(c.replace("\t", " ").replace("\n", " ") for c in cells)

    out = [f"# {title}", line(headers), *(line(row) for row in rows)]
    # Written as is: rich would expand the tabs into spaces.
    console.file.write("\n".join(out) + "\n")
