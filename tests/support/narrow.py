"""Narrowing for mypy where a test knows a value is there: `present(x)` is `x`, and an
AssertionError (not a later AttributeError on None) when it is not."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def present(value: T | None) -> T:
    assert value is not None
    return value
