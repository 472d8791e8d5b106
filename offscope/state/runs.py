"""Registered runs in the state store, so that a restarted proxy keeps serving them.

A run started through the control API (POST /runs) was acknowledged with a
credential; after a restart that credential must still open its run, with the
run's own targets, labels, history-rule memory and budget counters. Without a
store, the restarted proxy forgot the run: the credential was refused or the run
went on unauthenticated, and its in-scope calls turned out of scope.

The store (`--state`): a SQLite file (default `state.sqlite` in the state
directory, WAL mode, shared by the proxies of one host) or a PostgreSQL URL (a
fleet; offscope/state/db.py). Only the credential's SHA-256 digest is stored,
never the credential. Rows are per ledger id: a proxy loads the runs registered
under the ledger it serves.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from offscope.state.db import SCHEMA_VERSION, Database

__all__ = ["SCHEMA_VERSION", "RunStore", "StoredRun"]


@dataclass
class StoredRun:
    """One registration as stored (the credential's digest, never the credential)."""

    run: str
    digest: bytes
    expires: float
    labels: dict[str, str]
    targets: dict[str, Any] | None
    agent: str | None
    ended: bool
    exhausted: str | None
    triggered: list[str]
    spent: dict[str, int]


class RunStore:
    """The registered runs of one ledger in the state store."""

    def __init__(self, db: Database | str | Path, ledger: str) -> None:
        self.db = db if isinstance(db, Database) else Database(str(db))
        self.ledger = ledger

    def save(self, run: StoredRun) -> None:
        row = (
            run.digest,
            run.expires,
            json.dumps(run.labels, sort_keys=True),
            None if run.targets is None else json.dumps(run.targets, sort_keys=True),
            run.agent,
            int(run.ended),
            run.exhausted,
            json.dumps(sorted(run.triggered)),
            json.dumps(run.spent, sort_keys=True),
        )
        self.db.execute(
            "INSERT INTO registrations (ledger, run, digest, expires, labels, targets, agent, "
            "ended, exhausted, triggered, spent) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (ledger, run) DO UPDATE SET digest = excluded.digest, "
            "expires = excluded.expires, labels = excluded.labels, targets = excluded.targets, "
            "agent = excluded.agent, ended = excluded.ended, exhausted = excluded.exhausted, "
            "triggered = excluded.triggered, spent = excluded.spent",
            (self.ledger, run.run, *row),
        )

    def load(self, now: float, keep: float) -> list[StoredRun]:
        """This ledger's registrations still within their ttl (plus `keep` seconds, so a
        late credential is refused as expired), oldest first; older rows are deleted."""
        self.db.execute(
            "DELETE FROM registrations WHERE ledger = ? AND expires + ? <= ?",
            (self.ledger, keep, now),
        )
        rows = self.db.query(
            "SELECT run, digest, expires, labels, targets, agent, ended, exhausted, triggered, "
            "spent FROM registrations WHERE ledger = ? ORDER BY expires",
            (self.ledger,),
        )
        return [
            StoredRun(
                run,
                bytes(digest),
                expires,
                json.loads(labels),
                None if targets is None else json.loads(targets),
                agent,
                bool(ended),
                exhausted,
                json.loads(triggered),
                json.loads(spent),
            )
            for run, digest, expires, labels, targets, agent, ended, exhausted, triggered, spent in rows
        ]

    def close(self) -> None:
        self.db.close()
