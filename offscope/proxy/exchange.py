"""One flow's state between the request and the response hooks, and the
protocol of the handlers that own each kind of exchange.

A handler (offscope/proxy/handlers/) owns one kind: plain HTTP tool calls,
MCP JSON-RPC, LLM API calls, operator asks. It claims a request, extracts
its calls, tags and decides them through the engine, and builds their
records when the response (or stream) arrives. The engine picks the handler
once per request (`HANDLERS`, in registration order) and calls it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypedDict

import structlog

from offscope.ledgers.matcher import CallInput, CompiledLedger, TagResult, normalize
from offscope.policies.decide import CompiledPolicy, PolicyVerdict
from offscope.proxy.extract.http import HttpRequest, HttpResponse, parse_json_body, split_path
from offscope.proxy.runs import RunContext, traceparent_of
from offscope.trace.redact import (
    REDACTED,
    is_secret_key,
    is_secret_param,
    json_secret_values,
    minimise_args,
    redact_field,
    redact_target,
    redact_text,
    redact_url,
    secret_values,
)
from offscope.vocab import Source

if TYPE_CHECKING:
    from collections import OrderedDict

    from offscope.ledgers.matcher import CompiledLedger
    from offscope.proxy.exporter import Exporter
    from offscope.proxy.extract.input_rounds import Elicitations, InputRounds
    from offscope.proxy.extract.mcp import ToolRegistry
    from offscope.proxy.extract.mcp_tasks import TaskCalls
    from offscope.proxy.surface import Drift
    from offscope.trace.events import Event

log = structlog.get_logger("offscope")

PROVENANCE_HEADER = "x-offscope-provenance"
EXCERPT = 600


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
    verdict: PolicyVerdict
    notes: list[str]
    mcp_id: Any = None
    request_id: str | None = None
    held: PolicyVerdict | None = None  # the block a held call gets unless it is approved
    approval: dict[str, Any] | None = None  # the human decision, for the record
    continues: int | None = None  # the step of the call this one retries (MCP input rounds)


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


# Scores an LLM response's text: (coherence, decisiveness, words).
BehaviorScorer = Callable[[str], tuple[float | None, float | None, int]]


class Recorder(Protocol):
    """Writes a decided call's record: what the handlers, refusals and the hold flow
    share of the engine (offscope/proxy/records.py)."""

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
        """Write the call's trace record (and its metrics)."""
        ...


class Pipeline(Recorder, Protocol):
    """What a handler may ask of the engine: the few operations every kind of call
    uses, and the shared state it reads; never the rest of the engine (runs, holds,
    stores, listeners). The engine satisfies it (mypy checks that wherever it passes
    itself), and the handlers import this module, never `engine.py`: the core has no
    import cycle."""

    clock: Callable[[], float]
    exporter: Exporter
    behavior: BehaviorScorer | None
    tools: ToolRegistry  # MCP tool annotations learnt from tools/list, per server
    drift: Drift  # tool surfaces and the other changes a run can see
    # A legacy MCP session's replies to calls offscope answered itself, by stream.
    stream_replies: OrderedDict[tuple[str, str], dict[Any, dict[str, Any]]]

    rounds: InputRounds  # MCP input-required rounds awaiting the client's retry
    tasks: TaskCalls  # MCP calls answered with a task handle, awaiting tasks/result
    elicitations: Elicitations  # server-sent elicitation/create awaiting the client's answer

    def tag_call(
        self,
        ex: Exchange,
        call: CallInput,
        notes: list[str],
        mcp_id: Any = None,
        tag: TagResult | None = None,
        continues: int | None = None,
    ) -> PendingCall:
        """Tag and decide one call; a block is filed as a scope-expansion request.
        `continues`: the step of the call this one retries (no new step)."""
        ...

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
        """Answer a request offscope will not forward, recorded as a blocked call."""
        ...

    def response(self, ex: Exchange, resp: HttpResponse | None, error: str | None = None) -> None:
        """The exchange is over: its records are built (once)."""
        ...

    def emit(self, ctx: RunContext, event: Event) -> None:
        """Write one trace event of a run."""
        ...

    def cover(self, ledger: CompiledLedger, tag: TagResult) -> None:
        """Count the ledger entries a tag used (ledger coverage)."""
        ...


