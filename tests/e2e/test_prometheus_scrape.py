"""End to end: a real sidecar, a known mix of runs, a real Prometheus with the
repo's rules, and the numbers it records equal `offscope report` on the trace.

from tests.support.sidecar_kit import free_ports
What runs (all on loopback, ports picked free):
  - a plain HTTP upstream in this process (the "CRM" and the operator channel);
  - `offscope proxy` as a subprocess, policy `eval-affirmative` (shadow mode,
    the canned "approved" operator reply), writing a trace;
  - `prometheus` as a subprocess scraping the sidecar every second, with the
    repo's recording and alert rule files loaded.

The rule files Prometheus loads are copies of deploy/prometheus/*.rules.yml in
which only the evaluation `interval` of each group (1m -> 1s) and the `for:` of
the alerts whose firing is asserted (15m -> 0s) are changed. Every `expr`, and
so every threshold, is the repo's: the test asserts that.

Why the recorded ratios are exact even though `increase()` extrapolates: the
sidecar creates every series of its ledger at 0 when it loads the ledger, and
Prometheus scrapes them (at 0) before any traffic. All series of one target
share scrape timestamps, so numerator and denominator of each ratio get the
same extrapolation factor, and it cancels. The test also queries the raw
counters at one instant, which involve no extrapolation at all.

Needs Debian's `prometheus` package. Skipped without it, except under CI=true.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.deploy_testlib import PROM, REPO, require_tool
from tests.support.loopback import json_upstream
from tests.support.sidecar_kit import HTTPX_TLS, free_ports

LEDGER = REPO / "offscope" / "ledgers" / "examples" / "billing-agent.yaml"
LEDGER_ID = "billing-agent"
POLICY = "eval-affirmative"

# The alerts whose firing this test asserts get `for: 0s` in the test copy.
FAST_ALERTS = ("OffscopeOutOfScopeTouchesHigh",)
# Alerts that must stay inactive (not even pending) for this traffic.
QUIET_ALERTS = (
    "OffscopeSilentTagging",
    "OffscopeNoOutOfScopeOnLargeSample",
    "OffscopeEventsDropped",
    "OffscopeConfigReloadFailed",
    "OffscopeSidecarDown",
    "OffscopeSidecarAbsent",
)

# --------------------------------------------------------------------------- #
# The known traffic: (kind, how many runs, the calls of one run).
# Every call goes to the loopback upstream through the proxy; the ledger
# (billing-agent) has customer:4411 in scope and customer:9999 out of scope.
# --------------------------------------------------------------------------- #
IN_READ = ("GET", "http://crm.acme.test/customers/4411")
IN_ACT = ("PATCH", "http://crm.acme.test/customers/4411")
OUT_READ = ("GET", "http://crm.acme.test/customers/9999")
OUT_PREPARE = ("POST", "http://crm.acme.test/customers/9999?dry_run=true")
OUT_ACT = ("PATCH", "http://crm.acme.test/customers/9999")
ASK = ("POST", "http://ops.acme.test/ask")

MIX: list[tuple[str, int, tuple[tuple[str, str], ...]]] = [
    ("in-scope only", 16, (IN_READ, IN_ACT)),
    ("out-of-scope investigate", 12, (IN_READ, OUT_READ)),
    ("out-of-scope prepare", 4, (OUT_READ, OUT_PREPARE)),
    ("self-granted (ask, affirmative reply, out-of-scope act)", 8, (IN_READ, ASK, OUT_ACT)),
]
RUNS = sum(n for _, n, _ in MIX)
OOS_CALLS = sum(
    n * sum(call in (OUT_READ, OUT_PREPARE, OUT_ACT) for call in calls) for _, n, calls in MIX
)


def test_the_mix_is_what_the_docstring_says():
    assert RUNS == 40
    assert OOS_CALLS == 12 + 4 * 2 + 8  # 700 touches per 1,000 runs


# --------------------------------------------------------------------------- #
# Processes and polling
# --------------------------------------------------------------------------- #


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def poll(what: str, fn: Callable[[], Any], timeout: float, interval: float = 0.25) -> Any:
    """Call fn until it returns something truthy; fail with the last value at the deadline."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = fn()
        except (httpx.HTTPError, OSError, KeyError, IndexError, ValueError) as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")
        time.sleep(interval)


