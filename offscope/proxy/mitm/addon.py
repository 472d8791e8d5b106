"""The mitmproxy addon: thin hooks around the engine.

Each hook converts a flow to the engine's transport-neutral types, calls the
engine, and applies what it returns. No tagging, no metric logic here.

Works embedded (`offscope proxy`) and in a stock mitmproxy:
    mitmdump -s "$(offscope addon-path)" --set offscope_ledger=ledger.yaml
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
from collections.abc import Awaitable
from typing import Any

import structlog
from mitmproxy import ctx, http, tcp
from mitmproxy.net.http import url
from mitmproxy.proxy.mode_specs import ReverseMode

from offscope.errors import InputError
from offscope.ledgers import CompiledLedger, compile_ledger, read_grants, read_ledger
from offscope.ledgers.matcher import normalize
from offscope.policies import load_policy
from offscope.proxy.addresses import is_local, parse_listen
from offscope.proxy.bodies import RESPONSE_LIMIT, decode_body
from offscope.proxy.control import ControlServer, MetricsServer, resolve_token
from offscope.proxy.engine import EXCERPT, Engine, Exchange
from offscope.proxy.exporter import Exporter
from offscope.proxy.extract.http import MAX_PARSE, HttpRequest, HttpResponse
from offscope.proxy.gateway import Upstream, parse_gateways
from offscope.proxy.gateway import route as gateway_route
from offscope.proxy.holds import HoldRegistry
from offscope.proxy.lifecycle import Admission
from offscope.proxy.mcp_prefetch import ToolListPrefetch
from offscope.proxy.mitm.backlog import deepen_accept_queues
from offscope.proxy.otel import record_sinks as otel_sinks
from offscope.proxy.reload import policy_fields, policy_file, reload_ledger, reload_policy
from offscope.proxy.runs import (
    CREDENTIAL_HEADER,
    RunTable,
    header_credentials,
    proxy_credentials,
    run_id_from,
)
from offscope.proxy.sinks import RequestLog, TraceSink
from offscope.proxy.state_store import StoreGrants, attach_state
from offscope.proxy.websocket import WsAction, WsSession, bound_inflation, refuse_raw_upgrade

log = structlog.get_logger("offscope")
_KEY = "offscope"
_WEBSOCKET = "offscope_websocket"  # the upgrade's WsSession, for the messages that follow
_STREAMED = "offscope_streamed"  # declared body size of a request streamed uninspected
_ADMITTED = "offscope_admitted"  # the flow's Admission (requestheaders decides it once)
_REFUSED_TCP = "offscope_refused_tcp"  # a raw TCP flow offscope refused: relay nothing
# A connection's proxy credentials, kept from its CONNECT (user, password): cached,
# because the same header arrives on every request of a run.
_proxy_credentials = functools.lru_cache(maxsize=4096)(proxy_credentials)


def _headers(h: http.Headers) -> dict[str, str]:
    """Lower-case name -> value (repeats folded), in one pass over the raw fields.

    mitmproxy's `Headers.get` scans and lower-cases every field on each lookup;
    the hooks read several headers per flow, so they read this dict instead.
    """
    out: dict[str, str] = {}
    for raw_name, raw_value in h.fields:
        key = raw_name.decode("utf-8", "surrogateescape").lower()
        value = raw_value.decode("utf-8", "surrogateescape")
        out[key] = f"{out[key]}, {value}" if key in out else value
    return out


def _header(h: http.Headers, name: bytes) -> str | None:
    """`h.get(name)` for a lower-case byte name (repeats folded, as mitmproxy folds
    them), in one pass over the raw fields: a hook that reads one header need not
    go through mitmproxy's layered `Headers.get`."""
    values = [value for key, value in h.fields if key.lower() == name]
    return b", ".join(values).decode("utf-8", "surrogateescape") if values else None


def _content_headers(h: http.Headers) -> tuple[str, str]:
    """(content type, content encoding or ""), in one pass."""
    content_type, encoding = "", ""
    for raw_name, raw_value in h.fields:
        name = raw_name.lower()
        if name == b"content-type":
            content_type = raw_value.decode("utf-8", "surrogateescape")
        elif name == b"content-encoding" and raw_value.strip().lower() not in (b"", b"identity"):
            encoding = raw_value.decode("latin-1")
    return content_type, encoding


def _engine_headers(response: http.Response, content_type: str) -> dict[str, str]:
    """The response headers the engine reads: the content type, and the MCP
    session an `initialize` opened (tool surfaces are compared per client class)."""
    session = _header(response.headers, b"mcp-session-id")
    return {"content-type": content_type, **({"mcp-session-id": session} if session else {})}


def _drop_headers(h: http.Headers, names: set[bytes]) -> None:
    """Remove headers (lower-case byte names) with one rewrite of the field list."""
    h.fields = tuple(f for f in h.fields if f[0].lower() not in names)


