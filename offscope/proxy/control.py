"""offscope's two listeners beside the proxy (never reachable through it).

The metrics listener (open, for scrapers):
GET  /metrics            Prometheus exposition
GET  /healthz            liveness: the process answers
GET  /readyz             readiness: a ledger is loaded

The control listener (every request needs `Authorization: Bearer TOKEN`):
POST /runs               start a run: {"targets", "labels", "ttl", "agent"} -> {"run", "credential", ...}
GET  /runs               the active runs (count and ids, capped)
GET  /runs/RUN_ID        a run's live summary
POST /runs/RUN_ID/end    end a run now (body: {"reason", "task_success", "exit_code"} optional)
POST /requests/ID/approve  approve a scope-expansion request; a held call is released at once
                           (body: {"approver" (required), "scope": "run"|"ledger", "expires": "8h", "reason"})
POST /requests/ID/deny     deny it; a held call gets its 403 at once (body: {"approver", "reason"})

Routes live in `ControlServer.routes`, a table (method, pattern, handler) that
other features extend. docs/runs.md describes the API.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import re
import secrets
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from prometheus_client.exposition import choose_encoder
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from offscope.proxy.exporter import Exporter
from offscope.proxy.listener import ThreadedServer
from offscope.proxy.runs import StoreUnavailable

if TYPE_CHECKING:
    from offscope.proxy.engine import Engine

TOKEN_ENV = "OFFSCOPE_CONTROL_TOKEN"
MAX_BODY = 256 * 1024
_END_REASONS = (None, "end", "exit", "timeout", "crash", "step_limit")
_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


class _Listener:
    """A Starlette app served on its own thread (listener.py)."""

    def __init__(self, host: str, port: int, name: str, app: Starlette) -> None:
        self._server = ThreadedServer(app, host, port, name, lifespan="off")
        self.port = self._server.port

    def start(self) -> None:
        self._server.start()

    def request_stop(self) -> None:
        self._server.request_stop()

    def stop(self) -> None:
        self._server.stop()


class MetricsServer(_Listener):
    """/metrics, /healthz and /readyz: open, nothing here changes anything."""

    def __init__(self, host: str, port: int, exporter: Exporter, engine: Engine) -> None:
        self.engine = engine
        self.registry = exporter.registry
        app = Starlette(
            routes=[
                Route("/metrics", self._metrics),
                Route("/healthz", self._healthz),
                Route("/readyz", self._readyz),
                Route("/{path:path}", _not_found, methods=_METHODS),
            ],
            # Prometheus asks for gzip; /metrics of a busy sidecar is tens of kB.
            middleware=[Middleware(GZipMiddleware, minimum_size=1024)],
        )
        super().__init__(host, port, "offscope-metrics", app)

    async def _metrics(self, request: Request) -> Response:
        # The text format, or OpenMetrics when the scraper asks for it.
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(self.registry), headers={"content-type": content_type})

    async def _healthz(self, request: Request) -> Response:
        return _reply(200, {"status": "ok"})

    async def _readyz(self, request: Request) -> Response:
        ready = self.engine is not None and self.engine.ledger is not None
        return _reply(
            200 if ready else 503,
            {
                "ready": ready,
                "ledger": self.engine.ledger.id,
                "ledger_hash": self.engine.ledger.hash,
                "policy": self.engine.policy.id,
            },
        )


async def _not_found(request: Request) -> Response:
    return _reply(404, {"error": "not found"})


Handler = Callable[["ControlServer", dict[str, Any], dict[str, str]], tuple[int, dict[str, Any]]]


class ControlServer(_Listener):
    """The control API: bearer token required on every route."""

    def __init__(
        self, host: str, port: int, engine: Engine, loop: asyncio.AbstractEventLoop, token: str
    ) -> None:
        self.engine = engine
        self.loop = loop
        self._token = token.encode()
        self.ledger_path = (
            ""  # the ledger whose grants overlay an approval writes (set by the addon)
        )
        self.routes: list[tuple[str, re.Pattern[str], Handler]] = [
            ("POST", re.compile(r"^/runs$"), _start_run),
            ("GET", re.compile(r"^/runs$"), _list_runs),
            ("GET", re.compile(r"^/runs/(?P<run>[^/]+)$"), _run_summary),
            ("POST", re.compile(r"^/runs/(?P<run>[^/]+)/end$"), _end_run),
            ("POST", re.compile(r"^/requests/(?P<request>[^/]+)/approve$"), _approve_request),
            ("POST", re.compile(r"^/requests/(?P<request>[^/]+)/deny$"), _deny_request),
        ]
        # One route takes every request: the token is checked before anything else (an
        # unknown path without it is a 401, not a 404), then `routes` is matched.
        app = Starlette(routes=[Route("/{path:path}", self._dispatch, methods=_METHODS)])
        super().__init__(host, port, "offscope-control", app)

    def on_loop(self, fn, *args, **kwargs) -> Any:
        """Run on the proxy's event loop: engine state has one owner."""

        async def call():
            return fn(*args, **kwargs)

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(timeout=10)

    def _authorized(self, request: Request) -> bool:
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        # Compared in constant time; an empty or missing token never matches.
        return scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode(), self._token
        )

    async def _dispatch(self, request: Request) -> Response:
        if not self._authorized(request):
            return _reply(
                401,
                {
                    "error": "unauthorized",
                    "message": "The control API needs Authorization: Bearer TOKEN (docs/runs.md).",
                },
                {"WWW-Authenticate": 'Bearer realm="offscope-control"'},
            )
        path, method = request.url.path, request.method
        allowed = False
        for route_method, pattern, handler in self.routes:
            m = pattern.match(path)
            if m is None:
                continue
            if route_method != method:
                allowed = True
                continue
            try:
                body = await _read_json(request)
            except ValueError as exc:
                return _reply(400, {"error": "bad_request", "message": str(exc)})
            params = {k: unquote(v) for k, v in m.groupdict().items()}
            # Handlers block on the proxy's loop (on_loop) and on files: off this loop.
            status, payload = await run_in_threadpool(handler, self, body, params)
            return _reply(status, payload)
        if allowed:
            return _reply(405, {"error": "method not allowed"})
        return _reply(404, {"error": "not found"})


