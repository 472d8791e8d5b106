"""A loopback OpenAI-compatible model that answers exactly as the simulated model does, slowly
and with injected faults: what a hosted model looks like to the grid.

It wraps the simulated model's own ASGI app (offscope/evalmode/sim/simmodel.py), so there is
one model, not two: a request that is answered gets the simulated model's answer for that
request, byte for byte. Before answering it waits `latency` seconds; some requests instead get
a 429 with Retry-After, a 500, or a stalled connection (headers never sent). Which request gets
which fault is drawn from a seeded hash of (seed, request digest, how many times that exact
request has been seen), never from arrival order, so a run is reproducible however the
requests interleave, and a retry of a failed request is a fresh draw.

It records what it received (for tests: arrival times, the outcome of each request, the
number of requests in flight and its peak).

It lives in tests/support rather than the package: it is an instrument for the tests and
bench/grid_real_model.py, not something a user points a grid at.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from offscope.evalmode.case import BUNDLED, Case, load_cases
from offscope.evalmode.sim.simmodel import SimulatedModel, load_disposition
from offscope.evalmode.sim.simmodel import app as sim_app

CHAT = "/v1/chat/completions"


@dataclass
class Faults:
    throttle: float = 0.10  # 429 with Retry-After
    error: float = 0.02  # 500
    stall: float = 0.01  # connection accepted, nothing sent
    retry_after: str = "1"  # the Retry-After value sent with a 429 (seconds or an HTTP date)

    @classmethod
    def none(cls) -> Faults:
        return cls(0.0, 0.0, 0.0)


@dataclass
class Arrival:
    at: float  # time.monotonic() when the request arrived
    key: str  # digest of the request body
    attempt: int  # 1 for the first time this exact request came, 2 for its first retry, ...
    outcome: str  # ok | 429 | 500 | stall


@dataclass
class FaultyModel:
    cases: list[Case] = field(default_factory=lambda: load_cases([BUNDLED]))
    latency: float = 2.0
    faults: Faults = field(default_factory=Faults)
    seed: int = 0
    stall_seconds: float = 3600.0
    # every request fails this way (an outcome: 429, 500, stall): a model that only refuses
    always: str | None = None
    # the first `fail_first` attempts of every distinct request fail with `fail_with`
    fail_first: int = 0
    fail_with: str = "429"

    def __post_init__(self) -> None:
        self.inner = sim_app(SimulatedModel(self.cases, load_disposition("default")))
        self.arrivals: list[Arrival] = []
        self.in_flight = 0
        self.peak_in_flight = 0
        self._seen: dict[str, int] = {}

    # --- what it did -------------------------------------------------------------

    def outcomes(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for a in self.arrivals:
            counts[a.outcome] = counts.get(a.outcome, 0) + 1
        return counts

    @property
    def calls(self) -> int:
        return len(self.arrivals)

    # --- the fault draw ----------------------------------------------------------

    def _draw(self, key: str, attempt: int) -> str:
        if self.always:
            return self.always
        if attempt <= self.fail_first:
            return self.fail_with
        digest = hashlib.blake2b(f"{self.seed}:{key}:{attempt}".encode(), digest_size=8).digest()
        u = int.from_bytes(digest, "big") / 2**64
        f = self.faults
        if u < f.throttle:
            return "429"
        if u < f.throttle + f.error:
            return "500"
        if u < f.throttle + f.error + f.stall:
            return "stall"
        return "ok"

    # --- ASGI ----------------------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != CHAT or scope["method"] != "POST":
            await self.inner(scope, receive, send)
            return
        body = await _read_body(receive)
        key = hashlib.sha256(body).hexdigest()
        attempt = self._seen[key] = self._seen.get(key, 0) + 1
        outcome = self._draw(key, attempt)
        self.arrivals.append(Arrival(time.monotonic(), key, attempt, outcome))
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            if outcome == "429":
                await _json(
                    send,
                    429,
                    {"error": {"type": "rate_limit_exceeded"}},
                    [(b"retry-after", self.faults.retry_after.encode())],
                )
            elif outcome == "500":
                await _json(send, 500, {"error": {"type": "server_error"}})
            elif outcome == "stall":
                await _stall(receive, self.stall_seconds)
            else:
                await asyncio.sleep(self.latency)
                await self.inner(scope, _replay(body, receive), send)
        finally:
            self.in_flight -= 1


async def _read_body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Any) -> Any:
    sent = False

    async def again() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


async def _json(
    send: Any, status: int, payload: Any, extra: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    data = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + list(extra)})
    await send({"type": "http.response.body", "body": data})


async def _stall(receive: Any, seconds: float) -> None:
    """Hold the connection without a byte until the client gives up (or `seconds` pass)."""

    async def until_disconnect() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(until_disconnect(), seconds)
