"""The pipeline, transport-neutral: flow -> extract -> tag -> decide -> event -> sinks.

The mitmproxy addon (addon.py) only converts flows to `HttpRequest` /
`HttpResponse` and applies what the engine returns, so everything here can
be driven and tested without mitmproxy, and the eval grid drives the very
same engine through a real proxy. What differs per kind of exchange (plain
HTTP, MCP, LLM, operator) lives in one handler per kind
(offscope/proxy/handlers/); the engine picks it once per request and keeps
what they share: runs, the refusals every kind can get, tagging and
deciding a call, and writing its record.

Entry points: `begin`/`request` (a request), `stream_for` (an event-stream
response), `response`/`response_soon` (the answer), `frame` (a WebSocket
message), `failed` (a flow whose handling raised), and `decide_mcp` (one MCP
JSON-RPC message from any transport).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from datetime import datetime
from typing import Any

import structlog
from pydantic_core import PydanticSerializationError

from offscope.ledgers.coverage import Coverage
from offscope.ledgers.matcher import (
    CallInput,
    CompiledLedger,
    TagResult,
    TargetTag,
    call_digest,
    default_stage,
    normalize,
    query_digest,
    url_path,
)
from offscope.policies.decide import ALLOW, CompiledPolicy, PolicyVerdict
from offscope.policies.requests import DECISION_SCHEMA
from offscope.proxy import assembly
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
    scrub,
    tool_call_fields,
)
from offscope.proxy.exporter import Exporter
from offscope.proxy.extract.http import (
    HttpRequest,
    HttpResponse,
    JsonBody,
    extract_http,
    split_path,
)
from offscope.proxy.extract.input_rounds import Elicitations, InputRounds
from offscope.proxy.extract.mcp import McpRequest, ToolRegistry, call_from_message, mcp_messages
from offscope.proxy.extract.mcp_tasks import TaskCalls
from offscope.proxy.extract.websocket import WsReading
from offscope.proxy.handlers import decide_messages
from offscope.proxy.handlers.http import HTTP, tag_readings
from offscope.proxy.handlers.mcp import legacy_session, mcp_result
from offscope.proxy.handlers.offered import filter_listed
from offscope.proxy.holds import HoldRegistry, Resolution
from offscope.proxy.lifecycle import RunLifecycle
from offscope.proxy.runs import UNREGISTERED, RunContext, RunTable, traceparent_of
from offscope.proxy.sinks import RequestLog, TraceSink
from offscope.proxy.surface import Drift
from offscope.trace.events import Event, RunEnd, RunStart, ToolCallEvent
from offscope.trace.redact import (
    minimise_args,
    redact_target,
    redact_text,
    redact_url,
    secret_values,
)
from offscope.vocab import STAGE_RANK

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
    "printable",
    "request_secrets",
    "tag_readings",
]


class Engine(RunLifecycle):
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
        self._init_lifecycle()  # registered runs, budgets (offscope/proxy/lifecycle.py)

    # -- runs ------------------------------------------------------------------

    def _run(
        self,
        run_id: str,
        labels: dict[str, str] | None = None,
        ledger: CompiledLedger | None = None,
        policy: CompiledPolicy | None = None,
    ) -> RunContext:
        now = self.clock()
        led = ledger or self.ledger
        ctx, created = self.runs.touch(run_id, led.id, now)
        if created:
            ctx.ledger, ctx.policy = ledger, policy
            pol = policy or self.policy
            if ledger is None:  # a registered run takes its targets, history and labels along
                labels = self._registered_context(ctx) or labels
            if labels is None:  # a run the client named, unauthenticated (or the catch-all)
                labels = {"auth": UNREGISTERED if run_id == UNREGISTERED else "unauthenticated"}
            led = self.ledger_of(ctx)
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
                self.evict(old)
        return ctx

    def start_run(
        self,
        run_id: str,
        labels: dict[str, str] | None = None,
        *,
        ledger: CompiledLedger | None = None,
        policy: CompiledPolicy | None = None,
    ) -> None:
        """Start a run explicitly, with labels and optionally its own ledger and
        policy (the eval grid does this per case and cell); otherwise a run
        starts with its first flow and uses the proxy's ledger and policy."""
        self._run(run_id, labels, ledger, policy)

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
        self.expire_registrations()
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

    def emit(self, ctx: RunContext, event: Event) -> None:
        if ctx.state.ended is not None and event.type != "run_end":
            # A call answered after its run ended: fold it where `offscope report`
            # folds it, into the latest run of that id (a new one, if it started).
            ctx = self.runs.get(event.run) or ctx
        signals = ctx.state.observe(event)
        try:
            self.exporter.record(event, signals)
            try:
                self.trace.write(event, signals)
            except (PydanticSerializationError, UnicodeError):
                # Bytes that are not UTF-8 (a header an extract rule reads) or a lone
                # surrogate from a JSON body: record the call with them escaped.
                self.trace.write(printable(event), signals)
        except OSError as exc:  # a full disk: count it (an alert), keep serving
            self.exporter.trace_write_failed()
            self.exporter.dropped()
            log.error(
                "trace_write_failed", error=exc.strerror or str(exc), run=event.run, type=event.type
            )
            return
        except Exception as exc:  # a sink failure must not take the flow down
            self.exporter.dropped()
            log.error("event_dropped", error=str(exc), run=event.run, type=event.type)
            return
        if event.type == "tool_call" and event.call.scope == "out":
            log.info(
                "out_of_scope_call",
                run=event.run,
                ledger=event.ledger,
                step=event.step,
                stage=event.call.stage,
                decision=event.decision,
                targets=[f"{t.kind}:{t.value}" for t in event.call.targets if not t.in_scope],
            )

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
        elif (spent := self.exhausted_refusal(run_id)) is not None:
            ex.handler = REFUSED  # the run was ended by its budget: nothing more is sent
            ex.synthetic = json_response(429, spent)
        else:
            self._enter_run(ex)
            delay = self._classify(ex, oversize, length_required)
            assembly.credential(self, ex, ex.kind if ex.kind in ("llm", "mcp") else "http")
            if ex.ctx is not None and ex.ctx.exhausted is not None:
                self.end_exhausted(ex.ctx)
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
        ex.ctx = self._run(ex.run)
        ex.ledger = self.ledger_of(ex.ctx).for_run(ex.run)  # another run's grants do not apply
        ex.policy = ex.ctx.policy or self.policy

    def _classify(self, ex: Exchange, oversize: int | None, length_required: bool = False) -> float:
        """Refusals first (in order of what must be refused first), then the one
        handler that claims the request."""
        refused = self._refusal(ex, oversize, length_required)
        if refused is not None:
            return refused
        for handler in HANDLERS:
            claimed = handler.claim(self, ex)
            if claimed is not None:
                ex.handler = handler
                return handler.request(self, ex, claimed)
        raise AssertionError("the plain HTTP handler claims every request")

    def _refusal(self, ex: Exchange, oversize: int | None, length_required: bool) -> float | None:
        """A refusal every kind of request can get (None: none applies; notes
        about what was let through are added to the exchange)."""
        req, policy = ex.req, ex.policy.policy
        if req.host_header is not None:
            ex.notes.append(
                f"Host header {req.host_header!r} disagrees with the destination "
                f"{req.host}:{req.port}; tagged by the destination"
            )
            if policy.mode == "enforce":
                return self.refuse_request(
                    ex,
                    421,
                    "offscope_misdirected",
                    "The Host header names a different host than the one this request "
                    "is sent to. offscope refuses requests whose target is ambiguous.",
                    "host header disagrees with the destination",
                )
        if length_required:
            return self.refuse_request(
                ex,
                411,
                "offscope_length_required",
                "Send the request body with a Content-Length: offscope inspects a body "
                "before it is forwarded and does not forward chunked bodies in this mode.",
                "chunked body (no Content-Length)",
            )
        if oversize is not None:
            ex.notes.append(f"body of {oversize} bytes is over the inspection limit; not inspected")
            if not ex.streamed and policy.fail_closed:
                return self.refuse_request(
                    ex,
                    413,
                    "offscope_body_too_large",
                    "The request body is larger than offscope inspects; it was not sent.",
                    "body over the inspection limit",
                )
        if ex.streamed:
            ex.notes.append("request body went upstream before offscope could inspect it")
            return None
        if (error := req.json_body().error) is not None:
            if policy.fail_closed:
                return self.refuse_request(
                    ex,
                    400,
                    "offscope_uninspectable",
                    f"offscope could not inspect this request body ({error}); it was not sent.",
                    "extraction error (on_error: closed)",
                )
            ex.notes.append(
                f"extraction error: {error}; forwarded without inspecting the body (on_error: open)"
            )
        elif (ambiguity := req.json_body().ambiguity) is not None:
            # Decided, and recorded, by the body's most out-of-scope reading.
            req._json = _worst_reading(ex.ledger, self.tools, req)
            if policy.refuses_ambiguous:
                return self.refuse_request(
                    ex,
                    400,
                    "offscope_ambiguous",
                    f"Servers could read this request body differently ({ambiguity}). "
                    "Send it in its plain form.",
                    "ambiguous request: " + ambiguity,
                )
            ex.notes.append("ambiguous (tagged by its most out-of-scope reading): " + ambiguity)
        return None

    def refuse_request(
        self,
        ex: Exchange,
        status: int,
        code: str,
        message: str,
        reason: str,
        tag: TagResult | None = None,
        answer: Synthetic | None = None,
    ) -> float:
        """Answer a request offscope will not forward (with `answer`, else a JSON body
        naming `code`), and record it as a blocked call."""
        assert ex.ctx is not None
        ex.handler = HTTP
        call, notes = extract_http(ex.req)
        mcp = mcp_messages(ex.req)  # a refused MCP call is recorded as the tool call it was
        if mcp is not None and (msg := next((m for m in mcp[0] if m.method == "tools/call"), None)):
            call = call_from_message(ex.req, msg, None)
        tag = ex.policy.settle(tag or ex.ledger.tag(call))
        body = {"error": code, "message": message, "reason": reason}
        pending = PendingCall(
            call,
            tag,
            ex.ctx.allocate_step(),
            PolicyVerdict("block", status, body, reason=reason),
            notes + ex.notes,
        )
        ex.calls.append(pending)
        ex.synthetic = answer or json_response(status, body)
        self.record_call(ex, pending, status, injected=True, excerpt=ex.synthetic.body)
        log.warning("request_refused", run=ex.run, reason=reason, host=ex.req.host, status=status)
        return 0.0

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
            request = self._file_request(ex, pending)
            pending.request_id = request["id"]
            if self._hold(ex, pending, request):
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
            pending.verdict = self.spend(ex.ctx, ex.policy, tag, pending.verdict)  # per-run budgets
        self.persist_run(ex.ctx)  # a registered run's history and budgets survive a restart
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
            ctx = self._run(run_id)
            ledger = self.ledger_of(ctx)
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
            self._run(upgrade.run),
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
        if self.exhausted_refusal(run_id) is not None:  # ended by its budget: nothing more
            return True
        ctx = self._run(run_id)
        req = HttpRequest(method="TCP", host=host, path="/", scheme="tcp", port=port)
        call = CallInput(source="http", method="TCP", host=host, path="/")
        policy = ctx.policy or self.policy
        ex = Exchange(run_id, ctx, req, self.ledger_of(ctx).for_run(run_id), policy, handler=HTTP)
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
        """A pass-through chunk callback when the response is an event stream
        whose content the record needs (an LLM call, an MCP exchange); it parses
        as the bytes pass, in bounded memory, and never holds them back."""
        content_type = headers.get("content-type", "")
        if not ex.may_stream or "text/event-stream" not in content_type:
            return None
        return ex.handler.stream(self, ex, content_type)

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

    def record_call(
        self,
        ex: Exchange,
        pending: PendingCall,
        status: int | None,
        *,
        injected: bool,
        excerpt: bytes = b"",
        error: str | None = None,
    ) -> None:
        assert ex.ctx is not None
        self.cover(ex.ledger, pending.tag)
        v = pending.verdict
        notes = pending.notes + ([f"upstream error: {error}"] if error else [])
        url = ex.req.url if pending.call.source != "llm" else None
        # One validation of the whole event (nested dicts are built in pydantic-core).
        self.emit(
            ex.ctx,
            ToolCallEvent.model_validate(
                {
                    "run": ex.run,
                    "ts": self.clock(),
                    "ledger": ex.ledger.id,
                    "step": pending.step,
                    "call": {
                        **tool_call_fields(
                            pending.call,
                            pending.tag,
                            notes,
                            url,
                            len(ex.req.body),
                            ledger=ex.ledger,
                            port=ex.req.port if url else None,
                        ),
                        "stage_from": pending.tag.stage_from,
                    },
                    "decision": v.decision,
                    "status": status,
                    "injected": injected,
                    "friction": v.friction,
                    "reason": v.reason,
                    "request_id": pending.request_id,
                    "approval": pending.approval or _grant_approval(ex.ledger, pending.tag),
                    "started": ex.started,
                    "traceparent": traceparent_of(ex.req.headers),
                    "call_id": None if pending.mcp_id is None else str(pending.mcp_id),
                    "session": _session_digest(getattr(ex.state, "session", None)),
                    "continues": pending.continues,
                    "response_excerpt": redact_text(
                        scrub(ex, excerpt[:EXCERPT].decode("utf-8", "replace")), EXCERPT
                    )
                    or None,
                }
            ),
        )

    def filter_listed(self, ex: Exchange, body: bytes) -> bytes | None:
        """A whole MCP response body with the tools that can never be in scope
        removed from its tools/list results (policy `filter_tools`); None: unchanged."""
        return filter_listed(self, ex, body)

    def _file_request(self, ex: Exchange, pending: PendingCall) -> dict[str, Any]:
        request_id = "req-" + uuid.uuid4().hex[:12]
        request = {
            "schema": "offscope.request/1",
            "id": request_id,
            "ts": self.clock(),
            "run": ex.run,
            "ledger": ex.ledger.id,
            "status": "pending",
            "tool": pending.call.tool,
            "source": pending.call.source,
            "method": pending.call.method,
            "stage": pending.tag.stage,
            "url": redact_url(ex.req.url),
            "host": normalize("host", pending.call.host) if pending.call.host else None,
            "path": redact_text(url_path(pending.call.path), 500) or None,
            "query_digest": query_digest(pending.call.query),
            "step": pending.step,
            "targets": _target_strings(pending.call, pending.tag, only_out=True),
            "args_digest": call_digest(pending.call),
            # What a reviewer needs to decide: the argument values the trace keeps (the
            # others as names and digests, redacted alike), and the run's labels.
            "args": minimise_args(pending.call.args, ex.ledger.kept_args)
            if pending.call.args is not None
            else None,
            "labels": dict(ex.ctx.state.labels) if ex.ctx is not None else {},
            "reason": pending.verdict.reason,
        }
        if self._holdable(ex, pending):  # the agent waits for the decision until then
            request["held_until"] = request["ts"] + ex.policy.policy.hold_timeout
        if not self.requests.write(request):
            # The review store did not take it: nobody could decide it, so it is not held.
            request.pop("held_until", None)
            request["unfiled"] = True
        self.exporter.scope_request(ex.ledger.id)
        return request

    # -- held calls (policy on_out_of_scope: hold; offscope/proxy/holds.py) --------

    def _hold(self, ex: Exchange, pending: PendingCall, request: dict[str, Any]) -> bool:
        """Park a call the policy blocks until a human decides, when the policy
        asks for it and the caller can wait (`settle`); False: block it now."""
        policy = ex.policy.policy
        if self.holds is None or not self._holdable(ex, pending) or request.get("unfiled"):
            return False
        body = {**(pending.verdict.body or {}), "request_id": request["id"]}
        pending.held = PolicyVerdict(
            "block", 403, body, pending.verdict.friction, pending.verdict.reason
        )
        pending.verdict = PolicyVerdict(
            "block", None, reason=pending.verdict.reason
        )  # not refused (yet)
        ex.held.append(pending)
        self.holds.park(request)
        self.holds.notify(policy.webhook, request, policy.hold_timeout)
        log.info("call_held", run=ex.run, request=request["id"], timeout=policy.hold_timeout)
        return True

    def _holdable(self, ex: Exchange, pending: PendingCall) -> bool:
        """Whether a call the policy blocks is held for a human instead."""
        return (
            ex.may_hold
            and self.holds is not None
            and ex.policy.policy.on_out_of_scope == "hold"
            and pending.verdict.status is not None
            and not (ex.kind == "mcp" and legacy_session(ex))  # its answers go on another stream
        )

    async def settle(self, ex: Exchange) -> None:
        """Wait until every held call of the exchange is decided (or times out).
        Then the exchange is either released (forward it as usual) or answered
        by offscope (`ex.synthetic`: a 403 saying denied or timed out)."""
        assert self.holds is not None
        start = self.clock()
        timeout = ex.policy.policy.hold_timeout
        results = await asyncio.gather(
            *(self.holds.wait(p.request_id or "", timeout) for p in ex.held)
        )
        refused = [
            self._decided(ex, p, r, self.clock() - start)
            for p, r in zip(ex.held, results, strict=True)
        ]
        ex.held = []
        if any(refused):
            self._answer_refused(ex)

    def _decided(self, ex: Exchange, pending: PendingCall, res: Resolution, waited: float) -> bool:
        """Apply one decision to a held call; True when it is refused."""
        assert pending.held is not None
        self.exporter.held(ex.ledger.id, res.outcome)
        pending.approval = {
            "request_id": pending.request_id,
            "outcome": res.outcome,
            "approver": res.approver,
            "at": res.at,
            "grants": list(res.grants),
            "scope": res.scope,
            "held_seconds": round(waited, 3),
        }
        if res.outcome == "approved":
            pending.tag = dataclasses.replace(
                pending.tag,
                targets=tuple(
                    t
                    if t.in_scope
                    else TargetTag(t.kind, t.value, True, res.grant_for(f"{t.kind}:{t.value}"))
                    for t in pending.tag.targets
                ),
            )
            pending.verdict = PolicyVerdict(
                "allow", reason=f"approved by {res.approver} (request {pending.request_id})"
            )
            log.info(
                "held_call_released", run=ex.run, request=pending.request_id, approver=res.approver
            )
            return False
        if (
            res.outcome == "timeout"
        ):  # the log says so, and a late approval is refused as already decided
            self.requests.write(
                {
                    "schema": DECISION_SCHEMA,
                    "request": pending.request_id,
                    "decision": "timed_out",
                    "approver": None,
                    "reason": "hold_timeout passed",
                    "ts": res.at,
                    "grants": [],
                }
            )
        what = (
            "timed out waiting for approval"
            if res.outcome == "timeout"
            else f"was denied by {res.approver}"
            if res.approver
            else f"was refused: {res.reason}"
        )
        body = {
            **(pending.held.body or {}),
            "message": f"Blocked by offscope: this call was held for approval and {what}.",
            "held": {
                "outcome": res.outcome,
                "held_seconds": round(waited, 3),
                "approver": res.approver,
            },
        }
        pending.verdict = PolicyVerdict(
            "block", 403, body, reason=f"{pending.held.reason}; held, {res.outcome}"
        )
        log.info("held_call_refused", run=ex.run, request=pending.request_id, outcome=res.outcome)
        return True

    def _answer_refused(self, ex: Exchange) -> None:
        """Answer an exchange one of whose held calls was refused; nothing goes upstream."""
        if ex.kind == "mcp":
            # As for a block: the batch is answered whole, calls allowed alongside are not sent.
            replies = []
            for pending in ex.calls:
                v = pending.verdict
                if v.status is not None:
                    text = f"HTTP {v.status}: {json.dumps(v.body, sort_keys=True)}"
                    modern = getattr(ex.state, "modern", False)
                    replies.append(mcp_result(pending.mcp_id, text, True, modern=modern))
                    self.record_call(ex, pending, v.status, injected=True, excerpt=text.encode())
                else:
                    replies.append(
                        {
                            "jsonrpc": "2.0",
                            "id": pending.mcp_id,
                            "error": {
                                "code": -32000,
                                "message": "not sent: batch contained a refused call",
                            },
                        }
                    )
                    self.record_call(ex, pending, None, injected=True, excerpt=b"not sent")
            single = len(replies) == 1 and not (ex.req.body or b"").lstrip().startswith(b"[")
            ex.synthetic = Synthetic(200, json.dumps(replies[0] if single else replies).encode())
        else:
            pending = ex.calls[0]
            ex.synthetic = json_response(403, pending.verdict.body or {})
            self.record_call(ex, pending, 403, injected=True, excerpt=ex.synthetic.body)
        ex.done = True


