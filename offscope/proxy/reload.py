"""Hot reload off the event loop.

Every agent's flows run on the proxy's one event loop, so nothing a reload
does may run there: reading a 100,000-target ledger is seconds of YAML
parsing and validation. Large ledger files are read and compiled in a child
process, and only the compiled ledger comes back (a thread would still stall
the loop: it holds the GIL, and the garbage collections its allocations
trigger pause every thread); small files, the grants overlay and the policy
are read in a worker thread. The caller swaps the result in with one
assignment.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import pickle
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import structlog

from offscope.errors import InputError
from offscope.ledgers import (
    CompiledLedger,
    Ledger,
    compile_ledger,
    coverage,
    read_grants,
    read_ledger,
)
from offscope.policies import CompiledPolicy, load_policy, resolve_policy

log = structlog.get_logger("offscope")

# Files at least this large are parsed in a child process (about 20,000 targets);
# below it a thread is quicker than starting a process, and short enough.
CHILD_PROCESS_BYTES = 512 * 1024


async def reload_ledger(
    path: str, base: CompiledLedger | None
) -> tuple[CompiledLedger, CompiledLedger]:
    """(ledger without its overlay, ledger with it), off the event loop.

    With `base` (the ledger file did not change) only the grants overlay is
    read and applied to it: an approval costs a small file read, not a
    recompile of the ledger."""
    if base is None:
        base = await _compile(path)
        # The coverage index walks every target: build it here, not on the first
        # call after the swap (a copy with grants shares it).
        await asyncio.to_thread(coverage.prepare, base)
    grants = await asyncio.to_thread(read_grants, path, base.id)
    return base, await asyncio.to_thread(base.with_grants, grants)


async def reload_policy(spec: str) -> CompiledPolicy:
    """The policy `spec` names (a preset by name, a file by path: never a file
    named like a preset in the current directory), read in a worker thread."""
    return await asyncio.to_thread(load_policy, spec)


def policy_file(spec: str) -> str | None:
    """The file to watch for a policy spec: None for a preset (it is part of
    offscope, not configuration) and for a spec that names nothing (start-up
    has already refused it)."""
    try:
        source = resolve_policy(spec)
    except InputError:
        return None
    return None if source.preset else str(source.path)


def policy_fields(policy: CompiledPolicy) -> dict[str, str]:
    """How the log says which policy is in force, at start-up and on every reload."""
    return {"policy": policy.id, "mode": policy.mode, "source": policy.source, "hash": policy.hash}


async def _compile(path: str) -> CompiledLedger:
    try:
        big = Path(path).stat().st_size >= CHILD_PROCESS_BYTES
    except OSError:
        big = False  # read_ledger reports the missing file
    if big:
        try:
            done = await _compile_in_child(path)
        except (BrokenProcessPool, OSError) as exc:  # no child process here: use a thread
            log.warning("reload_child_failed", error=str(exc), fallback="thread")
        else:
            return (
                done
                if isinstance(done, CompiledLedger)
                else await asyncio.to_thread(compile_ledger, done, path)
            )
    return await asyncio.to_thread(lambda: compile_ledger(read_ledger(path), path))


async def _compile_in_child(path: str) -> CompiledLedger | Ledger:
    # spawn, not fork: the proxy has threads (control server, exporter), and a
    # forked child would inherit their locks in whatever state they were. The
    # child runs at a lower priority: on a busy machine, the agents' flows first.
    pool = ProcessPoolExecutor(
        max_workers=1, mp_context=multiprocessing.get_context("spawn"), initializer=_lower_priority
    )
    try:
        outcome = await asyncio.get_running_loop().run_in_executor(pool, _child_compile, path)
    finally:
        pool.shutdown(wait=False)
    if outcome[0] == "ok":
        return outcome[1]
    if outcome[0] == "input":
        _, message, where, line, hint = outcome
        raise InputError(message, path=where, line=line, hint=hint)
    raise RuntimeError(f"{path}: {outcome[1]}")


def _lower_priority() -> None:
    with contextlib.suppress(OSError):
        os.nice(10)


def _child_compile(path: str) -> tuple[Any, ...]:
    """Runs in the child: the compiled ledger (or, if it cannot be pickled, the
    validated model), or the error as plain values (an InputError's keyword
    fields do not survive pickling)."""
    try:
        model = read_ledger(path)
        compiled = compile_ledger(model, path)
    except InputError as exc:
        return ("input", exc.message, exc.path, exc.line, exc.hint)
    except Exception as exc:  # any failure is reported, never a dead child
        return ("error", f"{type(exc).__name__}: {exc}")
    try:
        pickle.dumps(compiled)
    except Exception:  # a matcher that does not pickle: the parent compiles the model
        return ("ok", model)
    return ("ok", compiled)
