"""`offscope report --json` writes its runs one at a time: byte for byte the JSON of the
whole summary, without holding every run's row at once."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from offscope.cli.report import print_json, summarize
from offscope.trace.metrics import fold
from tests.support.trajectories import Run


@pytest.mark.parametrize("n_runs", [0, 1, 3])
def test_streamed_json_is_the_summary_json(n_runs: int) -> None:
    events = [e for i in range(n_runs) for e in Run(f"r{i}").call().oos("act").end().events]
    runs = fold(events)
    simulated = {"r0": "simulated:x"} if n_runs else {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_json(runs, simulated)
    expected = json.dumps(summarize(runs, simulated), indent=2, sort_keys=True) + "\n"
    assert out.getvalue() == expected
