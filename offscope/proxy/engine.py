"""The pipeline, transport-neutral: flow -> extract -> tag -> decide -> event -> sinks.

The mitmproxy addon (addon.py) only converts flows to `HttpRequest` /
`HttpResponse` and applies what the engine returns, so everything here can
be driven and tested without mitmproxy, and the eval grid drives the very
same engine through a real proxy.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import structlog
from pydantic_core import PydanticSerializationError

from offscope.ledgers.coverage import Coverage
from offscope.ledgers.matcher import (
    CallInput,
    CompiledLedger,
    TagResult,
    TargetTag,
    args_digest,
    default_stage,
    normalize,
    url_path,
)
from offscope.policies.decide import ALLOW, CompiledPolicy, Verdict
from offscope.proxy.exporter import Exporter
from offscope.proxy.extract.http import (
    HttpRequest,
    HttpResponse,
    extract_http,
    parse_json_body,
    split_path,
)
from offscope.proxy.extract.llm import (
    Api,
    LlmResponseParser,
    LlmToolCall,
    is_auxiliary,
    llm_api_of,
    parse_request,
    substitute_tool_results,
)
from offscope.proxy.extract.mcp import (
    McpRequest,
    McpResponses,
    ToolRegistry,
    call_from_message,
    id_key,
    mcp_messages,
    response_messages,
    session_of,
    structured_text,
    tool_annotations,
    tool_output_schemas,
)
from offscope.proxy.extract.readings import alternative_readings
from offscope.proxy.extract.sse import SseParser
from offscope.proxy.runs import RunContext, RunTable, traceparent_of
from offscope.proxy.sinks import RequestLog, TraceSink
from offscope.trace.events import (
    Event,
    LlmEvent,
    OperatorEvent,
    RunEnd,
    RunStart,
    ToolCall,
    ToolCallEvent,
)
from offscope.trace.redact import (
    REDACTED,
    is_secret_key,
    is_secret_param,
    minimise_args,
    redact_claim,
    redact_target,
    redact_text,
    redact_url,
    secret_values,
)
from offscope.vocab import STAGE_RANK, Source

log = structlog.get_logger("offscope")

PROVENANCE_HEADER = "x-offscope-provenance"
EXCERPT = 600
MCP_MAX_EVENT = 1024 * 1024  # one MCP SSE event larger than this is skipped (bounded memory)
LEGACY_MAX_EVENT = 16 * 1024 * 1024  # the legacy stream is passed on event by event: a larger one is lost
COVERAGE_LOG_SECONDS = 300.0  # how often the log gets each ledger's coverage summary


@dataclass
class Synthetic:
    """A response offscope sends instead of forwarding the request."""

    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=lambda: {"content-type": "application/json"})


@dataclass
class PendingCall:
    call: CallInput
    tag: TagResult
    step: int | None
    verdict: Verdict
    notes: list[str]
    mcp_id: Any = None
    request_id: str | None = None


@dataclass
class OperatorAsk:
    step: int
    source: Source
    channel: str
    question: str
    claimed: str | None
    policy: str
    reply: str | None  # None: pass-through, the reply comes from upstream
    mcp_id: Any = None
    human: bool = False  # a passed-through reply on a route the ledger declares reaches a person


@dataclass(slots=True)
class Exchange:
    """Per-flow state between the request and the response hooks."""

    run: str
    ctx: RunContext | None
    req: HttpRequest
    ledger: CompiledLedger
    policy: CompiledPolicy
    kind: Literal["http", "mcp", "llm", "operator", "refused", "other"] = "other"
    calls: list[PendingCall] = field(default_factory=list)
    ask: OperatorAsk | None = None
    synthetic: Synthetic | None = None
    new_body: bytes | None = None  # rewritten request body (LLM operator substitution)
    llm_api: Api | None = None
    llm_parser: LlmResponseParser | None = None
    llm_model: str | None = None
    llm_first_user: str | None = None
    llm_stream: bool = False
    llm_tools: dict[str, dict[str, Any]] = field(default_factory=dict)  # annotations the request declared
    mcp_server: str | None = None
    mcp_session: str | None = None
    mcp_list_ids: set[Any] = field(default_factory=set)  # id_key of the tools/list requests
    mcp: McpResponses | None = None  # what the response stream yields that the record needs
    sse: SseParser | None = None
    secrets: list[str] | None = None  # secret values the request carried (computed on demand)
    notes: list[str] = field(default_factory=list)  # about the exchange, added to each call's notes
    streamed: bool = False  # the request body went upstream before offscope could read it
    seconds: float = 0.0
    done: bool = False
    started: float | None = None  # the engine's clock when the flow began (the record's `started`)

    @property
    def may_stream(self) -> bool:
        """Whether `stream_for` could return a callback (plain HTTP is never parsed as a stream)."""
        return self.kind in ("llm", "mcp", "operator")


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
        self.tools = ToolRegistry()
        # Legacy MCP transport: offscope's answers waiting to replace the server's on a
        # session's stream, by (server, session) then request id.
        self._stream_replies: OrderedDict[tuple[str, str], dict[Any, dict[str, Any]]] = OrderedDict()
        # Responses recorded after the current event-loop step (`response_soon`).
        self._pending: deque[tuple[Exchange, HttpResponse | None, str | None]] = deque()
        self._flush_scheduled = False
        self.coverage: dict[str, Coverage] = {}  # ledger id -> entries used (offscope/ledgers/coverage.py)
        self._coverage_logged = clock()

    # -- runs ------------------------------------------------------------------

    def _run(self, run_id: str, labels: dict[str, str] | None = None, ledger: CompiledLedger | None = None,
             policy: CompiledPolicy | None = None) -> RunContext:
        now = self.clock()
        led = ledger or self.ledger
        ctx, created = self.runs.touch(run_id, led.id, now)
        if created:
            ctx.ledger, ctx.policy = ledger, policy
            pol = policy or self.policy
            self._emit(ctx, RunStart(run=run_id, ts=now, ledger=led.id, labels=labels or {},
                                     ledger_hash=led.hash, policy=pol.id))
            for old in self.runs.over_capacity():
                self.end_run(old, "idle")
        return ctx

    def start_run(self, run_id: str, labels: dict[str, str] | None = None, *,
                  ledger: CompiledLedger | None = None, policy: CompiledPolicy | None = None) -> None:
        """Start a run explicitly, with labels and optionally its own ledger and
        policy (the eval grid does this per case and cell); otherwise a run
        starts with its first flow and uses the proxy's ledger and policy."""
        self._run(run_id, labels, ledger, policy)

    def end_run(self, run_id: str, reason: str = "end", *, exit_code: int | None = None,
                task_success: bool | None = None, detail: str | None = None,
                effects: list[dict] | None = None) -> dict | None:
        self.flush_pending()  # a run's calls are recorded before its end
        ctx = self.runs.pop(run_id)
        if ctx is None:
            return None
        self._emit(ctx, RunEnd(run=run_id, ts=self.clock(), ledger=ctx.state.ledger, reason=reason,  # type: ignore[arg-type]
                               exit_code=exit_code, task_success=task_success, detail=detail,
                               effects=effects))  # type: ignore[arg-type]
        return ctx.state.as_dict()

    def sweep(self) -> int:
        """End runs idle for longer than the idle timeout; returns how many."""
        self.flush_pending()
        idle = self.runs.idle(self.clock())
        for run_id in idle:
            self.end_run(run_id, "idle")
        self._log_coverage()
        return len(idle)

    def _cover(self, ledger: CompiledLedger, tag: TagResult) -> None:
        """Count which ledger entries this call used (a reloaded ledger starts over)."""
        cov = self.coverage.get(ledger.id)
        if cov is None or cov.ledger.hash != ledger.hash:
            cov = self.coverage[ledger.id] = Coverage(ledger)
            self.exporter.coverage(ledger.id, cov.declared_counts(), cov.used_counts())  # type: ignore[arg-type]
        if cov.observe(tag):
            self.exporter.coverage(ledger.id, cov.declared_counts(), cov.used_counts())  # type: ignore[arg-type]

    def _log_coverage(self, force: bool = False) -> None:
        """Every COVERAGE_LOG_SECONDS: each ledger's used / declared entries, in the log."""
        now = self.clock()
        if not force and now - self._coverage_logged < COVERAGE_LOG_SECONDS:
            return
        self._coverage_logged = now
        for ledger_id, cov in self.coverage.items():
            log.info("ledger_coverage", ledger=ledger_id, ledger_hash=cov.ledger.hash, calls=cov.calls,
                     used=cov.summary(), unused=len(cov.unused()))

    def close(self) -> None:
        self.flush_pending()
        self._log_coverage(force=True)
        self.trace.close()
        self.requests.close()

    # -- sinks ------------------------------------------------------------------

    def _emit(self, ctx: RunContext, event: Event) -> None:
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
            log.error("trace_write_failed", error=exc.strerror or str(exc), run=event.run, type=event.type)
            return
        except Exception as exc:  # a sink failure must not take the flow down
            self.exporter.dropped()
            log.error("event_dropped", error=str(exc), run=event.run, type=event.type)
            return
        if event.type == "tool_call" and event.call.scope == "out":  # type: ignore[union-attr]
            log.info("out_of_scope_call", run=event.run, ledger=event.ledger, step=event.step,  # type: ignore[union-attr]
                     stage=event.call.stage, decision=event.decision,  # type: ignore[union-attr]
                     targets=[f"{t.kind}:{t.value}" for t in event.call.targets if not t.in_scope])  # type: ignore[union-attr]

    # -- request ----------------------------------------------------------------

    async def request(self, req: HttpRequest, run_id: str) -> Exchange:
        """`begin`, then the operator-reply delay (timeout-then-continue) if any."""
        ex, delay = self.begin(req, run_id)
        if delay:
            await asyncio.sleep(delay)  # the agent waits, other flows don't
        return ex

    def begin(self, req: HttpRequest, run_id: str, *, oversize: int | None = None,
              streamed: bool = False, length_required: bool = False) -> tuple[Exchange, float]:
        """Tag and decide a request; returns the exchange and how long the agent
        must wait for its (synthetic) reply. Synchronous: no coroutine per flow.
        An exchange answered by offscope itself (`synthetic`) is finished here:
        there is no upstream response to record.

        `req.host`/`req.port` are where the proxy connects, never the Host header.
        `oversize`: the body is declared larger than offscope inspects (refused);
        `length_required`: a chunked body the policy will not let stream unseen
        (refused); `streamed`: its body already went upstream uninspected."""
        t0 = time.perf_counter()
        ex = Exchange(run_id, None, req, self.ledger, self.policy, streamed=streamed, started=self.clock())
        delay = 0.0
        if self.refuse(req.host, req.port):
            ex.kind = "refused"
            ex.synthetic = _json_response(403, {
                "error": "offscope_refused",
                "message": "offscope's metrics and control endpoints are not reachable through the proxy."})
            log.warning("control_endpoint_refused", run=run_id, host=req.host, port=req.port)
        else:
            ex.ctx = self._run(run_id)
            ex.ledger = ex.ctx.ledger or self.ledger
            ex.policy = ex.ctx.policy or self.policy
            delay = self._classify(ex, oversize, length_required)
        ex.seconds += time.perf_counter() - t0
        if ex.synthetic is not None:
            ex.done = True
            self.exporter.tag_seconds(ex.seconds)
        return ex, delay

    def _classify(self, ex: Exchange, oversize: int | None, length_required: bool = False) -> float:
        """Which kind of exchange this is, checked in order of what must be refused first."""
        req, policy = ex.req, ex.policy.policy
        if req.host_header is not None:
            ex.notes.append(f"Host header {req.host_header!r} disagrees with the destination "
                            f"{req.host}:{req.port}; tagged by the destination")
            if policy.mode == "enforce":
                return self._refuse(ex, 421, "offscope_misdirected",
                                    "The Host header names a different host than the one this request "
                                    "is sent to. offscope refuses requests whose target is ambiguous.",
                                    "host header disagrees with the destination")
        if length_required:
            return self._refuse(ex, 411, "offscope_length_required",
                                "Send the request body with a Content-Length: offscope inspects a body "
                                "before it is forwarded and does not forward chunked bodies in this mode.",
                                "chunked body (no Content-Length)")
        if oversize is not None:
            ex.notes.append(f"body of {oversize} bytes is over the inspection limit; not inspected")
            if not ex.streamed and policy.fail_closed:
                return self._refuse(ex, 413, "offscope_body_too_large",
                                    "The request body is larger than offscope inspects; it was not sent.",
                                    "body over the inspection limit")
        if ex.streamed:
            ex.notes.append("request body went upstream before offscope could inspect it")
        elif (error := req.json_body().error) is not None:
            if policy.fail_closed:
                return self._refuse(ex, 400, "offscope_uninspectable",
                                    f"offscope could not inspect this request body ({error}); "
                                    "it was not sent.", "extraction error (on_error: closed)")
            ex.notes.append(f"extraction error: {error}; forwarded without inspecting the body "
                            "(on_error: open)")
        if ex.ledger.is_llm_host(req.host, req.port) and req.method.upper() == "POST" and not ex.streamed:
            if (api := llm_api_of(req.path)) is not None:
                self._llm_request(ex, api)
                return 0.0
            if not is_auxiliary(req.path):
                # A model call offscope cannot read: its tool calls would go untagged.
                error = f"no LLM dialect recognises POST {split_path(req.path)[0]}"
                if policy.fail_closed:
                    return self._refuse(ex, 400, "offscope_uninspectable",
                                        f"offscope could not inspect this LLM request ({error}); "
                                        "it was not sent.", "extraction error (on_error: closed)")
                ex.notes.append(f"extraction error: {error}; forwarded as a plain HTTP call (on_error: open)")
        if not ex.streamed and (mcp := mcp_messages(req)) is not None:
            return self._mcp_request(ex, *mcp)
        return self._http_request(ex)

    def _refuse(self, ex: Exchange, status: int, code: str, message: str, reason: str,
                tag: TagResult | None = None) -> float:
        """Answer a request offscope will not forward, and record it as a blocked call."""
        assert ex.ctx is not None
        ex.kind = "http"
        call, notes = extract_http(ex.req)
        mcp = mcp_messages(ex.req)  # a refused MCP call is recorded as the tool call it was
        if mcp is not None and (msg := next((m for m in mcp[0] if m.method == "tools/call"), None)):
            call = call_from_message(ex.req, msg, None)
        tag = tag or ex.ledger.tag(call)
        body = {"error": code, "message": message, "reason": reason}
        pending = PendingCall(call, tag, ex.ctx.allocate_step(), Verdict("block", status, body, reason=reason),
                              notes + ex.notes)
        ex.calls.append(pending)
        ex.synthetic = _json_response(status, body)
        self._record_call(ex, pending, status, injected=True, excerpt=ex.synthetic.body)
        log.warning("request_refused", run=ex.run, reason=reason, host=ex.req.host, status=status)
        return 0.0

    def _read_all(self, ex: Exchange, call: CallInput) -> tuple[TagResult, list[str]]:
        return tag_readings(ex.ledger, call)

    def _tag(self, ex: Exchange, call: CallInput, notes: list[str], mcp_id: Any = None,
             tag: TagResult | None = None) -> PendingCall:
        assert ex.ctx is not None
        tag = tag or ex.ledger.tag(call)
        notes = notes + ex.notes if ex.notes else notes
        step = ex.ctx.allocate_step()
        verdict = ex.policy.decide(call, tag, ex.ctx.history, f"{ex.run}:{step}")
        if ex.streamed and verdict.status is not None:
            # The body is already upstream: nothing can be blocked or injected now,
            # and the record must not say otherwise.
            notes = notes + [f"not {'blocked' if verdict.decision == 'block' else 'injected'}: "
                             "the request had already been sent"]
            verdict = Verdict("shadow", reason=verdict.reason) if verdict.decision == "block" else ALLOW
        pending = PendingCall(call, tag, step, verdict, notes, mcp_id)
        if verdict.decision == "block":
            pending.request_id = self._file_request(ex, pending)
            if verdict.body is not None:
                verdict = Verdict(verdict.decision, verdict.status,
                                  {**verdict.body, "request_id": pending.request_id},
                                  verdict.friction, verdict.reason)
                pending.verdict = verdict
        return pending

    def _http_request(self, ex: Exchange) -> float:
        call, notes = extract_http(ex.req)
        if ex.ledger.is_operator(call):
            return self._operator_ask(ex, "http", f"{ex.req.method} {ex.req.host}{call.path}",
                                      _question(call.args, ex.req.body), _claimed(ex.req, call.args),
                                      human=ex.ledger.reaches_person(call))
        ex.kind = "http"
        tag, ambiguities = self._read_all(ex, call)
        if ambiguities:
            if ex.policy.policy.refuses_ambiguous:
                return self._refuse(
                    ex, 400, "offscope_ambiguous",
                    "Servers could read this request as a different target or stage ("
                    + "; ".join(ambiguities) + "). Send it in its plain form.",
                    "ambiguous request: " + "; ".join(ambiguities), tag=tag)
            notes = notes + ["ambiguous (tagged by its most out-of-scope reading): " + "; ".join(ambiguities)]
        pending = self._tag(ex, call, notes, tag=tag)
        ex.calls.append(pending)
        if pending.verdict.status is not None:
            ex.synthetic = _json_response(pending.verdict.status, pending.verdict.body or {},
                                          pending.verdict.headers)
            self._record_call(ex, pending, pending.verdict.status, injected=True,
                              excerpt=ex.synthetic.body)
        return 0.0

    def failed(self, req: HttpRequest, run_id: str, error: str, *, forwarded: bool) -> None:
        """Record a call whose handling raised: every call that crosses the proxy
        leaves a record, and the record says whether it went upstream. Built from
        the request line alone, so that the failing part is not run again."""
        try:
            ctx = self._run(run_id)
            ledger = ctx.ledger or self.ledger
            path, query = split_path(req.path)
            call = CallInput(source="http", method=req.method.upper(), host=req.host, path=path, query=query)
            host = normalize("host", req.host) if req.host else None
            targets = (TargetTag("host", host, ledger.contains("host", host)),) if host else ()
            tag = TagResult(targets, default_stage(call), False)
            verdict = ALLOW if forwarded else Verdict("block", 503, reason="offscope error (on_error: closed)")
            note = f"offscope error: {error[:200]}; " + ("forwarded unchecked (on_error: open)" if forwarded
                                                       else "not sent (on_error: closed)")
            ex = Exchange(run_id, ctx, req, ledger, ctx.policy or self.policy, kind="http", done=True,
                          started=self.clock())
            pending = PendingCall(call, tag, ctx.allocate_step(), verdict, [note])
            self._record_call(ex, pending, None if forwarded else 503, injected=not forwarded)
        except Exception as exc:  # the record of a failure must not fail the flow
            self.exporter.dropped()
            log.error("event_dropped", run=run_id, error=str(exc))

    def policy_for(self, run_id: str) -> CompiledPolicy:
        """The policy a run's calls are decided by (its own, or the proxy's)."""
        ctx = self.runs.get(run_id)
        return (ctx.policy if ctx is not None else None) or self.policy

    def frame(self, upgrade: Exchange, text: str | None, size: int) -> Verdict:
        """A message the agent sends on a WebSocket: a call to the upgrade's
        destination, its JSON run through the same extract rules, recorded at
        once (a frame has no reply). A blocking verdict means: drop the frame."""
        req = upgrade.req
        path, query = split_path(req.path)
        args, notes = parse_json_body(text.encode(), "application/json") if text else (None, [])
        if text is None:
            notes = notes + [f"binary frame of {size} bytes (not inspected)"]
        call = CallInput(source="http", tool="websocket", method="WS", host=req.host, path=path,
                         query=query, args=args, headers=req.headers)
        ex = Exchange(upgrade.run, self._run(upgrade.run), req, upgrade.ledger, upgrade.policy, kind="http",
                      started=self.clock())
        pending = self._tag(ex, call, notes)
        verdict = pending.verdict
        blocked = verdict.status is not None
        self._record_call(ex, pending, verdict.status, injected=blocked,
                          excerpt=json.dumps(verdict.body).encode() if blocked else b"")
        return verdict

    def _mcp_request(self, ex: Exchange, messages: list[McpRequest], notes: list[str]) -> float:
        # Only tools/call is a call; initialize, notifications, ping, tools/list,
        # posted responses, the session's GET stream and DELETE are protocol:
        # they take no step and are not recorded as calls.
        ex.kind = "mcp"
        ex.mcp_server = ToolRegistry.key(ex.req)
        ex.mcp_session = session_of(ex.req)
        synthetic: list[dict[str, Any]] = []
        delay = 0.0
        for msg in messages:
            if msg.method == "tools/list":
                ex.mcp_list_ids.add(id_key(msg.id))
            if msg.method != "tools/call":
                continue
            name = msg.params.get("name")
            ann = self.tools.annotations(ex.mcp_server, name, ex.mcp_session) if isinstance(name, str) else None
            call = call_from_message(ex.req, msg, ann)
            if ex.ledger.is_operator(call):
                delay = self._operator_ask(ex, "mcp", f"mcp:{call.tool}", _question(call.args, b""),
                                           _claimed(ex.req, call.args), msg.id,
                                           human=ex.ledger.reaches_person(call))
                if ex.ask and ex.ask.reply is not None:
                    schema = self.tools.output_schema(ex.mcp_server, call.tool)
                    synthetic.append(_mcp_result(msg.id, ex.ask.reply, False,
                                                 structured_text(schema, ex.ask.reply)))
                ex.kind = "mcp"
                continue
            pending = self._tag(ex, call, notes, msg.id)
            ex.calls.append(pending)
            v = pending.verdict
            if v.status is not None:
                text = f"HTTP {v.status}: {json.dumps(v.body, sort_keys=True)}"
                synthetic.append(_mcp_result(msg.id, text, True))
                self._record_call(ex, pending, v.status, injected=True, excerpt=text.encode())
        if synthetic:
            # A batch answered in part by offscope is answered whole by it: calls that
            # were allowed alongside are refused rather than half-forwarded.
            answered = {id_key(m["id"]) for m in synthetic}
            for pending in ex.calls:
                if id_key(pending.mcp_id) not in answered:
                    synthetic.append({"jsonrpc": "2.0", "id": pending.mcp_id,
                                      "error": {"code": -32000, "message": "not sent: batch contained a refused call"}})
                    self._record_call(ex, pending, None, injected=True, excerpt=b"not sent")
            if self._legacy_session(ex):
                self._answer_on_stream(ex, messages, synthetic)
            else:
                payload = synthetic[0] if len(synthetic) == 1 and len(messages) == 1 else synthetic
                ex.synthetic = Synthetic(200, json.dumps(payload).encode())
        return delay

    def _legacy_session(self, ex: Exchange) -> bool:
        """A POST of the legacy HTTP+SSE transport: the session is in the query,
        and responses travel on the session's GET stream, not in this response."""
        return ex.mcp_session is not None and "mcp-session-id" not in ex.req.headers

    def _answer_on_stream(self, ex: Exchange, messages: list[McpRequest], synthetic: list[dict[str, Any]]) -> None:
        """Legacy transport: the client waits for answers on the session's stream.
        The refused requests still go to the server, renamed to a method it does
        not know (so nothing runs and it answers each id on the stream), and the
        stream swaps those answers for offscope's (see `stream_for`)."""
        replies = {id_key(m["id"]): m for m in synthetic}
        out = []
        for msg in messages:
            item: dict[str, Any] = {"jsonrpc": "2.0", "method": msg.method, "params": msg.params}
            if msg.id is not None:
                item["id"] = msg.id
            if id_key(msg.id) in replies:
                item = {"jsonrpc": "2.0", "id": msg.id, "method": "offscope/refused"}
            out.append(item)
        key = (ex.mcp_server, ex.mcp_session)
        self._stream_replies.setdefault(key, {}).update(replies)  # type: ignore[arg-type]
        self._stream_replies.move_to_end(key)  # type: ignore[arg-type]
        while len(self._stream_replies) > 4096:  # bounded: sessions that never read their answers
            self._stream_replies.popitem(last=False)
        ex.new_body = json.dumps(out[0] if len(out) == 1 else out).encode()
        ex.calls = []  # every call of this POST is recorded already (refused or not sent)

    def _operator_ask(self, ex: Exchange, source: Source, channel: str,
                      question: str, claimed: str | None, mcp_id: Any = None, *, human: bool = False) -> float:
        """An operator ask. `human`: the ledger declares this route reaches a
        person; a passed-through reply on any other route is the harness's."""
        assert ex.ctx is not None
        ex.kind = "operator"
        reply = ex.policy.operator_reply()
        if claimed:
            claimed = redact_claim(claimed)  # the agent chose it: it may be anything, a key too
            log.warning("provenance_claim_ignored", run=ex.run, claimed=claimed, channel=redact_url(channel))
        ex.ask = OperatorAsk(ex.ctx.allocate_step(), source, channel, question, claimed,
                             reply.policy if reply else "pass-through", reply.text if reply else None, mcp_id,
                             human=human and reply is None)
        if reply is None:
            return 0.0
        if source == "http":
            ex.synthetic = _json_response(200, {"reply": reply.text})
        self._record_operator(ex, reply.text)
        return reply.delay

    def _record_operator(self, ex: Exchange, reply: str) -> None:
        assert ex.ctx is not None and ex.ask is not None
        ask = ex.ask
        self._emit(ex.ctx, OperatorEvent(
            run=ex.run, ts=self.clock(), ledger=ex.ledger.id, started=ex.started,
            traceparent=traceparent_of(ex.req.headers), step=ask.step, source=ask.source,
            channel=ask.channel, question=redact_text(_scrub(ex, ask.question)),
            reply=redact_text(_scrub(ex, reply)),
            provenance="human" if ask.human and ask.policy == "pass-through" else "harness",
            policy=ask.policy,  # type: ignore[arg-type]
            claimed_provenance=ask.claimed))

    def _llm_request(self, ex: Exchange, api: Api) -> None:
        assert ex.ctx is not None
        ex.kind = "llm"
        ex.llm_api = api
        info = parse_request(api, ex.req.body, ex.req.path)
        ex.llm_model, ex.llm_first_user, ex.llm_stream = info.model, info.first_user, info.stream
        ex.llm_tools = info.tool_annotations
        pending = ex.ctx.pending_llm_operator
        if not pending:
            return
        # The agent's harness answered an operator tool: apply the reply policy.
        body, _ = parse_json_body(ex.req.body, "application/json")
        reply = ex.policy.operator_reply()
        replies = {cid: reply.text for cid in pending} if reply else {}
        originals = substitute_tool_results(api, body, replies or dict.fromkeys(pending, ""))
        human = reply is None and _human_marked(ex.ledger, ex.req)
        for call_id, original in originals:
            step, question = pending.pop(call_id)
            ex.ask = OperatorAsk(step, "llm", "llm:operator-tool", question, None,
                                 reply.policy if reply else "pass-through", None, human=human)
            self._record_operator(ex, reply.text if reply else original)
        ex.ask = None
        if reply and originals:
            ex.new_body = json.dumps(body).encode()

    # -- response ---------------------------------------------------------------

    def stream_for(self, ex: Exchange, status: int, headers: dict[str, str]) -> Callable[[bytes], bytes] | None:
        """A pass-through chunk callback when the response is an event stream
        whose content the record needs (an LLM call, an MCP exchange); it parses
        as the bytes pass, in bounded memory, and never holds them back."""
        if not ex.may_stream or "text/event-stream" not in headers.get("content-type", ""):
            return None
        if ex.kind == "llm" and ex.llm_api:
            ex.llm_parser = LlmResponseParser(ex.llm_api, headers.get("content-type", ""))
        elif ex.kind in ("mcp", "operator") and ex.mcp_server is not None:
            ex.mcp = self._mcp_collector(ex)
            if _is_legacy_stream(ex):
                return self._legacy_stream(ex)
            ex.sse = SseParser(max_event=MCP_MAX_EVENT)
        else:
            return None

        def on_chunk(chunk: bytes) -> bytes:
            t0 = time.perf_counter()
            try:
                if ex.llm_parser is not None:
                    ex.llm_parser.feed(chunk)
                elif ex.sse is not None and ex.mcp is not None:
                    for event in ex.sse.feed(chunk):
                        ex.mcp.feed_payload(event.data)
            except Exception as exc:  # never break the stream
                log.error("stream_parse_error", error=str(exc))
            ex.seconds += time.perf_counter() - t0
            return chunk

        return on_chunk

    def _legacy_stream(self, ex: Exchange) -> Callable[[bytes], list[bytes]]:
        """The legacy transport's session stream, passed on event by event (an
        event is held only until its last byte arrives): tools/list results on it
        are learnt, and the server's answers to requests offscope refused are
        replaced by offscope's."""
        ex.sse = parser = SseParser(max_event=LEGACY_MAX_EVENT)
        assert ex.mcp is not None
        collected = ex.mcp

        def on_chunk(chunk: bytes) -> list[bytes]:
            # A list, never b"": an empty chunk would end a chunked response.
            t0 = time.perf_counter()
            out: list[bytes] = []
            try:
                for event in parser.feed(chunk) + (parser.close() if not chunk else []):
                    data = event.data
                    if event.event == "endpoint":
                        self._legacy_endpoint(ex, data)
                    else:
                        data = self._swap_refused(ex, data)
                        collected.feed_payload(data)
                    out.append(_sse_event(event.event, data))
            except Exception as exc:  # never break the stream
                log.error("stream_parse_error", error=str(exc))
            ex.seconds += time.perf_counter() - t0
            return out

        return on_chunk

    def _swap_refused(self, ex: Exchange, data: str) -> str:
        key = (ex.mcp_server, ex.mcp_session)
        waiting = self._stream_replies.get(key)  # type: ignore[arg-type]
        if not waiting or "offscope/refused" not in data and '"id"' not in data:
            return data
        try:
            msg = json.loads(data)
        except ValueError:
            return data
        reply = waiting.pop(id_key(msg.get("id")), None) if isinstance(msg, dict) else None
        if not waiting:
            self._stream_replies.pop(key, None)  # type: ignore[arg-type]
        return json.dumps(reply) if reply is not None else data

    def _mcp_collector(self, ex: Exchange) -> McpResponses:
        wanted = {id_key(p.mcp_id) for p in ex.calls}
        if ex.ask is not None and ex.ask.reply is None:
            wanted.add(id_key(ex.ask.mcp_id))

        def on_tools(message: dict[str, Any]) -> None:
            server, session = ex.mcp_server, ex.mcp_session
            if server is not None:
                self.tools.remember(server, tool_annotations(message), tool_output_schemas(message), session)

        return McpResponses(wanted, ex.mcp_list_ids, on_tools)

    def _legacy_endpoint(self, ex: Exchange, data: str) -> None:
        """The legacy HTTP+SSE transport names the URL its session posts to in
        the stream's first event; tools/list results on this stream are about
        that server and session."""
        path = data.strip()
        if "://" in path:
            path = "/" + path.split("://", 1)[1].partition("/")[2]
        posts = HttpRequest(method="POST", host=ex.req.host, path=path, scheme=ex.req.scheme, port=ex.req.port)
        ex.mcp_server, ex.mcp_session = ToolRegistry.key(posts), session_of(posts)

    def response_soon(self, ex: Exchange, resp: HttpResponse | None, error: str | None = None) -> None:
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
        if ex.ctx is None:
            return
        status = resp.status if resp else None
        body = resp.body if resp else b""
        ctype = resp.headers.get("content-type", "") if resp else ""
        if ex.kind == "llm":
            self._llm_response(ex, resp, error)
        elif ex.kind in ("mcp", "operator") and ex.mcp_server is not None:
            collected = ex.mcp
            if collected is None:  # a whole (JSON) body
                collected = self._mcp_collector(ex)
                for m in response_messages(body, ctype):
                    collected.add(m)
            elif ex.sse is not None:
                for event in ex.sse.close():
                    collected.feed_payload(event.data)
            for pending in ex.calls:
                found = collected.results.get(id_key(pending.mcp_id))
                text = found[1] if found else (error or "")
                self._record_call(ex, pending, status, injected=False, excerpt=text.encode())
            if ex.ask and ex.ask.reply is None:
                found = collected.results.get(id_key(ex.ask.mcp_id))
                self._record_operator(ex, found[1] if found else (error or "no reply"))
        elif ex.kind == "operator" and ex.ask and ex.ask.reply is None:
            data, _ = parse_json_body(body, ctype)
            reply = data.get("reply") if isinstance(data, dict) and isinstance(data.get("reply"), str) else \
                body[:EXCERPT].decode("utf-8", "replace")
            self._record_operator(ex, reply if resp else f"no reply: {error}")
        elif ex.kind == "http":
            for pending in ex.calls:
                self._record_call(ex, pending, status, injected=False, excerpt=body[:EXCERPT],
                                  error=error)

    def _llm_response(self, ex: Exchange, resp: HttpResponse | None, error: str | None) -> None:
        assert ex.ctx is not None and ex.llm_api is not None
        parser = ex.llm_parser
        if parser is None:
            parser = LlmResponseParser(ex.llm_api, resp.headers.get("content-type", "") if resp else "")
            if resp:
                parser.feed(resp.body)
        result = parser.finish()
        calls: list[ToolCall] = []
        for tc in result.tool_calls:
            call = tc.to_call_input()
            call.annotations = ex.llm_tools.get(tc.name)  # staged like an MCP tool when declared
            if ex.ledger.is_operator(call):
                # An operator tool run by the agent's own harness: its reply arrives
                # in the next LLM request, where the reply policy is applied.
                if tc.id:
                    ex.ctx.pending_llm_operator[tc.id] = (ex.ctx.allocate_step(), _question(tc.args, b""))
                continue
            calls.append(self._llm_tool_call(ex, tc, call))
        if self.behavior and result.text:
            coherence, _, words = self.behavior(result.text)
            self.exporter.observe_behavior(ex.ledger.id, coherence, words)
        self._emit(ex.ctx, LlmEvent(
            run=ex.run, ts=self.clock(), ledger=ex.ledger.id, started=ex.started,
            traceparent=traceparent_of(ex.req.headers), api=ex.llm_api,
            model=result.model or ex.llm_model, text=redact_text(result.text, 20_000), tool_calls=calls,
            first_user=redact_text(ex.llm_first_user, 4000) if ex.llm_first_user else None,
            stream=ex.llm_stream, notes=result.notes + (resp.notes if resp else [])
            + ([f"upstream error: {error}"] if error else [])))

    def _llm_tool_call(self, ex: Exchange, tc: LlmToolCall, call: CallInput) -> ToolCall:
        assert ex.ctx is not None
        tag = ex.ledger.tag(call)
        model = ToolCall.model_validate({**_tool_call_fields(call, tag, tc.notes, None, 0, ledger=ex.ledger),
                                         "stage_from": tag.stage_from})
        if ex.ledger.ledger.llm.tool_calls_are_steps:  # recorded as a call: its coverage counts
            self._cover(ex.ledger, tag)
            self._emit(ex.ctx, ToolCallEvent(run=ex.run, ts=self.clock(), ledger=ex.ledger.id,
                                             step=ex.ctx.allocate_step(), call=model, call_id=tc.id,
                                             traceparent=traceparent_of(ex.req.headers)))
        return model

    # -- recording -------------------------------------------------------------

    def _record_call(self, ex: Exchange, pending: PendingCall, status: int | None, *, injected: bool,
                     excerpt: bytes = b"", error: str | None = None) -> None:
        assert ex.ctx is not None
        self._cover(ex.ledger, pending.tag)
        v = pending.verdict
        notes = pending.notes + ([f"upstream error: {error}"] if error else [])
        url = ex.req.url if pending.call.source != "llm" else None
        # One validation of the whole event (nested dicts are built in pydantic-core).
        self._emit(ex.ctx, ToolCallEvent.model_validate({
            "run": ex.run, "ts": self.clock(), "ledger": ex.ledger.id, "step": pending.step,
            "call": {**_tool_call_fields(pending.call, pending.tag, notes, url, len(ex.req.body),
                                         ledger=ex.ledger, port=ex.req.port if url else None),
                     "stage_from": pending.tag.stage_from},
            "decision": v.decision, "status": status, "injected": injected, "friction": v.friction,
            "reason": v.reason, "request_id": pending.request_id,
            "started": ex.started, "traceparent": traceparent_of(ex.req.headers),
            "call_id": None if pending.mcp_id is None else str(pending.mcp_id),
            "session": _session_digest(ex.mcp_session),
            "response_excerpt": redact_text(_scrub(ex, excerpt[:EXCERPT].decode("utf-8", "replace")),
                                            EXCERPT) or None}))

    def _file_request(self, ex: Exchange, pending: PendingCall) -> str:
        request_id = "req-" + uuid.uuid4().hex[:12]
        self.requests.write({
            "schema": "offscope.request/1", "id": request_id, "ts": self.clock(), "run": ex.run,
            "ledger": ex.ledger.id, "status": "pending", "tool": pending.call.tool,
            "source": pending.call.source, "method": pending.call.method, "stage": pending.tag.stage,
            "url": redact_url(ex.req.url), "path": redact_text(url_path(pending.call.path), 500) or None,
            "step": pending.step,
            "targets": _target_strings(pending.call, pending.tag, only_out=True),
            "args_digest": args_digest(pending.call.args), "reason": pending.verdict.reason,
        })
        self.exporter.scope_request(ex.ledger.id)
        return request_id


