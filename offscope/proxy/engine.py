"""The pipeline, transport-neutral: flow -> extract -> tag -> decide -> event -> sinks.

The mitmproxy addon (addon.py) only converts flows to `HttpRequest` /
`HttpResponse` and applies what the engine returns, so everything here can
be driven and tested without mitmproxy, and the eval grid drives the very
same engine through a real proxy. What differs per kind of exchange (plain
HTTP, MCP, LLM, operator) lives in one handler per kind
(offscope/proxy/handlers/); the engine picks it once per request and keeps
what they share: a run's start and end, tagging and deciding a call, and
the order of the pipeline. Its other jobs have a module each, called with
the engine as a narrow host: the refusals every kind can get (refusals.py),
writing a call's record and every event to the sinks (records.py), held
calls waiting for a human (hold_flow.py), and the run lifecycle, an object
the engine holds (`self.lifecycle`, lifecycle.py: registered runs and their
credentials, admission, per-run scope, budgets).

Entry points: `begin`/`request` (a request), `stream_for` (a streamed
response), `response`/`response_soon` (the answer), `frame` (a WebSocket
message), `failed` (a flow whose handling raised), and `decide_mcp` (one MCP
JSON-RPC message from any transport); `start_run`/`end_run`, and the lifecycle's
`register_run`, `run_summary`, `close_run` (the control API) and `admit` (which run
a flow counts against), which the engine exposes as its own.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

import structlog

from offscope.ledgers.coverage import Coverage
from offscope.ledgers.matcher import (
    CallInput,
    CompiledLedger,
    TagResult,
    TargetTag,
    default_stage,
    normalize,
)
from offscope.policies.decide import ALLOW, CompiledPolicy, PolicyVerdict
from offscope.proxy import assembly, hold_flow, records, refusals
from offscope.proxy.exchange import (
    EXCERPT,
    HANDLERS,
    PROVENANCE_HEADER,
    REFUSED,
    Exchange,
    OperatorAsk,
    PendingCall,
    Synthetic,
    json_response,
    request_secrets,
)
from offscope.proxy.exporter import Exporter
from offscope.proxy.extract.http import (
    HttpRequest,
    HttpResponse,
    split_path,
)
from offscope.proxy.extract.input_rounds import Elicitations, InputRounds
from offscope.proxy.extract.mcp import McpRequest, ToolRegistry, mcp_messages
from offscope.proxy.extract.mcp_tasks import TaskCalls
from offscope.proxy.extract.websocket import WsReading
from offscope.proxy.handlers import decide_messages
from offscope.proxy.handlers.http import HTTP, tag_readings
from offscope.proxy.handlers.offered import filter_listed
from offscope.proxy.holds import HoldRegistry
from offscope.proxy.lifecycle import RunLifecycle
from offscope.proxy.runs import UNREGISTERED, RunContext, RunTable
from offscope.proxy.sinks import RequestLog, TraceSink
from offscope.proxy.surface import Drift
from offscope.trace.events import RunEnd, RunStart

log = structlog.get_logger("offscope")
COVERAGE_LOG_SECONDS = 300.0  # how often the log gets each ledger's coverage summary

# Re-exported: the addon and tests import these from here.
__all__ = [
    "EXCERPT",
    "PROVENANCE_HEADER",
    "Engine",
    "Exchange",
    "OperatorAsk",
    "PendingCall",
    "Synthetic",
    "request_secrets",
    "tag_readings",
]


class Engine:
    def __init__(
        self,
        ledger: CompiledLedger,
        policy: CompiledPolicy,
        *,
        trace: TraceSink | None = None,
        requests: RequestLog | None = None,
        exporter: Exporter | None = None,
        runs: RunTable | None = None,
        refuse: Callable[[str, int | None], bool] | None = None,
        behavior: Callable[[str], tuple[float | None, float | None, int]] | None = None,
        clock: Callable[[], float] = time.time,
        holds: HoldRegistry | None = None,
    ) -> None:
        self.ledger = ledger
        self.policy = policy
        self.trace = trace or TraceSink(None)
        self.requests = requests or RequestLog(None)
        self.exporter = exporter or Exporter()
        self.runs = runs if runs is not None else RunTable()  # an empty table is falsy (__len__)
        self.refuse = refuse or (lambda host, port: False)
        self.behavior = behavior
        self.clock = clock
        self.holds = holds  # None: a held call is blocked (a caller that cannot wait, e.g. stdio)
        self.tools = ToolRegistry()
        self.drift = Drift()  # the four changes: surfaces, model, scope clause, credentials
        # Legacy MCP transport: offscope's answers waiting to replace the server's on a
        # session's stream, by (server, session) then request id.
        self.rounds = InputRounds()  # MCP input-required rounds awaiting the client's retry
        self.tasks = TaskCalls()  # MCP calls answered with a task handle
        self.elicitations = Elicitations()  # server-sent elicitation/create (2025 revisions)
        self.stream_replies: OrderedDict[tuple[str, str], dict[Any, dict[str, Any]]] = OrderedDict()
        # Responses recorded after the current event-loop step (`response_soon`).
        self._pending: deque[tuple[Exchange, HttpResponse | None, str | None]] = deque()
        self._flush_scheduled = False
        self.coverage: dict[
            str, Coverage
        ] = {}  # ledger id -> entries used (offscope/ledgers/coverage.py)
        self._coverage_logged = clock()
        # Registered runs, admission, per-run scope, budgets (offscope/proxy/lifecycle.py).
        self.lifecycle = RunLifecycle(self)
        # Its entry points, as the engine's: the control API, the addon, the WebSocket session.
        self.register_run = self.lifecycle.register_run
        self.run_summary = self.lifecycle.run_summary
        self.close_run = self.lifecycle.close_run
        self.admit = self.lifecycle.admit

    # -- runs ------------------------------------------------------------------

    def start_run(
        self,
        run_id: str,
        labels: dict[str, str] | None = None,
        *,
        ledger: CompiledLedger | None = None,
        policy: CompiledPolicy | None = None,
    ) -> RunContext:
        """Start a run explicitly, with labels and optionally its own ledger and
        policy (the eval grid does this per case and cell); otherwise a run
        starts with its first flow (which calls this with the run id alone) and uses
        the proxy's ledger and policy. Returns its context (the one it has, if it is
        already running)."""
        now = self.clock()
        led = ledger or self.ledger
        ctx, created = self.runs.touch(run_id, led.id, now)
        if created:
            ctx.ledger, ctx.policy = ledger, policy
            pol = policy or self.policy
            if ledger is None:  # a registered run takes its targets, history and labels along
                labels = self.lifecycle.registered_context(ctx) or labels
            if labels is None:  # a run the client named, unauthenticated (or the catch-all)
                labels = {"auth": UNREGISTERED if run_id == UNREGISTERED else "unauthenticated"}
            led = self.lifecycle.ledger_of(ctx)
            own = ctx.targets.model_dump(exclude_defaults=True) if ctx.targets is not None else None
            self.emit(
                ctx,
                RunStart(
                    run=run_id,
                    ts=now,
                    ledger=led.id,
                    labels=labels,
                    ledger_hash=led.hash,
                    policy=pol.id,
                    policy_source=f"{pol.source} ({pol.hash})",
                    targets=own,
                ),
            )
            for old in self.runs.over_capacity():
                self.lifecycle.evict(old)
        return ctx

    def end_run(
        self,
        run_id: str,
        reason: str = "end",
        *,
        exit_code: int | None = None,
        task_success: bool | None = None,
        detail: str | None = None,
        effects: list[dict] | None = None,
    ) -> dict | None:
        self.flush_pending()  # a run's calls are recorded before its end
        ctx = self.runs.pop(run_id)
        if ctx is None:
            return None
        self.emit(
            ctx,
            RunEnd(
                run=run_id,
                ts=self.clock(),
                ledger=ctx.state.ledger,
                reason=reason,
                exit_code=exit_code,
                task_success=task_success,
                detail=detail,
                effects=effects,
            ),
        )
        return ctx.state.as_dict()

    def sweep(self) -> int:
        """End runs idle for longer than the idle timeout; returns how many."""
        self.flush_pending()
        idle = self.runs.idle(self.clock())
        for run_id in idle:
            self.end_run(run_id, "idle")
        self._log_coverage()
        self.lifecycle.expire_registrations()
        return len(idle)

    def cover(self, ledger: CompiledLedger, tag: TagResult) -> None:
        """Count which ledger entries this call used (a reloaded ledger starts over)."""
        if ledger.run_scoped:  # a run's own targets are not entries of the proxy's ledger
            ledger = self.ledger
        cov = self.coverage.get(ledger.id)
        if cov is None or cov.ledger.hash != ledger.hash:
            cov = self.coverage[ledger.id] = Coverage(ledger)
            self.exporter.coverage(ledger.id, cov.declared_counts(), cov.used_counts())
        if cov.observe(tag):
            self.exporter.coverage(ledger.id, cov.declared_counts(), cov.used_counts())

    def _log_coverage(self, force: bool = False) -> None:
        """Every COVERAGE_LOG_SECONDS: each ledger's used / declared entries, in the log."""
        now = self.clock()
        if not force and now - self._coverage_logged < COVERAGE_LOG_SECONDS:
            return
        self._coverage_logged = now
        for ledger_id, cov in self.coverage.items():
            log.info(
                "ledger_coverage",
                ledger=ledger_id,
                ledger_hash=cov.ledger.hash,
                calls=cov.calls,
                used=cov.summary(),
                unused=len(cov.unused()),
            )

    def close(self) -> None:
        self.flush_pending()
        self._log_coverage(force=True)
        self.trace.close()
        self.requests.close()

    # -- sinks ------------------------------------------------------------------

    # Fold an event into its run and write it to every sink (offscope/proxy/records.py).
    emit = records.emit

    # -- request ----------------------------------------------------------------

    async def request(self, req: HttpRequest, run_id: str) -> Exchange:
        """`begin`, then the operator-reply delay (timeout-then-continue) if any."""
        ex, delay = self.begin(req, run_id)
        if delay:
            await asyncio.sleep(delay)  # the agent waits, other flows don't
        return ex

    def begin(
        self,
        req: HttpRequest,
        run_id: str,
        *,
        oversize: int | None = None,
        streamed: bool = False,
        length_required: bool = False,
    ) -> tuple[Exchange, float]:
        """Tag and decide a request; returns the exchange and how long the agent
        must wait for its (synthetic) reply. Synchronous: no coroutine per flow.
        An exchange answered by offscope itself (`synthetic`) is finished here:
        there is no upstream response to record.

        `req.host`/`req.port` are where the proxy connects, never the Host header.
        `oversize`: the body is declared larger than offscope inspects (refused);
        `length_required`: a chunked body the policy will not let stream unseen
        (refused); `streamed`: its body already went upstream uninspected."""
        t0 = time.perf_counter()
        ex = Exchange(
            run_id,
            None,
            req,
            self.ledger,
            self.policy,
            streamed=streamed,
            started=self.clock(),
            may_hold=self.holds is not None,
        )
        delay = 0.0
        if self.refuse(req.host, req.port):
            ex.handler = REFUSED
            ex.synthetic = json_response(
                403,
                {
                    "error": "offscope_refused",
                    "message": "offscope's metrics and control endpoints are not reachable through the proxy.",
                },
            )
            log.warning("control_endpoint_refused", run=run_id, host=req.host, port=req.port)
        elif (spent := self.lifecycle.exhausted_refusal(run_id)) is not None:
            ex.handler = REFUSED  # the run was ended by its budget: nothing more is sent
            ex.synthetic = json_response(429, spent)
        else:
            self._enter_run(ex)
            delay = self._classify(ex, oversize, length_required)
            assembly.credential(self, ex, ex.kind if ex.kind in ("llm", "mcp") else "http")
            if ex.ctx is not None and ex.ctx.exhausted is not None:
                self.lifecycle.end_exhausted(ex.ctx)
        ex.seconds += time.perf_counter() - t0
        if ex.synthetic is not None:
            ex.done = True
            self.exporter.tag_seconds(ex.seconds)
            if (
                ex.held and self.holds is not None
            ):  # refused for another reason alongside: nothing waits
                for pending in ex.held:
                    self.holds.forget(pending.request_id or "")
                ex.held = []
        return ex, delay

    def _enter_run(self, ex: Exchange) -> None:
        ex.ctx = self.start_run(ex.run)
        ex.ledger = self.lifecycle.ledger_of(ex.ctx).for_run(
            ex.run
        )  # another run's grants do not apply
        ex.policy = ex.ctx.policy or self.policy

    def _classify(self, ex: Exchange, oversize: int | None, length_required: bool = False) -> float:
        """Refusals first (in order of what must be refused first), then the one
        handler that claims the request."""
        refused = refusals.refusal(self, ex, oversize, length_required)
        if refused is not None:
            return refused
        for handler in HANDLERS:
            claimed = handler.claim(self, ex)
            if claimed is not None:
                ex.handler = handler
                return handler.request(self, ex, claimed)
        raise AssertionError("the plain HTTP handler claims every request")

    # Answer a request offscope will not forward, recorded as a blocked call (refusals.py).
    refuse_request = refusals.refuse_request

    def tag_call(
        self,
        ex: Exchange,
        call: CallInput,
        notes: list[str],
        mcp_id: Any = None,
        tag: TagResult | None = None,
        continues: int | None = None,
    ) -> PendingCall:
        """Tag and decide one call of this exchange; a block is filed as a scope request.
        `continues`: the step of the call this one retries (an MCP input-required round):
        the same logical call, decided afresh but recorded as no new step."""
        assert ex.ctx is not None
        tag = ex.policy.settle(tag or ex.ledger.tag(call))  # the policy reads unknown targets
        notes = notes + ex.notes if ex.notes else notes
        step = continues if continues is not None else ex.ctx.allocate_step()
        verdict = ex.policy.decide(call, tag, ex.ctx.history, f"{ex.run}:{step}")
        if ex.streamed and verdict.status is not None:
            # The body is already upstream: nothing can be blocked or injected now,
            # and the record must not say otherwise.
            notes = notes + [
                f"not {'blocked' if verdict.decision == 'block' else 'injected'}: "
                "the request had already been sent"
            ]
            verdict = (
                PolicyVerdict("shadow", reason=verdict.reason)
                if verdict.decision == "block"
                else ALLOW
            )
        pending = PendingCall(call, tag, step, verdict, notes, mcp_id)
        if continues is not None:
            pending.step, pending.continues = None, continues  # one logical call, one step
            pending.notes = [*notes, f"the retry of step {continues} with its input responses"]
        if verdict.decision == "block":
            request = hold_flow.file_request(self, ex, pending)
            pending.request_id = request["id"]
            if hold_flow.hold(self, ex, pending, request):
                return pending
            if verdict.body is not None:
                verdict = PolicyVerdict(
                    verdict.decision,
                    verdict.status,
                    {**verdict.body, "request_id": pending.request_id},
                    verdict.friction,
                    verdict.reason,
                )
                pending.verdict = verdict
        if not ex.streamed:
            pending.verdict = self.lifecycle.spend(
                ex.ctx, ex.policy, tag, pending.verdict
            )  # per-run budgets
        self.lifecycle.persist_run(
            ex.ctx
        )  # a registered run's history and budgets survive a restart
        return pending

    def decide_mcp(
        self,
        req: HttpRequest,
        run_id: str,
        messages: list[McpRequest] | None = None,
        notes: list[str] | None = None,
    ) -> tuple[Exchange, float]:
        """Decide one MCP JSON-RPC message (or batch) from any transport (HTTP,
        stdio): `req` names the server (`ToolRegistry.key`: scheme, host, port,
        path), carries the session header if any, and, when `messages` is not
        given, the message as its JSON body (a POST).

        Returns the exchange and how long to wait before answering. If
        `ex.synthetic` is set, offscope answers: send its body (a JSON-RPC
        response or batch) to the client instead of the message (the exchange
        is finished). Otherwise forward the message, and give the server's
        answer to `response(ex, HttpResponse(200, {"content-type":
        "application/json"}, body))`, which records the calls and learns
        tools/list results (annotations stage later calls)."""
        t0 = time.perf_counter()
        ex = Exchange(run_id, None, req, self.ledger, self.policy, started=self.clock())
        self._enter_run(ex)
        if messages is None:
            messages, notes = mcp_messages(req) or ([], [])
        delay = decide_messages(self, ex, messages, notes or [])
        ex.seconds += time.perf_counter() - t0
        if ex.synthetic is not None:
            ex.done = True
            self.exporter.tag_seconds(ex.seconds)
        return ex, delay

    def failed(self, req: HttpRequest, run_id: str, error: str, *, forwarded: bool) -> None:
        """Record a call whose handling raised: every call that crosses the proxy
        leaves a record, and the record says whether it went upstream. Built from
        the request line alone, so that the failing part is not run again."""
        try:
            ctx = self.start_run(run_id)
            ledger = self.lifecycle.ledger_of(ctx)
            path, query = split_path(req.path)
            call = CallInput(
                source="http", method=req.method.upper(), host=req.host, path=path, query=query
            )
            host = normalize("host", req.host) if req.host else None
            targets = (TargetTag("host", host, ledger.contains("host", host)),) if host else ()
            tag = TagResult(targets, default_stage(call), False)
            verdict = (
                ALLOW
                if forwarded
                else PolicyVerdict("block", 503, reason="offscope error (on_error: closed)")
            )
            note = f"offscope error: {error[:200]}; " + (
                "forwarded unchecked (on_error: open)"
                if forwarded
                else "not sent (on_error: closed)"
            )
            ex = Exchange(
                run_id,
                ctx,
                req,
                ledger,
                ctx.policy or self.policy,
                handler=HTTP,
                done=True,
                started=self.clock(),
            )
            pending = PendingCall(call, tag, ctx.allocate_step(), verdict, [note])
            self.record_call(ex, pending, None if forwarded else 503, injected=not forwarded)
        except Exception as exc:  # the record of a failure must not fail the flow
            self.exporter.dropped()
            log.error("event_dropped", run=run_id, error=str(exc))

    def policy_for(self, run_id: str) -> CompiledPolicy:
        """The policy a run's calls are decided by (its own, or the proxy's)."""
        ctx = self.runs.get(run_id)
        return (ctx.policy if ctx is not None else None) or self.policy

    def frame(self, upgrade: Exchange, reading: WsReading) -> PolicyVerdict:
        """A message the agent sends on a WebSocket that is not MCP: a call to
        the upgrade's destination, its JSON run through the same extract rules,
        recorded at once (a message has no reply). A message offscope could not
        read completely (`reading.error`) is decided by the policy's `on_error`.
        A blocking verdict means: drop the message, send the client its body."""
        req = upgrade.req
        path, query = split_path(req.path)
        call = CallInput(
            source="http",
            tool="websocket",
            method="WS",
            host=req.host,
            path=path,
            query=query,
            args=reading.value,
            headers=req.headers,
        )
        ex = Exchange(
            upgrade.run,
            self.start_run(upgrade.run),
            req,
            upgrade.ledger,
            upgrade.policy,
            handler=HTTP,
            started=self.clock(),
        )
        notes = [reading.note] if reading.note else []
        if reading.error is not None:
            pending = self._unread_frame(ex, call, reading)
        else:
            pending = self.tag_call(ex, call, notes)
        verdict = pending.verdict
        blocked = verdict.status is not None
        self.record_call(
            ex,
            pending,
            verdict.status,
            injected=blocked,
            excerpt=json.dumps(verdict.body).encode() if blocked else b"",
        )
        return verdict

    def _unread_frame(self, ex: Exchange, call: CallInput, reading: WsReading) -> PendingCall:
        """A WebSocket message offscope cannot read: refused (on_error: closed)
        or forwarded uninspected (open), as an HTTP body it cannot read."""
        assert ex.ctx is not None
        tag = ex.ledger.tag(call)
        if reading.closed is not None:  # whatever on_error says: it went nowhere
            reason = f"WebSocket message refused by the proxy's parser (closed, {reading.closed})"
            verdict = PolicyVerdict("block", reason=reason)
            note = f"{reading.error}; not sent: the proxy closed the WebSocket ({reading.closed})"
        elif ex.policy.policy.fail_closed:
            reason = "extraction error (on_error: closed)"
            body = {
                "error": "offscope_uninspectable",
                "message": f"offscope could not inspect this message ({reading.error}); "
                "it was not sent.",
                "reason": reason,
            }
            verdict = PolicyVerdict("block", 400, body, reason=reason)
            note = f"extraction error: {reading.error}; not sent (on_error: closed)"
        else:
            verdict = ALLOW
            note = (
                f"extraction error: {reading.error}; forwarded without inspecting it "
                "(on_error: open)"
            )
        return PendingCall(call, tag, ex.ctx.allocate_step(), verdict, [note])

    def raw_stream(self, run_id: str, host: str, port: int | None) -> bool:
        """A raw TCP stream to host:port (mitmproxy's TCP layer: a tunnel that
        carries neither TLS nor HTTP): a call to its destination, at stage act,
        whose bytes offscope cannot read. Decided by the policy, then by
        `on_error`; recorded at once. Returns whether it is refused."""
        if (
            self.lifecycle.exhausted_refusal(run_id) is not None
        ):  # ended by its budget: nothing more
            return True
        ctx = self.start_run(run_id)
        req = HttpRequest(method="TCP", host=host, path="/", scheme="tcp", port=port)
        call = CallInput(source="http", method="TCP", host=host, path="/")
        policy = ctx.policy or self.policy
        ex = Exchange(
            run_id, ctx, req, self.lifecycle.ledger_of(ctx).for_run(run_id), policy, handler=HTTP
        )
        ex.started = self.clock()
        pending = self.tag_call(ex, call, [])
        refused = pending.verdict.decision == "block"
        if not refused and policy.policy.fail_closed:
            reason = "raw TCP stream (on_error: closed)"
            pending.verdict = PolicyVerdict("block", reason=reason)
            refused = True
        pending.notes = [
            *pending.notes,
            "raw TCP stream (not TLS, HTTP or WebSocket): not inspected; "
            + ("refused: the proxy did not connect" if refused else "relayed (on_error: open)"),
        ]
        self.record_call(ex, pending, None, injected=False)
        return refused

    # -- response ---------------------------------------------------------------

    def stream_for(
        self, ex: Exchange, status: int, headers: dict[str, str]
    ) -> Callable[[bytes], Any] | None:
        """A pass-through chunk callback when the response is a stream whose content
        the record needs (an LLM call in its dialect's stream format, an MCP
        exchange's event stream); it parses as the bytes pass, in bounded memory,
        and never holds them back. The handler says which content types it streams."""
        if not ex.may_stream:
            return None
        return ex.handler.stream(self, ex, headers.get("content-type", ""))

    def response_soon(
        self, ex: Exchange, resp: HttpResponse | None, error: str | None = None
    ) -> None:
        """Record a response (or an upstream error) after the current event-loop step.

        mitmproxy writes the response to the agent as soon as the response hook
        returns, in the same step; recording it afterwards keeps offscope's
        work off the agent's latency. Order is kept (one FIFO), and ending a
        run, sweeping or closing records whatever is still pending first."""
        self._pending.append((ex, resp, error))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush_pending)

    def flush_pending(self) -> None:
        self._flush_scheduled = False
        while self._pending:
            ex, resp, error = self._pending.popleft()
            try:
                self.response(ex, resp, error)
            except Exception as exc:  # one bad record must not drop the rest
                log.exception("response_record_failed", run=ex.run, error=str(exc))

    def response(self, ex: Exchange, resp: HttpResponse | None, error: str | None = None) -> None:
        """The upstream answered (or failed). Record what the agent received."""
        if ex.done:
            return
        ex.done = True
        t0 = time.perf_counter()
        if resp is not None and resp.notes:  # e.g. a body too large to decode
            for pending in ex.calls:
                pending.notes = [*pending.notes, *resp.notes]
        try:
            self._response(ex, resp, error)
        finally:
            ex.seconds += time.perf_counter() - t0
            self.exporter.tag_seconds(ex.seconds)

    def _response(self, ex: Exchange, resp: HttpResponse | None, error: str | None) -> None:
        if ex.ctx is not None:
            ex.handler.response(self, ex, resp, error)

    # -- recording -------------------------------------------------------------

    # Record one decided call of an exchange (offscope/proxy/records.py).
    record_call = records.record_call

    def filter_listed(self, ex: Exchange, body: bytes) -> bytes | None:
        """A whole MCP response body with the tools that can never be in scope
        removed from its tools/list results (policy `filter_tools`); None: unchanged."""
        return filter_listed(self, ex, body)

    # -- held calls (policy on_out_of_scope: hold): offscope/proxy/hold_flow.py ----

    # Wait until every held call of the exchange is decided, or times out.
    settle = hold_flow.settle
