"""The proxy's side of the state store (`--state`): what it keeps there, and when.

- Registered runs, always (offscope/state/runs.py): a restart keeps serving them.
- With a PostgreSQL store (a fleet), also the review queue (offscope/state/review.py):
  requests are filed there, held calls are released by a decision made anywhere, and
  the ledger's grants are read from it again whenever they change.

When the store cannot be reached, tagging and ledger enforcement go on from what the
proxy holds in memory; what needs the store fails closed (a run is not registered, a
call is blocked at once instead of held, an approval is refused). Each failure is
logged and counted (`offscope_state_store_errors_total`).
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from offscope.ledgers.model import Grant
from offscope.proxy.engine import Engine
from offscope.proxy.exporter import Exporter
from offscope.state.db import Database, StoreError, redacted
from offscope.state.review import ReviewStore
from offscope.state.runs import RunStore

log = structlog.get_logger("offscope")


def attach_state(engine: Engine, spec: str, exporter: Exporter) -> ReviewStore | None:
    """Open the store, take back the ledger's registered runs, and (PostgreSQL) make
    it the review queue of this proxy. InputError when it cannot be opened."""
    db = Database(spec)
    engine.lifecycle.registry.on_store_failure = lambda: exporter.state_failed("write")
    restored = engine.lifecycle.registry.attach(RunStore(db, engine.ledger.id), engine.clock())
    if restored:
        log.info("runs_restored", runs=restored, state=redacted(spec))
    if db.kind != "postgresql":
        return None  # one host: requests and grants stay in the request log and grants file
    review = ReviewStore(db)
    engine.requests.store = review
    engine.requests.on_store_failure = lambda: exporter.state_failed("write")
    if engine.holds is not None:
        engine.holds.store = review
        engine.holds.on_store_failure = lambda: exporter.state_failed("read")
    return review


class StoreGrants:
    """The ledger's grants in the review store, read again only when they changed."""

    def __init__(self, review: ReviewStore, ledger: str, on_failure: Callable[[], None]) -> None:
        self.review = review
        self.ledger = ledger
        self.on_failure = on_failure
        self.version: tuple[int, int] | None = None
        self.grants: list[Grant] = []

    def refresh(self) -> bool:
        """Re-read the grants if a new one was written; True when they changed. A store
        that cannot be read keeps the grants already applied (and counts a failure)."""
        try:
            version = self.review.grants_version(self.ledger)
            if version == self.version:
                return False
            self.grants = self.review.grants(self.ledger)
        except StoreError as exc:
            self.on_failure()
            log.error("state_read_failed", what="grants", error=str(exc))
            return False
        self.version = version
        return True
