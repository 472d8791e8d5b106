"""The fleet's review queue in the state store: requests, decisions, grants.

With a PostgreSQL store (`--state postgresql://...`) every proxy of a fleet files
its scope-expansion requests here, one reviewer approves or denies from anywhere
(`offscope requests ... --state URL`, or any proxy's control API), a held call is
released by whichever proxy holds it (it polls the decisions of the calls it holds),
and every proxy applies the grants of its ledger (read again when they change).

A decision is one transaction: the decision row is unique per request, so of two
reviewers deciding at once exactly one wins and the other is told it was already
decided, and no approval's grants are ever lost to another's write. The same SQL
runs on SQLite (offscope/state/db.py), which the tests use beside PostgreSQL.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from offscope.errors import InputError
from offscope.ledgers.model import Grant
from offscope.policies.requests import check_decision, decision_line, grants_for
from offscope.state.db import Database


class ReviewStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    # -- requests -----------------------------------------------------------------

    def file(self, request: dict[str, Any]) -> None:
        """Add a request (a retried write of the same id is a no-op)."""
        self.db.execute(
            "INSERT INTO requests (id, ledger, ts, body) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (id) DO NOTHING",
            (
                request["id"],
                str(request.get("ledger") or ""),
                float(request.get("ts") or 0.0),
                json.dumps(request, sort_keys=True),
            ),
        )

    def read(self) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
        """(every request in filing order, the decision per request id): the shape
        `offscope.policies.requests.read_log` gives for a request log."""
        requests = [
            json.loads(b) for (b,) in self.db.query("SELECT body FROM requests ORDER BY seq")
        ]
        decisions = {
            r: json.loads(b) for r, b in self.db.query("SELECT request, body FROM decisions")
        }
        return requests, decisions

    def find(self, request_id: str) -> dict[str, Any]:
        rows = self.db.query("SELECT body FROM requests WHERE id = ?", (request_id,))
        if not rows:
            raise InputError(
                f"no request {request_id!r} in the state store", hint="offscope requests list"
            )
        return dict(json.loads(rows[0][0]))

    # -- decisions ----------------------------------------------------------------

    def approve(
        self,
        request_id: str,
        approver: str,
        expires_in: str,
        reason: str = "",
        now: datetime | None = None,
        scope: str = "run",
    ) -> list[Grant]:
        """Grant the request's out-of-scope targets (for its ledger) and record the decision."""
        check_decision(approver, scope)
        now = now or datetime.now(UTC)
        request = self.find(request_id)
        grants = grants_for(request, approver, expires_in, reason, now, scope)
        line = decision_line(
            request_id, "approved", approver, reason, now, grants, scope, request.get("targets", [])
        )
        with self.db.transaction():
            self._decide(line)
            for g in grants:
                self.db.execute(
                    "INSERT INTO grants (id, ledger, body) VALUES (?, ?, ?)",
                    (
                        g.id,
                        str(request.get("ledger") or ""),
                        g.model_dump_json(by_alias=True, exclude_none=True),
                    ),
                )
        return grants

    def deny(
        self, request_id: str, approver: str, reason: str = "", now: datetime | None = None
    ) -> None:
        check_decision(approver)
        self.find(request_id)
        with self.db.transaction():
            self._decide(
                decision_line(request_id, "denied", approver, reason, now or datetime.now(UTC))
            )

    def record(self, line: dict[str, Any]) -> bool:
        """Record a decision the proxy made itself (a hold that timed out); False when
        a human's decision came first."""
        with self.db.transaction():
            return self._insert_decision(line)

    def _decide(self, line: dict[str, Any]) -> None:
        if not self._insert_decision(line):
            (previous,) = self.db.query(
                "SELECT body FROM decisions WHERE request = ?", (line["request"],)
            )[0]
            raise InputError(
                f"request {line['request']} was already {json.loads(previous)['decision']}"
            )

    def _insert_decision(self, line: dict[str, Any]) -> bool:
        # The unique request column makes check-and-decide one step, across processes and hosts.
        return (
            self.db.execute(
                "INSERT INTO decisions (request, body) VALUES (?, ?) ON CONFLICT (request) DO NOTHING",
                (line["request"], json.dumps(line, sort_keys=True)),
            )
            == 1
        )

    def decisions_for(self, request_ids: list[str]) -> list[dict[str, Any]]:
        """The decisions made so far on these requests (the calls a proxy holds)."""
        if not request_ids:
            return []
        marks = ", ".join("?" * len(request_ids))
        rows = self.db.query(
            f"SELECT body FROM decisions WHERE request IN ({marks})", tuple(request_ids)
        )
        return [json.loads(b) for (b,) in rows]

    # -- grants -------------------------------------------------------------------

    def grants(self, ledger: str) -> list[Grant]:
        rows = self.db.query("SELECT body FROM grants WHERE ledger = ? ORDER BY seq", (ledger,))
        return [Grant.model_validate_json(b) for (b,) in rows]

    def grants_version(self, ledger: str) -> tuple[int, int]:
        """Changes whenever a grant of the ledger is added (rows are never rewritten)."""
        ((count, last),) = self.db.query(
            "SELECT COUNT(*), COALESCE(MAX(seq), 0) FROM grants WHERE ledger = ?", (ledger,)
        )
        return int(count), int(last)
