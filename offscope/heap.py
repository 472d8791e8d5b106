"""The heap of a long-running offscope process (a sidecar, a grid and its workers)."""

from __future__ import annotations

import gc

# Allocations (less deallocations) of tracked objects between two young collections;
# CPython's default is 700. A flow or a trajectory step allocates thousands of
# short-lived containers, so at 700 most collections find nothing to free: with 20,000
# a grid's CPU per trajectory fell by a fifth, at the same peak RSS (older generations:
# a collection every 20 of the one below, CPython's default is 10).
THRESHOLDS = (20_000, 20, 20)


def tune_collector() -> None:
    """Call once, at the start of the process's main work, in a process of its own.

    Moves what is alive now (modules, classes, the loaded ledgers and cases) out of the
    cyclic garbage collector's generations, so that a full collection walks only what
    came since. It walked all of it, with the GIL held: in a sidecar on a busy 2-core
    machine a full collection took 100-250 ms, a stall of every flow in flight; in a
    grid the collector took half of the process's CPU. What is frozen is never collected
    as part of a reference cycle (reference counting still frees it).

    Only the young generations are collected first: a full collection here walked the
    whole start-up heap (70-100 ms of CPU at every sidecar start) to free about ten
    objects; what start-up leaves in reference cycles is in the young ones."""
    gc.collect(1)
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