class Handler:
    """One kind of exchange. Stateless: per-flow state is on the `Exchange`
    (`state` holds what only this kind needs); engine-wide state on the engine."""

    kind: ClassVar[str]
    order: ClassVar[int] = 50  # requests are offered to the claiming handlers lowest first
    streams: ClassVar[bool] = False  # whether `stream` may parse an event stream

    def claim(self, engine: Pipeline, ex: Exchange) -> Any:
        """What this handler extracted from the request if it is of its kind, else None."""
        return None

    def request(self, engine: Pipeline, ex: Exchange, claimed: Any) -> float:
        """Tag and decide; returns how long the agent waits for a synthetic reply."""
        return 0.0

    def stream(
        self, engine: Pipeline, ex: Exchange, content_type: str
    ) -> Callable[[bytes], Any] | None:
        """A pass-through chunk callback for a response this handler reads as a stream
        (by its content type), or None."""
        return None

    def response(
        self, engine: Pipeline, ex: Exchange, resp: HttpResponse | None, error: str | None
    ) -> None:
        """Record what the agent received (`resp` None: the upstream failed with `error`)."""


class _Unclassified(Handler):
    """Before a handler is chosen, and for requests offscope answers itself."""

    kind = "other"


class _Refused(Handler):
    kind = "refused"


UNCLASSIFIED: Handler = _Unclassified()
REFUSED: Handler = _Refused()
HANDLERS: list[Handler] = []  # tried in `order`; the last (plain HTTP) claims everything
_BY_KIND: dict[str, Handler] = {"other": UNCLASSIFIED, "refused": REFUSED}


def register_handler(cls: type[Handler], *, claims: bool = True) -> Handler:
    """Make a handler known by its kind; `claims`: tried for every request
    (the operator handler is not: a handler of another kind hands over to it)."""
    if cls.kind in _BY_KIND:
        raise ValueError(f"exchange handler {cls.kind!r} registered twice")
    instance = cls()
    _BY_KIND[cls.kind] = instance
    if claims:
        HANDLERS.append(instance)
        HANDLERS.sort(key=lambda h: h.order)
    return instance


def handler_of(kind: str) -> Handler:
    return _BY_KIND[kind]


@dataclass(slots=True)
class Exchange:
    """Per-flow state between the request and the response hooks."""

    run: str
    ctx: RunContext | None
    req: HttpRequest
    ledger: CompiledLedger
    policy: CompiledPolicy
    handler: Handler = UNCLASSIFIED
    state: Any = None  # the handler's own per-flow state (e.g. LlmState, McpState)
    calls: list[PendingCall] = field(default_factory=list)
    ask: OperatorAsk | None = None
    synthetic: Synthetic | None = None
    new_body: bytes | None = (
        None  # rewritten request body (reply substitution, legacy MCP refusals)
    )
    secrets: list[str] | None = None  # secret values the request carried (computed on demand)
    notes: list[str] = field(default_factory=list)  # about the exchange, added to each call's notes
    streamed: bool = False  # the request body went upstream before offscope could read it
    seconds: float = 0.0
    done: bool = False
    started: float | None = None  # the engine's clock when the flow began (the record's `started`)
    may_hold: bool = (
        False  # a proxied request whose caller awaits `settle` (policy on_out_of_scope: hold)
    )
    held: list[PendingCall] = field(default_factory=list)  # its calls waiting for a human

    @property
    def kind(self) -> str:
        return self.handler.kind

    @property
    def awaits_answer(self) -> bool:
        """Whether the record needs the upstream's answer: calls to record,
        tools/list results to learn from, or an operator reply passed through."""
        return (
            bool(self.calls)
            or bool(getattr(self.state, "list_ids", None))
            or (self.ask is not None and self.ask.reply is None)
        )

    @property
    def may_stream(self) -> bool:
        """Whether `stream_for` could return a callback (plain HTTP is never parsed as a stream)."""
        return self.handler.streams


# -- helpers the handlers share -------------------------------------------------


class RecordStamp(TypedDict):
    """The fields every trace record starts with (trace/events.py `_Event`)."""

    run: str
    ts: float
    ledger: str


class FlowStamp(RecordStamp):
    """A record of the flow itself (`_Flow`) also says when it began and under which trace."""

    started: float | None
    traceparent: str | None


def record_stamp(ex: Exchange, now: float) -> RecordStamp:
    """What each record of this exchange starts with: one place, so that the records the
    handlers write cannot disagree on their run, ledger or time."""
    return {"run": ex.run, "ts": now, "ledger": ex.ledger.id}


def flow_stamp(ex: Exchange, now: float) -> FlowStamp:
    """`record_stamp` and the flow's start and (valid) W3C traceparent."""
    return {
        **record_stamp(ex, now),
        "started": ex.started,
        "traceparent": traceparent_of(ex.req.headers),
    }


@contextmanager
def stream_chunk(ex: Exchange) -> Iterator[None]:
    """Around a stream hook's work on one chunk: a parse error is logged and never breaks
    the stream (the chunk still goes on), and the time spent is the flow's. Every
    handler that parses a stream needs both."""
    t0 = time.perf_counter()
    try:
        yield
    except Exception as exc:  # never break the stream
        log.error("stream_parse_error", error=str(exc))
    ex.seconds += time.perf_counter() - t0


