"""Scope-expansion requests and the grants that answer them.

A run blocked in enforce mode files a request (the proxy's request log). A
human reviews it: an approval is bound to the exact target, tool and argument
digest, names its approver and expires; it is written to the ledger's grants
overlay, which the running proxy hot-reloads, and every call it lets through
records the grant id in the trace. Decisions are appended to the request log,
so the log is the full, reviewable history.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from offscope.errors import InputError
from offscope.jsonl import is_torn, loads, warn_torn
from offscope.ledgers import grants_path
from offscope.ledgers.model import Grant, GrantsOverlay, Ledger

DECISION_SCHEMA = "offscope.request-decision/1"


def read_log(path: str | Path) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """(requests in order, latest decision per request id)."""
    requests: list[dict[str, Any]] = []
    decisions: dict[str, dict[str, Any]] = {}
    try:
        lines = (
            Path(path)
            .read_text(encoding="utf-8", errors="surrogateescape")
            .splitlines(keepends=True)
        )
    except OSError as exc:
        raise InputError(
            f"cannot read request log: {exc.strerror}",
            path=str(path),
            hint="the proxy writes it (--requests, default beside the trace)",
        ) from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = loads(line)  # (NaN, Infinity: a bad line, as in every reader)
        except ValueError:
            if is_torn(line):  # a write cut short by a full disk: only the last line can be
                warn_torn(path, number)
                break
            raise InputError("not a JSON line", path=str(path), line=number) from None
        if item.get("schema") == DECISION_SCHEMA:
            decisions[item["request"]] = item
        else:
            requests.append(item)
    return requests, decisions


def find(requests: list[dict[str, Any]], request_id: str, path: str | Path) -> dict[str, Any]:
    for r in requests:
        if r.get("id") == request_id:
            return r
    raise InputError(
        f"no request {request_id!r} in the log", path=str(path), hint="offscope requests list"
    )


@contextlib.contextmanager
def exclusive(path: str | Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (through `<path>.lock`) for a read-modify-write.

    Several reviewers (processes) may decide at once: without it, two approvals read
    the same grants overlay and the second write drops the first one's grants, and two
    decisions on one request both pass the "already decided" check. The lock is
    released when the process dies, so a crash never leaves it held."""
    lock = Path(str(path) + ".lock")
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def parse_duration(text: str) -> timedelta:
    units = {"m": 60, "h": 3600, "d": 86400}
    if not text or text[-1] not in units or not text[:-1].isdigit() or int(text[:-1]) <= 0:
        raise InputError(f"bad duration {text!r}", hint="e.g. 30m, 8h, 7d")
    return timedelta(seconds=int(text[:-1]) * units[text[-1]])


def approve(
    log: str | Path,
    request_id: str,
    ledger_path: str | Path,
    approver: str,
    expires_in: str,
    reason: str = "",
    now: datetime | None = None,
    scope: str = "run",
) -> list[Grant]:
    """Write one grant per out-of-scope target of the request; returns them.

    `scope` 'run' (the default) binds each grant to the run that asked;
    'ledger' lets it apply to every run of the ledger."""
    from offscope.yamlio import load_model

    check_decision(approver, scope)
    ledger = load_model(Ledger, ledger_path)
    overlay_file = grants_path(ledger_path)
    # The log's lock makes check-and-decide one step; the overlay's, the grants rewrite
    # (several request logs may feed one overlay). Always in this order.
    with exclusive(log), exclusive(overlay_file):
        return _approve(
            log, request_id, ledger, overlay_file, approver, expires_in, reason, now, scope
        )


def _approve(
    log: str | Path,
    request_id: str,
    ledger: Ledger,
    overlay_file: Path,
    approver: str,
    expires_in: str,
    reason: str,
    now: datetime | None,
    scope: str,
) -> list[Grant]:
    from offscope.yamlio import load_model

    requests, decisions = read_log(log)
    request = find(requests, request_id, log)
    if request_id in decisions:
        raise InputError(
            f"request {request_id} was already {decisions[request_id]['decision']}", path=str(log)
        )
    if request.get("ledger") != ledger.id:
        raise InputError(
            f"request {request_id} is for ledger {request.get('ledger')!r}, not {ledger.id!r}",
            hint="approve it with the ledger its run was tagged against",
        )
    now = now or datetime.now(UTC)
    grants = grants_for(request, approver, expires_in, reason, now, scope)
    existing = load_model(GrantsOverlay, overlay_file).grants if overlay_file.exists() else []
    write_overlay(overlay_file, ledger.id, [*existing, *grants])
    _decide(
        log,
        request_id,
        "approved",
        approver,
        reason,
        now,
        [g.id for g in grants],
        scope,
        request.get("targets", []),
    )
    return grants


