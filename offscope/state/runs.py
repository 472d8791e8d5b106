"""Registered runs in SQLite, so that a restarted proxy keeps serving them.

A run started through the control API (POST /runs) was acknowledged with a
credential; after a restart that credential must still open its run, with the
run's own targets, labels, history-rule memory and budget counters. Without a
store, the restarted proxy forgot the run: the credential was refused or the run
went on unauthenticated, and its in-scope calls turned out of scope.

One SQLite file (`--state`, default `state.sqlite` in the state directory), in WAL
mode, so several proxy processes on one host can share it; only the credential's
SHA-256 digest is stored, never the credential. Rows are per ledger id: a proxy
loads the runs registered under the ledger it serves. The schema is versioned: a
file written by a newer offscope is refused with both versions named.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from offscope.errors import InputError

SCHEMA_VERSION = 1

# version -> the statements that bring the schema from the version before to it
_MIGRATIONS: dict[int, list[str]] = {
    1: [
        """
    CREATE TABLE registrations (
        ledger TEXT NOT NULL,
        run TEXT NOT NULL,
        digest BLOB NOT NULL,
        expires REAL NOT NULL,
        labels TEXT NOT NULL,
        targets TEXT,
        agent TEXT,
        ended INTEGER NOT NULL DEFAULT 0,
        exhausted TEXT,
        triggered TEXT NOT NULL DEFAULT '[]',
        spent TEXT NOT NULL DEFAULT '{}',
        PRIMARY KEY (ledger, run)
    )
    """
    ],
}


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
    """The registered runs of one ledger, in a SQLite file shared by the proxies of a host."""

    def __init__(self, path: str | Path, ledger: str) -> None:
        self.path = Path(path)
        self.ledger = ledger
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=10, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at each checkpoint
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise InputError(
                f"cannot open the state store: {exc}",
                path=str(self.path),
                hint="give --state a writable file (SQLite), or move the damaged one away",
            ) from None

    def _migrate(self) -> None:
        db = self._db
        db.execute("BEGIN IMMEDIATE")  # one migrating process at a time
        try:
            db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = db.execute("SELECT version FROM schema_version").fetchone()
            version = row[0] if row else 0
            if version > SCHEMA_VERSION:
                raise InputError(
                    f"the state store was written by a newer offscope (schema version {version}; "
                    f"this one reads up to {SCHEMA_VERSION})",
                    path=str(self.path),
                    hint="run the newer offscope, or give this one another --state file",
                )
            for step in range(version + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[step]:
                    db.execute(statement)
            if row is None:
                db.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION,))
            elif version < SCHEMA_VERSION:
                db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def save(self, run: StoredRun) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO registrations VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                self.ledger,
                run.run,
                run.digest,
                run.expires,
                json.dumps(run.labels, sort_keys=True),
                None if run.targets is None else json.dumps(run.targets, sort_keys=True),
                run.agent,
                int(run.ended),
                run.exhausted,
                json.dumps(sorted(run.triggered)),
                json.dumps(run.spent, sort_keys=True),
            ),
        )

    def load(self, now: float, keep: float) -> list[StoredRun]:
        """This ledger's registrations still within their ttl (plus `keep` seconds, so a
        late credential is refused as expired), oldest first; older rows are deleted."""
        self._db.execute(
            "DELETE FROM registrations WHERE ledger = ? AND expires + ? <= ?",
            (self.ledger, keep, now),
        )
        rows = self._db.execute(
            "SELECT run, digest, expires, labels, targets, agent, ended, exhausted, triggered, "
            "spent FROM registrations WHERE ledger = ? ORDER BY expires",
            (self.ledger,),
        ).fetchall()
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
        self._db.close()
