"""An adversarial tool argument against mid-path globs does not stall the proxy.

With the backtracking regex a 146 KiB argument against `/srv/**/data/**/*.json`
held the event loop for 10 s (every agent and /healthz waited), and
`/srv/**a**a**a**x` on a 1 KB path took 44 s. Here a real `offscope proxy`
subprocess carries such arguments (in a JSON body the ledger extracts a path
from, in a field a stage rule matches with a mid-path glob, and in the URL path)
by one attacking agent calling back to back while a bystander agent keeps
calling; the bystander's latency is compared with its own baseline, measured in
the same test, against the same proxy.
"""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

import httpx
import pytest

from offscope.ledgers.matcher import MAX_VALUE_CHARS
from offscope.proxy.mitm.ca import ensure_ca
from tests.support.sidecar_kit import ProxyProcess, echo_upstream, events, of_type

pytestmark = pytest.mark.timeout(300)

LEDGER = """\
schema: offscope.ledger/1
id: glob-dos
targets:
  hosts: [crm.acme.test, tools.acme.test]
  records: ["customer:4411"]
  paths: ["/srv/**/data/**/*.json", "/srv/**a**a**a**x", "/srv/app/**"]
extract:
  - match: {host: crm.acme.test, path: "/customers/{id}"}
    targets: {record: "customer:{id}"}
  - match: {host: tools.acme.test, path: "/**/files/{name}/**"}
    targets: {path: "{body.path}"}
stages:
  - match: {args: {path: "/srv/**a**b**c**x"}}
    stage: prepare
  - match: {path: "/**/v*/**/items/*"}
    stage: prepare
"""

# Bodies and URLs an agent controls: ~146 KiB each, shaped to make a backtracking
# matcher try every split (no final '.json', no final 'x').
ADVERSARIAL_PATHS = [
    "/srv/" + "data/" * 30_000 + "x.jso",  # matches nothing
    "/srv/" + "a" * 150_000 + "bcx",
]  # matches the stage rule and (but for its length) a target
ADVERSARIAL_URL = "http://tools.acme.test/" + "v1/" * 2_000 + "files/f/x"

BYSTANDER = "http://crm.acme.test/customers/4411"
SAMPLES = 40
# The requirement: an adversarial input never delays a bystander by more
# than 100 ms. Measured on the 90th percentile, so that the scheduling spikes a
# shared 2-CPU machine gives any process (the baseline shows them too) do not
# decide the test; the backtracking regex this replaces held the loop for
# seconds per call, which moves every percentile. The worst call gets a wider
# bound that still rules out any stall.
BOUND_P90_S = 0.100
BOUND_WORST_S = 1.0


def p90(samples: list[float]) -> float:
    return sorted(samples)[int(len(samples) * 0.9) - 1]


@pytest.fixture(scope="module")
def confdir(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("ca")
    ensure_ca(d)
    return str(d)


def _bystander(proxy: ProxyProcess, run: str, n: int) -> list[float]:
    took = []
    with httpx.Client(proxy=proxy.proxy_url(run), timeout=60) as client:
        for _ in range(n):
            start = time.perf_counter()
            assert client.get(BYSTANDER).status_code == 200
            took.append(time.perf_counter() - start)
            time.sleep(0.02)
    return took


def _attacker(proxy: ProxyProcess, stop: threading.Event, sent: list[int]) -> None:
    with httpx.Client(proxy=proxy.proxy_url("attacker"), timeout=120) as client:
        while not stop.is_set():
            for path in ADVERSARIAL_PATHS:
                r = client.post("http://tools.acme.test/api/files/f/x", json={"path": path})
                assert r.status_code == 200
                sent.append(1)
            assert client.get(ADVERSARIAL_URL).status_code == 200
            sent.append(1)


def test_adversarial_globs_do_not_delay_a_bystander(tmp_path: Path, confdir: str) -> None:
    ledger = tmp_path / "ledger.yaml"
    ledger.write_text(LEDGER, encoding="utf-8")
    with (
        echo_upstream() as up,
        ProxyProcess(
            tmp_path,
            ledger=str(ledger),
            confdir=confdir,
            routes=up.routes(("crm.acme.test", "tools.acme.test")),
            name="dos",
        ) as proxy,
    ):
        _bystander(proxy, "warm-up", 5)
        baseline = _bystander(proxy, "baseline", SAMPLES)

        stop = threading.Event()
        sent: list[int] = []
        attacker = threading.Thread(target=_attacker, args=(proxy, stop, sent), daemon=True)
        attacker.start()
        while len(sent) < 2:  # the attack is under way before the bystander measures
            time.sleep(0.01)
        during = _bystander(proxy, "during", SAMPLES)
        stop.set()
        attacker.join(120)
        assert proxy.control("GET", "/healthz").status_code == 200

    numbers = (
        f"bystander baseline median {statistics.median(baseline) * 1000:.1f} ms, p90 "
        f"{p90(baseline) * 1000:.1f} ms, worst {max(baseline) * 1000:.1f} ms; during the attack median "
        f"{statistics.median(during) * 1000:.1f} ms, p90 {p90(during) * 1000:.1f} ms, "
        f"worst {max(during) * 1000:.1f} ms; {len(sent)} adversarial calls"
    )
    print(numbers)
    assert p90(during) - p90(baseline) < BOUND_P90_S, numbers
    assert max(during) - max(baseline) < BOUND_WORST_S, numbers

    # The adversarial calls were tagged on their whole values, not skipped or cut:
    # the stage rule saw the end of the 146 KiB argument, and the extracted paths,
    # one of which a target glob matches, are out of scope for their length alone.
    calls = of_type(events(proxy.trace), "tool_call", run="attacker")
    posts = [c["call"] for c in calls if c["call"]["method"] == "POST"]
    assert len(posts) >= 2
    assert {c["stage"] for c in posts} == {"act", "prepare"}
    paths = [t for c in posts for t in c["targets"] if t["kind"] == "path"]
    assert len(paths) == len(posts) and not any(t["in_scope"] for t in paths)
    assert all(c["scope"] == "out" for c in posts)
    assert min(len(p) for p in ADVERSARIAL_PATHS) > MAX_VALUE_CHARS
