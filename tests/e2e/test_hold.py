"""Approvals that wait (policy `on_out_of_scope: hold`), through a real
`offscope proxy` subprocess to a loopback upstream that records what it
received: a held call reaches the upstream once, after a named approver
approves it (CLI or control API); a denied or timed-out one never does; a
run-scoped grant does not help another run; the webhook receiver on loopback
gets the notice (offscope's JSON and the Slack form)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.sidecar_kit import (
    LEDGER_YAML,
    EchoUpstream,
    ProxyProcess,
    cli,
    echo_upstream,
    events,
    of_type,
    scrape,
    total,
)

pytestmark = pytest.mark.timeout(120)

PATCH_OOS = "http://crm.acme.test/customers/9999"  # an act on a record the ledger does not name


def _policy(tmp: Path, timeout: float, webhook: str = "") -> str:
    path = tmp / f"hold-{timeout}-{abs(hash(webhook))}.yaml"
    path.write_text(
        "schema: offscope.policy/1\nid: hold-test\nmode: enforce\non_out_of_scope: hold\n"
        f"hold_timeout: {timeout}\n" + webhook,
        encoding="utf-8",
    )
    return str(path)


class Receiver:
    """A loopback webhook receiver that records every POSTed JSON body."""

    def __init__(self, status: int = 200) -> None:
        self.bodies: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - stdlib name
                size = int(self.headers.get("content-length") or 0)
                outer.bodies.append(json.loads(self.rfile.read(size)))
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook/SECRET-PATH"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def upstream() -> Iterator[EchoUpstream]:
    with echo_upstream() as up:
        yield up


@pytest.fixture
def ledger(tmp_path: Path) -> str:
    path = tmp_path / "ledger.yaml"
    path.write_text(LEDGER_YAML, encoding="utf-8")
    return str(path)


def _start(
    tmp: Path, ledger: str, policy: str, upstream: EchoUpstream, confdir: str
) -> ProxyProcess:
    return ProxyProcess(
        tmp, ledger=ledger, policy=policy, routes=upstream.routes(), confdir=confdir
    )


class Agent:
    """One agent call in a thread: the caller goes on while the proxy holds it."""

    def __init__(self, proxy: ProxyProcess, run: str, url: str = PATCH_OOS) -> None:
        self.response: httpx.Response | None = None
        self.answered_at: float | None = None

        def call() -> None:
            with httpx.Client(proxy=proxy.proxy_url(run), timeout=60) as client:
                self.response = client.patch(url, json={"plan": "free"})
                self.answered_at = time.monotonic()

        self.thread = threading.Thread(target=call, daemon=True)
        self.thread.start()

    def join(self) -> httpx.Response:
        self.thread.join(60)
        assert self.response is not None
        return self.response


def _pending_request(proxy: ProxyProcess, run: str, timeout: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proxy.requests.exists():
            for line in proxy.requests.read_text().splitlines():
                item = json.loads(line)
                if item.get("schema") == "offscope.request/1" and item["run"] == run:
                    return item
        time.sleep(0.05)
    raise AssertionError(f"no request filed for {run}: {proxy.stderr()[-2000:]}")


def _ledger_hash(proxy: ProxyProcess) -> str:
    return httpx.get(f"http://127.0.0.1:{proxy.metrics_port}/readyz", timeout=10).json()[
        "ledger_hash"
    ]


def _wait_for_reload(proxy: ProxyProcess, old_hash: str, timeout: float = 30) -> None:
    """Until the proxy has loaded the grants overlay (the ledger hash includes its grants)."""
    deadline = time.monotonic() + timeout
    while _ledger_hash(proxy) == old_hash:
        assert time.monotonic() < deadline, "the grants overlay was not reloaded"
        time.sleep(0.1)


def _patches(upstream: EchoUpstream, path: str = "/customers/9999") -> list[dict[str, Any]]:
    return [s for s in upstream.seen if s["method"] == "PATCH" and s["path"] == path]


def test_held_call_is_released_by_a_cli_approval_and_reaches_upstream_once(
    tmp_path, ledger, upstream, confdir
):
    with _start(tmp_path, ledger, _policy(tmp_path, 60), upstream, confdir) as proxy:
        agent = Agent(proxy, "run-a")
        request = _pending_request(proxy, "run-a")
        time.sleep(0.5)
        assert agent.response is None and _patches(upstream) == []  # parked: nothing went upstream
        approving = time.monotonic()
        approved = cli(
            "requests",
            "approve",
            request["id"],
            "--log",
            str(proxy.requests),
            "--ledger",
            ledger,
            "--approver",
            "alice@acme.test",
            "--reason",
            "ticket OPS-7",
        )
        assert approved.returncode == 0, approved.stderr
        response = agent.join()
        assert response.status_code == 200 and response.json()["path"] == "/customers/9999"
        assert agent.answered_at is not None and agent.answered_at > approving
        assert len(_patches(upstream)) == 1
        samples = scrape(proxy.metrics_port)
    assert total(samples, "offscope_held_calls_total", outcome="approved") == 1
    (call,) = [c for c in of_type(events(proxy.trace), "tool_call", "run-a")]
    assert (
        call["decision"] == "allow"
        and call["status"] == 200
        and call["request_id"] == request["id"]
    )
    approval = call["approval"]
    assert approval["outcome"] == "approved" and approval["approver"] == "alice@acme.test"
    assert approval["scope"] == "run" and approval["grants"][0].startswith("grant-")
    assert approval["at"] > 0 and approval["held_seconds"] > 0.4
    assert call["call"]["targets"][-1] == {
        "kind": "record",
        "value": "customer:9999",
        "in_scope": True,
        "grant": approval["grants"][0],
    }


def test_held_call_is_denied_at_timeout_and_never_reaches_upstream(
    tmp_path, ledger, upstream, confdir
):
    with _start(tmp_path, ledger, _policy(tmp_path, 1.5), upstream, confdir) as proxy:
        response = Agent(proxy, "run-t").join()
        request = _pending_request(proxy, "run-t")
        late = cli(
            "requests",
            "approve",
            request["id"],
            "--log",
            str(proxy.requests),
            "--ledger",
            ledger,
            "--approver",
            "bob",
        )
        samples = scrape(proxy.metrics_port)
    assert response.status_code == 403
    body = response.json()
    assert body["error"] == "offscope_blocked" and body["held"]["outcome"] == "timeout"
    assert body["request_id"] == request["id"] and "timed out" in body["message"]
    assert _patches(upstream) == []
    assert (
        late.returncode == 2 and "timed_out" in late.stderr
    )  # a late approval is refused, not silently lost
    (call,) = of_type(events(proxy.trace), "tool_call", "run-t")
    assert (
        call["decision"] == "block"
        and call["injected"]
        and call["approval"]["outcome"] == "timeout"
    )
    assert "approver" not in call["approval"]
    assert total(samples, "offscope_held_calls_total", outcome="timeout") == 1


def test_denial_over_the_control_api_refuses_the_held_call_at_once(
    tmp_path, ledger, upstream, confdir
):
    with _start(tmp_path, ledger, _policy(tmp_path, 60), upstream, confdir) as proxy:
        agent = Agent(proxy, "run-d")
        request = _pending_request(proxy, "run-d")
        anonymous = proxy.control(
            "POST", f"/requests/{request['id']}/deny", token=None, json={"approver": "mallory"}
        )
        missing = proxy.control("POST", f"/requests/{request['id']}/deny", json={})
        denied = proxy.control(
            "POST",
            f"/requests/{request['id']}/deny",
            json={"approver": "carol@acme.test", "reason": "use the primary"},
        )
        response = agent.join()
        again = proxy.control(
            "POST", f"/requests/{request['id']}/approve", json={"approver": "carol@acme.test"}
        )
    assert anonymous.status_code == 401  # the control API's bearer token is required
    assert missing.status_code == 400  # a decision names its human
    assert denied.status_code == 200 and denied.json()["refused"] is True
    assert response.status_code == 403 and response.json()["held"] == {
        "outcome": "denied",
        "approver": "carol@acme.test",
        "held_seconds": response.json()["held"]["held_seconds"],
    }
    assert again.status_code == 409
    assert _patches(upstream) == []
    (call,) = of_type(events(proxy.trace), "tool_call", "run-d")
    assert (
        call["approval"]["outcome"] == "denied"
        and call["approval"]["approver"] == "carol@acme.test"
    )


def test_api_approval_is_run_scoped_and_does_not_help_another_run(
    tmp_path, ledger, upstream, confdir
):
    with _start(tmp_path, ledger, _policy(tmp_path, 2), upstream, confdir) as proxy:
        before = _ledger_hash(proxy)
        agent = Agent(proxy, "run-a")
        request = _pending_request(proxy, "run-a")
        approved = proxy.control(
            "POST",
            f"/requests/{request['id']}/approve",
            json={"approver": "alice@acme.test", "expires": "1h"},
        )
        assert approved.status_code == 200 and approved.json()["released"] is True
        assert approved.json()["scope"] == "run"
        assert agent.join().status_code == 200
        _wait_for_reload(proxy, before)
        # The same call: run-a is let through by its grant; run-b is held again and times out.
        again = Agent(proxy, "run-a").join()
        other = Agent(proxy, "run-b").join()
    assert again.status_code == 200
    assert other.status_code == 403 and other.json()["held"]["outcome"] == "timeout"
    assert len(_patches(upstream)) == 2
    calls = of_type(events(proxy.trace), "tool_call")
    second_a = [c for c in calls if c["run"] == "run-a"][1]
    assert (
        second_a["approval"]["outcome"] == "granted"
        and second_a["approval"]["approver"] == "alice@acme.test"
    )
    assert second_a["approval"]["scope"] == "run" and "held_seconds" not in second_a["approval"]
    (b,) = [c for c in calls if c["run"] == "run-b"]
    assert b["call"]["scope"] == "out" and b["decision"] == "block"


@pytest.mark.parametrize("form", ["json", "slack"])
def test_webhook_receives_the_hold_notice(tmp_path, ledger, upstream, confdir, form):
    receiver = Receiver()
    try:
        hook = f"webhook: {{url: '{receiver.url}', format: {form}, timeout_seconds: 2}}\n"
        with _start(tmp_path, ledger, _policy(tmp_path, 1, hook), upstream, confdir) as proxy:
            response = Agent(proxy, "run-w").join()
            request = _pending_request(proxy, "run-w")
    finally:
        receiver.close()
    assert response.status_code == 403
    (body,) = receiver.bodies
    if form == "json":
        assert body["schema"] == "offscope.hold/1" and body["event"] == "held"
        assert body["request"]["id"] == request["id"] and body["request"]["run"] == "run-w"
        assert body["request"]["targets"] == ["record:customer:9999"] and body["hold_timeout"] == 1
        assert body["approve"]["api"] == f"POST /requests/{request['id']}/approve"
    else:
        assert set(body) == {"text", "blocks"}
        assert request["id"] in body["text"] and "record:customer:9999" in body["text"]
        assert (
            body["blocks"][0]["type"] == "section"
            and request["id"] in body["blocks"][0]["text"]["text"]
        )


def test_a_failing_webhook_is_counted_and_the_hold_goes_on(tmp_path, ledger, upstream, confdir):
    receiver = Receiver(status=500)
    try:
        hook = f"webhook: {{url: '{receiver.url}', timeout_seconds: 2}}\n"
        with _start(tmp_path, ledger, _policy(tmp_path, 1, hook), upstream, confdir) as proxy:
            response = Agent(proxy, "run-f").join()
            samples = scrape(proxy.metrics_port)
            stderr = proxy.stderr()
    finally:
        receiver.close()
    assert response.status_code == 403 and response.json()["held"]["outcome"] == "timeout"
    assert total(samples, "offscope_webhook_failures_total") == 1
    assert (
        "webhook_failed" in stderr and "SECRET-PATH" not in stderr
    )  # the URL's path is its secret
