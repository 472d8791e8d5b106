"""One connection to the state store: a SQLite file (one host) or PostgreSQL (a fleet).

Everything above this module writes its SQL once, with `?` placeholders and three
type words (`{blob}`, `{real}`, `{serial}`) that each backend spells its own way.
Errors of either driver surface as `StoreError`, so callers decide what fails
closed without knowing which database is behind the store.

The schema is versioned (`schema_version`, one row): a store written by a newer
offscope is refused with both versions named; an older one is migrated, by one
process at a time (SQLite: an immediate transaction; PostgreSQL: an advisory lock).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from offscope.errors import InputError

SCHEMA_VERSION = 2

# version -> the statements that bring the schema from the version before to it
MIGRATIONS: dict[int, list[str]] = {
    1: [
        """CREATE TABLE registrations (
            ledger TEXT NOT NULL,
            run TEXT NOT NULL,
            digest {blob} NOT NULL,
            expires {real} NOT NULL,
            labels TEXT NOT NULL,
            targets TEXT,
            agent TEXT,
            ended INTEGER NOT NULL DEFAULT 0,
            exhausted TEXT,
            triggered TEXT NOT NULL DEFAULT '[]',
            spent TEXT NOT NULL DEFAULT '{{}}',
            PRIMARY KEY (ledger, run)
        )"""
    ],
    # The review queue of a fleet: scope-expansion requests, their decisions, the grants.
    2: [
        """CREATE TABLE requests (
            seq {serial},
            id TEXT NOT NULL UNIQUE,
            ledger TEXT NOT NULL,
            ts {real} NOT NULL,
            body TEXT NOT NULL
        )""",
        """CREATE TABLE decisions (
            seq {serial},
            request TEXT NOT NULL UNIQUE,
            body TEXT NOT NULL
        )""",
        """CREATE TABLE grants (
            seq {serial},
            id TEXT NOT NULL UNIQUE,
            ledger TEXT NOT NULL,
            body TEXT NOT NULL
        )""",
        "CREATE INDEX grants_by_ledger ON grants (ledger)",
    ],
}

_TYPES = {
    "sqlite": {"blob": "BLOB", "real": "REAL", "serial": "INTEGER PRIMARY KEY AUTOINCREMENT"},
    "postgresql": {"blob": "BYTEA", "real": "DOUBLE PRECISION", "serial": "BIGSERIAL PRIMARY KEY"},
}
_MIGRATION_LOCK = 0x0FF5C09E  # PostgreSQL advisory lock key: one migrating process at a time


class StoreError(RuntimeError):
    """The state store could not be read or written (unreachable, full, locked too long)."""


def is_url(spec: str) -> bool:
    return spec.startswith(("postgresql://", "postgres://"))


def redacted(spec: str) -> str:
    """The store's address for logs and errors: a URL's password is never shown."""
    if not is_url(spec):
        return spec
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(spec)
    if parts.password is None:
        return spec
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


class Database:
    """A connection used by one process from several threads (one at a time: a lock).

    PostgreSQL: a lost connection is reopened on the next use, so a store that comes
    back is used again without a restart; while it is away every use raises
    StoreError at once (connect timeout 3 s), never hangs the caller."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.kind = "postgresql" if is_url(spec) else "sqlite"
        self._lock = threading.RLock()
        self._conn: Any = None
        self._in_transaction = False
        self._closed = False
        try:
            with self.transaction(migrating=True):
                self._migrate()
        except StoreError as exc:
            raise InputError(
                f"cannot open the state store: {exc}",
                path=redacted(spec),
                hint="give --state a writable SQLite file or a reachable postgresql:// URL",
            ) from None

    # -- connections ------------------------------------------------------------

    def _connect(self) -> Any:
        if self.kind == "sqlite":
            path = Path(self.spec)
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(path, timeout=10, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")  # several processes of one host
            conn.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at each checkpoint
            return conn
        try:
            import psycopg
        except ImportError:
            raise InputError(
                "a postgresql:// state store needs the PostgreSQL driver",
                hint="pip install 'offscope[postgres]'",
            ) from None
        # autocommit: one statement is one transaction unless transaction() says otherwise;
        # statement_timeout: a stuck server fails the call instead of holding the proxy.
        return psycopg.connect(
            self.spec, autocommit=True, connect_timeout=3, options="-c statement_timeout=5000"
        )

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        if self.kind == "sqlite":
            return (sqlite3.Error,)
        import psycopg

        return (psycopg.Error, OSError)

    @contextlib.contextmanager
    def _using(self) -> Iterator[Any]:
        """The connection, opened if needed; a driver error becomes StoreError (and a
        PostgreSQL connection that failed is dropped, to be reopened next time)."""
        with self._lock:
            if self._closed:
                raise StoreError("the state store was closed")
            try:
                if self._conn is None:
                    self._conn = self._connect()
                yield self._conn
            except self._driver_errors() as exc:
                if self.kind == "postgresql" and not self._in_transaction:
                    self._drop()
                raise StoreError(
                    str(exc).strip().splitlines()[0] if str(exc) else repr(exc)
                ) from exc

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    # -- statements ---------------------------------------------------------------

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self.kind == "postgresql" else sql

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._using() as conn:
            cur = conn.execute(self._sql(sql), tuple(params))
            return list(cur.fetchall()) if cur.description is not None else []

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; the number of rows it changed."""
        with self._using() as conn:
            return int(conn.execute(self._sql(sql), tuple(params)).rowcount)

    @contextlib.contextmanager
    def transaction(self, migrating: bool = False) -> Iterator[None]:
        """Statements inside are one atomic step. SQLite takes the write lock at once
        (BEGIN IMMEDIATE), so a check-then-write never races another process."""
        with self._using() as conn:
            self._in_transaction = True
            try:
                if self.kind == "sqlite":
                    conn.execute("BEGIN IMMEDIATE")
                    try:
                        yield
                    except BaseException:
                        conn.execute("ROLLBACK")
                        raise
                    conn.execute("COMMIT")
                else:
                    with conn.transaction():
                        if migrating:
                            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
                        yield
            finally:
                self._in_transaction = False
                if self.kind == "postgresql" and conn.closed:
                    self._drop()

    def _migrate(self) -> None:
        self.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        row = self.query("SELECT version FROM schema_version")
        version = row[0][0] if row else 0
        if version > SCHEMA_VERSION:
            raise InputError(
                f"the state store was written by a newer offscope (schema version {version}; "
                f"this one reads up to {SCHEMA_VERSION})",
                path=redacted(self.spec),
                hint="run the newer offscope, or give this one another --state",
            )
        types = _TYPES[self.kind]
        for step in range(version + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[step]:
                self.execute(statement.format(**types))
        if not row:
            self.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION,))
        elif version < SCHEMA_VERSION:
            self.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._drop()
