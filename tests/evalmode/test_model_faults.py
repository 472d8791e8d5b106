"""A model endpoint that fails for infrastructure reasons: retried, limited, cached, never scored.

Real servers on loopback (tests/support/faulty_model.py answers as the simulated model does,
with faults injected by request), the real reference agent, `offscope grid` as a subprocess.
Assertions are on what the model server received (its arrival log, its concurrency count)
and on what the grid wrote."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from offscope.evalmode.agent import EXIT_INFRA, AgentConfig, ModelTally, run_agent
from offscope.evalmode.case import BUNDLED, load_cases
from offscope.evalmode.endpoint import EndpointLimiter, RetryPolicy, retry_after
from offscope.evalmode.harness import LoopbackServer
from offscope.trace.events import read_trace
from tests.support.faulty_model import Faults, FaultyModel

CASES = load_cases([BUNDLED])
HTTP_CASES = [c for c in CASES if c.tools == ["http_request"]][:2]
# A brief the simulated model does not know: it answers in one call, with no tool call.
UNKNOWN_BRIEF = "Summarise the weather in a city that does not exist."


def _agent(url: str, retry: RetryPolicy, tally: ModelTally | None = None) -> AgentConfig:
    return AgentConfig(
        model_url=url + "/v1", model="m", brief=UNKNOWN_BRIEF, tools=[], retry=retry, tally=tally
    )


def _quick(**kw) -> RetryPolicy:
    return RetryPolicy(**{"base": 0.01, "cap": 0.05, "read_timeout": 5.0, **kw})


def test_429_is_retried_after_the_retry_after_it_asked_for() -> None:
    model = FaultyModel(
        latency=0, fail_first=2, fail_with="429", faults=Faults(0, 0, 0, retry_after="1")
    )
    with LoopbackServer(model, "model") as srv:
        tally = ModelTally()
        result = asyncio.run(run_agent(_agent(srv.url, _quick(), tally)))
    assert result.stopped == "no_tool_call", result
    assert [a.outcome for a in model.arrivals] == ["429", "429", "ok"]
    assert len({a.key for a in model.arrivals}) == 1  # the same request, sent again
    gaps = [b.at - a.at for a, b in zip(model.arrivals, model.arrivals[1:], strict=False)]
    # full jitter alone would wait at most 0.05 s; the endpoint asked for 1 s
    assert all(g >= 1.0 for g in gaps), gaps
    assert tally.retries == 2 and tally.infra_errors == 0


def test_retry_after_as_seconds_or_http_date() -> None:
    assert retry_after("7") == 7.0
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert retry_after("soon") is None and retry_after(None) is None


def test_500s_are_retried_and_the_answer_is_the_models() -> None:
    model = FaultyModel(latency=0, fail_first=3, fail_with="500", faults=Faults.none())
    with LoopbackServer(model, "model") as srv:
        cfg = _agent(srv.url, _quick())
        result = asyncio.run(run_agent(cfg))
    assert [a.outcome for a in model.arrivals] == ["500", "500", "500", "ok"]
    assert result.stopped == "no_tool_call" and "unknown brief" in result.summary
    assert cfg.budget.retries == 3 and cfg.budget.attempts == 4


def test_a_stalled_connection_is_detected_by_the_read_timeout_and_retried() -> None:
    model = FaultyModel(
        latency=0, fail_first=1, fail_with="stall", stall_seconds=60, faults=Faults.none()
    )
    with LoopbackServer(model, "model") as srv:
        result = asyncio.run(run_agent(_agent(srv.url, _quick(read_timeout=0.5))))
    assert [a.outcome for a in model.arrivals] == ["stall", "ok"]
    assert result.stopped == "no_tool_call"


def test_an_exhausted_budget_ends_the_run_as_infra_error() -> None:
    model = FaultyModel(latency=0, always="429", faults=Faults(0, 0, 0, retry_after="0"))
    with LoopbackServer(model, "model") as srv:
        tally = ModelTally()
        result = asyncio.run(run_agent(_agent(srv.url, _quick(retries=3), tally)))
    assert result.stopped == "infra_error"
    assert "HTTP 429" in result.summary and "3 retries" in result.summary
    assert model.calls == 4  # the first attempt and three retries, no more
    assert tally.infra_errors == 1


def test_the_agent_module_exits_75_on_an_infra_failure() -> None:
    model = FaultyModel(latency=0, always="500", faults=Faults.none())
    with LoopbackServer(model, "model") as srv:
        env = {
            **os.environ,
            "OFFSCOPE_MODEL_URL": srv.url + "/v1",
            "OFFSCOPE_MODEL": "m",
            "OFFSCOPE_BRIEF": UNKNOWN_BRIEF,
            "OFFSCOPE_MODEL_RETRIES": "2",
            "OFFSCOPE_MODEL_RETRY_WAIT": "5",
        }
        proc = subprocess.run(
            [sys.executable, "-m", "offscope.evalmode.agent"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == EXIT_INFRA == 75, proc.stderr
    assert json.loads(proc.stdout)["stopped"] == "infra_error"
    assert model.calls == 3


def test_the_shared_limiter_holds_its_concurrency_across_tasks() -> None:
    limiter = EndpointLimiter(concurrency=3)
    seen: list[int] = []

    async def call() -> None:
        cohort = await limiter.acquire(10)
        seen.append(limiter.in_flight)
        await asyncio.sleep(0.01)
        await limiter.release(cohort, 200, 10, 10)

    async def main() -> None:
        await asyncio.gather(*(call() for _ in range(40)))

    asyncio.run(main())
    assert max(seen) == 3 and limiter.stats.peak_in_flight == 3 and limiter.in_flight == 0


class Clock:
    """The limiter's clock, moved by hand: its windows without sleeping."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _send(limiter: EndpointLimiter, n: int) -> list[int]:
    return [await limiter.acquire(1) for _ in range(n)]


