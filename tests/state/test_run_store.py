"""The run store (offscope/state/runs.py) on a real SQLite file, without sockets."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from offscope.errors import InputError
from offscope.ledgers.model import TargetLists
from offscope.proxy.runs import Registry, StoreUnavailable
from offscope.state.runs import SCHEMA_VERSION, RunStore


def test_a_registration_and_what_its_run_learnt_come_back(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    first = Registry()
    first.attach(RunStore(path, "billing"), now=1000.0)
    targets = TargetLists.model_validate({"records": ["customer:7777"]})
    reg, credential = first.register(1000.0, 600.0, {"ticket": "T-1"}, targets, None, False)
    reg.history.triggered.add("read-then-exfiltrate")
    reg.spent["max_tool_calls"] = 3
    first.persist(reg)

    again = Registry()
    assert again.attach(RunStore(path, "billing"), now=1100.0) == 1
    back, _ = again.check(reg.run, credential, 1100.0)
    assert back is not None and back.labels == {"ticket": "T-1"}
    assert back.targets == targets and back.history.triggered == {"read-then-exfiltrate"}
    assert back.spent == {"max_tool_calls": 3}
    assert again.check(reg.run, "forged", 1100.0)[0] is None
    # Another ledger's proxy sharing the file does not serve this run.
    assert Registry().attach(RunStore(path, "other-ledger"), now=1100.0) == 0
    # Past its ttl (and the hour an expired credential is still named), it is gone.
    assert Registry().attach(RunStore(path, "billing"), now=1000.0 + 600 + 3600) == 0


def test_a_store_written_by_a_newer_offscope_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    RunStore(path, "billing").close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    with pytest.raises(InputError, match="newer offscope") as info:
        RunStore(path, "billing")
    assert f"schema version {SCHEMA_VERSION + 1}" in str(info.value)


def test_a_file_that_is_not_sqlite_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    path.write_bytes(b"not a database, " * 100)
    with pytest.raises(InputError, match="cannot open the state store"):
        RunStore(path, "billing")


def test_a_store_that_cannot_be_written_refuses_to_register_and_says_so(tmp_path: Path) -> None:
    registry = Registry()
    store = RunStore(tmp_path / "state.sqlite", "billing")
    registry.attach(store, now=1000.0)
    reg, _ = registry.register(1000.0, 600.0, {}, None, None, False)
    store.close()  # the store goes away mid-run (a removed volume, a full disk)
    with pytest.raises(StoreUnavailable):
        registry.register(1000.0, 600.0, {}, None, None, False)
    assert len(registry) == 1  # no credential is handed out that a restart would forget
    reg.history.triggered.add("rule")
    assert registry.persist(reg) is False  # the caller fails the call (closed in enforce)
