"""Reading append-only JSON-lines files (traces, request logs): the torn-line rule.

Bottom layer: both policies/ (the request log) and trace/ (the trace) read
JSON lines, and neither may import the other for it.
"""

from __future__ import annotations

import sys
from pathlib import Path


def is_torn(line: str) -> bool:
    """A line without its newline can only be a file's last one: a write cut
    short (a full disk, a crash). Readers skip it with a warning; a bad line
    that was written whole is an error."""
    return not line.endswith("\n")


def warn_torn(path: str | Path, number: int) -> None:
    print(
        f"offscope: warning: {path}:{number}: skipped a torn final line "
        "(a write was cut short, e.g. by a full disk); every line before it was read",
        file=sys.stderr,
    )