async def _answer(limiter: EndpointLimiter, cohorts: list[int], status: int) -> None:
    for cohort in cohorts:
        await limiter.release(cohort, status, 1, None)


def test_many_429s_slow_the_whole_endpoint_down_and_a_clean_cohort_speeds_it_up() -> None:
    clock = Clock()
    limiter = EndpointLimiter(concurrency=40, clock=clock)

    async def main() -> None:
        sent = await _send(limiter, 20)
        clock.now = 2.5  # the window closed: the cohort is judged once all 20 are answered
        await _answer(limiter, sent[:19], 429)
        assert limiter.stats.slowdowns == 0  # one answer still to come
        await _answer(limiter, sent[19:], 429)
        assert limiter.stats.slowdowns == 1 and limiter.allowed == 28 and limiter.rate_factor < 1
        clock.now = 4.0  # the next window, wholly at the new limits
        sent = await _send(limiter, 20)
        clock.now = 6.0
        await _answer(limiter, sent, 200)

    asyncio.run(main())
    # sped up: the rate x1.1, the concurrency at once to the configured 40 (far more than the
    # few calls in flight)
    assert limiter.allowed == 40 and limiter.rate_factor == 0.7 * 1.1
    assert limiter.stats.slowdowns == 1


def test_a_steady_tenth_of_429s_that_come_back_first_never_slows_the_endpoint_down() -> None:
    """A 429 comes back at once, a success after the model's latency: counted as they
    arrive, the first answers of every second would be mostly 429s. Judged by the second
    in which they were sent, a tenth is a tenth."""
    clock = Clock()
    limiter = EndpointLimiter(clock=clock)

    async def main() -> None:
        for window in range(30):
            clock.now = window * 2.0
            sent = await _send(limiter, 60)
            clock.now += 1.9
            await _answer(limiter, sent[:6], 429)
            clock.now += 2.0  # a window later the successes come back
            await _answer(limiter, sent[6:], 200)

    asyncio.run(main())
    assert limiter.stats.throttled == 180 and limiter.stats.slowdowns == 0
    assert limiter.allowed == math.inf and limiter.rate_factor == 1.0


def test_requests_sent_before_a_slowdown_do_not_slow_it_down_again() -> None:
    """Two overloaded windows in flight at once are one overload: the second was sent at
    the old limits and says nothing about the new ones."""
    clock = Clock()
    limiter = EndpointLimiter(concurrency=100, clock=clock)

    async def main() -> None:
        first = await _send(limiter, 30)
        clock.now = 2.0
        second = await _send(limiter, 30)
        clock.now = 4.0
        await _answer(limiter, first, 429)
        await _answer(limiter, second, 429)
        clock.now = 6.0
        third = await _send(limiter, 30)  # the next window, wholly at the new limits: judged
        clock.now = 8.0
        await _answer(limiter, third, 429)

    asyncio.run(main())
    assert limiter.stats.slowdowns == 2 and limiter.allowed == 100 * 0.7 * 0.7


