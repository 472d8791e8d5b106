"""Hot reload never stalls the agents.

A bystander agent calls through a real `offscope proxy` subprocess every
20 ms while the proxy hot-reloads a 100,000-target ledger (seconds of
parsing, done in a child process) and then while a grant is approved
(applied as an overlay, nothing recompiled). The baseline is a twin: the
same agent through a second, identical proxy that reloads nothing, over the
same seconds, so both see the same machine load. The reloading proxy's
slowest call may exceed the twin's by at most 200 ms (generously: twice the
twin's, plus 200 ms, since one slowest call is noise on a loaded machine).
The reload that ran on the event loop stalled every agent for the whole
parse (8 s and more), and fails this by seconds.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import yaml

from tests.support.hostile import ScriptedUpstream
from tests.support.sidecar_kit import LEDGER_YAML, ProxyProcess, events, of_type, scrape, total

# Seconds a reload may add to the slowest call. The stall this guards against (the
# target index built on the event loop) was ~350 ms; 100 ms failed 1 CI run in 2 on a
# loaded 2-core machine (165 ms vs the twin's 17 ms), so the bound sits between.
STALL_BOUND = 0.200
TARGETS = 100_000


def script(
    method: str, path: str, headers: dict[str, str], body: bytes
) -> tuple[int, dict[str, str], bytes]:
    return 200, {"content-type": "application/json"}, b'{"ok":true}'


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def big_ledger(n: int) -> str:
    """The sidecar ledger under a new id, with `n` more customer records in scope."""
    records = "\n".join(f'    - "customer:{100_000 + i}"' for i in range(n))
    return LEDGER_YAML.replace("id: sidecar-e2e", "id: sidecar-big").replace(
        '  records: ["customer:4411"]', '  records:\n    - "customer:4411"\n' + records
    )


class Bystander:
    """An agent calling every 20 ms on its own thread; records (start, latency)."""

    def __init__(self, proxy: ProxyProcess) -> None:
        self.proxy = proxy
        self.calls: list[tuple[float, float]] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(proxy=self.proxy.proxy_url("bystander"), timeout=60) as client:
            while not self._stop.is_set():
                t0 = time.monotonic()
                try:
                    ok = client.get("http://crm.acme.test/customers/4411").status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.calls.append((t0, time.monotonic() - t0))
                self.failures += not ok
                time.sleep(0.02)

    def __enter__(self) -> Bystander:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def slowest(self, start: float, end: float) -> float:
        # A call that began before `end` and was still running counts too.
        return max((lat for t0, lat in self.calls if start <= t0 < end), default=0.0)


def wait_for(check, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def within_bound(reloading: float, twin: float) -> bool:
    return reloading <= 2 * twin + STALL_BOUND


def test_reloads_do_not_stall_a_bystander(tmp_path, confdir):
    ledger = tmp_path / "ledger.yaml"
    ledger.write_text(LEDGER_YAML)
    twin_dir = tmp_path / "twin"
    twin_dir.mkdir()
    (twin_dir / "ledger.yaml").write_text(LEDGER_YAML)
    grants = tmp_path / "ledger.grants.yaml"
    with (
        ScriptedUpstream(script) as up,
        ProxyProcess(
            tmp_path,
            ledger=str(ledger),
            routes=up.routes("crm.acme.test"),
            confdir=confdir,
            name="reload",
        ) as proxy,
        ProxyProcess(
            twin_dir,
            ledger=str(twin_dir / "ledger.yaml"),
            routes=up.routes("crm.acme.test"),
            confdir=confdir,
            name="twin",
        ) as twin,
        Bystander(proxy) as agent,
        Bystander(twin) as twin_agent,
    ):
        ledger_id = lambda: proxy.control("GET", "/readyz").json()["ledger"]  # noqa: E731
        time.sleep(2)  # past the first calls' warm-up

        t1 = time.monotonic()
        write_atomically(ledger, big_ledger(TARGETS))
        assert wait_for(lambda: ledger_id() == "sidecar-big", timeout=300), proxy.stderr()[-2000:]
        time.sleep(1)
        reload_seconds = time.monotonic() - t1
        during_reload, twin_reload = (
            agent.slowest(t1, time.monotonic()),
            twin_agent.slowest(t1, time.monotonic()),
        )
        print(
            "reload: slowest calls (s after the edit, ms):",
            sorted(
                ((round(t - t1, 2), round(lat * 1000)) for t, lat in agent.calls if t >= t1),
                key=lambda c: -c[1],
            )[:5],
            "twin:",
            sorted(
                ((round(t - t1, 2), round(lat * 1000)) for t, lat in twin_agent.calls if t >= t1),
                key=lambda c: -c[1],
            )[:5],
        )
        assert within_bound(during_reload, twin_reload), (
            f"slowest call {during_reload:.3f} s during the reload, {twin_reload:.3f} s through the twin"
        )

        # A grant for a customer outside the ledger: applied without recompiling it.
        t2 = time.monotonic()
        write_atomically(
            grants,
            yaml.safe_dump(
                {
                    "schema": "offscope.grants/1",
                    "ledger": "sidecar-big",
                    "grants": [
                        {
                            "id": "grant-resilience",
                            "target": "record:customer:9999",
                            "approver": "ops",
                            "expires": "2099-01-01T00:00:00Z",
                        }
                    ],
                }
            ),
        )
        assert wait_for(lambda: '"file": "grants"' in proxy.stderr(), timeout=30), proxy.stderr()[
            -2000:
        ]
        grant_seconds = time.monotonic() - t2
        time.sleep(1)
        during_grant, twin_grant = (
            agent.slowest(t2, time.monotonic()),
            twin_agent.slowest(t2, time.monotonic()),
        )
        with httpx.Client(proxy=proxy.proxy_url("granted"), timeout=30) as c:
            assert c.get("http://crm.acme.test/customers/9999").status_code == 200

        # A deleted ledger is one failed reload, not one a second; the old one stays.
        ledger.unlink()
        time.sleep(3.5)
        failures = total(
            scrape(proxy.metrics_port), "offscope_reload_failures_total", file="ledger"
        )
        assert ledger_id() == "sidecar-big"
        failures_after_wait = total(
            scrape(proxy.metrics_port), "offscope_reload_failures_total", file="ledger"
        )
        calls, failed = len(agent.calls), agent.failures + twin_agent.failures
    print(
        f"bystander: {calls} calls; slowest during the {TARGETS}-target reload ({reload_seconds:.1f} s) "
        f"{during_reload * 1000:.0f} ms (twin {twin_reload * 1000:.0f} ms), during the grant "
        f"({grant_seconds:.1f} s) {during_grant * 1000:.0f} ms (twin {twin_grant * 1000:.0f} ms)"
    )
    assert failed == 0
    assert within_bound(during_grant, twin_grant)
    assert failures == failures_after_wait == 1

    (granted,) = of_type(events(proxy.trace), "tool_call", "granted")
    assert granted["call"]["scope"] == "in" and granted["ledger"] == "sidecar-big"
    assert [t["grant"] for t in granted["call"]["targets"] if t["kind"] == "record"] == [
        "grant-resilience"
    ]