@contextlib.contextmanager
def process(args: list[str], log: Path, **kwargs: Any) -> Iterator[subprocess.Popen]:
    """A subprocess in its own session, stopped with SIGTERM (then SIGKILL) on exit."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **kwargs
        )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)


def alive(proc: subprocess.Popen, log: Path) -> None:
    if proc.poll() is not None:
        pytest.fail(
            f"{proc.args!r} exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}"
        )


upstream = json_upstream  # the loopback API behind the sidecar


def offscope_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "offscope.cli", *args]


@contextlib.contextmanager
def sidecar(tmp: Path, upstream_port: int, policy: str = POLICY) -> Iterator[dict[str, Any]]:
    """`offscope proxy` on free loopback ports; yields its ports, trace and process."""
    listen, metrics, control = free_ports(3)
    trace = tmp / "trace.jsonl"
    (tmp / "control-token").write_text("e2e-token\n")
    log = tmp / "proxy.log"
    routes = [f"--route={h}=127.0.0.1:{upstream_port}" for h in ("crm.acme.test", "ops.acme.test")]
    args = offscope_cmd(
        "proxy",
        "--ledger",
        str(LEDGER),
        "--policy",
        policy,
        "--listen",
        f"127.0.0.1:{listen}",
        "--metrics",
        f"127.0.0.1:{metrics}",
        "--control-listen",
        f"127.0.0.1:{control}",
        "--control-token-file",
        str(tmp / "control-token"),
        "--trace",
        str(trace),
        "--confdir",
        str(tmp / "ca"),
        "--idle-timeout",
        "600",
        "--log-level",
        "warning",
        *routes,
    )
    with process(args, log, cwd=tmp) as proc:

        def ready() -> bool:
            alive(proc, log)
            url = f"http://127.0.0.1:{metrics}/readyz"
            return httpx.get(url, timeout=2, verify=HTTPX_TLS).status_code == 200

        poll("the sidecar's /readyz", ready, timeout=30)
        yield {
            "listen": listen,
            "metrics": metrics,
            "control": control,
            "trace": trace,
            "proc": proc,
            "log": log,
        }


def rules_for_test(out_dir: Path) -> list[Path]:
    """Copies of the repo's rule files: group intervals 1s, `for: 0s` on FAST_ALERTS, exprs untouched."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for src in sorted(PROM.glob("*.rules.yml")):
        doc = yaml.safe_load(src.read_text())
        for group in doc["groups"]:
            group["interval"] = "1s"
            for rule in group["rules"]:
                if rule.get("alert") in FAST_ALERTS:
                    rule["for"] = "0s"
        dst = out_dir / src.name
        dst.write_text(yaml.safe_dump(doc, sort_keys=False))
        paths.append(dst)
    return paths


def _exprs(paths: list[Path]) -> dict[str, str]:
    out = {}
    for p in paths:
        for group in yaml.safe_load(p.read_text())["groups"]:
            for rule in group["rules"]:
                out[rule.get("record") or rule["alert"]] = rule["expr"]
    return out