def _grid(url: str, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-m",
        "offscope.cli",
        "grid",
        "--cases",
        *[str(BUNDLED / f"{c.id}.yaml") for c in HTTP_CASES],
        "--cells",
        "diagonal",
        "--reps",
        "2",
        "--model-url",
        url + "/v1",
        "--model",
        "m",
        "--operator-timeout",
        "0",
        "--progress-every",
        "0.2",
        "--out",
        str(out),
        *extra,
    ]
    env = {**os.environ, "CI": ""}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.timeout(600)
def test_grid_limits_concurrency_reports_progress_and_reuses_paid_answers(tmp_path: Path) -> None:
    model = FaultyModel(latency=0.2, faults=Faults.none())
    out = tmp_path / "out"
    with LoopbackServer(model, "model") as srv:
        first = _grid(srv.url, out, "--model-concurrency", "2", "--workers", "8")
        assert first.returncode == 0, first.stderr[-2000:]
        calls = model.calls
        assert calls >= 8
        # the server counted: never more than the limit in flight, and the limit was used
        assert model.peak_in_flight == 2
        # stderr is a pipe: plain progress lines with done/total, rate, ETA, retries
        lines = [x for x in first.stderr.splitlines() if x.startswith("offscope grid: ")]
        done = [x for x in lines if " done" in x]
        assert done and done[-1].startswith("offscope grid: 8/8 done"), first.stderr
        assert all("trajectories/s" in x and "retries" in x and "infra errors" in x for x in done)
        meta = json.loads((out / "grid.json").read_text())
        endpoint = meta["configuration"]["model_endpoint"]
        assert endpoint["cache"] == "on" and endpoint["limits"]["concurrency"] == 2
        assert meta["model_endpoint_stats"]["cache"]["misses"] == calls
        before = _rows(out)

        # the same trajectories again (their runs dropped from the trace): every answer is reused
        (out / "trajectories.jsonl").unlink()
        again = _grid(srv.url, out, "--model-concurrency", "2", "--workers", "8")
        assert again.returncode == 0, again.stderr[-2000:]
        assert model.calls == calls  # zero model calls
        assert (
            json.loads((out / "grid.json").read_text())["model_endpoint_stats"]["cache"]["hits"]
            == calls
        )
        assert _rows(out) == before  # the proxy recorded the cached answers as the originals

        (out / "trajectories.jsonl").unlink()
        refused = _grid(srv.url, out, "--no-cache", "--workers", "8")
        assert refused.returncode == 0, refused.stderr[-2000:]
        assert model.calls == 2 * calls
        assert _rows(out) == before


def _rows(out: Path) -> dict[str, dict]:
    return {r["run"]: r for r in json.loads((out / "results.json").read_text())["runs"]}


@pytest.mark.timeout(300)
def test_a_model_that_only_throttles_never_yields_an_ordinary_run(tmp_path: Path) -> None:
    model = FaultyModel(latency=0, always="429", faults=Faults(0, 0, 0, retry_after="0"))
    out = tmp_path / "out"
    with LoopbackServer(model, "model") as srv:
        proc = _grid(srv.url, out, "--model-retries", "2", "--workers", "4")
    ends = [e for e in read_trace(out / "trajectories.jsonl") if e.type == "run_end"]
    assert len(ends) == 8, proc.stderr[-2000:]
    # each run: its first call and 2 retries reached the model, and the run says infra_error
    assert model.calls == 8 * 3
    assert all("infra_error" in (e.reason, e.detail) for e in ends), [
        (e.reason, e.detail) for e in ends
    ]


def test_rate_budgets_make_the_next_call_wait_and_usage_settles_the_estimate() -> None:
    from offscope.evalmode.endpoint import TokenBucket, estimate_tokens, used_tokens

    requests = TokenBucket(60)  # one a second, a burst of one
    assert requests.wait_time(1, 1.0) == 0
    requests.spend(1)
    assert requests.wait_time(1, 1.0) > 0.5  # the next request waits about a second
    assert requests.wait_time(1, 0.5) > requests.wait_time(1, 1.0)  # slowed down: longer
    body = json.dumps({"messages": [{"content": "x" * 400}], "max_tokens": 100}).encode()
    assert estimate_tokens(body) == len(body) / 4 + 100
    assert used_tokens(b'{"usage": {"total_tokens": 42}}') == 42
    assert used_tokens(b"not json") is None
