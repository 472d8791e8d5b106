"""The smaller defects of issue 22, each tried as it was found: through a real
`offscope proxy` subprocess, asserting on what the upstream received, on the
trace and on the metrics the proxy exports.

- `filter_tools` on a gzip-encoded LLM request (the removed tool must not
  reach the model);
- shadow mode with `filter_tools` (shadow changes no traffic: the would-be
  removal is recorded, the list is passed on whole);
- run ends by budget and ttl (`step_limit`, `timeout`) are counted under the
  same reason in `offscope_run_ends_total` as the trace records;
- IPv6 listen addresses for `--metrics` and `--control-listen`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamablehttp_client
from mcp.server.fastmcp import FastMCP
from mcp.server.transport_security import TransportSecuritySettings

from tests.support.sidecar_kit import (
    HTTPX_TLS,
    LEDGER_YAML,
    AsgiServer,
    ProxyProcess,
    events,
    free_port,
    of_type,
    scrape,
    tls,
    total,
)
from tests.support.trajectories import Run

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:Use `streamable_http_client`:DeprecationWarning"),
]

FILTER_LEDGER = """\
# A support agent on customer 4411: invoices are never its work, deleting is never offered.
schema: offscope.ledger/1
id: small-defects
targets:
  hosts: [tools.acme.test, llm.acme.test]
  records: ["customer:4411"]
extract:
  - match: {tool: get_customer}
    targets: {record: "customer:{args.customer_id}"}
  - match: {tool: get_invoice}
    targets: {record: "invoice:{args.invoice_id}"}
denied_tools: ["delete_*"]
llm:
  hosts: [llm.acme.test]
"""


def _policy(tmp: Path, mode: str, extra: str = "", name: str = "policy.yaml") -> str:
    path = tmp / name
    path.write_text(
        f"schema: offscope.policy/1\nid: small-{mode}\nmode: {mode}\n{extra}", encoding="utf-8"
    )
    return str(path)


def _ledger(tmp: Path, text: str = FILTER_LEDGER) -> str:
    path = tmp / "ledger.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def _tool(name: str, arg: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {"type": "object", "properties": {arg: {"type": "string"}}},
        },
    }


CHAT_TOOLS = [
    _tool("get_customer", "customer_id"),
    _tool("get_invoice", "invoice_id"),
    _tool("delete_customer", "customer_id"),
]


def recording_llm(seen: list[tuple[dict[str, str], bytes]]) -> Any:
    """An OpenAI-compatible chat endpoint that records each request's headers
    and raw body (as it came off the wire) and answers with plain text."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def completions(request: Request) -> Any:
        seen.append(({k.lower(): v for k, v in request.headers.items()}, await request.body()))
        return JSONResponse(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 1,
                "model": "sim-1",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "done"},
                        "finish_reason": "stop",
                    }
                ],
            }
        )

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


def _as_received(headers: dict[str, str], raw: bytes) -> dict[str, Any]:
    """The body as the upstream's framework reads it: per its Content-Encoding."""
    coding = headers.get("content-encoding", "identity").strip().lower()
    assert coding in ("gzip", "identity"), coding
    return json.loads(gzip.decompress(raw) if coding == "gzip" else raw)


def _post_chat(proxy: ProxyProcess, run: str, body: dict[str, Any], gzipped: bool) -> int:
    raw = json.dumps(body).encode()
    headers = {"content-type": "application/json", "authorization": "Bearer sk-test-0000"}
    if gzipped:
        raw, headers["content-encoding"] = gzip.compress(raw), "gzip"
    with httpx.Client(proxy=proxy.proxy_url(run), verify=tls(proxy.ca), timeout=20) as client:
        return client.post(
            "https://llm.acme.test/v1/chat/completions", content=raw, headers=headers
        ).status_code


CHAT = {
    "model": "sim-1",
    "messages": [{"role": "user", "content": "look up customer 4411"}],
    "tools": CHAT_TOOLS,
}


