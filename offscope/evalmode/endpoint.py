"""The model endpoint as the grid sees it: retry policy, one shared limiter, and a gateway.

A model endpoint is infrastructure, not part of the world an agent is measured in: a 429, a
5xx, a reset or stalled connection says nothing about the agent. So:

- `RetryPolicy` is what the reference agent does with such a failure: exponential backoff with
  full jitter, at least the `Retry-After` the endpoint asked for, within a per-trajectory
  budget (retries and seconds waited). Past the budget the trajectory ends as `infra_error`,
  which is never a result.
- `EndpointLimiter` is one per model endpoint for the whole grid: at most `concurrency`
  requests in flight, `rpm` requests and `tpm` tokens per minute, and when the requests sent
  within a window were surely more than a fifth 429s it slows the whole endpoint down
  (multiplicative decrease), speeding up again while they are surely fewer (multiplicative
  increase, capped at the configured limits).
- `gateway_app` is a loopback HTTP server the grid's proxy routes the model host to: every
  model call of every trajectory (the reference agent's or an `--agent` command's) passes the
  limiter and the response cache (cache.py) there, behind the proxy, so the proxy records a
  cached answer exactly as it recorded the original, and the cache key is the request the
  model receives (after the proxy's reply policy and tool filtering).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import math
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from offscope.trace.rates import wilson

# Status codes that say "the endpoint could not answer now", not "the request was wrong".
RETRY_STATUSES = frozenset({408, 409, 429})
# Status codes that say the endpoint is misconfigured (key, URL): retrying cannot help, and the
# run must not be scored either.
CONFIG_STATUSES = frozenset({401, 404})


@dataclass(frozen=True)
class RetryPolicy:
    """How the reference agent retries a model call that failed for infrastructure reasons."""

    retries: int = 10  # retries per trajectory (all its model calls together)
    wait_budget: float = 300.0  # seconds per trajectory spent waiting between attempts
    base: float = 1.0  # first backoff ceiling; doubles per consecutive failure
    cap: float = 60.0  # largest backoff ceiling
    connect_timeout: float = 10.0  # seconds to open a connection to the endpoint
    read_timeout: float = 20.0  # seconds without a byte (first byte included) = a stall

    def backoff(self, failures: int, retry_after: float | None, rng: random.Random) -> float:
        """Seconds to wait before the next attempt: full jitter over an exponential ceiling,
        and never less than what the endpoint asked for."""
        ceiling = min(self.cap, self.base * 2 ** max(0, failures - 1))
        delay = rng.uniform(0, ceiling)
        return max(delay, retry_after or 0.0)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """`Retry-After` as seconds from now: delta-seconds or an HTTP date; None if absent/bad."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def retryable_status(status: int) -> bool:
    return status in RETRY_STATUSES or status >= 500


# --------------------------------------------------------------------------- #
# The shared limiter
# --------------------------------------------------------------------------- #


class TokenBucket:
    """`per_minute` units a minute, refilled continuously, with a one-second burst."""

    def __init__(self, per_minute: float) -> None:
        self.per_minute = per_minute
        self.capacity = max(1.0, per_minute / 60.0)
        self.level = self.capacity
        self.at = time.monotonic()

    def wait_time(self, cost: float, factor: float) -> float:
        """Seconds until `cost` may be spent at `factor` of the rate (0: now). A cost larger
        than the burst waits only for a full bucket, then goes into debt."""
        now = time.monotonic()
        rate = self.per_minute / 60.0 * factor
        self.level = min(self.capacity, self.level + (now - self.at) * rate)
        self.at = now
        need = min(cost, self.capacity)
        return 0.0 if self.level >= need else (need - self.level) / rate

    def spend(self, cost: float) -> None:
        self.level -= cost


@dataclass
class LimiterStats:
    requests: int = 0
    throttled: int = 0  # 429 answers
    slowdowns: int = 0  # cohorts that made the endpoint slow down
    peak_in_flight: int = 0
    queued_seconds: float = 0.0


@dataclass
class _Cohort:
    """The requests sent within one window of the limiter."""

    sent: int = 0
    answered: int = 0
    throttled: int = 0