def json_response(
    status: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> Synthetic:
    return Synthetic(
        status,
        json.dumps(body, sort_keys=True).encode(),
        {"content-type": "application/json", **(headers or {})},
    )


def question_of(args: Any, raw: bytes) -> str:
    if isinstance(args, dict):
        for key in ("question", "message", "text", "prompt", "request"):
            if isinstance(args.get(key), str):
                return args[key]
        return json.dumps(args, sort_keys=True)[:2000]
    return raw[:2000].decode("utf-8", "replace")


def claimed_provenance(req: HttpRequest, args: Any) -> str | None:
    """Provenance the agent tried to assert; recorded and ignored."""
    claimed = req.headers.get(PROVENANCE_HEADER)
    if claimed is None and isinstance(args, dict) and isinstance(args.get("provenance"), str):
        claimed = args["provenance"]
    return claimed


def request_secrets(req: HttpRequest, parsed_body: Any = None) -> list[str]:
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
    found.extend(json_secret_values(body, numbers=False))
    # Longest first, so a value is not half-replaced by one of its own parts.
    return sorted({v for v in found if len(v) >= 6}, key=len, reverse=True)


def scrub(ex: Exchange, text: str) -> str:
    """`text` with the secret values the exchange's request carried redacted."""
    if not text:
        return text
    if ex.secrets is None:
        parsed = ex.calls[0].call.args if ex.calls and ex.calls[0].call.source == "http" else None
        ex.secrets = request_secrets(ex.req, parsed)
    for value in ex.secrets:
        if value in text:
            text = text.replace(value, REDACTED)
    return text


def tool_call_fields(
    call: CallInput,
    tag: TagResult,
    notes: list[str],
    url: str | None,
    size: int,
    keep_args: list[str] | tuple[str, ...] = (),
    *,
    ledger: CompiledLedger | None = None,
    port: int | None = None,
) -> dict[str, Any]:
    """The trace's `ToolCall` (redacted), as the dict that validates into it.
    Argument values are kept only for the fields the ledger names (`keep_args`,
    plus the fields its rules read, whose values are targets anyway); the
    others are stored as names and digests. A target an extract rule took
    from a secret (a header, a query parameter, a secret-shaped id) is redacted."""
    secrets = secret_values(call.headers, call.query, call.args) if tag.targets else []
    if ledger is not None:
        keep_args = ledger.kept_args
    return {
        "source": call.source,
        "tool": call.tool,
        "method": call.method,
        "url": redact_url(url) if url else None,
        "args": minimise_args(call.args, keep_args) if call.args is not None else None,
        "targets": [
            {
                "kind": t.kind,
                "value": redact_target(t.kind, t.value, secrets),
                "in_scope": t.in_scope,
                "grant": t.grant,
            }
            for t in tag.targets
        ],
        "stage": tag.stage,
        "scope": tag.scope,
        "unknown": tag.unknown or None,  # no extract rule found a target (policy: unknown_target)
        "size": size,
        "notes": [redact_field(n, 500) for n in notes],  # a note may quote a header as sent
        "input": _input_record(call, ledger, port, keep_args) if ledger is not None else None,
    }


def _input_record(
    call: CallInput, ledger: CompiledLedger, port: int | None, kept: list[str] | tuple[str, ...]
) -> dict[str, Any]:
    """`call.input` (offscope.trace/2): what `offscope replay` needs to tag the
    call again under another ledger, redacted as the rest of the record."""
    out: dict[str, Any] = {}
    if call.host:
        out["host"] = normalize("host", call.host)
    if port is not None:
        out["port"] = port
    if call.path is not None:
        out["path"] = redact_field(call.path, 2000)
    if call.query:
        out["query"] = {
            k: [REDACTED if is_secret_param(k) else redact_text(v, 500) for v in vs]
            for k, vs in call.query.items()
        }
    if ledger.read_headers:
        out["read_headers"] = list(ledger.read_headers)
        sent = {
            h: REDACTED if is_secret_key(h) else redact_text(call.headers[h], 500)
            for h in ledger.read_headers
            if h in call.headers
        }
        if sent:
            out["headers"] = sent
    if ledger.reads_basic_auth and call.basic_auth_user:
        out["basic_auth_user"] = redact_text(call.basic_auth_user, 200)
    if call.annotations:
        out["annotations"] = {k: v for k, v in call.annotations.items() if isinstance(v, bool)}
    if kept and call.args is not None:
        out["kept"] = list(kept)
    return out
