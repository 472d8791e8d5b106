"""Hot reload off the event loop.

Every agent's flows run on the proxy's one event loop, so nothing a reload
does may run there: reading a 100,000-target ledger is seconds of YAML
parsing and validation. Large ledger files are read in a child process
(a thread would still stall the loop: it holds the GIL, and the garbage
collections its allocations trigger pause every thread); small files, the
grants overlay, the policy and compiling are done in a worker thread. The
caller swaps the result in with one assignment.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import structlog

from offscope.errors import InputError
from offscope.ledgers import CompiledLedger, Ledger, compile_ledger, read_grants, read_ledger

log = structlog.get_logger("offscope")

# Files at least this large are parsed in a child process (about 20,000 targets);
# below it a thread is quicker than starting a process, and short enough.
CHILD_PROCESS_BYTES = 512 * 1024


async def reload_ledger(path: str, base: CompiledLedger | None) -> tuple[CompiledLedger, CompiledLedger]:
    """(ledger without its overlay, ledger with it), off the event loop.

    With `base` (the ledger file did not change) only the grants overlay is
    read and applied to it: an approval costs a small file read, not a
    recompile of the ledger."""
    if base is None:
        model = await _read_ledger(path)
        base = await asyncio.to_thread(compile_ledger, model, path)
    assert base is not None
    grants = await asyncio.to_thread(read_grants, path, base.id)
    return base, await asyncio.to_thread(base.with_grants, grants)


async def _read_ledger(path: str) -> Ledger:
    try:
        big = Path(path).stat().st_size >= CHILD_PROCESS_BYTES
    except OSError:
        big = False  # read_ledger reports the missing file
    if big:
        try:
            return await _read_in_child(path)
        except (BrokenProcessPool, OSError) as exc:  # no child process here: read in a thread
            log.warning("reload_child_failed", error=str(exc), fallback="thread")
    return await asyncio.to_thread(read_ledger, path)


async def _read_in_child(path: str) -> Ledger:
    # spawn, not fork: the proxy has threads (control server, exporter), and a
    # forked child would inherit their locks in whatever state they were.
    pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    try:
        outcome = await asyncio.get_running_loop().run_in_executor(pool, _child_read, path)
    finally:
        pool.shutdown(wait=False)
    if outcome[0] == "ok":
        return outcome[1]
    if outcome[0] == "input":
        _, message, where, line, hint = outcome
        raise InputError(message, path=where, line=line, hint=hint)
    raise RuntimeError(f"{path}: {outcome[1]}")


def _child_read(path: str) -> tuple[Any, ...]:
    """Runs in the child: the validated model, or the error as plain values
    (an InputError's keyword fields do not survive pickling)."""
    try:
        return ("ok", read_ledger(path))
    except InputError as exc:
        return ("input", exc.message, exc.path, exc.line, exc.hint)
    except Exception as exc:  # any failure is reported, never a dead child
        return ("error", f"{type(exc).__name__}: {exc}")
