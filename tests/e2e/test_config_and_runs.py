"""Configuration errors (start-up and hot reload), idle timeout and bounded
run state, against real `offscope proxy` processes and the real engine."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from pathlib import Path

import httpx
import pytest

from offscope.ledgers import load_ledger
from offscope.policies import load_policy
from offscope.proxy.engine import Engine
from offscope.proxy.extract.http import HttpRequest, HttpResponse
from offscope.proxy.runs import RunTable
from offscope.proxy.sinks import TraceSink
from tests.support.sidecar_kit import (
    LEDGER_YAML,
    ProxyProcess,
    cli,
    events,
    free_port,
    of_type,
    scrape,
    total,
)

pytestmark = pytest.mark.timeout(60)


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def wait_for(predicate, timeout: float = 8.0, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


@pytest.mark.parametrize("which", ["ledger", "policy"])
def test_malformed_file_at_start_up_exits_2_with_file_and_line(tmp_path, which, confdir):
    ledger = tmp_path / "ledger.yaml"
    ledger.write_text(LEDGER_YAML)
    policy = "shadow"
    if which == "ledger":
        bad = tmp_path / "bad-ledger.yaml"
        # line 5: a key the format does not have
        bad.write_text(LEDGER_YAML.replace("targets:\n", "targetz:\n", 1))
        ledger, line = bad, LEDGER_YAML.splitlines().index("targets:") + 1
    else:
        bad = tmp_path / "bad-policy.yaml"
        bad.write_text("schema: offscope.policy/1\nid: broken\nmode: enforced\n")
        policy, line = str(bad), 3
    proc = cli(
        "proxy",
        "--ledger",
        str(ledger),
        "--policy",
        policy,
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--metrics",
        f"127.0.0.1:{free_port()}",
        "--control-listen",
        "",
        "--trace",
        str(tmp_path / "t.jsonl"),
        "--confdir",
        confdir,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert f"{bad}:{line}:" in " ".join(proc.stderr.split()), proc.stderr
    assert "Traceback" not in proc.stderr


def test_hot_reload_rejects_bad_ledger_and_picks_up_good_edit(tmp_path, upstream, confdir):
    ledger = tmp_path / "ledger.yaml"
    ledger.write_text(LEDGER_YAML)
    with ProxyProcess(
        tmp_path, ledger=str(ledger), routes=upstream.routes(), confdir=confdir, name="reload"
    ) as proxy:
        old = proxy.control("GET", "/readyz").json()

        def call(run: str) -> None:
            with httpx.Client(proxy=proxy.proxy_url(run), timeout=10) as c:
                assert c.get("http://crm.acme.test/customers/9999").status_code == 200

        call("before")
        # A malformed edit: rejected, counted, logged; the old ledger stays in force.
        write_atomically(ledger, LEDGER_YAML.replace("records:", "recordz:"))
        assert wait_for(
            lambda: (
                total(scrape(proxy.metrics_port), "offscope_reload_failures_total", file="ledger")
                == 1
            )
        )
        assert "reload_rejected" in proxy.stderr()
        assert proxy.control("GET", "/readyz").json() == old
        call("during-bad")
        # A good edit: customer 9999 joins the ledger, under a new id.
        write_atomically(
            ledger,
            LEDGER_YAML.replace("id: sidecar-e2e", "id: sidecar-e2e-v2").replace(
                'records: ["customer:4411"]', 'records: ["customer:4411", "customer:9999"]'
            ),
        )
        assert wait_for(
            lambda: proxy.control("GET", "/readyz").json()["ledger"] == "sidecar-e2e-v2"
        )
        call("after")
        assert '"reloaded"' in proxy.stderr()

    evs = events(proxy.trace)
    tagged = {c["run"]: (c["ledger"], c["call"]["scope"]) for c in of_type(evs, "tool_call")}
    assert tagged == {
        "before": ("sidecar-e2e", "out"),
        "during-bad": ("sidecar-e2e", "out"),
        "after": ("sidecar-e2e-v2", "in"),
    }
    starts = {e["run"]: e["ledger_hash"] for e in of_type(evs, "run_start")}
    assert starts["before"] == starts["during-bad"] == old["ledger_hash"] != starts["after"]


def test_idle_run_ends_with_reason_idle(tmp_path, ledger_file, upstream, confdir):
    with ProxyProcess(
        tmp_path,
        ledger=ledger_file,
        routes=upstream.routes(),
        confdir=confdir,
        name="idle",
        extra=["--idle-timeout", "1"],
    ) as proxy:
        with httpx.Client(proxy=proxy.proxy_url("sleepy"), timeout=10) as c:
            assert c.get("http://crm.acme.test/customers/4411").status_code == 200
        assert proxy.control("GET", "/runs").json()["runs"] == ["sleepy"]
        assert wait_for(lambda: proxy.control("GET", "/runs").json()["active"] == 0, timeout=6)
        m = scrape(proxy.metrics_port)
    assert total(m, "offscope_run_ends_total", reason="idle") == 1
    ends = of_type(events(proxy.trace), "run_end", "sleepy")
    assert [e["reason"] for e in ends] == ["idle"]


async def test_max_runs_evicts_least_recently_active_as_idle(tmp_path, ledger_file):
    trace = tmp_path / "engine.jsonl"
    clock = iter(range(1000, 2000))
    engine = Engine(
        load_ledger(ledger_file),
        load_policy("shadow"),
        trace=TraceSink(trace),
        runs=RunTable(max_runs=3, idle_timeout=300),
        clock=lambda: float(next(clock)),
    )

    async def call(run: str) -> None:
        ex = await engine.request(HttpRequest("GET", "crm.acme.test", "/customers/4411"), run)
        engine.response(ex, HttpResponse(200, {"content-type": "application/json"}, b"{}"))

    for run in ("r1", "r2", "r3"):
        await call(run)
    await call("r1")  # r1 is active again: r2 is now the least recently active
    await call("r4")
    assert engine.runs.ids() == ["r3", "r1", "r4"]
    await call("r5")
    assert engine.runs.ids() == ["r1", "r4", "r5"] and len(engine.runs) == 3
    engine.close()
    evs = events(trace)
    assert [(e["run"], e["reason"]) for e in of_type(evs, "run_end")] == [
        ("r2", "idle"),
        ("r3", "idle"),
    ]
    # An evicted run that comes back is a new run (a fresh run_start, steps from 1).
    engine2 = Engine(
        load_ledger(ledger_file),
        load_policy("shadow"),
        trace=TraceSink(trace),
        runs=RunTable(max_runs=1),
    )
    ex = await engine2.request(HttpRequest("GET", "crm.acme.test", "/customers/4411"), "a")
    engine2.response(ex, HttpResponse(200))
    ex = await engine2.request(HttpRequest("GET", "crm.acme.test", "/customers/4411"), "b")
    engine2.response(ex, HttpResponse(200))
    ex = await engine2.request(HttpRequest("GET", "crm.acme.test", "/customers/4411"), "a")
    engine2.response(ex, HttpResponse(200))
    engine2.close()
    a_calls = [c["step"] for c in of_type(events(trace), "tool_call", "a")]
    assert a_calls == [1, 1]
    assert engine2.exporter.m["offscope_active_runs"].labels("sidecar-e2e")._value.get() == 1


@pytest.mark.parametrize("flag", ["--listen", "--metrics", "--control-listen"])
def test_taken_port_exits_2_naming_the_flag(tmp_path, ledger_file, confdir, flag):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = f"127.0.0.1:{taken.getsockname()[1]}"
        ports = {
            "--listen": f"127.0.0.1:{free_port()}",
            "--metrics": f"127.0.0.1:{free_port()}",
            "--control-listen": f"127.0.0.1:{free_port()}",
            flag: busy,
        }
        proc = cli(
            "proxy",
            "--ledger",
            ledger_file,
            "--listen",
            ports["--listen"],
            "--metrics",
            ports["--metrics"],
            "--control-listen",
            ports["--control-listen"],
            "--trace",
            str(tmp_path / "t.jsonl"),
            "--confdir",
            confdir,
            timeout=60,
        )
    assert proc.returncode == 2, proc.stderr
    assert f"{flag} {busy}" in proc.stderr and "in use" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_max_runs_flag_bounds_the_run_table(tmp_path, ledger_file, upstream, confdir):
    proxy = ProxyProcess(
        tmp_path,
        ledger=ledger_file,
        routes=upstream.routes(),
        confdir=confdir,
        extra=["--max-runs", "2"],
    )
    with proxy:
        for run in ("m1", "m2", "m3"):
            with httpx.Client(proxy=proxy.proxy_url(run), timeout=20) as c:
                assert c.get("http://crm.acme.test/customers/4411").status_code == 200
        assert proxy.control("GET", "/runs").json() == {"active": 2, "runs": ["m2", "m3"]}
    ends = of_type(events(proxy.trace), "run_end")
    assert [(e["run"], e["reason"]) for e in ends][:1] == [("m1", "idle")]


def test_max_runs_below_one_exits_2(tmp_path, ledger_file, confdir):
    proc = cli(
        "proxy",
        "--ledger",
        ledger_file,
        "--max-runs",
        "0",
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--metrics",
        f"127.0.0.1:{free_port()}",
        "--control-listen",
        "",
        "--trace",
        str(tmp_path / "t.jsonl"),
        "--confdir",
        confdir,
        timeout=60,
    )
    assert proc.returncode == 2 and "--max-runs 0" in proc.stderr, proc.stderr


async def test_responses_recorded_after_the_step_in_order_and_before_the_run_ends(
    tmp_path, ledger_file
):
    trace = tmp_path / "soon.jsonl"
    engine = Engine(load_ledger(ledger_file), load_policy("shadow"), trace=TraceSink(trace))
    for path in ("/customers/4411", "/customers/9999"):
        ex, _ = engine.begin(HttpRequest("GET", "crm.acme.test", path), "soon")
        engine.response_soon(ex, HttpResponse(200, {"content-type": "application/json"}, b"{}"))
    assert (
        of_type(events(trace), "tool_call") == []
    )  # not in this step: the agent's response goes first
    await asyncio.sleep(0)
    assert [c["call"]["url"].rsplit("/", 1)[1] for c in of_type(events(trace), "tool_call")] == [
        "4411",
        "9999",
    ]
    # Still pending when the run ends: recorded first, so the run's record is whole.
    ex, _ = engine.begin(HttpRequest("GET", "crm.acme.test", "/customers/4411"), "soon")
    engine.response_soon(ex, HttpResponse(200))
    summary = engine.end_run("soon")
    assert summary is not None and summary["calls"] == 3
    assert [e["type"] for e in events(trace)][-2:] == ["tool_call", "run_end"]
    engine.close()
