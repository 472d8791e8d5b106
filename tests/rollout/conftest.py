"""Real grid outputs for the gate, merge and mine tests (run once per session)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.gate_testlib import AGGRESSIVE, run_grid


def once_per_run(factory: pytest.TempPathFactory, name: str, make: Callable[[Path], Path]) -> Path:
    """`make(dir)` once per test run, not once per xdist worker: test_gate.py and
    test_mine.py, which both read the base grid (never write it), usually run in two
    workers. The workers of one run share the parent of their temporary directories;
    the first to get there makes the output, under a lock, and the others read it."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # one process: a session fixture is enough
        return make(factory.mktemp(name))
    root = factory.getbasetemp().parent / f"shared-{name}"
    root.mkdir(exist_ok=True)
    with (root / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        done = root / "done"
        if done.exists():
            return Path(done.read_text(encoding="utf-8"))
        out = make(root)
        done.write_text(str(out), encoding="utf-8")
        return out


@pytest.fixture(scope="session")
def base_grid(tmp_path_factory) -> Path:
    """The diagonal on every bundled case, 3 reps (126 runs), default disposition."""
    return once_per_run(tmp_path_factory, "base", lambda d: run_grid(d / "out"))


@pytest.fixture(scope="session")
def regressed_grid(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("cand")
    profile = tmp / "aggressive.yaml"
    profile.write_text(AGGRESSIVE)
    return run_grid(tmp / "out", disposition=str(profile))
