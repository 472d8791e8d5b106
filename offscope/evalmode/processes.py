"""The worker processes of `offscope grid --processes N`: a pool that knows nothing of grids.

One Python process does what one core does: the proxy, the fixture world, the agents and the
simulated model share its GIL. With `--processes N` the trajectories still to run are split
deterministically (worker k takes every N-th, from the k-th, `split`) over N worker processes,
each with its own embedded proxy, fixture world and simulated model, running `--workers`
trajectories at a time and writing its own trace under OUT/.processes/part-K.

The parent keeps what must be one per grid: the output directory's lock, the CA (the workers
load it), and the model gateway with the endpoint's limits and its response cache (the
workers' proxies route the model host to it, so `--model-concurrency`, `--model-rpm` and
`--model-tpm` bound the whole grid, and the cache has one writer). When the workers are done
the parent folds their traces into the grid's (outdir.fold_parts). A trajectory's outcome
depends on its seed and cell, never on the process that ran it, and results are computed from
the trace in plan order, so they equal one process's, field for field.

This module starts the processes, relays their progress and tallies to the grid, and notices
one that died; what a worker runs (`grid.worker_main`) and what it is sent (`grid.WorkerJob`)
are the grid's.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import queue
import threading
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from typing import Any, Protocol, TypeVar

from offscope.evalmode.agent import ModelTally

POLL_SECONDS = 0.5

T = TypeVar("T")
Job = TypeVar("Job")


class WorkerFailed(RuntimeError):
    """A worker process died before it reported its end (its finished runs are kept)."""


class FanOutHost(Protocol):
    """What the pool updates of the grid it runs for: the tallies and the per-process counts
    its progress line reads, and the progress callback."""

    tally: ModelTally
    timings: dict[str, Any]
    progress: Callable[[int, int], None] | None


def split(todo: list[T], n: int) -> list[list[T]]:
    """Worker k's trajectories: every n-th from the k-th (cells and cases spread evenly)."""
    return [todo[k::n] for k in range(n)]


def report(
    messages: Any, kind: str, index: int, tally: ModelTally, done: int, tag_seconds: float = 0.0
) -> None:
    """A worker's message to the parent: a progress `tick`, or its `end`."""
    messages.put((kind, index, done, tally.retries, tally.infra_errors, tag_seconds))


def exit_with_parent() -> None:
    """A worker whose parent died (killed, not stopped) must not go on writing into an
    output directory whose lock is gone."""
    parent = mp.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()
        os._exit(1)

    threading.Thread(target=watch, name="offscope-parent-watch", daemon=True).start()


async def run_in_processes(
    host: FanOutHost, target: Callable[[Job, Any], None], jobs: Sequence[Job], total: int
) -> float:
    """Run `target(job, messages)` in one spawned process per job (spawn, not fork: the
    parent runs threads, the gateway's server) until each reported its end. Returns the
    seconds their proxies spent tagging; `host.timings["per_process"]` is how many
    trajectories each worker reported it ran. On an error or a cancel the workers are
    stopped (an interrupted run)."""
    ctx = mp.get_context("spawn")
    messages = ctx.Queue()
    procs: list[BaseProcess] = []
    try:
        for k, job in enumerate(jobs):
            procs.append(
                ctx.Process(target=target, args=(job, messages), name=f"offscope-grid-{k}")
            )
            procs[-1].start()
        return await _collect(host, procs, messages, total)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
            proc.join()


async def _collect(host: FanOutHost, procs: list[BaseProcess], messages: Any, total: int) -> float:
    """Progress and tallies from the workers until each reported its end."""
    n = len(procs)
    done, retries, infra = [0] * n, [0] * n, [0] * n
    ended: set[int] = set()
    tag_seconds = 0.0
    dead_before: set[int] = set()
    while len(ended) < n:
        try:
            kind, k, d, r, i, tag = await asyncio.to_thread(messages.get, True, POLL_SECONDS)
        except queue.Empty:
            # A process that is gone and still had not reported after a further wait died.
            dead = {k for k, p in enumerate(procs) if k not in ended and not p.is_alive()}
            failed = dead & dead_before
            if failed:
                k = min(failed)
                raise WorkerFailed(
                    f"grid worker process {k} exited with code {procs[k].exitcode} before it "
                    "finished; the runs it finished are kept, run the same command to resume"
                ) from None
            dead_before = dead
            continue
        done[k], retries[k], infra[k] = d, r, i
        host.tally.retries, host.tally.infra_errors = sum(retries), sum(infra)
        host.timings["per_process"] = list(done)
        if kind == "end":
            ended.add(k)
            tag_seconds += tag
        if host.progress:
            host.progress(sum(done), total)
    return tag_seconds
