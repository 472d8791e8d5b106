"""Calls parked in the proxy until a human decides (policy `on_out_of_scope: hold`).

A call the policy would block is held instead: its scope-expansion request is
filed as usual, a webhook is told, and the flow waits (an asyncio future: the
event loop keeps serving every other flow) until one of

- a decision line in the request log (`offscope requests approve|deny`, any
  process on the machine: the log is polled while something waits),
- a decision in the fleet's review store (PostgreSQL: `offscope requests ...
  --state URL` or another proxy's control API, from any host; the decisions of
  the held calls are polled while something waits),
- the control API (`POST /requests/ID/approve|deny`), which resolves at once,
- the policy's `hold_timeout`,

releases it (approved: the call goes upstream, once) or refuses it (denied or
timed out: the agent gets a 403 naming which).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from offscope.policies.model import Webhook
from offscope.policies.requests import DECISION_SCHEMA
from offscope.state.db import StoreError
from offscope.state.review import ReviewStore
from offscope.vocab import HoldOutcome

log = structlog.get_logger("offscope")

POLL_SECONDS = 0.2  # how often the request log is read while a call is held
HOLD_SCHEMA = "offscope.hold/1"


@dataclass(frozen=True, slots=True)
class Resolution:
    """How a hold ended: who decided, when (seconds since the epoch), and the
    grants an approval wrote (by the request's targets, in order)."""

    outcome: HoldOutcome
    at: float
    approver: str | None = None
    reason: str = ""
    grants: tuple[str, ...] = ()
    targets: tuple[str, ...] = ()
    scope: str | None = None

    @classmethod
    def from_line(cls, line: dict[str, Any]) -> Resolution:
        return cls(
            "approved" if line.get("decision") == "approved" else "denied",
            float(line.get("ts") or 0.0),
            str(line.get("approver") or "") or None,
            str(line.get("reason") or ""),
            tuple(str(g) for g in line.get("grants") or ()),
            tuple(str(t) for t in line.get("targets") or ()),
            line.get("scope"),
        )

    def grant_for(self, target: str) -> str | None:
        """The grant that answers one `kind:value` target of the request."""
        if target in self.targets:
            i = self.targets.index(target)
            return self.grants[i] if i < len(self.grants) else None
        return self.grants[0] if len(self.grants) == 1 and not self.targets else None


@dataclass
class _Waiting:
    future: asyncio.Future
    request: dict[str, Any] = field(default_factory=dict)


class HoldRegistry:
    """The held calls of one proxy, by request id. Used on the event loop only
    (the control API hops onto it)."""

    def __init__(
        self,
        log_path: str | Path | None,
        *,
        store: ReviewStore | None = None,
        on_webhook_failure: Callable[[], None] | None = None,
        on_store_failure: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.log_path = Path(log_path) if log_path else None
        self.store = store
        self.on_store_failure = on_store_failure or (lambda: None)
        self.clock = clock
        self.on_webhook_failure = on_webhook_failure or (lambda: None)
        self.webhook_failures = 0
        self._waiting: dict[str, _Waiting] = {}
        self._poller: asyncio.Task | None = None
        self._where = (
            self._end_of_log()
        )  # decisions written before we started answer nothing held here
        self._partial = b""

    def __len__(self) -> int:
        return len(self._waiting)

    def pending(self) -> list[str]:
        return list(self._waiting)

    def park(self, request: dict[str, Any]) -> None:
        """Start holding the call that filed `request` (its id is the key)."""
        loop = asyncio.get_running_loop()
        self._waiting[request["id"]] = _Waiting(loop.create_future(), request)
        watched = self.log_path is not None or self.store is not None
        if watched and (self._poller is None or self._poller.done()):
            self._poller = loop.create_task(self._poll_while_waiting())

    async def wait(self, request_id: str, timeout: float) -> Resolution:
        """Until the request is decided, or `timeout` seconds pass."""
        waiting = self._waiting.get(request_id)
        if waiting is None:
            return Resolution("timeout", self.clock())
        try:
            return await asyncio.wait_for(asyncio.shield(waiting.future), timeout)
        except TimeoutError:
            # A decision written in the last moments still counts.
            if self.log_path is not None:
                self.poll()
            if self.store is not None and not waiting.future.done():
                await self.poll_store([request_id])
            if waiting.future.done():
                return waiting.future.result()
            return Resolution("timeout", self.clock())
        finally:
            self._waiting.pop(request_id, None)

    def resolve(self, request_id: str, resolution: Resolution) -> bool:
        """Release (or refuse) a held call now; False when nothing waits for it."""
        waiting = self._waiting.get(request_id)
        if waiting is None or waiting.future.done():
            return False
        waiting.future.set_result(resolution)
        return True

    def forget(self, request_id: str) -> None:
        """Stop holding a call that was answered otherwise (nothing will wait for it)."""
        self._waiting.pop(request_id, None)

    def request(self, request_id: str) -> dict[str, Any] | None:
        waiting = self._waiting.get(request_id)
        return waiting.request if waiting else None

    def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        for request_id in list(self._waiting):
            self.resolve(request_id, Resolution("denied", self.clock(), reason="proxy stopped"))

    # -- the request log ---------------------------------------------------------

    def _end_of_log(self) -> tuple[int, int]:
        """(inode, size) of the log now."""
        if self.log_path is None:
            return (0, 0)
        try:
            st = os.stat(self.log_path)
        except OSError:
            return (0, 0)
        return (st.st_ino, st.st_size)

    async def _poll_while_waiting(self) -> None:
        while self._waiting:
            try:
                if self.log_path is not None:
                    self.poll()
                if self.store is not None:
                    await self.poll_store(list(self._waiting))
            except Exception as exc:  # the poller must not die while calls wait
                log.error("hold_poll_failed", error=str(exc))
            await asyncio.sleep(POLL_SECONDS)

    async def poll_store(self, request_ids: list[str]) -> int:
        """Resolve the held calls among `request_ids` that the review store has a
        decision for (read in a worker thread: the event loop never waits on the
        database). A store that cannot be read is logged and counted; the calls
        stay held until it answers or their hold_timeout refuses them."""
        assert self.store is not None
        try:
            lines = await asyncio.to_thread(self.store.decisions_for, request_ids)
        except StoreError as exc:
            self.on_store_failure()
            log.error("state_read_failed", what="decisions", error=str(exc))
            return 0
        return sum(
            self.resolve(str(line.get("request")), Resolution.from_line(line)) for line in lines
        )

    def poll(self) -> int:
        """Read decision lines appended to the log since last time; resolve the
        held calls they answer. Returns how many were resolved."""
        assert self.log_path is not None
        inode, offset = self._where
        try:
            st = os.stat(self.log_path)
        except OSError:
            return 0
        if (
            st.st_ino != inode or st.st_size < offset
        ):  # rotated or replaced: read the new file whole
            offset, self._partial = 0, b""
        if st.st_size == offset:
            self._where = (st.st_ino, offset)
            return 0
        with self.log_path.open("rb") as f:
            f.seek(offset)
            data = f.read(st.st_size - offset)
        self._where = (st.st_ino, offset + len(data))
        data, self._partial = self._partial + data, b""
        lines = data.split(b"\n")
        self._partial = lines.pop()  # after the last newline: a line still being written
        resolved = 0
        for raw in lines:
            if DECISION_SCHEMA.encode() not in raw:
                continue
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            if isinstance(line, dict) and line.get("schema") == DECISION_SCHEMA:
                resolved += self.resolve(str(line.get("request")), Resolution.from_line(line))
        return resolved

    # -- the webhook -------------------------------------------------------------

    def notify(self, webhook: Webhook | None, request: dict[str, Any], timeout: float) -> None:
        """POST the hold's notice, in a worker thread: the event loop never waits
        on the receiver. A failure is logged and counted."""
        if webhook is None:
            return
        body = (
            hold_notice(request, timeout, self.clock())
            if webhook.format == "json"
            else slack_notice(request, timeout)
        )
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(None, _post, webhook.url, body, webhook.timeout_seconds)
        future.add_done_callback(lambda f: self._posted(f, webhook.url, request["id"]))

    def _posted(self, future: asyncio.Future, url: str, request_id: str) -> None:
        error = future.exception()
        if error is None:
            return
        self.webhook_failures += 1
        self.on_webhook_failure()
        log.error(
            "webhook_failed", url=_url_origin(url), request=request_id, error=str(error)[:200]
        )


def hold_notice(request: dict[str, Any], timeout: float, now: float) -> dict[str, Any]:
    """The JSON webhook body (`offscope.hold/1`)."""
    rid = request["id"]
    return {
        "schema": HOLD_SCHEMA,
        "event": "held",
        "request": request,
        "held_at": now,
        "deadline": now + timeout,
        "hold_timeout": timeout,
        "approve": {
            "cli": f"offscope requests approve {rid} --ledger LEDGER.yaml --approver NAME",
            "api": f"POST /requests/{rid}/approve",
        },
        "deny": {
            "cli": f"offscope requests deny {rid} --approver NAME",
            "api": f"POST /requests/{rid}/deny",
        },
    }


def slack_notice(request: dict[str, Any], timeout: float) -> dict[str, Any]:
    """A Slack-compatible body (`text` for notifications, `blocks` for the message)."""
    rid = request["id"]
    call = (
        f"{request.get('method') or ''} {request.get('url') or request.get('tool') or ''}".strip()
    )
    targets = ", ".join(request.get("targets") or []) or "-"
    text = (
        f"offscope is holding a call of run {request.get('run')} (ledger {request.get('ledger')}) "
        f"for approval: {call}; out-of-scope targets: {targets}. Request {rid}; "
        f"denied in {int(timeout)} s unless approved."
    )
    commands = (
        f"`offscope requests approve {rid} --ledger LEDGER.yaml --approver NAME`\n"
        f"`offscope requests deny {rid} --approver NAME`"
    )
    return {
        "text": text,
        "blocks": [
            {
                "type": "section",
                "text": {
                    "type": "mrkdwn",
                    "text": (
                        f"*offscope: approval needed* (request `{rid}`)\n"
                        f"run `{request.get('run')}`, ledger `{request.get('ledger')}`, stage {request.get('stage')}\n"
                        f"call: `{call}`\nout-of-scope targets: `{targets}`"
                    ),
                },
            },
            {
                "type": "context",
                "elements": [
                    {
                        "type": "mrkdwn",
                        "text": (f"Denied in {int(timeout)} s unless approved.\n{commands}"),
                    }
                ],
            },
        ],
    }


def _post(url: str, body: dict[str, Any], timeout: float) -> int:
    data = json.dumps(body, sort_keys=True).encode()
    req = urllib.request.Request(
        url,
        data=data,
        method="POST",
        headers={"content-type": "application/json", "user-agent": "offscope"},
    )
    # The receiver is configured by the operator, never by the agent; direct,
    # not through any proxy the environment names.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=timeout) as resp:
        if resp.status >= 300:
            raise OSError(f"webhook answered HTTP {resp.status}")
        return resp.status


def _url_origin(url: str) -> str:
    """Scheme, host and port of a URL: a Slack webhook's path is its secret."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


def decide_over_api(
    resolve: Callable[[str, Resolution], bool],
    log_path: str | Path | None,
    ledger_path: str | Path,
    request_id: str,
    decision: str,
    body: dict[str, Any],
    store: ReviewStore | None = None,
) -> tuple[int, dict[str, Any]]:
    """`POST /requests/ID/approve|deny` on the control API: the same decision
    `offscope requests approve|deny` makes (a grant in the overlay, a line in
    the request log; with a review store, in the store, where the proxy that holds
    the call may be another one), then a call held here is released or refused at
    once (`resolve` runs on the event loop). Runs in the control server's thread."""
    from offscope.errors import InputError
    from offscope.policies import requests as reqs

    if log_path is None and store is None:
        return 409, {
            "error": "no_request_log",
            "message": "this proxy writes no request log (--requests)",
        }
    approver = body.get("approver")
    if not isinstance(approver, str) or not approver.strip():
        return 400, {
            "error": "bad_request",
            "message": "`approver` is required: a decision names its human",
        }
    reason = str(body.get("reason") or "")
    try:
        if decision == "approve":
            scope = str(body.get("scope") or "run")
            expires = str(body.get("expires") or "24h")
            if store is not None:
                grants = store.approve(request_id, approver, expires, reason, scope=scope)
            else:
                assert log_path is not None
                grants = reqs.approve(
                    log_path, request_id, ledger_path, approver, expires, reason, scope=scope
                )
            resolution = Resolution(
                "approved",
                time.time(),
                approver,
                reason,
                tuple(g.id for g in grants),
                tuple(g.target for g in grants),
                scope,
            )
        elif store is not None:
            store.deny(request_id, approver, reason)
            resolution = Resolution("denied", time.time(), approver, reason)
        else:
            assert log_path is not None
            reqs.deny(log_path, request_id, approver, reason)
            resolution = Resolution("denied", time.time(), approver, reason)
    except StoreError as exc:
        return 503, {"error": "state_store_unavailable", "message": str(exc)}
    except InputError as exc:
        status = 404 if "no request" in exc.message else 409 if "already" in exc.message else 400
        return status, {"error": "request_not_decided", "message": exc.message}
    released = resolve(request_id, resolution)
    payload: dict[str, Any] = {
        "request": request_id,
        "decision": resolution.outcome,
        "approver": approver,
        "released" if resolution.outcome == "approved" else "refused": released,
    }
    if resolution.grants:
        payload["grants"] = list(resolution.grants)
        payload["scope"] = resolution.scope
    return 200, payload