def tag_readings(ledger: CompiledLedger, call: CallInput,
                 now: datetime | None = None) -> tuple[TagResult, list[str]]:
    """An HTTP call's tag, and what other server readings of it would change
    (`offscope replay` tags recorded calls with this too).

    When readings disagree about an out-of-scope target or the stage, the
    most out-of-scope reading is returned with the reasons."""
    tag = ledger.tag(call, now)
    alternatives = alternative_readings(call)
    if not alternatives:
        return tag, []
    worst, why = tag, []
    plain = _outcome(tag)
    for reading in alternatives:
        other_tag = ledger.tag(reading.call, now)
        if _outcome(other_tag, tag if reading.case_folded else None) != plain:
            why.append(reading.why)
            if _severity(other_tag) > _severity(worst):
                worst = other_tag
    if not why or (tag.scope == "in" and worst.scope == "in"):
        return tag, []
    return worst, why


def _tool_call_fields(call: CallInput, tag: TagResult, notes: list[str], url: str | None,
                      size: int, keep_args: list[str] | tuple[str, ...] = (), *,
                      ledger: CompiledLedger | None = None, port: int | None = None) -> dict[str, Any]:
    """The trace's `ToolCall` (redacted), as the dict that validates into it.
    Argument values are kept only for the fields the ledger names (`keep_args`,
    plus the fields its rules read, whose values are targets anyway); the
    others are stored as names and digests. A target an extract rule took
    from a secret (a header, a query parameter, a secret-shaped id) is redacted."""
    secrets = secret_values(call.headers, call.query, call.args) if tag.targets else []
    if ledger is not None:
        keep_args = ledger.kept_args
    return {
        "source": call.source, "tool": call.tool, "method": call.method,
        "url": redact_url(url) if url else None,
        "args": minimise_args(call.args, keep_args) if call.args is not None else None,
        "targets": [{"kind": t.kind, "value": redact_target(t.kind, t.value, secrets),
                     "in_scope": t.in_scope, "grant": t.grant} for t in tag.targets],
        "stage": tag.stage, "scope": tag.scope, "size": size,
        "notes": [redact_text(n, 500) for n in notes],  # a note may quote a header as sent
        "input": _input_record(call, ledger, port, keep_args) if ledger is not None else None}


