"""Real grid outputs for the gate, merge and mine tests (run once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.gate_testlib import AGGRESSIVE, run_grid


@pytest.fixture(scope="session")
def base_grid(tmp_path_factory) -> Path:
    """The diagonal on every bundled case, 3 reps (126 runs), default disposition."""
    return run_grid(tmp_path_factory.mktemp("base") / "out")


@pytest.fixture(scope="session")
def regressed_grid(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("cand")
    profile = tmp / "aggressive.yaml"
    profile.write_text(AGGRESSIVE)
    return run_grid(tmp / "out", disposition=str(profile))
