"""`offscope grid --processes N`: one grid, N worker processes.

One Python process does what one core does: the proxy, the fixture world, the agents and the
simulated model share its GIL. With `--processes N` the trajectories still to run are split
deterministically (worker k takes every N-th, from the k-th) over N worker processes, each with
its own embedded proxy, fixture world and simulated model, running `--workers` trajectories at
a time and writing its own trace under OUT/.processes/part-K.

The parent keeps what must be one per grid: the output directory's lock, the CA (the workers
load it), and the model gateway with the endpoint's limits and its response cache (the
workers' proxies route the model host to it, so `--model-concurrency`, `--model-rpm` and
`--model-tpm` bound the whole grid, and the cache has one writer). When the workers are done
the parent folds their traces into the grid's (outdir.fold_parts). A trajectory's outcome
depends on its seed and cell, never on the process that ran it, and results are computed from
the trace in plan order, so they equal one process's, field for field.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import queue
import threading
from contextlib import ExitStack
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from offscope.evalmode.grid import Grid, GridConfig, Trajectory
from offscope.evalmode.harness import LoopbackServer
from offscope.evalmode.outdir import PARTS_DIR, fold_parts

POLL_SECONDS = 0.5


class WorkerFailed(RuntimeError):
    """A worker process died before it reported its end (its finished runs are kept)."""


@dataclass
class WorkerJob:
    """What one worker process is sent (pickled: spawn, not fork, since the parent runs
    threads: the gateway's server)."""

    index: int
    cfg: GridConfig
    todo: list[Trajectory]
    part: Path
    confdir: Path
    model_id: str
    gateway_port: int | None


def split(todo: list[Trajectory], n: int) -> list[list[Trajectory]]:
    """Worker k's trajectories: every n-th from the k-th (cells and cases spread evenly)."""
    return [todo[k::n] for k in range(n)]


def worker_main(job: WorkerJob, messages: Any) -> None:
    """A worker process: run its trajectories, reporting progress and its end to the parent."""
    _exit_with_parent()
    grid = Grid(job.cfg)
    grid.prepare_model()

    def report(kind: str, done: int, tag_seconds: float = 0.0) -> None:
        tally = grid.tally
        messages.put((kind, job.index, done, tally.retries, tally.infra_errors, tag_seconds))

    tag_seconds = asyncio.run(
        grid.serve(
            job.todo,
            job.confdir,
            job.part / "trajectories.jsonl",
            job.part / "requests.jsonl",
            job.model_id,
            lambda done, _total: report("tick", done),
            job.gateway_port,
        )
    )
    report("end", len(job.todo), tag_seconds)


def _exit_with_parent() -> None:
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
    grid: Grid, todo: list[Trajectory], confdir: Path, model_id: str
) -> float:
    """Run `todo` over `grid.cfg.processes` worker processes; fold their traces into the
    grid's. Returns the seconds their proxies spent tagging; `grid.timings["per_process"]`
    is how many trajectories each worker reported it ran."""
    cfg = grid.cfg
    root = cfg.out / PARTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")
    messages = ctx.Queue()
    with ExitStack() as stack:
        port = None
        if grid.gateway is not None:
            port = stack.enter_context(LoopbackServer(grid.gateway.app(), "model-gateway")).port
        procs: list[BaseProcess] = []
        try:
            for k, share in enumerate(split(todo, min(cfg.processes, len(todo)))):
                part = root / f"part-{k:03d}"
                part.mkdir(parents=True, exist_ok=True)
                job = WorkerJob(k, cfg, share, part, confdir, model_id, port)
                procs.append(
                    ctx.Process(target=worker_main, args=(job, messages), name=f"offscope-grid-{k}")
                )
                procs[-1].start()
            tag_seconds = await _collect(grid, procs, messages, len(todo))
        finally:
            for proc in procs:  # an error or a cancel here: stop them (an interrupted run)
                if proc.is_alive():
                    proc.terminate()
                proc.join()
            # what they finished is kept, even when one failed; the rest runs on resume
            fold_parts(cfg.out, cfg.out / "trajectories.jsonl")
    return tag_seconds


async def _collect(grid: Grid, procs: list[BaseProcess], messages: Any, total: int) -> float:
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
        grid.tally.retries, grid.tally.infra_errors = sum(retries), sum(infra)
        grid.timings["per_process"] = list(done)
        if kind == "end":
            ended.add(k)
            tag_seconds += tag
        if grid.progress:
            grid.progress(sum(done), total)
    return tag_seconds