@pytest.mark.parametrize("gzipped", [True, False], ids=["gzip", "identity"])
def test_filter_tools_narrows_a_gzip_encoded_llm_request(tmp_path, confdir, gzipped):
    seen: list[tuple[dict[str, str], bytes]] = []
    srv = AsgiServer(recording_llm(seen), "llm").start()
    try:
        with ProxyProcess(
            tmp_path,
            ledger=_ledger(tmp_path),
            policy=_policy(tmp_path, "enforce", "filter_tools: true\n"),
            routes=f"llm.acme.test=127.0.0.1:{srv.port}",
            confdir=confdir,
        ) as proxy:
            status = _post_chat(proxy, "run-gz", CHAT, gzipped)
    finally:
        srv.stop()
    assert status == 200
    ((headers, raw),) = seen
    received = _as_received(headers, raw)
    assert [t["function"]["name"] for t in received["tools"]] == ["get_customer"]
    assert received["messages"] == CHAT["messages"]  # the rest of the body as sent
    assert int(headers["content-length"]) == len(raw)
    (event,) = of_type(events(proxy.trace), "tools_filtered", "run-gz")
    assert event["offered"] == 3 and event["shadow"] is False
    assert [r["name"] for r in event["removed"]] == ["get_invoice", "delete_customer"]


def test_shadow_filter_tools_changes_no_llm_request(tmp_path, confdir):
    seen: list[tuple[dict[str, str], bytes]] = []
    srv = AsgiServer(recording_llm(seen), "llm").start()
    sent = json.dumps(CHAT).encode()
    try:
        with ProxyProcess(
            tmp_path,
            ledger=_ledger(tmp_path),
            policy=_policy(tmp_path, "shadow", "filter_tools: true\n"),
            routes=f"llm.acme.test=127.0.0.1:{srv.port}",
            confdir=confdir,
        ) as proxy:
            with httpx.Client(
                proxy=proxy.proxy_url("run-sl"), verify=tls(proxy.ca), timeout=20
            ) as client:
                status = client.post(
                    "https://llm.acme.test/v1/chat/completions",
                    content=sent,
                    headers={"content-type": "application/json"},
                ).status_code
    finally:
        srv.stop()
    assert status == 200
    ((_, raw),) = seen
    assert raw == sent  # byte for byte: shadow changes no traffic
    (event,) = of_type(events(proxy.trace), "tools_filtered", "run-sl")
    assert event["shadow"] is True
    assert [r["name"] for r in event["removed"]] == ["get_invoice", "delete_customer"]


def build_mcp(json_response: bool) -> FastMCP:
    server = FastMCP(
        "crm-tools",
        stateless_http=True,
        json_response=json_response,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )

    @server.tool()
    def get_customer(customer_id: str) -> str:
        """Read a customer record."""
        return f"customer {customer_id}"

    @server.tool()
    def get_invoice(invoice_id: str) -> str:
        """Read an invoice."""
        return f"invoice {invoice_id}"

    @server.tool()
    def delete_customer(customer_id: str) -> str:
        """Delete a customer record."""
        return "deleted"

    return server


