"""A streamed model answer holds one of the endpoint's concurrency slots while it streams; an
agent that hangs up mid-stream must give the slot back. With `--model-concurrency 1` and an
endpoint that never ends its stream, a leaked slot blocks every later call for good, so these
tests hang (and fail on their client timeouts) if it leaks."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from offscope.cli import main
from offscope.evalmode.case import BUNDLED, load_cases
from offscope.evalmode.endpoint import EndpointLimiter, Gateway, RetryPolicy
from offscope.evalmode.harness import LoopbackServer
from offscope.trace.events import read_trace

FIRST_CHUNK = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"a"}}]}\n\n'


class EndlessStream:
    """An endpoint whose streamed answers send one chunk and then nothing, ever (until the
    caller hangs up); plain calls get a short JSON answer. It counts streams begun and ended."""

    def __init__(self) -> None:
        self.begun = 0
        self.ended = 0
        self.plain = 0

    def app(self) -> Starlette:
        async def chat(request: Request) -> Response:
            body = await request.json()
            if not body.get("stream"):
                self.plain += 1
                return JSONResponse({"choices": [{"message": {"content": "ok"}}]})

            async def endless():
                self.begun += 1
                try:
                    yield FIRST_CHUNK
                    await asyncio.sleep(3600)
                finally:
                    self.ended += 1

            return StreamingResponse(endless(), media_type="text/event-stream")

        return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def _until(condition, what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.mark.timeout(120)
def test_a_client_that_hangs_up_mid_stream_releases_its_slot() -> None:
    upstream = EndlessStream()
    limiter = EndpointLimiter(concurrency=1)
    with LoopbackServer(upstream.app(), "endless") as up:
        gateway = Gateway(up.url, limiter, None, RetryPolicy(read_timeout=3600))
        with LoopbackServer(gateway.app(), "gateway") as gw:
            url = gw.url + "/v1/chat/completions"

            async def drop_mid_stream() -> bytes:
                async with (
                    httpx.AsyncClient(timeout=30) as client,
                    client.stream("POST", url, json={"stream": True}) as r,
                ):
                    async for chunk in r.aiter_bytes():
                        return chunk  # hang up after the first chunk
                return b""

            for _ in range(3):  # each drop must free the one slot for the next stream
                assert asyncio.run(drop_mid_stream()).startswith(b"data:")
            # and a plain call gets through (it would wait for the slot forever otherwise)
            assert httpx.post(url, json={"stream": False}, timeout=30).status_code == 200
    assert upstream.begun == 3 and upstream.plain == 1
    assert limiter.in_flight == 0 and limiter.stats.peak_in_flight == 1
    _until(lambda: upstream.ended == 3, "the gateway did not close the upstream streams")


AGENT = """
import os, httpx
with httpx.Client(timeout=60) as client:  # proxy and CA from the environment the grid sets
    with client.stream(
        "POST",
        os.environ["OFFSCOPE_MODEL_URL"] + "/chat/completions",
        json={"model": os.environ["OFFSCOPE_MODEL"], "stream": True,
              "messages": [{"role": "user", "content": os.environ["OFFSCOPE_RUN_ID"]}]},
    ) as r:
        for chunk in r.iter_bytes():
            break
os._exit(0)  # gone mid-stream, as an agent that crashes or gives up
"""


@pytest.mark.timeout(300)
def test_agents_that_drop_mid_stream_through_the_proxy_do_not_starve_the_next(
    tmp_path: Path,
) -> None:
    """Real grid, real proxy: four agent commands, one model slot, an endpoint that never ends
    a stream. Each agent reads the first chunk and exits; if the slot leaked, the second agent
    would wait for it until its --timeout and end as `timeout`."""
    upstream = EndlessStream()
    agent = tmp_path / "dropper.py"
    agent.write_text(AGENT)
    case = next(c for c in load_cases([BUNDLED]) if c.tools == ["http_request"])
    out = tmp_path / "out"
    with LoopbackServer(upstream.app(), "endless") as up:
        argv = ["grid", "--cases", str(BUNDLED / f"{case.id}.yaml"), "--cells", "diagonal"]
        argv += ["--reps", "2", "--workers", "4", "--operator-timeout", "0", "--timeout", "60"]
        argv += ["--model-url", up.url + "/v1", "--model", "m", "--model-concurrency", "1"]
        argv += ["--model-read-timeout", "3600", "--agent", f"{sys.executable} {agent}"]
        argv += ["--stream", "--out", str(out)]
        assert main(argv) == 0
        _until(lambda: upstream.ended == 4, "the gateway did not close the upstream streams")
    ends = [e for e in read_trace(out / "trajectories.jsonl") if e.type == "run_end"]
    assert sorted((e.reason, e.exit_code) for e in ends) == [("exit", 0)] * 4
    assert upstream.begun == 4
