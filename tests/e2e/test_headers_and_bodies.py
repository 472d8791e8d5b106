"""What crosses the proxy and what is recorded, at the header and body level:
proxy credentials and the run header stop at the proxy, the Host header names
the target (port or not), and compressed responses are recorded decoded."""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from tests.support.sidecar_kit import events, of_type, tls

pytestmark = pytest.mark.timeout(60)

NOTE = {"note": "hello from a compressed body", "customer": 4411}


class _Encoded(BaseHTTPRequestHandler):
    """GET /gzip answers gzip-encoded JSON, GET /identity the same JSON unencoded."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        raw = json.dumps(NOTE).encode()
        body, encoding = (gzip.compress(raw), "gzip") if self.path == "/gzip" else (raw, "identity")
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-encoding", encoding)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def encoded_upstream() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Encoded)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


async def test_proxy_credentials_and_run_header_stop_at_the_proxy(embedded, upstream, ca):
    async with embedded() as e:
        async with httpx.AsyncClient(proxy=e.url("hdr-1"), verify=tls(ca), timeout=20) as c:
            plain = await c.get(
                "http://crm.acme.test/customers/4411",
                headers={"X-Offscope-Run": "someone-else", "X-Keep": "kept"},
            )
            tls_ok = await c.get(
                "https://crm.acme.test/customers/4411", headers={"X-Offscope-Run": "x"}
            )
        # No proxy credentials: the run header names the run, and is not forwarded either.
        async with httpx.AsyncClient(proxy=e.url(""), timeout=20) as c:
            by_header = await c.get(
                "http://crm.acme.test/customers/4411", headers={"X-Offscope-Run": "hdr-2"}
            )
            # Credentials the proxy cannot parse are still credentials: never forwarded.
            garbled = await c.get(
                "http://crm.acme.test/customers/4411",
                headers={"Proxy-Authorization": "Basic !!not-base64!!"},
            )
    assert {r.status_code for r in (plain, tls_ok, by_header, garbled)} == {200}
    assert len(upstream.seen) == 4
    for seen in upstream.seen:
        assert "proxy-authorization" not in seen["headers"], seen
        assert "x-offscope-run" not in seen["headers"], seen
        assert seen["host"] == "crm.acme.test"
    assert upstream.seen[0]["headers"]["x-keep"] == "kept"  # other headers pass untouched
    runs = [ev["run"] for ev in of_type(events(e.trace), "tool_call")]
    assert runs[:3] == ["hdr-1", "hdr-1", "hdr-2"]
    assert runs[3].startswith("client:127.0.0.1")  # the fallback, not the garbled credential


async def test_host_header_with_a_port_names_the_same_host(embedded, upstream, ca):
    async with embedded() as e:
        async with httpx.AsyncClient(proxy=e.url("port-1"), timeout=20) as c:
            r = await c.get("http://crm.acme.test:8080/customers/4411")
    assert r.status_code == 200
    assert (
        upstream.seen[-1]["host"] == "crm.acme.test"
    )  # a route re-points the connection, not the host
    (call,) = of_type(events(e.trace), "tool_call", "port-1")
    targets = {(t["kind"], t["value"], t["in_scope"]) for t in call["call"]["targets"]}
    assert targets == {("host", "crm.acme.test", True), ("record", "customer:4411", True)}
    assert call["call"]["scope"] == "in"


@pytest.mark.parametrize("path", ["/gzip", "/identity"])
async def test_compressed_response_is_recorded_decoded(embedded, encoded_upstream, path):
    routes = f"files.acme.test=127.0.0.1:{encoded_upstream}"
    async with embedded(routes=routes) as e:
        async with httpx.AsyncClient(proxy=e.url("enc-1"), timeout=20) as c:
            r = await c.get(f"http://files.acme.test{path}")
    assert r.status_code == 200
    assert r.headers["content-encoding"] == ("gzip" if path == "/gzip" else "identity")
    assert r.json() == NOTE  # the agent's bytes are untouched (httpx decodes them itself)
    (call,) = of_type(events(e.trace), "tool_call", "enc-1")
    assert json.loads(call["response_excerpt"]) == NOTE
