"""Small things a user hits: bad --route, --metrics '', trailing-dot hosts, and
agent-controlled text in `offscope requests list`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import httpx
import pytest

from tests.support.sidecar_kit import (
    BANNER_END,
    ProxyProcess,
    echo_upstream,
    events,
    free_port,
    of_type,
)

pytestmark = pytest.mark.timeout(90)


def offscope(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["offscope", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def banner_of(proc: subprocess.Popen[str]) -> str:
    """A sidecar's stderr up to the banner's last line (log lines may come before it)."""
    assert proc.stderr is not None
    text = ""
    while BANNER_END not in text and proc.poll() is None:
        text += proc.stderr.readline()
    return text


@pytest.mark.parametrize(
    "route", ["foo", "crm.acme.test=127.0.0.1", "=127.0.0.1:80", "h=127.0.0.1:99999"]
)
def test_bad_route_exits_2_before_the_banner(ledger_file, tmp_path, route):
    p = offscope(
        "proxy",
        "--ledger",
        ledger_file,
        "--route",
        route,
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--metrics",
        "",
        "--control-listen",
        "",
        "--trace",
        str(tmp_path / "t.jsonl"),
        "--confdir",
        str(tmp_path / "ca"),
    )
    assert p.returncode == 2, p.stderr
    assert "bad route" in p.stderr and "--route HOST=127.0.0.1:PORT" in p.stderr
    assert "listening" not in p.stderr and "Traceback" not in p.stderr


def test_metrics_off_says_so(ledger_file, tmp_path, confdir):
    port = free_port()
    proc = subprocess.Popen(
        [
            "offscope",
            "proxy",
            "--ledger",
            ledger_file,
            "--listen",
            f"127.0.0.1:{port}",
            "--metrics",
            "",
            "--control-listen",
            "",
            "--trace",
            str(tmp_path / "t.jsonl"),
            "--confdir",
            confdir,
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = banner_of(proc).splitlines()
    finally:
        proc.terminate()
        proc.wait(20)
    at = next(i for i, line in enumerate(lines) if "listening" in line)
    assert "metrics off" in lines[at + 1] and "http:///" not in lines[at + 1]


def test_port_0_banner_names_the_bound_ports(ledger_file, tmp_path, confdir):
    """Port 0 (any free port, as an orchestrator or a test asks): the banner comes once the
    listeners are bound and names the ports they got, which answer as the banner says."""
    with echo_upstream() as up:
        proc = subprocess.Popen(
            [
                *("offscope", "proxy", "--ledger", ledger_file, "--confdir", confdir),
                *("--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"),
                *("--control-listen", "127.0.0.1:0", "--route", up.routes()),
                *("--trace", str(tmp_path / "t.jsonl"), "--state", str(tmp_path / "s.sqlite")),
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            banner = banner_of(proc)
            found = {
                what: re.search(rf"{what} http://127\.0\.0\.1:(\d+)\b", banner)
                for what in ("listening on", "metrics", "control")
            }
            assert all(found.values()), banner
            proxy, metrics, control = (int(m[1]) for m in found.values() if m)
            assert 0 not in (proxy, metrics, control), banner
            assert httpx.get(f"http://127.0.0.1:{metrics}/healthz", timeout=10).status_code == 200
            assert httpx.get(f"http://127.0.0.1:{control}/runs", timeout=10).status_code == 401
            with httpx.Client(proxy=f"http://port0-1:x@127.0.0.1:{proxy}", timeout=20) as c:
                r = c.get("http://crm.acme.test/customers/4411")
            assert r.status_code == 200 and r.json()["path"] == "/customers/4411"
            assert f"@127.0.0.1:{proxy}" in banner  # the line that tells an agent where to go
        finally:
            proc.terminate()
            proc.wait(20)


def test_route_applies_to_the_fully_qualified_spelling(tmp_path, confdir, ledger_file):
    with (
        echo_upstream() as up,
        ProxyProcess(
            tmp_path, ledger=ledger_file, routes=up.routes(), confdir=confdir, name="fqdn"
        ) as proxy,
    ):
        with httpx.Client(proxy=proxy.proxy_url("fqdn-1"), timeout=20) as c:
            r = c.get("http://crm.acme.test./customers/4411")
        assert r.status_code == 200 and r.json()["path"] == "/customers/4411"
        deadline = time.monotonic() + 10
        while (
            not of_type(events(proxy.trace), "tool_call", "fqdn-1") and time.monotonic() < deadline
        ):
            time.sleep(0.1)
    (call,) = of_type(events(proxy.trace), "tool_call", "fqdn-1")
    assert call["call"]["scope"] == "in" and call["status"] == 200


def test_requests_list_shows_agent_text_verbatim_and_whole_ids(tmp_path):
    log = tmp_path / "requests.jsonl"
    request = {
        "schema": "offscope.request/1",
        "id": "req-f49a1b2c3d4e",
        "ts": 1.0,
        "run": "run-with-a-long-identifier-0042",
        "ledger": "billing-agent",
        "status": "pending",
        "tool": "http",
        "source": "http",
        "method": "PATCH",
        "step": 3,
        "stage": "act",
        "url": "https://crm.acme.test/customers/[/x]",
        "targets": ["record:customer:[bold]9999[/x] :ticket:"],
        "args_digest": "abc",
        "reason": "out-of-scope target at stage act",
    }
    log.write_text(json.dumps(request) + "\n")
    for columns in ("80", "200"):
        p = offscope("requests", "list", "--log", str(log), env={"COLUMNS": columns})
        assert p.returncode == 0, p.stderr
        assert "req-f49a1b2c3d4e" in p.stdout and "run-with-a-long-identifier-0042" in p.stdout, (
            p.stdout
        )
        assert (
            "[bold]9999[/x]" in p.stdout and ":ticket:" in p.stdout and "\N{TICKET}" not in p.stdout
        )