def _grant_approval(ledger: CompiledLedger, tag: TagResult) -> dict[str, Any] | None:
    """Who approved the grants a call was let through by, and when."""
    if not tag.targets or not (ids := tag.grants):
        return None
    grant = ledger.grant(ids[0])
    if grant is None:
        return None
    at = datetime.fromisoformat(grant.created).timestamp() if grant.created else None
    return {
        "request_id": grant.request_id,
        "outcome": "granted",
        "approver": grant.approver,
        "at": at,
        "grants": list(ids),
        "scope": grant.scope,
    }


def _session_digest(session: str | None) -> str | None:
    """An MCP session id as the record keeps it: a digest that correlates calls
    of one session without handing out the id, which lets its holder use the session."""
    if not session:
        return None
    return "sha256:" + hashlib.sha256(session.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def _worst_reading(ledger: CompiledLedger, tools: ToolRegistry, req: HttpRequest) -> JsonBody:
    """Of the readings of an ambiguous JSON body (strict_json.py), the one whose
    calls are the most out of scope (targets out, then stage, a listed tool's
    annotations counted), as HTTP's `tag_readings` picks among readings of a URL."""
    body = req.json_body()
    server = ToolRegistry.key(req)

    def annotations(msg: McpRequest) -> dict[str, Any] | None:
        name = msg.params.get("name")
        return tools.annotations(server, name) if isinstance(name, str) else None

    def severity(value: Any) -> tuple[int, int, int]:
        reading = dataclasses.replace(req, _json=JsonBody(value))
        mcp = mcp_messages(reading)
        calls = (
            [
                call_from_message(reading, m, annotations(m))
                for m in mcp[0]
                if m.method == "tools/call"
            ]
            if mcp is not None
            else [extract_http(reading)[0]]
        )
        worst = (0, 0, 0)
        for call in calls:
            tag = ledger.tag(call)
            out = [t for t in tag.targets if not t.in_scope]
            worst = max(worst, (1 if out else 0, STAGE_RANK[tag.stage], len(out)))
        return worst

    value = max((body.value, *body.other_readings), key=severity)
    return dataclasses.replace(body, value=value)


def _target_strings(call: CallInput, tag: TagResult, only_out: bool = False) -> list[str]:
    """`kind:value` of a call's targets, redacted as in the trace (for the request log)."""
    secrets = secret_values(call.headers, call.query, call.args)
    return [
        f"{t.kind}:{redact_target(t.kind, t.value, secrets)}"
        for t in tag.targets
        if not (only_out and t.in_scope)
    ]


def printable(event: Event) -> Event:
    """The event with every string made encodable as UTF-8: bytes that came in
    as surrogate escapes read `\\xff`, other lone surrogates `\\ud800`."""
    return type(event).model_validate(_printable(event.model_dump(by_alias=True)))


def _printable(value: Any) -> Any:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            try:
                return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            except UnicodeEncodeError:
                return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_printable(k): _printable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_printable(v) for v in value]
    return value