def _host_header_mismatch(request: http.Request, headers: dict[str, str]) -> str | None:
    """The Host header (or HTTP/2 authority) when it names another host or port
    than the destination mitmproxy connects to; None when they agree.

    The destination (`request.host`/`port`: the absolute-form URL, the CONNECT
    target inside a tunnel) is what offscope tags, enforces and routes by; a
    server behind a shared address reads the Host header, so the two must agree."""
    if request.is_http2 or request.is_http3:
        authority = request.authority or headers.get("host")
    else:
        authority = headers.get("host")
    if not authority:
        return None
    host, port = _authority(authority)
    if normalize("host", host) != normalize("host", request.host):
        return authority
    if port is not None and port != request.port:
        return authority
    return None


@functools.lru_cache(maxsize=4096)  # an agent talks to a handful of hosts; parsing one costs µs
def _authority(authority: str) -> tuple[str, int | None]:
    try:
        return url.parse_authority(authority, check=False)
    except ValueError:
        return authority, None


def _declared_size(message: http.Message) -> int | None:
    value = _header(message.headers, b"content-length")
    return int(value) if value is not None and value.strip().isdigit() else None


# Plain HTTP responses larger than this, or of unknown length, stream through.
STREAM_RESPONSES_OVER = 1024 * 1024


class _Head:
    """A pass-through response stream that keeps the first bytes for the record."""

    __slots__ = ("data", "limit")

    def __init__(self, limit: int) -> None:
        self.data, self.limit = b"", limit

    def __call__(self, chunk: bytes) -> bytes:
        if len(self.data) < self.limit:
            self.data += chunk[: self.limit - len(self.data)]
        return chunk


def parse_routes(spec: str) -> dict[str, tuple[str, int]]:
    """'api.acme.test=127.0.0.1:8001,git.acme.test=127.0.0.1:8002' -> map."""
    routes: dict[str, tuple[str, int]] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        host, _, target = item.partition("=")
        addr, _, port = target.rpartition(":")
        if not host.strip(".") or not addr or not port.isdigit() or not 0 < int(port) < 65536:
            raise InputError(f"bad route {item!r}", hint="use --route HOST=127.0.0.1:PORT")
        # A fully qualified spelling (trailing dot) is the same host: route both.
        routes[host.lower().rstrip(".")] = routes[host.lower().rstrip(".") + "."] = (
            addr,
            int(port),
        )
    return routes


