"""User-facing errors. Anything raised as InputError becomes exit code 2 with a
message naming the file and line, never a traceback."""

from __future__ import annotations


class InputError(Exception):
    """Bad input from the user: a file, a flag, a value.

    `path` and `line` locate the problem; `hint` says what to fix.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        self.line = line
        self.hint = hint

    def __str__(self) -> str:
        where = ""
        if self.path:
            where = f"{self.path}:{self.line}: " if self.line else f"{self.path}: "
        text = f"{where}{self.message}"
        if self.hint:
            text += f" ({self.hint})"
        return text
