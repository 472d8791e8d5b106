"""Helpers for the `offscope mcp` tests: a ledger, the wrapper's command line,
and the official SDK's stdio client pointed at it."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

HERE = Path(__file__).parent
SERVER = HERE / "stdio_server.py"
REPO = HERE.parent.parent


def env() -> dict[str, str]:
    """The SDK passes a child only a few variables: give the wrapper this checkout."""
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))
    return out


def wrapper_args(ledger: Path, trace: Path, *extra: str) -> list[str]:
    return [
        "-m",
        "offscope.cli",
        "mcp",
        "--ledger",
        str(ledger),
        "--trace",
        str(trace),
        "--log-level",
        "warning",
        *extra,
    ]


def write_ledger(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@contextlib.asynccontextmanager
async def session(
    args: list[str], errlog: Any = None, **client: Any
) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=sys.executable, args=args, env=env())
    with open(os.devnull, "w") if errlog is None else contextlib.nullcontext(errlog) as err:
        async with (
            stdio_client(params, errlog=err) as (read, write),
            ClientSession(read, write, **client) as s,
        ):
            await s.initialize()
            yield s


def events(trace: Path, type_: str | None = None) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in trace.read_text(encoding="utf-8").splitlines() if line]
    return [r for r in rows if type_ is None or r["type"] == type_]


def received(record: Path) -> list[dict[str, Any]]:
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines() if line]