async def _list_tools(proxy: ProxyProcess, run: str) -> list[str]:
    def factory(headers=None, timeout=None, auth=None) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            proxy=proxy.proxy_url(run),
            verify=tls(proxy.ca),
            headers=headers,
            timeout=timeout or httpx.Timeout(30, read=60),
            auth=auth,
        )

    async with (
        streamablehttp_client("https://tools.acme.test/mcp", httpx_client_factory=factory) as (
            read,
            write,
            _,
        ),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        return [t.name for t in (await session.list_tools()).tools]


@pytest.mark.parametrize("json_response", [False, True], ids=["sse", "json"])
def test_shadow_filter_tools_records_but_does_not_narrow_tools_list(
    tmp_path, confdir, json_response
):
    srv = AsgiServer(build_mcp(json_response).streamable_http_app(), "fastmcp").start()
    try:
        with ProxyProcess(
            tmp_path,
            ledger=_ledger(tmp_path),
            policy=_policy(tmp_path, "shadow", "filter_tools: true\n"),
            routes=f"tools.acme.test=127.0.0.1:{srv.port}",
            confdir=confdir,
        ) as proxy:
            offered = asyncio.run(_list_tools(proxy, "run-sm"))
    finally:
        srv.stop()
    assert sorted(offered) == ["delete_customer", "get_customer", "get_invoice"]  # the full list
    (event,) = of_type(events(proxy.trace), "tools_filtered", "run-sm")
    assert event["shadow"] is True and event["source"] == "mcp" and event["offered"] == 3
    assert {r["name"] for r in event["removed"]} == {"get_invoice", "delete_customer"}


async def _list_tools_legacy(proxy: ProxyProcess, run: str) -> list[str]:
    """tools/list over the legacy HTTP+SSE transport: the answer comes on the session stream."""

    def factory(headers=None, timeout=None, auth=None) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            proxy=proxy.proxy_url(run),
            verify=tls(proxy.ca),
            headers=headers,
            timeout=timeout or httpx.Timeout(30, read=60),
            auth=auth,
        )

    async with (
        sse_client("https://tools.acme.test/sse", httpx_client_factory=factory) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        return [t.name for t in (await session.list_tools()).tools]


@pytest.mark.parametrize("mode", ["enforce", "shadow"])
def test_filter_tools_on_the_legacy_sse_session_stream(tmp_path, confdir, mode):
    srv = AsgiServer(build_mcp(False).sse_app(), "fastmcp-sse").start()
    try:
        with ProxyProcess(
            tmp_path,
            ledger=_ledger(tmp_path),
            policy=_policy(tmp_path, mode, "filter_tools: true\n"),
            routes=f"tools.acme.test=127.0.0.1:{srv.port}",
            confdir=confdir,
        ) as proxy:
            offered = asyncio.run(_list_tools_legacy(proxy, "run-legacy"))
    finally:
        srv.stop()
    full = ["delete_customer", "get_customer", "get_invoice"]
    assert sorted(offered) == (["get_customer"] if mode == "enforce" else full)
    (event,) = of_type(events(proxy.trace), "tools_filtered", "run-legacy")
    assert event["shadow"] is (mode == "shadow") and event["offered"] == 3
    assert {r["name"] for r in event["removed"]} == {"get_invoice", "delete_customer"}


# -- run-end reasons: the trace and the metric agree --------------------------------


def _start_run(proxy: ProxyProcess, **body: Any) -> tuple[str, str]:
    r = proxy.control("POST", "/runs", json=body)
    assert r.status_code == 201, r.text
    return r.json()["run"], r.json()["credential"]


def test_budget_and_ttl_run_ends_are_counted_under_their_trace_reason(tmp_path, upstream, confdir):
    policy = _policy(tmp_path, "enforce", "budgets: {max_tool_calls: 1}\n")
    with ProxyProcess(
        tmp_path,
        ledger=_ledger(tmp_path, LEDGER_YAML),
        policy=policy,
        routes=upstream.routes(),
        confdir=confdir,
    ) as proxy:
        budget_run, cred = _start_run(proxy)
        url = f"http://{budget_run}:{cred}@127.0.0.1:{proxy.port}"
        with httpx.Client(proxy=url, timeout=10, trust_env=False) as c:
            statuses = [c.get("http://crm.acme.test/customers/4411").status_code for _ in range(2)]
        ttl_run, _ = _start_run(proxy, ttl=1)
        deadline = time.monotonic() + 15
        while proxy.control("GET", f"/runs/{ttl_run}").json()["active"]:
            assert time.monotonic() < deadline, "the ttl run was not ended"
            time.sleep(0.2)
        metrics = scrape(proxy.metrics_port)
    assert statuses == [200, 429]
    trace = events(proxy.trace)
    reasons = {run: of_type(trace, "run_end", run)[0]["reason"] for run in (budget_run, ttl_run)}
    assert reasons == {budget_run: "step_limit", ttl_run: "timeout"}
    ledger = "sidecar-e2e"
    for reason in ("step_limit", "timeout"):
        assert total(metrics, "offscope_run_ends_total", ledger=ledger, reason=reason) == 1
    assert total(metrics, "offscope_run_ends_total", ledger=ledger, reason="exit") == 0


# -- IPv6 listen addresses -----------------------------------------------------------


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_metrics_and_control_listen_on_ipv6_loopback(tmp_path, confdir):
    metrics, control = free_port(), free_port()
    token = tmp_path / "token"
    token.write_text("ipv6-token\n", encoding="utf-8")
    args = [
        "offscope",
        "proxy",
        "--ledger",
        _ledger(tmp_path, LEDGER_YAML),
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--metrics",
        f"[::1]:{metrics}",
        "--control-listen",
        f"[::1]:{control}",
        "--control-token-file",
        str(token),
        "--trace",
        str(tmp_path / "trace.jsonl"),
        "--confdir",
        confdir,
    ]
    stderr = tmp_path / "stderr.log"
    with stderr.open("wb") as err:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err)
        try:
            ready = _wait_ok(f"http://[::1]:{metrics}/readyz", proc)
            runs = httpx.get(
                f"http://[::1]:{control}/runs",
                headers={"authorization": "Bearer ipv6-token"},
                timeout=5,
            )
        finally:
            proc.terminate()
            proc.wait(20)
    assert ready, stderr.read_text()
    assert runs.status_code == 200 and "runs" in runs.json()
    assert "Traceback" not in stderr.read_text()


