"""A long-running process's collector: start-up objects frozen, young collections rarer."""

from __future__ import annotations

import gc

from offscope.heap import THRESHOLDS, tune_collector


def test_tune_collector_freezes_what_is_alive_and_sets_the_thresholds() -> None:
    before = gc.get_threshold()
    alive = [[i] for i in range(1000)]  # lists stay tracked (a dict of ints is let go)
    frozen = gc.get_freeze_count()  # conftest.py froze what collecting the tests left
    try:
        tune_collector()
        assert gc.get_freeze_count() >= frozen + len(alive)
        assert gc.get_threshold() == THRESHOLDS
    finally:  # frozen objects stay frozen: to the rest of this worker that is harmless
        gc.set_threshold(*before)
