"""Load: 50 concurrent runs, thousands of calls, through one `offscope proxy`
process; then SIGTERM. Every call is in the trace exactly once, the run
counters match, and per-run state is released (RSS back near warm-up)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import httpx
import pytest

from tests.support.sidecar_kit import (
    ProxyProcess,
    events,
    of_type,
    scrape,
    steps_by_run,
    tls,
    total,
)

pytestmark = pytest.mark.timeout(180)

CONCURRENT = 50
CALLS = 40  # per run in the measured round -> 2,000 calls
WARM_CALLS = 12
RSS_SLACK_MB = 30


def plan(i: int, n: int) -> list[tuple[str, str]]:
    """A run's calls: in-scope reads, out-of-scope reads, blocked acts, operator asks."""
    scheme = "https" if i % 5 == 0 else "http"
    cycle = [
        ("GET", f"{scheme}://crm.acme.test/customers/4411"),
        ("GET", f"{scheme}://crm.acme.test/customers/9999"),
        ("PATCH", f"{scheme}://crm.acme.test/customers/9999"),
        ("POST", f"{scheme}://ops.acme.test/ask"),
        ("GET", f"{scheme}://other.acme.test/status"),
    ]
    return [cycle[(i + k) % len(cycle)] for k in range(n)]


async def drive(proxy: ProxyProcess, prefix: str, n_calls: int) -> dict[str, Counter]:
    """CONCURRENT runs at once; returns run -> Counter(status)."""
    ca = tls(proxy.ca)
    results: dict[str, Counter] = {}

    async def run(i: int) -> None:
        run_id = f"{prefix}-{i:03d}"
        statuses: Counter = Counter()
        async with httpx.AsyncClient(proxy=proxy.proxy_url(run_id), verify=ca, timeout=60) as c:
            for method, url in plan(i, n_calls):
                r = await c.request(method, url, json={"n": 1} if method != "GET" else None)
                statuses[r.status_code] += 1
                if r.status_code not in (200, 403):
                    print(f"{run_id} {method} {url}: {r.status_code} {r.text[:300]}")
        results[run_id] = statuses

    await asyncio.gather(*(run(i) for i in range(CONCURRENT)))
    async with httpx.AsyncClient(timeout=10) as ctl:
        for run_id in results:
            r = await ctl.post(
                f"http://127.0.0.1:{proxy.control_port}/runs/{run_id}/end",
                json={},
                headers={"authorization": f"Bearer {proxy.token}"},
            )
            assert r.status_code == 200, r.text
    return results


def settle_rss(proxy: ProxyProcess) -> int:
    """RSS in kB once it stops moving (bounded: at most ~2 s)."""
    last = proxy.rss_kb()
    for _ in range(10):
        time.sleep(0.2)
        now = proxy.rss_kb()
        if abs(now - last) < 256:
            return now
        last = now
    return last


@pytest.mark.slow
async def test_fifty_concurrent_runs_thousands_of_calls(tmp_path, ledger_file, upstream, confdir):
    proxy = ProxyProcess(
        tmp_path,
        ledger=ledger_file,
        policy="enforce",
        routes=upstream.routes(),
        confdir=confdir,
        name="load",
        extra=["--log-level", "warning"],
    )
    try:
        await asyncio.to_thread(proxy.wait_ready)
        rss_start = proxy.rss_kb()
        warm = await drive(proxy, "warm", WARM_CALLS)
        rss_warm = await asyncio.to_thread(settle_rss, proxy)
        t0 = time.monotonic()
        main = await drive(proxy, "load", CALLS)
        elapsed = time.monotonic() - t0
        rss_after = await asyncio.to_thread(settle_rss, proxy)
        active = proxy.control("GET", "/runs").json()
        m = await asyncio.to_thread(scrape, proxy.metrics_port)
    finally:
        code = await asyncio.to_thread(proxy.terminate)

    n_runs = 2 * CONCURRENT
    print(
        f"\nload: {CONCURRENT * CALLS} calls in {elapsed:.1f}s ({CONCURRENT * CALLS / elapsed:.0f}/s); "
        f"RSS start {rss_start / 1024:.1f} MB, after warm-up {rss_warm / 1024:.1f} MB, "
        f"after {CONCURRENT} runs x {CALLS} calls {rss_after / 1024:.1f} MB"
    )
    assert code == 0, proxy.stderr()
    # Agents got real answers: 200 from the upstream, 403 for the blocked acts, nothing else.
    for statuses in [*warm.values(), *main.values()]:
        assert set(statuses) <= {200, 403}, statuses
    assert sum(s[403] for s in main.values()) == CONCURRENT * CALLS // 5

    # Per-run state released, counters exact.
    assert active["active"] == 0
    assert total(m, "offscope_runs_total") == n_runs
    assert total(m, "offscope_run_ends_total", reason="end") == n_runs
    assert total(m, "offscope_active_runs") == 0
    assert total(m, "offscope_tool_calls_total") + total(
        m, "offscope_operator_replies_total"
    ) == CONCURRENT * (CALLS + WARM_CALLS)
    assert rss_after < rss_warm + RSS_SLACK_MB * 1024, (rss_warm, rss_after)

    # Every call is in the trace exactly once: steps 1..N, one event each.
    evs = events(proxy.trace)
    steps = steps_by_run(evs)
    assert len(steps) == n_runs
    for run_id, counter in steps.items():
        n = WARM_CALLS if run_id.startswith("warm") else CALLS
        assert counter == Counter(range(1, n + 1)), run_id
    assert Counter(e["run"] for e in of_type(evs, "run_start")) == Counter({r: 1 for r in steps})
    ends = of_type(evs, "run_end")
    assert len(ends) == n_runs and {e["reason"] for e in ends} == {"end"}