def _input_record(call: CallInput, ledger: CompiledLedger, port: int | None,
                  kept: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """`call.input` (offscope.trace/2): what `offscope replay` needs to tag the
    call again under another ledger, redacted as the rest of the record."""
    out: dict[str, Any] = {}
    if call.host:
        out["host"] = normalize("host", call.host)
    if port is not None:
        out["port"] = port
    if call.path is not None:
        out["path"] = redact_text(call.path, 2000)
    if call.query:
        out["query"] = {k: [REDACTED if is_secret_param(k) else redact_text(v, 500) for v in vs]
                        for k, vs in call.query.items()}
    if ledger.read_headers:
        out["read_headers"] = list(ledger.read_headers)
        sent = {h: REDACTED if is_secret_key(h) else redact_text(call.headers[h], 500)
                for h in ledger.read_headers if h in call.headers}
        if sent:
            out["headers"] = sent
    if ledger.reads_basic_auth and call.basic_auth_user:
        out["basic_auth_user"] = redact_text(call.basic_auth_user, 200)
    if call.annotations:
        out["annotations"] = {k: v for k, v in call.annotations.items() if isinstance(v, bool)}
    if kept and call.args is not None:
        out["kept"] = list(kept)
    return out


def _session_digest(session: str | None) -> str | None:
    """An MCP session id as the record keeps it: a digest that correlates calls
    of one session without handing out the id, which lets its holder use the session."""
    if not session:
        return None
    return "sha256:" + hashlib.sha256(session.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def _target_strings(call: CallInput, tag: TagResult, only_out: bool = False) -> list[str]:
    """`kind:value` of a call's targets, redacted as in the trace (for the request log)."""
    secrets = secret_values(call.headers, call.query, call.args)
    return [f"{t.kind}:{redact_target(t.kind, t.value, secrets)}" for t in tag.targets
            if not (only_out and t.in_scope)]


def _is_legacy_stream(ex: Exchange) -> bool:
    """The legacy MCP transport's session stream (`GET .../sse`)."""
    return ex.req.method.upper() == "GET" and split_path(ex.req.path)[0].rstrip("/").endswith("/sse")


def _sse_event(name: str, data: str) -> bytes:
    head = "" if name == "message" else f"event: {name}\n"
    return (head + "".join(f"data: {line}\n" for line in data.split("\n")) + "\n").encode()


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


def _json_response(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Synthetic:
    return Synthetic(status, json.dumps(body, sort_keys=True).encode(),
                     {"content-type": "application/json", **(headers or {})})


def _mcp_result(msg_id: Any, text: str, is_error: bool,
                structured: dict[str, Any] | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": is_error}
    if structured is not None:
        result["structuredContent"] = structured
    return {"jsonrpc": "2.0", "id": msg_id, "result": result}


def _request_secrets(req: HttpRequest, parsed_body: Any = None) -> list[str]:
    """Secret values this request carried (secret-named headers, query parameters
    and JSON fields), so that an upstream echoing them back (an error quoting the
    URL, a `next` link) does not put them in the record."""
    found: list[str] = []
    for name, value in req.headers.items():
        if not is_secret_key(name):
            continue
        found.append(value)
        if name in ("cookie", "set-cookie"):
            found.extend(part.partition("=")[2].strip() for part in value.split(";"))
        else:
            found.append(value.partition(" ")[2].strip())  # "Bearer TOKEN" -> TOKEN
    if "?" in req.path:
        for name, values in split_path(req.path)[1].items():
            if is_secret_key(name):
                found.extend(values)
    body = parsed_body  # the extractor already parsed it: no second parse per call
    if body is None and req.body:
        body, _ = parse_json_body(req.body, req.headers.get("content-type", ""))
    stack, budget = [body], 1000
    while stack and budget:
        budget -= 1
        node = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                if isinstance(v, str) and is_secret_key(str(k)):
                    found.append(v)
                elif isinstance(v, dict | list):
                    stack.append(v)
        elif isinstance(node, list):
            stack.extend(v for v in node if isinstance(v, dict | list))
    # Longest first, so a value is not half-replaced by one of its own parts.
    return sorted({v for v in found if len(v) >= 6}, key=len, reverse=True)


def _scrub(ex: Exchange, text: str) -> str:
    if not text:
        return text
    if ex.secrets is None:
        parsed = ex.calls[0].call.args if ex.calls and ex.calls[0].call.source == "http" else None
        ex.secrets = _request_secrets(ex.req, parsed)
    for value in ex.secrets:
        if value in text:
            text = text.replace(value, REDACTED)
    return text


def _question(args: Any, raw: bytes) -> str:
    if isinstance(args, dict):
        for key in ("question", "message", "text", "prompt", "request"):
            if isinstance(args.get(key), str):
                return args[key]
        return json.dumps(args, sort_keys=True)[:2000]
    return raw[:2000].decode("utf-8", "replace")


def _human_marked(ledger: CompiledLedger, req: HttpRequest) -> bool:
    """Whether the harness marked this LLM request as carrying a person's reply:
    the ledger's `humans.llm_header` with the secret only the harness holds."""
    humans = ledger.ledger.humans
    if not humans.llm_header:
        return False
    given = req.headers.get(humans.llm_header.lower())
    secret = _human_token(humans.token_env, humans.token_file)
    return bool(given and secret) and hmac.compare_digest(given.encode(), secret.encode())  # type: ignore[union-attr]


def _human_token(env: str | None, path: str | None) -> str | None:
    """The harness's secret, from the environment or a file (read per use: a
    rotated secret applies at once; the file is small)."""
    if env and os.environ.get(env):
        return os.environ[env].strip()
    if path:
        try:
            return Path(path).read_text(encoding="utf-8").strip() or None
        except OSError as exc:
            log.error("human_token_unreadable", path=path, error=exc.strerror or str(exc))
    return None


def _claimed(req: HttpRequest, args: Any) -> str | None:
    """Provenance the agent tried to assert; recorded and ignored."""
    claimed = req.headers.get(PROVENANCE_HEADER)
    if claimed is None and isinstance(args, dict) and isinstance(args.get("provenance"), str):
        claimed = args["provenance"]
    return claimed


def _outcome(tag: TagResult, plain: TagResult | None = None) -> tuple[frozenset[tuple[str, str]], str]:
    """What a reading of a request decides: its out-of-scope targets and its stage.
    Given the plain reading, a target equal to one of its targets but for case
    counts as that target (a case-insensitive router keeps identifiers as sent)."""
    same = {(t.kind, t.value.lower()): t for t in plain.targets} if plain else {}
    out = set()
    for t in tag.targets:
        t = same.get((t.kind, t.value.lower()), t)
        if not t.in_scope:
            out.add((t.kind, t.value))
    return frozenset(out), tag.stage


def _severity(tag: TagResult) -> tuple[int, int, int]:
    out = [t for t in tag.targets if not t.in_scope]
    return (1 if out else 0, STAGE_RANK[tag.stage], len(out))


_id_key = id_key  # one definition (offscope/proxy/extract/mcp.py)