def write_overlay(path: Path, ledger_id: str, grants: list[Grant]) -> None:
    """Write a grants overlay (`LEDGER.grants.yaml`) atomically: a proxy never reads half."""
    from offscope.yamlio import dump_yaml

    overlay = GrantsOverlay(ledger=ledger_id, grants=grants)
    tmp = path.with_suffix(".yaml.tmp")
    tmp.write_text(
        "# Reviewed scope expansions, written by `offscope requests approve`.\n"
        + dump_yaml(overlay.model_dump(by_alias=True, exclude_none=True)),
        encoding="utf-8",
    )
    tmp.replace(path)


def grants_for(
    request: dict[str, Any],
    approver: str,
    expires_in: str,
    reason: str,
    now: datetime,
    scope: str,
) -> list[Grant]:
    """One grant per out-of-scope target of the request, bound to its tool, method,
    destination and argument digest (and to its run, unless `scope` is 'ledger')."""
    expires = _iso(now + parse_duration(expires_in))
    return [
        Grant(
            id="grant-" + uuid.uuid4().hex[:12],
            target=target,
            tool=request.get("tool"),
            method=request.get("method"),
            host=request.get("host"),
            path=request.get("path"),
            query_digest=request.get("query_digest"),
            args_digest=request.get("args_digest"),
            approver=approver,
            reason=reason,
            expires=expires,
            request_id=request["id"],
            created=_iso(now),
            scope=scope,
            run=request.get("run") if scope == "run" else None,
        )
        for target in request.get("targets", [])
    ]


def check_decision(approver: str, scope: str = "run") -> None:
    if not approver.strip():
        raise InputError("--approver is required: a grant names the human who gave it")
    if scope not in ("run", "ledger"):
        raise InputError(
            f"bad grant scope {scope!r}", hint="--scope run (only the requesting run) or ledger"
        )


def decision_line(
    request_id: str,
    decision: str,
    approver: str | None,
    reason: str,
    now: datetime | float,
    grants: list[Grant] | None = None,
    scope: str | None = None,
    targets: list[str] | None = None,
) -> dict[str, Any]:
    """A decision as the request log and the state store keep it."""
    line: dict[str, Any] = {
        "schema": DECISION_SCHEMA,
        "request": request_id,
        "decision": decision,
        "approver": approver,
        "reason": reason,
        "ts": now.timestamp() if isinstance(now, datetime) else now,
        "grants": [g.id for g in grants or []],
    }
    if scope is not None:
        line["scope"] = scope
        line["targets"] = targets or []
    return line


def _iso(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")


def deny(
    log: str | Path, request_id: str, approver: str, reason: str = "", now: datetime | None = None
) -> None:
    with exclusive(log):
        requests, decisions = read_log(log)
        find(requests, request_id, log)
        if request_id in decisions:
            raise InputError(
                f"request {request_id} was already {decisions[request_id]['decision']}",
                path=str(log),
            )
        _decide(log, request_id, "denied", approver, reason, now or datetime.now(UTC), [])


def _decide(
    log: str | Path,
    request_id: str,
    decision: str,
    approver: str,
    reason: str,
    now: datetime,
    grants: list[str],
    scope: str | None = None,
    targets: list[str] | None = None,
) -> None:
    """Append a decision line. A proxy holding the request's call reads it
    (offscope/proxy/holds.py) and releases or refuses the call."""
    line = decision_line(request_id, decision, approver, reason, now, None, scope, targets)
    line["grants"] = grants
    with Path(log).open("a", encoding="utf-8") as f:
        f.write(json.dumps(line, sort_keys=True) + "\n")
