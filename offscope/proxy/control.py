"""The metrics and control listener, on its own port (never through the proxy).

GET  /metrics            Prometheus exposition
GET  /healthz            liveness: the process answers
GET  /readyz             readiness: a ledger is loaded
POST /runs/RUN_ID/end    end a run now (body: {"reason", "task_success", "exit_code"} optional)
GET  /runs               the active runs (count and ids, capped)
"""

from __future__ import annotations

import asyncio
import json
import threading
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app

from offscope.proxy.exporter import Exporter

if TYPE_CHECKING:
    from offscope.proxy.engine import Engine


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass


class ControlServer:
    def __init__(self, host: str, port: int, exporter: Exporter, engine: Engine,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.exporter = exporter
        self.engine = engine
        self.loop = loop
        self._metrics = make_wsgi_app(exporter.registry)
        self._server = make_server(host, port, self._app, server_class=_Server, handler_class=_QuietHandler)
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, name="offscope-control", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _on_loop(self, fn, *args, **kwargs) -> Any:
        """Run on the proxy's event loop: engine state has one owner."""
        async def call():
            return fn(*args, **kwargs)
        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(timeout=10)

    def _app(self, environ: dict[str, Any], start_response) -> list[bytes]:
        path = environ.get("PATH_INFO", "")
        method = environ.get("REQUEST_METHOD", "GET")
        if path == "/metrics":
            return self._metrics(environ, start_response)
        if path == "/healthz":
            return _reply(start_response, 200, {"status": "ok"})
        if path == "/readyz":
            ready = self.engine is not None and self.engine.ledger is not None
            return _reply(start_response, 200 if ready else 503,
                          {"ready": ready, "ledger": self.engine.ledger.id, "ledger_hash": self.engine.ledger.hash,
                           "policy": self.engine.policy.id})
        if path == "/runs" and method == "GET":
            ids = self._on_loop(self.engine.runs.ids)
            return _reply(start_response, 200, {"active": len(ids), "runs": ids[:1000]})
        if path.startswith("/runs/") and path.endswith("/end") and method == "POST":
            run_id = unquote(path[len("/runs/"):-len("/end")])
            body = _read_json(environ)
            summary = self._on_loop(self.engine.end_run, run_id, str(body.get("reason", "end")),
                                    exit_code=body.get("exit_code"), task_success=body.get("task_success"),
                                    detail=body.get("detail"))
            if summary is None:
                return _reply(start_response, 404, {"error": "no such active run", "run": run_id})
            return _reply(start_response, 200, summary)
        return _reply(start_response, 404, {"error": "not found"})


def _read_json(environ: dict[str, Any]) -> dict[str, Any]:
    try:
        size = int(environ.get("CONTENT_LENGTH") or 0)
        data = json.loads(environ["wsgi.input"].read(min(size, 65536)) or b"{}") if size else {}
    except (ValueError, KeyError):
        return {}
    if isinstance(data, dict) and data.get("reason") not in (None, "end", "exit", "timeout", "crash", "step_limit"):
        data["reason"] = "end"
    return data if isinstance(data, dict) else {}


def _reply(start_response, status: int, body: dict[str, Any]) -> list[bytes]:
    payload = json.dumps(body, sort_keys=True).encode()
    reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}.get(status, "")
    start_response(f"{status} {reason}", [("Content-Type", "application/json"),
                                          ("Content-Length", str(len(payload)))])
    return [payload]