@dataclass
class EndpointLimiter:
    """One per model endpoint, shared by every trajectory of a grid (see the module doc).

    Whether the endpoint is overloaded is judged per cohort: the requests sent within one
    `window`, once every one of them is answered. Counting answers as they arrive instead
    would be biased: a 429 comes back at once while a success takes the model's whole
    latency, so the first seconds of a grid would see mostly 429s from an endpoint that
    refuses a steady 10%. A cohort slows the endpoint down when its 429 share is above
    `slowdown_share` beyond doubt (its 95% Wilson interval lies above it), and speeds it up
    again when the share is below it beyond doubt; a cohort sent before the last change says
    nothing about the new limits and is not judged."""

    concurrency: int | None = None
    rpm: float | None = None
    tpm: float | None = None
    window: float = 2.0  # seconds: the requests sent within one window form a cohort
    slowdown_share: float = 0.2  # a cohort with surely more 429s than this slows down
    decrease: float = 0.7
    increase: float = 1.1
    clock: Callable[[], float] = time.monotonic
    stats: LimiterStats = field(default_factory=LimiterStats)

    def __post_init__(self) -> None:
        if self.window <= 0:
            raise ValueError(f"window must be positive seconds, not {self.window}")
        self.allowed: float = float(self.concurrency) if self.concurrency else math.inf
        self.rate_factor = 1.0
        self.in_flight = 0
        self._requests = TokenBucket(self.rpm) if self.rpm else None
        self._tokens = TokenBucket(self.tpm) if self.tpm else None
        self._cond: asyncio.Condition | None = None
        self._epoch = self.clock()
        self._cohorts: dict[int, _Cohort] = {}
        self._last_change = -1  # the cohort being sent when the limits last changed

    @property
    def cond(self) -> asyncio.Condition:
        if self._cond is None:  # made on the loop that uses it (the gateway's thread)
            self._cond = asyncio.Condition()
        return self._cond

    def _rate_wait(self, tokens: float) -> float:
        waits = [0.0]
        if self._requests is not None:
            waits.append(self._requests.wait_time(1, self.rate_factor))
        if self._tokens is not None:
            waits.append(self._tokens.wait_time(tokens, self.rate_factor))
        return max(waits)

    def _cohort_now(self) -> int:
        return int((self.clock() - self._epoch) // self.window)

    async def acquire(self, tokens: float) -> int:
        """Wait for a slot and for rate budget, then take them. Returns the request's cohort,
        which `release` takes back."""
        started = time.monotonic()
        async with self.cond:
            while True:
                if self.in_flight + 1 > max(1.0, self.allowed):  # floor(allowed) slots
                    await self.cond.wait()
                    continue
                wait = self._rate_wait(tokens)
                if wait <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.cond.wait(), timeout=wait)
            self.in_flight += 1
            if self._requests is not None:
                self._requests.spend(1)
            if self._tokens is not None:
                self._tokens.spend(tokens)
            cohort = self._cohort_now()
            self._cohorts.setdefault(cohort, _Cohort()).sent += 1
        self.stats.requests += 1
        self.stats.peak_in_flight = max(self.stats.peak_in_flight, self.in_flight)
        self.stats.queued_seconds += time.monotonic() - started
        return cohort

    async def release(
        self, cohort: int, status: int | None, estimated: float, used: float | None
    ) -> None:
        """Give the slot back and learn from the answer (`used`: tokens the response reported;
        `status` None: no answer, e.g. a stall)."""
        async with self.cond:
            self.in_flight -= 1
            if self._tokens is not None and used is not None:
                self._tokens.spend(used - estimated)  # settle the estimate against the bill
            answers = self._cohorts[cohort]
            answers.answered += 1
            if status == 429:
                self.stats.throttled += 1
                answers.throttled += 1
            if self._judge():
                self.cond.notify_all()
            else:
                self.cond.notify(1)

    def _judge(self) -> bool:
        """AIMD over complete cohorts: True when the allowed concurrency or rate changed."""
        now = self._cohort_now()
        changed = False
        complete = [i for i, c in self._cohorts.items() if i < now and c.answered == c.sent]
        for index in complete:
            cohort = self._cohorts.pop(index)
            if index <= self._last_change:
                continue
            low, high = wilson(cohort.throttled, cohort.answered)
            if low > self.slowdown_share:
                self.stats.slowdowns += 1
                base = self.allowed if math.isfinite(self.allowed) else self.in_flight + 1
                self.allowed = max(1.0, base * self.decrease)
                self.rate_factor = max(0.05, self.rate_factor * self.decrease)
            elif high < self.slowdown_share and (
                self.rate_factor < 1 or self.allowed < (self.concurrency or math.inf)
            ):
                self.rate_factor = min(1.0, self.rate_factor * self.increase)
                ceiling = float(self.concurrency) if self.concurrency else math.inf
                grown = self.allowed * self.increase + 1
                # unlimited again once it has grown well past what is in flight
                self.allowed = min(ceiling, grown if grown < 4 * (self.in_flight + 1) else ceiling)
            else:
                continue
            self._last_change = now
            changed = True
        return changed

    def settings(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "rpm": self.rpm,
            "tpm": self.tpm,
            "slowdown": f"x{self.decrease} when the requests sent within {self.window:g}s are "
            f"surely (95% Wilson interval) more than {self.slowdown_share:.0%} 429s, "
            f"x{self.increase} when surely fewer; judged once all are answered",
        }


