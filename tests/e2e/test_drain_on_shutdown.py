"""SIGTERM under load loses no answered call.

50 concurrent agents (httpx async clients, one run each) call a loopback
upstream through a real `offscope proxy` subprocess; the upstream counts
every response it has written in full. Mid-load the proxy gets SIGTERM: it
stops accepting, lets the flows in flight complete and records them, then
exits. Every call the upstream answered must be in the trace, and every
answer an agent received too.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time
from urllib.parse import parse_qs, urlsplit

import httpx

from tests.support.hostile import ScriptedUpstream
from tests.support.sidecar_kit import LEDGER_YAML, ProxyProcess, events, of_type

AGENTS = 50
SIGTERM_AFTER = 400  # answered calls before the signal


def script(
    method: str, path: str, headers: dict[str, str], body: bytes
) -> tuple[int, dict[str, str], bytes]:
    return (
        200,
        {"content-type": "application/json"},
        json.dumps({"ok": True, "path": path}).encode(),
    )


def call_id(url_or_path: str) -> str:
    return parse_qs(urlsplit(url_or_path).query)["call"][0]


async def agent(proxy: ProxyProcess, i: int, received: set[str], refused: list[int]) -> None:
    """Calls until the proxy stops answering (a 503 "stopping", or a refused connection)."""
    async with httpx.AsyncClient(proxy=proxy.proxy_url(f"agent-{i}"), timeout=30) as client:
        for n in range(100_000):
            try:
                r = await client.get(f"http://crm.acme.test/customers/4411?call={i}-{n}")
            except httpx.HTTPError:
                return
            if r.status_code != 200:
                refused.append(r.status_code)
                return
            received.add(f"{i}-{n}")


async def load_then_sigterm(
    proxy: ProxyProcess, up: ScriptedUpstream
) -> tuple[set[str], list[int], float]:
    received: set[str] = set()
    refused: list[int] = []
    agents = [asyncio.create_task(agent(proxy, i, received, refused)) for i in range(AGENTS)]
    deadline = time.monotonic() + 120
    while len(up.answered) < SIGTERM_AFTER and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    t0 = time.monotonic()
    proxy.proc.send_signal(signal.SIGTERM)
    await asyncio.wait_for(asyncio.gather(*agents), 120)
    return received, refused, t0


def test_sigterm_under_load_loses_no_answered_call(tmp_path, confdir):
    ledger = tmp_path / "ledger.yaml"
    ledger.write_text(LEDGER_YAML)
    jitter = random.Random(13)
    # A little upstream latency, so that many calls are in flight at any moment.
    with ScriptedUpstream(script, delay=lambda: jitter.uniform(0.02, 0.06)) as up:
        proxy = ProxyProcess(
            tmp_path,
            ledger=str(ledger),
            routes=up.routes("crm.acme.test"),
            confdir=confdir,
            name="drain",
        ).wait_ready()
        try:
            received, refused, _ = asyncio.run(load_then_sigterm(proxy, up))
            code = proxy.proc.wait(60)  # it exits by itself after draining: no second signal
        finally:
            proxy.terminate(timeout=60)
        answered = {call_id(p) for p in up.answered}
    stderr = proxy.stderr_path.read_text(encoding="utf-8", errors="replace")
    traced = [call_id(e["call"]["url"]) for e in of_type(events(proxy.trace), "tool_call")]
    lost = answered - set(traced)
    drained = [json.loads(line) for line in stderr.splitlines() if '"drained"' in line]
    print(
        f"upstream answered {len(answered)}, agents received {len(received)}, traced {len(traced)}, "
        f"lost {len(lost)}, refused while stopping {len(refused)}, drain {drained}"
    )
    assert len(answered) > SIGTERM_AFTER  # the load did run across the signal
    assert not lost, sorted(lost)[:20]
    assert code == 0, (code, stderr[-3000:])
    assert received <= set(traced)
    assert len(traced) == len(set(traced))  # each call recorded once
    assert set(refused) <= {503}
    assert len(drained) == 1 and drained[0]["abandoned"] == 0, drained
    assert drained[0]["in_flight"] > 0  # the signal did come mid-load
    ends = of_type(events(proxy.trace), "run_end")
    assert {e["run"] for e in ends} == {f"agent-{i}" for i in range(AGENTS)}