def _start_run(
    server: ControlServer, body: dict[str, Any], _: dict[str, str]
) -> tuple[int, dict[str, Any]]:
    try:
        return 201, server.on_loop(server.engine.register_run, body)
    except ValueError as exc:
        return 400, {"error": "bad_request", "message": str(exc)}
    except StoreUnavailable as exc:  # a credential that would not survive a restart: none
        return 503, {"error": "state_store_unavailable", "message": str(exc)}


def _list_runs(
    server: ControlServer, _: dict[str, Any], __: dict[str, str]
) -> tuple[int, dict[str, Any]]:
    ids = server.on_loop(server.engine.runs.ids)
    return 200, {"active": len(ids), "runs": ids[:1000]}


def _run_summary(
    server: ControlServer, _: dict[str, Any], params: dict[str, str]
) -> tuple[int, dict[str, Any]]:
    summary = server.on_loop(server.engine.run_summary, params["run"])
    return _summary_reply(summary, "no such run", params["run"])


def _end_run(
    server: ControlServer, body: dict[str, Any], params: dict[str, str]
) -> tuple[int, dict[str, Any]]:
    reason = body.get("reason") if body.get("reason") in _END_REASONS else "end"
    summary = server.on_loop(
        server.engine.close_run,
        params["run"],
        reason or "end",
        exit_code=body.get("exit_code"),
        task_success=body.get("task_success"),
        detail=body.get("detail"),
    )
    return _summary_reply(summary, "no such active run", params["run"])


def _summary_reply(
    summary: dict[str, Any] | None, missing: str, run: str
) -> tuple[int, dict[str, Any]]:
    """A run's summary (200), or 404 with `missing` as the error when there is none."""
    if summary is None:
        return 404, {"error": missing, "run": run}
    return 200, summary


def _approve_request(
    server: ControlServer, body: dict[str, Any], params: dict[str, str]
) -> tuple[int, dict[str, Any]]:
    return _decide_request(server, "approve", body, params["request"])


def _deny_request(
    server: ControlServer, body: dict[str, Any], params: dict[str, str]
) -> tuple[int, dict[str, Any]]:
    return _decide_request(server, "deny", body, params["request"])


def _decide_request(
    server: ControlServer, action: str, body: dict[str, Any], request_id: str
) -> tuple[int, dict[str, Any]]:
    """Approve or deny a scope-expansion request (docs/approvals.md); a held
    call is released or refused at once."""
    from offscope.proxy.holds import Resolution, decide_over_api

    holds = server.engine.holds

    def resolve(rid: str, resolution: Resolution) -> bool:
        return holds is not None and bool(server.on_loop(holds.resolve, rid, resolution))

    return decide_over_api(
        resolve,
        server.engine.requests.path,
        server.ledger_path,
        request_id,
        action,
        body,
        server.engine.requests.store,
    )


async def _read_json(request: Request) -> dict[str, Any]:
    # h11 has refused a malformed Content-Length already; a declared size over the cap
    # is refused before a byte of the body is read.
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        raise ValueError(f"body over {MAX_BODY} bytes")
    raw = bytearray()
    async for chunk in request.stream():  # a chunked body is capped as it arrives
        raw += chunk
        if len(raw) > MAX_BODY:
            raise ValueError(f"body over {MAX_BODY} bytes")
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        raise ValueError("body is not JSON") from None
    if not isinstance(data, dict):
        raise ValueError("body must be a JSON object")
    return data


def _reply(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
    return Response(
        json.dumps(body, sort_keys=True), status, headers, media_type="application/json"
    )


def resolve_token(token_file: str, state_dir: Path) -> tuple[str, str]:
    """The control token and where it came from: the file given, the
    environment, else the state directory's `control-token`, generated once
    (mode 0600) and kept across restarts, so a harness that read it once keeps
    working. The token itself is never printed: only where it is."""
    if token_file:
        return _read_token(
            Path(token_file), hint="give a readable file with the token, or set " + TOKEN_ENV
        ), token_file
    if os.environ.get(TOKEN_ENV, "").strip():
        return os.environ[TOKEN_ENV].strip(), TOKEN_ENV
    path = state_dir / "control-token"
    if path.exists():
        token = _read_token(path, hint=f"delete {path} to have a new token generated")
        print(f"offscope control token: {path}", file=sys.stderr)
        return token, str(path)
    token = secrets.token_urlsafe(32)
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        # O_EXCL: two proxies starting at once cannot each write a different token.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(token + "\n")
        where = str(path)
    except FileExistsError:
        return resolve_token("", state_dir)
    except OSError as exc:
        from offscope.errors import InputError

        raise InputError(
            f"cannot write the generated control token: {exc.strerror or exc}",
            path=str(path),
            hint=f"give --control-token-file FILE, or set {TOKEN_ENV}",
        ) from None
    print(f"offscope control token (generated): {where}", file=sys.stderr)
    return token, where


def _read_token(path: Path, hint: str) -> str:
    from offscope.errors import InputError

    try:
        token = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise InputError(
            f"cannot read control token: {exc.strerror or exc}", path=str(path), hint=hint
        ) from None
    if not token:
        raise InputError("control token file is empty", path=str(path), hint=hint)
    return token