def combine_stats(parts: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The endpoint stats of several grid processes (shards, or the workers of one grid) as
    one: counts add up, `peak_*` figures are the largest (each process had its own limiter),
    nested blocks (statuses, limiter, cache) combine key by key. None when no part has any."""
    present = [p for p in parts if p is not None]
    if not present:
        return None
    out: dict[str, Any] = {}
    for key in sorted({k for p in present for k in p}):
        values = [p[key] for p in present if p.get(key) is not None]
        if not values:
            out[key] = None
        elif all(isinstance(v, dict) for v in values):
            out[key] = combine_stats(values)
        elif all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            out[key] = max(values) if key.startswith("peak") else sum(values)
        else:  # not a count (a label): kept when the parts agree
            out[key] = values[0] if all(v == values[0] for v in values) else None
    return out


def estimate_tokens(body: bytes) -> float:
    """Tokens a request will cost before the answer says: ~4 bytes a token of prompt, plus
    the completion it allows (max_tokens), or a modest guess."""
    completion = 256
    try:
        parsed = json.loads(body)
        if isinstance(parsed, dict):
            completion = int(parsed.get("max_tokens") or parsed.get("max_completion_tokens") or 256)
    except (ValueError, TypeError):
        pass
    return len(body) / 4 + completion


def used_tokens(body: bytes) -> float | None:
    try:
        usage = json.loads(body).get("usage") or {}
        total = usage.get("total_tokens")
        return float(total) if total is not None else None
    except (ValueError, AttributeError, TypeError):
        return None


# --------------------------------------------------------------------------- #
# The gateway: behind the proxy, in front of the real endpoint
# --------------------------------------------------------------------------- #

# Request headers the gateway passes upstream (the proxy adds routing headers of its own).
_FORWARD_REQUEST = ("authorization", "content-type", "accept", "api-key", "openai-organization")
_DROP_RESPONSE = {"content-length", "content-encoding", "transfer-encoding", "connection"}
# The marker on a response the gateway made itself (the upstream never answered).
GATEWAY_HEADER = "x-offscope-gateway"
# Connection pools the gateway spreads model calls over (see Gateway.client).
POOL_SHARDS = 16


@dataclass
class GatewayStats:
    upstream_calls: int = 0
    upstream_failures: int = 0  # non-2xx answers and transport errors from the endpoint
    stalls: int = 0
    connect_errors: int = 0
    statuses: dict[str, int] = field(default_factory=dict)


class Gateway:
    """Forwards model calls to `upstream` (scheme://host[:port]) through the limiter and cache."""

    def __init__(
        self,
        upstream: str,
        limiter: EndpointLimiter,
        cache: Any | None,  # cache.ResponseCache
        retry: RetryPolicy,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.limiter = limiter
        self.cache = cache
        self.retry = retry
        self.stats = GatewayStats()
        self._clients: list[httpx.AsyncClient] = []
        self._next_client = 0

    @property
    def client(self) -> httpx.AsyncClient:
        """One of POOL_SHARDS clients, in turn. httpcore scans every connection of a pool on
        each request (and checks each socket with a syscall), so one pool of the hundreds of
        connections a slow model keeps open costs more CPU per call than the call itself
        (profiled: 9% of a grid's CPU at 256 in flight); shards keep each pool small."""
        if not self._clients:  # on the gateway's own loop
            timeout = httpx.Timeout(
                connect=self.retry.connect_timeout,
                read=self.retry.read_timeout,
                write=self.retry.read_timeout,
                pool=None,  # waiting for a pooled connection is the limiter's job
            )
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
            tls = httpx.create_ssl_context()  # one for all shards: building one reads the CA store
            self._clients = [
                httpx.AsyncClient(timeout=timeout, limits=limits, verify=tls)
                for _ in range(POOL_SHARDS)
            ]
        self._next_client = (self._next_client + 1) % POOL_SHARDS
        return self._clients[self._next_client]

    def summary(self) -> dict[str, Any]:
        return {
            **asdict(self.stats),
            "limiter": asdict(self.limiter.stats),
            "cache": self.cache.stats() if self.cache is not None else None,
        }

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import Response, StreamingResponse
        from starlette.routing import Route

        async def forward(request: Request) -> Response:
            body = await request.body()
            path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            key = None
            if self.cache is not None and request.method == "POST":
                from offscope.evalmode.cache import request_key

                key = request_key(path, body)
                hit = self.cache.get(key) if key else None
                if hit is not None:
                    status, content_type, cached = hit
                    return Response(cached, status, media_type=content_type)
            headers = {k: v for k, v in request.headers.items() if k in _FORWARD_REQUEST}
            upstream = httpx.Request(
                request.method, self.upstream + path, headers=headers, content=body
            )
            estimate = estimate_tokens(body)
            cohort = await self.limiter.acquire(estimate)
            released = False

            async def release(status: int | None, used: float | None) -> None:
                nonlocal released
                if not released:
                    released = True
                    await self.limiter.release(cohort, status, estimate, used)

            streaming = False
            try:
                try:
                    self.stats.upstream_calls += 1
                    r = await self.client.send(upstream, stream=True)
                except httpx.TransportError as exc:
                    return self._failure(exc)
                self._count(r.status_code)
                out_headers = {k: v for k, v in r.headers.items() if k not in _DROP_RESPONSE}
                if "text/event-stream" in r.headers.get("content-type", ""):
                    streaming = True

                    async def relay() -> AsyncIterator[bytes]:
                        try:
                            async for chunk in r.aiter_bytes():  # decoded: no content-encoding
                                yield chunk
                        except httpx.TransportError as exc:
                            self._note_transport(exc)
                        finally:
                            # shielded: a client hanging up mid-stream must not leak the slot
                            await asyncio.shield(release(r.status_code, None))
                            await r.aclose()

                    return StreamingResponse(relay(), r.status_code, headers=out_headers)
                try:
                    content = await r.aread()
                except httpx.TransportError as exc:
                    return self._failure(exc)
                finally:
                    await r.aclose()
                await release(r.status_code, used_tokens(content) if r.is_success else None)
            finally:
                if not streaming:  # whatever happened (an error, a cancel), the slot goes back
                    await asyncio.shield(release(None, None))
            if key and self.cache is not None:
                from offscope.evalmode.cache import cacheable

                if cacheable(r.status_code, content):
                    self.cache.put(
                        key,
                        r.status_code,
                        r.headers.get("content-type", "application/json"),
                        content,
                    )
            return Response(content, r.status_code, headers=out_headers)

        @contextlib.asynccontextmanager
        async def lifespan(_app: Any) -> AsyncIterator[None]:
            yield
            for client in self._clients:
                await client.aclose()

        return Starlette(
            routes=[Route("/{path:path}", forward, methods=["GET", "POST"])], lifespan=lifespan
        )

    def _count(self, status: int) -> None:
        self.stats.statuses[str(status)] = self.stats.statuses.get(str(status), 0) + 1
        if not 200 <= status < 300:
            self.stats.upstream_failures += 1

    def _note_transport(self, exc: httpx.TransportError) -> str:
        self.stats.upstream_failures += 1
        if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
            self.stats.stalls += 1
            return "stall"
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
            self.stats.connect_errors += 1
            return "connect"
        return "transport"

    def _failure(self, exc: httpx.TransportError) -> Any:
        from starlette.responses import JSONResponse

        kind = self._note_transport(exc)
        status = 504 if kind == "stall" else 502
        message = {
            "stall": f"the model endpoint sent nothing for {self.retry.read_timeout:g}s",
            "connect": "the model endpoint could not be reached",
            "transport": "the connection to the model endpoint failed",
        }[kind]
        return JSONResponse(
            {"error": {"type": f"offscope_upstream_{kind}", "message": f"{message}: {exc!r}"}},
            status,
            headers={GATEWAY_HEADER: kind},
        )