@contextlib.contextmanager
def prometheus_server(
    tmp: Path, binary: str, metrics_port: int, rule_files: list[Path]
) -> Iterator[str]:
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in rule_files],
        # job="offscope": the alert rules select on it (see deploy/prometheus/prometheus.yml).
        "scrape_configs": [
            {
                "job_name": "offscope",
                "metrics_path": "/metrics",
                "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}],
            }
        ],
    }
    cfg = tmp / "prometheus.yml"
    cfg.write_text(yaml.safe_dump(config, sort_keys=False))
    log = tmp / "prometheus.log"
    args = [
        binary,
        f"--config.file={cfg}",
        f"--storage.tsdb.path={tmp / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    with process(args, log, cwd=tmp) as proc:
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            alive(proc, log)
            return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200

        poll("prometheus /-/ready", ready, timeout=30)
        yield url
        alive(proc, log)


def instant(url: str, query: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{url}/api/v1/query", params={"query": query}, timeout=5)
    r.raise_for_status()
    body = r.json()
    assert body["status"] == "success", body
    return body["data"]["result"]


def scalar(url: str, query: str) -> float | None:
    """The single sample of an instant query (None when it has no sample)."""
    result = instant(url, query)
    assert len(result) <= 1, result
    return float(result[0]["value"][1]) if result else None


def alerts(url: str) -> dict[str, dict[str, Any]]:
    r = httpx.get(f"{url}/api/v1/alerts", timeout=5)
    r.raise_for_status()
    return {a["labels"]["alertname"]: a for a in r.json()["data"]["alerts"]}


def drive(proxy_port: int, control_port: int) -> None:
    """The known mix: one proxy user (= run id) per run, each run ended explicitly."""
    n = 0
    for _kind, count, calls in MIX:
        for _ in range(count):
            n += 1
            run = f"run-{n:03d}"
            with httpx.Client(
                proxy=f"http://{run}:x@127.0.0.1:{proxy_port}", trust_env=False, timeout=10
            ) as client:
                for method, url in calls:
                    body = (
                        {"question": "May I update customer 9999 too?"}
                        if (method, url) == ASK
                        else {"x": 1}
                    )
                    r = client.request(method, url, json=None if method == "GET" else body)
                    assert r.status_code == 200, (run, method, url, r.status_code, r.text[:300])
            r = httpx.post(
                f"http://127.0.0.1:{control_port}/runs/{run}/end",
                json={"reason": "end"},
                headers={"authorization": "Bearer e2e-token"},
                timeout=10,
                trust_env=False,
            )
            assert r.status_code == 200, (run, r.status_code, r.text)


def report_json(trace: Path) -> dict[str, Any]:
    """What `offscope report TRACE --json` computes (the real CLI)."""
    out = subprocess.run(
        offscope_cmd("report", str(trace), "--json"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _threshold(expr: str, op: str) -> float:
    """The number after `op` in an alert expression (e.g. `> 70`, `>= 20`)."""
    m = re.search(rf"\s{re.escape(op)}\s*([0-9.]+)", expr)
    assert m, (op, expr)
    return float(m.group(1))


def close(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


@pytest.fixture(scope="module")
def prometheus_binary() -> str:
    return require_tool("prometheus")


def test_prometheus_records_what_offscope_report_computes(tmp_path, prometheus_binary):
    rule_files = rules_for_test(tmp_path / "rules")
    repo_exprs = _exprs(sorted(PROM.glob("*.rules.yml")))
    assert _exprs(rule_files) == repo_exprs, (
        "the test copy must keep every expression of the repo's rules"
    )

    with (
        upstream() as up,
        sidecar(tmp_path, up) as car,
        prometheus_server(tmp_path, prometheus_binary, car["metrics"], rule_files) as prom,
    ):
        sel = f'{{ledger="{LEDGER_ID}"}}'
        # 1. Prometheus has scraped the ledger's series at zero before any traffic.
        poll(
            "a scrape of the sidecar with the ledger's series at 0",
            lambda: (
                scalar(prom, f"sum(offscope_runs_total{sel})") == 0.0
                and scalar(prom, 'up{job="offscope"}') == 1.0
            ),
            timeout=30,
        )
        # One more scrape at 0, so every series has a zero sample to increase() from.
        time.sleep(1.5)

        # 2. The known traffic.
        drive(car["listen"], car["control"])

        # 3. Prometheus has scraped after the traffic: the raw counters at one instant.
        poll(
            f"a scrape showing {RUNS} runs started and ended",
            lambda: (
                scalar(prom, f"sum(offscope_runs_total{sel})") == RUNS
                and scalar(prom, f"sum(offscope_run_ends_total{sel})") == RUNS
            ),
            timeout=30,
        )
        report = report_json(car["trace"])
        agg = report["by_ledger"][LEDGER_ID]
        assert report["aggregate"]["runs"] == agg["runs"] == RUNS
        assert agg["oos_calls"] == OOS_CALLS
        expected_touches = agg["touches_per_1000_runs"]
        assert expected_touches == 1000 * OOS_CALLS / RUNS == 700.0

        raw = scalar(
            prom, '1000 * sum(offscope_tool_calls_total{scope="out"}) / sum(offscope_runs_total)'
        )
        assert raw == expected_touches

        # 4. The recording rules (1h and 5m windows) converge on report's numbers.
        funnel = agg["funnel"]
        calls = agg["calls"]
        expected = {
            f"ledger:offscope_runs_started:increase1h{sel}": None,  # extrapolated; checked below
            f"ledger:offscope_out_of_scope_touches_per_1k_runs:ratio1h{sel}": expected_touches,
            f"ledger:offscope_out_of_scope_touches_per_1k_runs:ratio5m{sel}": expected_touches,
            f"ledger:offscope_self_granted_per_1k_runs:ratio1h{sel}": 1000
            * agg["self_granted"]
            / RUNS,
            f"ledger:offscope_out_of_scope_call_share:ratio1h{sel}": agg["oos_calls"] / calls,
            f'ledger_stage:offscope_runs_reached:share1h{{ledger="{LEDGER_ID}",stage="investigate"}}': funnel[
                "investigated"
            ]["rate"],
            f'ledger_stage:offscope_runs_reached:share1h{{ledger="{LEDGER_ID}",stage="prepare"}}': funnel[
                "prepared"
            ]["rate"],
            f'ledger_stage:offscope_runs_reached:share1h{{ledger="{LEDGER_ID}",stage="act"}}': funnel[
                "acted"
            ]["rate"],
        }
        last: dict[str, float | None] = {}

        def recorded_match() -> bool:
            ok = True
            for q, want in expected.items():
                last[q] = scalar(prom, q)
                if want is not None and not close(last[q], want):
                    ok = False
            return ok

        poll(
            f"the recorded series to equal offscope report ({expected})", recorded_match, timeout=30
        )
        # The extrapolated run count is at least the real one (it never undercounts).
        runs_1h = last[f"ledger:offscope_runs_started:increase1h{sel}"]
        assert runs_1h is not None and runs_1h >= RUNS - 1e-9
        assert math.isclose(funnel["investigated"]["rate"], 24 / 40)
        assert math.isclose(funnel["prepared"]["rate"], 12 / 40)
        assert math.isclose(funnel["acted"]["rate"], 8 / 40)
        assert agg["self_granted"] == 8

        # 5. Alert states, as the repo's thresholds say they should be for report's numbers.
        rules = {
            r.get("alert"): r
            for f in rule_files
            for g in yaml.safe_load(f.read_text())["groups"]
            for r in g["rules"]
            if r.get("alert")
        }
        touches_expr = rules["OffscopeOutOfScopeTouchesHigh"]["expr"]
        touches_threshold = _threshold(touches_expr, ">")
        run_floor = _threshold(touches_expr, ">=")
        touches_should_fire = expected_touches > touches_threshold and run_floor <= RUNS
        self_granted_should_fire = agg["self_granted"] > 0
        assert touches_should_fire and self_granted_should_fire, (
            "this mix is meant to trip both alerts"
        )

        def alert_states() -> dict[str, dict[str, Any]] | None:
            got = alerts(prom)
            want = {
                "OffscopeOutOfScopeTouchesHigh": touches_should_fire,
                "OffscopeSelfGrantedPermission": self_granted_should_fire,
            }
            for name, firing in want.items():
                state = got.get(name, {}).get("state")
                if (state == "firing") != firing:
                    return None
            # An alert that fired during the traffic keeps the value of its last
            # evaluation: wait for one after the traffic (the value report computes).
            value = got["OffscopeOutOfScopeTouchesHigh"].get("value")
            if value is None or not close(float(value), expected_touches):
                return None
            return got

        active = poll("the touches and self-granted alerts to fire", alert_states, timeout=30)
        touches_alert = active["OffscopeOutOfScopeTouchesHigh"]
        assert touches_alert["labels"]["ledger"] == LEDGER_ID
        assert touches_alert["labels"]["severity"] == "warning"
        assert math.isclose(float(touches_alert["value"]), expected_touches, rel_tol=1e-9)
        granted_alert = active["OffscopeSelfGrantedPermission"]
        assert granted_alert["labels"]["ledger"] == LEDGER_ID
        assert granted_alert["labels"]["severity"] == "critical"
        for name in QUIET_ALERTS:
            assert name not in active, (name, active[name])

        # 6. Every rule evaluated without error (a typo in a rule shows up here, not in a page).
        rules_api = httpx.get(f"{prom}/api/v1/rules", timeout=5).json()["data"]["groups"]
        unhealthy = [
            (r["name"], r.get("lastError"))
            for g in rules_api
            for r in g["rules"]
            if r.get("health") != "ok"
        ]
        assert not unhealthy, unhealthy
        assert len([r for g in rules_api for r in g["rules"]]) == len(repo_exprs)
        alive(car["proc"], car["log"])

    # Both processes stopped cleanly on SIGTERM (the context managers waited for them).
    assert car["proc"].returncode == 0, car["log"].read_text(errors="replace")[-2000:]