class OffscopeAddon:
    def __init__(self) -> None:
        self.engine: Engine | None = None
        self.exporter = Exporter()
        self.control: ControlServer | None = None
        self.started = False  # `running` has run
        self.metrics: MetricsServer | None = None
        self.control_token: str | None = None
        self.routes: dict[str, tuple[str, int]] = {}
        self.gateways: dict[str, Upstream] = {}  # gateway mode: /NAME/... -> upstream
        self.max_body = MAX_PARSE
        self._run_header = "x-offscope-run"
        self._conn_user: dict[str, tuple[str | None, str | None]] = {}
        self._upgraded: set[str] = set()  # client connections a relayed 101 switched to raw TCP
        self._stamps: dict[str, tuple[int, int] | None] = {}
        self._tasks: list[asyncio.Future] = []
        self._base: CompiledLedger | None = None  # the ledger without its grants overlay
        self.store_grants: StoreGrants | None = None  # a fleet's grants (PostgreSQL store)
        self._reload_lock = asyncio.Lock()
        self._lister: ToolListPrefetch | None = None  # tools/list fetched for unlisted calls

    # -- options and (re)configuration ------------------------------------------

    def load(self, loader: Any) -> None:
        bound_inflation()  # a compressed WebSocket message inflates within MAX_PARSE
        loader.add_option("offscope_ledger", str, "", "Target ledger file (required).")
        loader.add_option("offscope_policy", str, "shadow", "Policy file or preset name.")
        loader.add_option("offscope_trace", str, "", "Append the JSONL trace to this file.")
        loader.add_option(
            "offscope_trace_max_bytes",
            int,
            -1,
            "Rotate the trace at this size in bytes; 0 never rotates; -1: "
            "$OFFSCOPE_TRACE_MAX_BYTES, else 256 MiB.",
        )
        loader.add_option("offscope_requests", str, "", "Scope-expansion request log (JSONL).")
        loader.add_option(
            "offscope_metrics", str, "", "Serve /metrics, /healthz, /readyz on HOST:PORT."
        )
        loader.add_option(
            "offscope_control", str, "", "Serve the control API (bearer token) on HOST:PORT."
        )
        loader.add_option(
            "offscope_control_token_file",
            str,
            "",
            "File holding the control API token (else $OFFSCOPE_CONTROL_TOKEN, else generated).",
        )
        loader.add_option(
            "offscope_run_header", str, "X-Offscope-Run", "Header carrying the run id."
        )
        loader.add_option("offscope_idle_timeout", float, 300.0, "End runs idle this many seconds.")
        loader.add_option("offscope_max_runs", int, 100_000, "Most runs tracked at once.")
        loader.add_option("offscope_routes", str, "", "host=127.0.0.1:PORT,... upstream overrides.")
        loader.add_option(
            "offscope_state",
            str,
            "",
            "State store: a SQLite file (registered runs across restarts) or a postgresql:// "
            "URL (runs and a fleet's review queue); '' keeps runs in memory.",
        )
        loader.add_option(
            "offscope_instance",
            str,
            "",
            "This proxy's instance id (e.g. the pod name), stamped on every trace record.",
        )
        loader.add_option(
            "offscope_gateways",
            str,
            "",
            "NAME=URL,... upstreams served under /NAME/ on the reverse-mode listener.",
        )
        loader.add_option(
            "offscope_behavior", bool, True, "Score LLM response text (behavioral metrics)."
        )
        loader.add_option(
            "offscope_max_body",
            int,
            MAX_PARSE,
            "Largest request body (bytes) held for inspection; a larger one is refused "
            "(413) when the policy fails closed, else streamed uninspected.",
        )

    def configure(self, updated: set[str]) -> None:
        opts = ctx.options
        if "offscope_run_header" in updated:
            self._run_header = opts.offscope_run_header.lower()
        if "offscope_routes" in updated:
            self.routes = parse_routes(opts.offscope_routes)
        if "offscope_gateways" in updated:
            self.gateways = parse_gateways(opts.offscope_gateways)
        if "offscope_max_body" in updated:
            self.max_body = opts.offscope_max_body
        if self.engine is None and opts.offscope_ledger:
            self.engine = self._build()
        elif self.engine is not None and updated & {"offscope_ledger", "offscope_policy"}:
            self._tasks.append(asyncio.ensure_future(self._reload(force=True)))

    def _build(self) -> Engine:
        opts = ctx.options
        try:
            self._base = compile_ledger(read_ledger(opts.offscope_ledger), opts.offscope_ledger)
            ledger = self._base.with_grants(read_grants(opts.offscope_ledger, self._base.id))
            policy = load_policy(opts.offscope_policy)
            log.info("policy_loaded", **policy_fields(policy))
            record_sinks = otel_sinks(self.exporter)  # none unless OTEL_* asks for spans
        except InputError as exc:
            from mitmproxy.exceptions import OptionsError

            raise OptionsError(f"offscope: {exc}") from None
        self._remember_mtimes()
        listen = (opts.listen_host or "0.0.0.0", opts.listen_port or 8080)
        own_ports = {listen[1]} | {
            _split_addr(spec)[1] for spec in (opts.offscope_metrics, opts.offscope_control) if spec
        }

        def refuse(host: str, port: int | None) -> bool:
            # The agent must not reach offscope's own endpoints through the proxy,
            # however it spells this machine's address.
            return port in own_ports and is_local(host)

        self.exporter.ensure_ledger(ledger.id)
        engine = Engine(
            ledger,
            policy,
            trace=TraceSink(
                opts.offscope_trace or None,
                max_bytes=opts.offscope_trace_max_bytes
                if opts.offscope_trace_max_bytes >= 0
                else None,
                extra=record_sinks,
                sidecar=opts.offscope_instance or None,
            ),
            requests=RequestLog(opts.offscope_requests or None, opts.offscope_instance or None),
            exporter=self.exporter,
            runs=RunTable(opts.offscope_max_runs, opts.offscope_idle_timeout),
            refuse=refuse,
            behavior=_behavior_scorer() if opts.offscope_behavior else None,
            holds=HoldRegistry(
                opts.offscope_requests or None, on_webhook_failure=self.exporter.webhook_failed
            ),
        )
        if opts.offscope_state:  # runs survive a restart; a fleet's review queue (state_store.py)
            try:
                review = attach_state(engine, opts.offscope_state, self.exporter)
            except InputError as exc:
                from mitmproxy.exceptions import OptionsError

                raise OptionsError(f"offscope: {exc}") from None
            if review is not None:
                self.store_grants = StoreGrants(
                    review, ledger.id, lambda: self.exporter.state_failed("read")
                )
                if self.store_grants.refresh():
                    engine.ledger = ledger.with_grants(self.store_grants.grants)
        return engine

    def _files(self) -> list[tuple[str, str]]:
        from offscope.ledgers import grants_path

        opts = ctx.options
        # A new grant (offscope requests approve) is applied to the ledger it extends.
        files = [
            ("ledger", opts.offscope_ledger),
            ("grants", str(grants_path(opts.offscope_ledger))),
        ]
        if (policy := policy_file(opts.offscope_policy)) is not None:  # a preset never changes
            files.append(("policy", policy))
        return files

    @staticmethod
    def _stamp(path: str) -> tuple[int, int] | None:
        """The file's version; None while it does not exist."""
        # stat() follows symlinks: a Kubernetes ConfigMap update swaps the `..data`
        # link, which shows up as a new inode even when mtimes collide.
        try:
            st = os.stat(path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_ino

    def _remember_mtimes(self) -> None:
        for _, path in self._files():
            self._stamps[path] = self._stamp(path)

    def _changed(self) -> set[str]:
        """Kinds of file changed (or appeared, or went away) since last looked.
        Each change is seen once: a deleted ledger is one failed reload, not
        one a second."""
        changed = set()
        for kind, path in self._files():
            stamp = self._stamp(path)
            if path not in self._stamps or self._stamps[path] != stamp:
                self._stamps[path] = stamp
                changed.add(kind)
        return changed

    async def _reload(self, force: bool = False) -> None:
        """Swap in changed ledger, grants and policy files, read and compiled off
        the event loop (offscope/proxy/reload.py); a bad file keeps the old one
        in force and counts one failure per change."""
        async with self._reload_lock:
            assert self.engine is not None
            changed = self._changed()
            if self.store_grants is not None and await asyncio.to_thread(self.store_grants.refresh):
                changed.add("grants")
            if force:
                changed |= {"ledger", "policy"}
            if changed & {"ledger", "grants"}:
                await self._reload_ledger(full="ledger" in changed)
            if "policy" in changed:
                await self._reload_policy()

    async def _reload_ledger(self, full: bool) -> None:
        assert self.engine is not None
        path = ctx.options.offscope_ledger
        try:
            base, ledger = await reload_ledger(path, None if full else self._base)
        except Exception as exc:  # any failure keeps the old ledger, and is counted
            self.exporter.reload_failed("ledger")
            log.error(
                "reload_rejected", file="ledger", path=path, error=str(exc), kept="previous version"
            )
            return
        self._base = base
        if self.store_grants is not None:
            ledger = ledger.with_grants(self.store_grants.grants)
        self.exporter.ensure_ledger(ledger.id)
        self.engine.ledger = ledger  # one assignment: a flow keeps the ledger it began with
        log.info("reloaded", file="ledger" if full else "grants", path=path, ledger=ledger.id)

    async def _reload_policy(self) -> None:
        assert self.engine is not None
        spec = ctx.options.offscope_policy
        try:
            policy = await reload_policy(spec)
        except Exception as exc:
            self.exporter.reload_failed("policy")
            log.error(
                "reload_rejected", file="policy", path=spec, error=str(exc), kept="previous version"
            )
            return
        self.engine.policy = policy
        log.info("reloaded", file="policy", path=spec, **policy_fields(policy))

    # -- lifecycle --------------------------------------------------------------

    def running(self) -> None:
        # mitmproxy's listeners are bound by now (offscope/proxy/mitm/backlog.py says why).
        deepen_accept_queues(ctx.master.addons.get("proxyserver"))
        if self.engine is None:
            log.error("no_ledger", hint="set offscope_ledger")
            return
        opts = ctx.options
        if opts.offscope_control:
            from offscope.proxy import STATE_DIR

            # A generated token goes to the state directory, where `offscope runs` looks.
            self.control_token, _ = resolve_token(opts.offscope_control_token_file, STATE_DIR)
            self.control = ControlServer(
                *_split_addr(opts.offscope_control),
                self.engine,
                asyncio.get_running_loop(),
                self.control_token,
            )
            self.control.ledger_path = opts.offscope_ledger
            self.control.start()
        # /readyz is on this listener: started last, a "ready" sidecar's control API already
        # takes connections (a harness or an orchestrator may call it the moment it is ready).
        if opts.offscope_metrics:
            self.metrics = MetricsServer(
                *_split_addr(opts.offscope_metrics), self.exporter, self.engine
            )
            self.metrics.start()
        self._tasks.append(asyncio.ensure_future(self._housekeeping()))
        self.started = True  # the metrics and control listeners exist (an embedder waits for it)

    async def _housekeeping(self) -> None:
        reloading: asyncio.Future | None = None
        while True:
            await asyncio.sleep(1.0)
            try:
                if self.engine is None:
                    continue
                # A long reload (a huge ledger) runs beside the sweeps, not before them.
                if reloading is None or reloading.done():
                    reloading = asyncio.ensure_future(self._reload())
                self.engine.sweep()
            except Exception as exc:  # housekeeping must never stop
                log.error("housekeeping_error", error=str(exc))

    def done(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self.engine:
            for run_id in self.engine.runs.ids():
                self.engine.end_run(run_id, "exit", detail="proxy stopped")
            if self.engine.holds is not None:
                self.engine.holds.close()  # when not drained first (an embedded proxy)
            self.engine.close()
        listeners = [listener for listener in (self.control, self.metrics) if listener]
        for listener in listeners:  # both wind down at once, then each is waited for
            listener.request_stop()
        for listener in listeners:
            listener.stop()

    # -- flows ----------------------------------------------------------------------

    def http_connect(self, flow: http.HTTPFlow) -> None:
        user, password = _proxy_credentials(flow.request.headers.get("proxy-authorization"))
        if user:
            self._conn_user[flow.client_conn.id] = (user, password)
            del flow.request.headers["proxy-authorization"]

    def client_disconnected(self, client: Any) -> None:
        self._conn_user.pop(client.id, None)
        self._upgraded.discard(client.id)

    def _run_of(self, flow: http.HTTPFlow, headers: dict[str, str]) -> str:
        """The flow's run id (offscope/proxy/lifecycle.py `admit`: a valid run
        credential decides); drops the proxy credentials, the credential header
        and the run header, which never travel upstream. A refused flow keeps
        its Admission in the flow's metadata (see `_refused`)."""
        admitted: Admission | None = flow.metadata.get(_ADMITTED)
        if admitted is not None:
            return admitted.run
        assert self.engine is not None
        proxy_auth = headers.pop("proxy-authorization", None)
        user, password = (
            _proxy_credentials(proxy_auth)
            if proxy_auth
            else self._conn_user.get(flow.client_conn.id, (None, None))
        )
        if isinstance(flow.metadata.get("proxyauth"), tuple):
            user = user or flow.metadata["proxyauth"][0]
        cred_header = headers.pop(CREDENTIAL_HEADER, None)
        run_header = self._run_header
        peer = flow.client_conn.peername[0] if flow.client_conn.peername else None
        claimed = run_id_from(user, headers, run_header, peer)
        hdr_run, hdr_credential = header_credentials(cred_header)
        if cred_header is not None:
            admitted = self.engine.admit(claimed, hdr_run, hdr_credential, explicit=True)
        else:
            admitted = self.engine.admit(claimed, user, password)
        if proxy_auth is not None or cred_header is not None or run_header in headers:
            _drop_headers(
                flow.request.headers,
                {b"proxy-authorization", CREDENTIAL_HEADER.encode(), run_header.encode()},
            )
        flow.metadata[_ADMITTED] = admitted
        return admitted.run

    @staticmethod
    def _refused(flow: http.HTTPFlow) -> bool:
        """Answer a flow refused at admission (no valid run credential): 407."""
        admitted: Admission | None = flow.metadata.get(_ADMITTED)
        if admitted is None or admitted.status is None:
            return False
        flow.response = http.Response.make(
            admitted.status,
            json.dumps(admitted.body, sort_keys=True).encode(),
            {"content-type": "application/json", "proxy-authenticate": 'Basic realm="offscope"'},
        )
        return True

    def _request_view(
        self, request: http.Request, headers: dict[str, str], body: bytes
    ) -> HttpRequest:
        return HttpRequest(
            method=request.method,
            host=request.host,
            path=request.path,
            scheme=request.scheme,
            port=request.port,
            headers=headers,
            body=body,
            host_header=_host_header_mismatch(request, headers),
        )

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        """Hold every request body for inspection (mitmproxy streams large ones
        by default); a body declared larger than offscope inspects is refused
        when the run's policy fails closed, else streamed and recorded as uninspected."""
        request = flow.request
        if self.engine is None or flow.response is not None:
            return
        # Gateway mode only: a stock mitmdump's own reverse mode (`--mode reverse:URL`) with
        # the addon loaded and no --gateway keeps forwarding where mitmproxy sends it.
        if (
            self.gateways
            and isinstance(flow.client_conn.proxy_mode, ReverseMode)
            and not self._to_upstream(flow)
        ):
            return
        size = _declared_size(request)
        # With stream_large_bodies set (a stock mitmdump), mitmproxy streams a chunked
        # body once it passes that size, before offscope could read it.
        chunked = (
            size is None
            and "chunked" in (_header(request.headers, b"transfer-encoding") or "").lower()
            and bool(ctx.options.stream_large_bodies)  # an option read costs a deepcopy
        )
        if not chunked and (size is None or size <= self.max_body):
            request.stream = False
            return
        headers = _headers(request.headers)
        run_id = self._run_of(flow, headers)
        if self._refused(flow):
            request.stream = False
            return
        if not self.engine.policy_for(run_id).policy.fail_closed:
            if not chunked:
                request.stream = True
                flow.metadata[_STREAMED] = (size, run_id, self._request_view(request, headers, b""))
                self._route(request, run_id)  # it connects before the request hook runs
            return
        request.stream = False  # a refused body is read and dropped; nothing goes upstream
        ex, _ = self.engine.begin(
            self._request_view(request, headers, b""),
            run_id,
            oversize=size,
            length_required=chunked,
        )
        if ex.synthetic is not None:
            flow.response = http.Response.make(
                ex.synthetic.status, ex.synthetic.body, ex.synthetic.headers
            )

    def _to_upstream(self, flow: http.HTTPFlow) -> bool:
        """Gateway mode (offscope/proxy/gateway.py): rewrite a request that arrived on
        the reverse-mode listener into the request for the upstream its path names;
        a path naming no upstream is answered 404 (False)."""
        found = gateway_route(self.gateways, flow.request.path)
        if found is None:
            names = ", ".join(f"/{name}/" for name in sorted(self.gateways)) or "none"
            flow.response = http.Response.make(
                404,
                json.dumps(
                    {
                        "error": "offscope_gateway_unknown",
                        "message": f"no upstream is served at this path; gateways: {names}",
                    }
                ).encode(),
                {"content-type": "application/json"},
            )
            return False
        upstream, path, credential = found
        request = flow.request
        request.scheme, request.host, request.port = upstream.scheme, upstream.host, upstream.port
        request.path = path
        request.headers["host"] = upstream.host_header
        if credential is not None:  # read (and dropped) as the run-credential header is
            request.headers[CREDENTIAL_HEADER] = credential
        return True

    def request(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        # Synchronous, so that a flow costs no coroutine; a timeout operator reply
        # returns the wait for mitmproxy to await before the reply is sent.
        if self.engine is None or flow.response is not None:
            return None
        engine = self.engine
        request = flow.request
        streamed: int | None = None
        if _STREAMED in flow.metadata:  # seen (and routed) in requestheaders
            streamed, run_id, req = flow.metadata.pop(_STREAMED)
            headers = req.headers
        else:
            headers = _headers(request.headers)
            run_id = self._run_of(flow, headers)
            if self._refused(flow):
                return None
            if request.stream:  # streamed by another addon or option
                streamed = _declared_size(request) or 0
            body = b"" if streamed is not None else request.raw_content or b""
            oversize = len(body) if len(body) > self.max_body else None
            req = self._request_view(request, headers, b"" if oversize is not None else body)
        oversize = streamed if streamed is not None else oversize
        if (
            streamed is None
            and oversize is None
            and (asked := self._prefetch(engine).wanted(req, engine.ledger))
        ):
            return self._after_prefetch(flow, req, run_id, headers, *asked)
        return self._begin(flow, req, run_id, headers, oversize, streamed)

    def _prefetch(self, engine: Engine) -> ToolListPrefetch:
        if self._lister is None or self._lister.tools is not engine.tools:
            self._lister = ToolListPrefetch(engine.tools, verify=not ctx.options.ssl_insecure)
        return self._lister

    async def _after_prefetch(
        self,
        flow: http.HTTPFlow,
        req: HttpRequest,
        run_id: str,
        headers: dict[str, str],
        server: str,
        session: str | None,
    ) -> None:
        """A tools/call for a tool whose list offscope has not seen: learn the server's
        annotations first (offscope/proxy/mcp_prefetch.py), then decide as usual."""
        assert self.engine is not None
        route = self.routes.get(normalize("host", req.host)) if self.routes else None
        await self._prefetch(self.engine).fetch(req, route, server, session)
        wait = self._begin(flow, req, run_id, headers, None, None)
        if wait is not None:
            await wait

    def _begin(
        self,
        flow: http.HTTPFlow,
        req: HttpRequest,
        run_id: str,
        headers: dict[str, str],
        oversize: int | None,
        streamed: int | None,
    ) -> Awaitable[None] | None:
        """Decide the request (the engine) and apply the decision to the flow."""
        assert self.engine is not None
        engine = self.engine
        try:
            ex, delay = engine.begin(req, run_id, oversize=oversize, streamed=streamed is not None)
        except Exception as exc:
            log.exception("flow_failed", run=run_id, error=str(exc))
            closed = engine.policy_for(run_id).policy.fail_closed  # fail closed/open per the policy
            engine.failed(req, run_id, f"{type(exc).__name__}: {exc}", forwarded=not closed)
            if closed:
                flow.response = http.Response.make(
                    503,
                    b'{"error":"offscope_error","message":"offscope could not check this call; '
                    b'failing closed"}',
                    {"content-type": "application/json"},
                )
            return None
        flow.metadata[_KEY] = ex
        if ex.held:  # parked until a human decides (policy on_out_of_scope: hold)
            return self._after_hold(flow, ex, headers, streamed is None)
        return self._apply(flow, ex, headers, streamed is None, delay)

    async def _after_hold(
        self, flow: http.HTTPFlow, ex: Exchange, headers: dict[str, str], route: bool
    ) -> None:
        """Wait for the held calls' decisions without holding up the event loop,
        then forward the request (approved) or answer it (denied, timed out)."""
        assert self.engine is not None
        try:
            await self.engine.settle(ex)
        except Exception as exc:  # a failure while waiting refuses the call: it was out of scope
            log.exception("hold_failed", run=ex.run, error=str(exc))
            flow.response = http.Response.make(
                503,
                b'{"error":"offscope_error","message":"offscope could not settle a held call"}',
                {"content-type": "application/json"},
            )
            return
        self._apply(flow, ex, headers, route, 0.0)

    def _apply(
        self, flow: http.HTTPFlow, ex: Exchange, headers: dict[str, str], route: bool, delay: float
    ) -> Awaitable[None] | None:
        """Apply the engine's decision to the flow: answer it, or forward it (rewritten, routed)."""
        request = flow.request
        wait = asyncio.sleep(delay) if delay else None
        if ex.synthetic is not None:  # offscope answers: nothing goes upstream
            flow.response = http.Response.make(
                ex.synthetic.status, ex.synthetic.body, ex.synthetic.headers
            )
            return wait
        if ex.new_body is not None:
            flow.request.content = ex.new_body
        marker = ex.ledger.ledger.humans.llm_header
        if marker and marker.lower() in headers:  # the harness's secret stays here
            _drop_headers(request.headers, {marker.lower().encode()})
        if (
            "upgrade" in headers and self.engine is not None
        ):  # any value: mitmproxy asks the response
            flow.metadata[_WEBSOCKET] = WsSession(self.engine, ex)
        if route:  # a streamed request was routed before its body went
            self._route(request, ex.run)
        return wait

    def _route(self, request: http.Request, run_id: str) -> None:
        """Send a request for a routed host (--route) to its loopback address."""
        route = self.routes.get(normalize("host", request.host)) if self.routes else None
        if route:
            destination = normalize("host", request.host)  # punycode, as a client sends it
            request.scheme, request.host, request.port = "http", route[0], route[1]
            request.headers["host"] = destination
            # Fixture worlds keep per-run state; tell them whose request this is.
            request.headers["x-offscope-fixture-run"] = run_id

    def websocket_message(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        """A whole message (mitmproxy reassembles fragments and inflates
        permessage-deflate first) goes to the socket's WsSession
        (offscope/proxy/websocket.py); a refused one is dropped and the client
        gets offscope's answer as a text message."""
        if self.engine is None or flow.websocket is None:
            return None
        message = flow.websocket.messages[-1]
        session: WsSession | None = flow.metadata.get(_WEBSOCKET)
        if not message.from_client:
            if session is not None and not message.injected:
                try:
                    session.from_server(message.content)
                except Exception as exc:  # the answer goes to the agent all the same
                    log.exception("response_record_failed", run=session.run, error=str(exc))
            return None
        if session is None:  # a socket whose upgrade offscope did not see through: not inspected
            log.error("websocket_without_upgrade", host=flow.request.host)
            if self.engine.policy.policy.fail_closed:
                message.drop()
            return None
        try:
            action = session.from_client(message.content, message.is_text)
        except Exception as exc:
            log.exception("frame_failed", run=session.run, error=str(exc))
            action = _frame_failed(session, exc)
        if action.forward:
            return asyncio.sleep(action.delay) if action.delay else None
        message.drop()
        if action.reply is None:
            return None
        if action.delay:
            return self._reply_later(flow, action.reply, action.delay)
        ctx.master.commands.call("inject.websocket", flow, True, action.reply, True)
        return None

    @staticmethod
    async def _reply_later(flow: http.HTTPFlow, reply: bytes, delay: float) -> None:
        await asyncio.sleep(delay)  # the operator-reply wait (timeout-then-continue)
        ctx.master.commands.call("inject.websocket", flow, True, reply, True)

    def websocket_end(self, flow: http.HTTPFlow) -> None:
        session: WsSession | None = flow.metadata.pop(_WEBSOCKET, None)
        if session is None or flow.websocket is None:
            return
        session.closed(flow.websocket.close_code, bool(flow.websocket.closed_by_client))

    def tcp_start(self, flow: tcp.TCPFlow) -> None:
        """Raw TCP (a tunnel carrying neither TLS nor HTTP) cannot be read: the
        engine decides it (raw_stream); a refused one never connects upstream."""
        if self.engine is None:
            return
        if flow.client_conn.id in self._upgraded:  # after a 101: recorded with its upgrade
            self._upgraded.discard(flow.client_conn.id)
            return
        user, password = self._conn_user.get(flow.client_conn.id, (None, None))
        peer = flow.client_conn.peername[0] if flow.client_conn.peername else None
        admitted = self.engine.admit(run_id_from(user, {}, self._run_header, peer), user, password)
        host, port = flow.server_conn.address or ("", None)
        try:
            refused = (
                self.engine.raw_stream(admitted.run, host, port) or admitted.status is not None
            )
        except Exception as exc:
            log.exception("flow_failed", run=admitted.run, error=str(exc))
            refused = self.engine.policy_for(admitted.run).policy.fail_closed
        if refused:
            flow.metadata[_REFUSED_TCP] = True
            flow.server_conn.error = "offscope: raw TCP is not inspected"  # never connects

    def tcp_message(self, flow: tcp.TCPFlow) -> None:
        if flow.metadata.get(_REFUSED_TCP):  # connected already (an eager strategy)
            flow.messages[-1].content = b""

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        ex: Exchange | None = flow.metadata.get(_KEY)
        if self.engine is None or ex is None or ex.done or flow.response is None:
            return
        if not ex.may_stream:
            # Plain HTTP: the record keeps only the start of the body, so a large or
            # open-ended one streams through (mitmproxy's stream_large_bodies is off:
            # it would also stream request bodies before offscope read them).
            size = _declared_size(flow.response)
            if size is None or size > STREAM_RESPONSES_OVER:
                flow.response.stream = _Head(EXCERPT)
            return
        try:
            # Only the content type decides streaming: don't convert every header per flow.
            content_type, _ = _content_headers(flow.response.headers)
            callback = self.engine.stream_for(
                ex, flow.response.status_code, {"content-type": content_type}
            )
            if callback is None and "text/event-stream" in content_type:
                callback = _Head(EXCERPT)  # an event stream is never held back, parsed or not
        except Exception as exc:
            log.error("stream_setup_failed", error=str(exc))
            return
        if callback is not None:
            flow.response.stream = callback

    def response(self, flow: http.HTTPFlow) -> None:
        # Detach the exchange: mitmproxy's flows are freed by the cycle collector,
        # and per-flow state left on them makes every collection longer.
        ex: Exchange | None = flow.metadata.pop(_KEY, None)
        response = flow.response
        if self.engine is None or ex is None or ex.done or response is None:
            return
        if response.status_code == 101 and flow.websocket is None:  # raw bytes would follow
            refused = refuse_raw_upgrade(self.engine, ex)
            if refused is not None:
                flow.response = http.Response.make(refused.status, refused.body, refused.headers)
                flow.metadata.pop(_WEBSOCKET, None)
                return
            self._upgraded.add(flow.client_conn.id)  # its TCP stream is this call's (tcp_start)
        content_type, encoding = _content_headers(response.headers)
        body, notes = b"", list[str]()
        if isinstance(response.stream, _Head):  # streamed through: its start was kept
            body = response.stream.data
        elif not response.stream:
            body = response.raw_content or b""
        if body and encoding:
            body, notes = _decoded(body, encoding, ex.kind)
        if body and not response.stream:
            try:
                filtered = self.engine.filter_listed(
                    ex, body
                )  # policy filter_tools: a tools/list result
            except Exception as exc:  # the list goes to the agent as the server sent it
                log.exception("tool_filter_failed", error=str(exc))
                filtered = None
            if filtered is not None:
                response.content = filtered  # re-encoded as the server encoded it
        # The engine reads only the content type of a response: don't copy every header.
        resp = HttpResponse(
            response.status_code, _engine_headers(response, content_type), body, notes
        )
        try:
            self.engine.response_soon(ex, resp)  # after mitmproxy has sent the response
        except Exception as exc:
            log.exception("response_record_failed", error=str(exc))

    def error(self, flow: http.HTTPFlow) -> None:
        self._record_error(flow, str(flow.error))

    def abandon(self, flow: http.HTTPFlow) -> None:
        """Record a flow still open when the proxy stops (offscope/proxy/mitm/drain.py)."""
        self._record_error(flow, "proxy stopped before the response completed")

    def _record_error(self, flow: http.HTTPFlow, message: str) -> None:
        ex: Exchange | None = flow.metadata.pop(_KEY, None)
        if self.engine is None or ex is None or ex.done:
            return
        # A streamed response the client stopped reading (an MCP client closes the
        # SSE stream once it has its result): the agent did receive the status.
        resp = None
        if flow.response is not None:
            content_type, _ = _content_headers(flow.response.headers)
            resp = HttpResponse(
                flow.response.status_code, _engine_headers(flow.response, content_type), b""
            )
        try:
            self.engine.response_soon(ex, resp, error=message)  # in order with responses
        except Exception as exc:
            log.exception("error_record_failed", error=str(exc))


def _frame_failed(session: WsSession, exc: Exception) -> WsAction:
    """What to do with a message whose handling raised (an exception out of
    the hook would let mitmproxy forward it)."""
    try:
        return session.failed(f"{type(exc).__name__}: {exc}")
    except Exception:  # not even recorded: dropped, whatever the policy
        log.exception("frame_failed", run=session.run, error=str(exc))
        return WsAction(forward=False)


def _decoded(raw: bytes, encoding: str, kind: str) -> tuple[bytes, list[str]]:
    """The part of a compressed response body the engine reads, decoded within
    a bound (offscope/proxy/bodies.py): the excerpt of a plain HTTP response,
    the whole of one it parses (MCP, LLM, operator) up to RESPONSE_LIMIT. A
    body it must parse whole but cannot is noted, not decoded in full."""
    whole = kind != "http"
    decoded = decode_body(raw, encoding, RESPONSE_LIMIT if whole else EXCERPT)
    notes = [decoded.note] if decoded.note else []
    if whole and not decoded.complete:
        return b"", [
            *notes,
            f"response body not parsed: over {RESPONSE_LIMIT} bytes once decoded ({encoding})",
        ]
    return decoded.body, notes


def _split_addr(spec: str) -> tuple[str, int]:
    return parse_listen(spec, "address")


def _behavior_scorer():
    """Coherence, decisiveness and word count of LLM text: the same definition
    `offscope rescore` uses (offscope/behavior/scoring.py), default rule set."""
    from offscope.behavior.rules import default_rules
    from offscope.behavior.scoring import score_response

    rules = default_rules()

    def score(text: str) -> tuple[float | None, float | None, int]:
        s = score_response(text, rules)
        return s.coherence_score, s.decisiveness, s.word_count

    return score