def _wait_ok(url: str, proc: subprocess.Popen[bytes], timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url, timeout=1, verify=HTTPX_TLS).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(
    "flag,value",
    [
        ("--metrics", "::1:9464"),  # unbracketed IPv6: the port cannot be told apart
        ("--metrics", "[::1]"),
        ("--control-listen", "[::1]:notaport"),
        ("--control-listen", "[::1:9465"),
        ("--metrics", "127.0.0.1:99999"),
    ],
)
def test_malformed_listen_addresses_are_usage_errors(tmp_path, flag, value):
    result = subprocess.run(
        ["offscope", "proxy", "--ledger", _ledger(tmp_path, LEDGER_YAML), flag, value],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert flag in result.stderr and "Traceback" not in result.stderr


# -- a trace with NaN: an input error naming file:line, in every reading command ----


def _nan_trace(tmp: Path) -> tuple[Path, int]:
    """A trace whose out-of-scope tool call has `"ts": NaN`; returns it and that line's number."""
    events = Run("run-n").call().oos("act").end("exit", True).events
    lines = [e.to_json() for e in events]
    line = max(i for i, text in enumerate(lines) if '"tool_call"' in text)
    ts = json.dumps(json.loads(lines[line])["ts"])
    lines[line] = lines[line].replace(f'"ts":{ts}', '"ts":NaN', 1)
    assert '"ts":NaN' in lines[line]
    path = tmp / "nan-trace.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, line + 1


@pytest.mark.parametrize("command", ["replay", "report"])
def test_a_nan_timestamp_is_an_input_error_not_a_traceback(tmp_path, command):
    trace, line = _nan_trace(tmp_path)
    args = {
        "replay": ["replay", str(trace), "--ledger", _ledger(tmp_path, LEDGER_YAML)],
        "report": ["report", str(trace), "--json"],
    }[command]
    result = subprocess.run(["offscope", *args], capture_output=True, text=True, timeout=120)
    err = result.stderr.replace("\n", "")
    assert result.returncode == 2, result.stderr
    assert f"{trace}:{line}:" in err and "NaN" in err
    assert "Traceback" not in result.stderr


# -- a non-HTTP CONNECT tunnel (found while writing the threat model's table) -------


class _RawTcpServer:
    """A loopback TCP server that records the bytes each connection sends."""

    def __init__(self) -> None:
        import threading

        self.received: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    data = conn.recv(4096)
                    self.received.append(data)
                    conn.sendall(b"ok " + data)
                except OSError:
                    pass


def test_a_raw_tcp_tunnel_to_an_unnamed_host_is_refused_in_enforce(tmp_path, confdir):
    server = _RawTcpServer()
    try:
        with ProxyProcess(
            tmp_path, ledger=_ledger(tmp_path, LEDGER_YAML), policy="enforce", confdir=confdir
        ) as proxy:
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as agent:
                agent.sendall(
                    f"CONNECT 127.0.0.1:{server.port} HTTP/1.1\r\n"
                    f"Host: 127.0.0.1:{server.port}\r\n"
                    "Proxy-Authorization: Basic cnVuLXRjcDp4\r\n\r\n".encode()  # run-tcp:x
                )
                agent.recv(4096)  # the tunnel's answer
                agent.sendall(b"SSH-2.0-agent customer=9999 exfil\r\n")
                with contextlib.suppress(OSError):
                    agent.recv(4096)
    finally:
        server.sock.close()
    assert server.received == []  # the unnamed destination received nothing
    assert of_type(events(proxy.trace), "tool_call", "run-tcp")  # and the attempt is recorded
