"""Reading append-only JSON-lines files (traces, request logs): the torn-line rule.

Bottom layer: both policies/ (the request log) and trace/ (the trace) read
JSON lines, and neither may import the other for it.
"""

from __future__ import annotations

import gzip
import io
import json
import sys
from pathlib import Path
from typing import Any, TextIO

import zstandard

# Python's json reads these; JSON has no such values, and no offscope writer emits them.
_CONSTANTS = ("NaN", "Infinity")  # (-Infinity contains Infinity)


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


def loads(line: str) -> Any:
    """One JSON line, as json.loads, except that NaN, Infinity and -Infinity
    (not JSON: Python's json reads them, other tools do not) are a ValueError.
    Readers treat that like any bad line: an error naming file:line when the
    line was written whole, skipped when it is a torn final line."""
    return json.loads(line, parse_constant=_refuse_constant)


def check_constants(line: str) -> None:
    """Raise ValueError when `line` holds a NaN or Infinity literal outside a
    string. Cheap for the common line: a substring test decides whether the
    line is parsed at all."""
    if any(word in line for word in _CONSTANTS):
        loads(line)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value (a number must be finite)")


COMPRESSED_SUFFIXES = (".gz", ".zst")
# What reading a damaged compressed segment raises (gzip: OSError or EOFError).
DECOMPRESSION_ERRORS: tuple[type[Exception], ...] = (OSError, EOFError, zstandard.ZstdError)


def open_text(path: str | Path) -> TextIO:
    """A JSON-lines file for reading as text, decompressed as it is read when its name
    ends in .gz or .zst (rotated segments a log shipper compressed); surrogate escapes
    keep bytes that are not UTF-8 to the reader, which reports their line."""
    path = Path(path)
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", errors="surrogateescape")
    if path.suffix == ".zst":
        raw = zstandard.ZstdDecompressor().stream_reader(path.open("rb"), closefd=True)
        return io.TextIOWrapper(raw, encoding="utf-8", errors="surrogateescape")
    return path.open(encoding="utf-8", errors="surrogateescape")
