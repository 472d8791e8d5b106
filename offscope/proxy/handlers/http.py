"""Plain HTTP tool calls: every request no other handler claims."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from offscope.ledgers.matcher import CallInput, CompiledLedger, TagResult
from offscope.proxy.exchange import (
    EXCERPT,
    Exchange,
    Handler,
    Pipeline,
    json_response,
    register_handler,
)
from offscope.proxy.extract.http import HttpResponse, extract_http
from offscope.proxy.extract.readings import alternative_readings
from offscope.proxy.handlers.operator import OPERATOR
from offscope.vocab import STAGE_RANK


class HttpHandler(Handler):
    kind = "http"
    order = 90  # after every other kind: it claims every request

    def claim(self, engine: Pipeline, ex: Exchange) -> Any:
        return extract_http(ex.req)

    def request(self, engine: Pipeline, ex: Exchange, claimed: Any) -> float:
        call, notes = claimed
        if ex.ledger.is_operator(call):
            ex.handler = OPERATOR
            return OPERATOR.request(engine, ex, call)
        tag, ambiguities = tag_readings(ex.ledger, call)
        if ambiguities:
            if ex.policy.policy.refuses_ambiguous:
                return engine.refuse_request(
                    ex,
                    400,
                    "offscope_ambiguous",
                    "Servers could read this request as a different target or stage ("
                    + "; ".join(ambiguities)
                    + "). Send it in its plain form.",
                    "ambiguous request: " + "; ".join(ambiguities),
                    tag=tag,
                )
            notes = notes + [
                "ambiguous (tagged by its most out-of-scope reading): " + "; ".join(ambiguities)
            ]
        pending = engine.tag_call(ex, call, notes, tag=tag)
        ex.calls.append(pending)
        if pending.verdict.status is not None:
            ex.synthetic = json_response(
                pending.verdict.status, pending.verdict.body or {}, pending.verdict.headers
            )
            engine.record_call(
                ex, pending, pending.verdict.status, injected=True, excerpt=ex.synthetic.body
            )
        return 0.0

    def response(
        self, engine: Pipeline, ex: Exchange, resp: HttpResponse | None, error: str | None
    ) -> None:
        status = resp.status if resp else None
        body = resp.body if resp else b""
        for pending in ex.calls:
            engine.record_call(
                ex, pending, status, injected=False, excerpt=body[:EXCERPT], error=error
            )


HTTP = register_handler(HttpHandler)


def tag_readings(
    ledger: CompiledLedger, call: CallInput, now: datetime | None = None
) -> tuple[TagResult, list[str]]:
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
            if severity(other_tag) > severity(worst):
                worst = other_tag
    if not why or (tag.scope == "in" and worst.scope == "in"):
        return tag, []
    return worst, why


def _outcome(
    tag: TagResult, plain: TagResult | None = None
) -> tuple[frozenset[tuple[str, str]], str]:
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


def severity(tag: TagResult) -> tuple[int, int, int]:
    """How out of scope a reading is: any out-of-scope target, then stage, then count."""
    out = [t for t in tag.targets if not t.in_scope]
    return (1 if out else 0, STAGE_RANK[tag.stage], len(out))
