"""The sidecar's two listeners on their own uvicorn threads (offscope/proxy/control.py):
what a client receives over a real loopback socket, before any engine is involved."""

from __future__ import annotations

import asyncio
import gzip
import socket
from typing import Any, cast

import httpx
import pytest

from offscope.proxy.control import MAX_BODY, ControlServer, MetricsServer
from offscope.proxy.exporter import Exporter
from offscope.proxy.listener import ThreadedServer

TOKEN = "t0ken"


@pytest.fixture
def control():
    loop = asyncio.new_event_loop()  # never run: no request here reaches the engine
    server = ControlServer("127.0.0.1", 0, cast(Any, None), loop, TOKEN)
    server.start()
    yield f"http://127.0.0.1:{server.port}"
    server.stop()
    loop.close()


def test_a_busy_address_fails_when_the_listener_is_made() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(OSError) as err:
            ThreadedServer(lambda *a: None, "127.0.0.1", port, "busy")
    assert "in use" in str(err.value)


def test_every_path_needs_the_token_first(control: str) -> None:
    for method, path in [("GET", "/runs"), ("GET", "/no/such/path"), ("DELETE", "/runs/r1")]:
        r = httpx.request(method, control + path)
        assert r.status_code == 401, (method, path)
        assert r.headers["www-authenticate"] == 'Bearer realm="offscope-control"'
        assert r.json()["error"] == "unauthorized"
    wrong = httpx.get(control + "/runs", headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 401


def test_unknown_paths_and_methods_with_the_token(control: str) -> None:
    auth = {"authorization": f"Bearer {TOKEN}"}
    assert httpx.get(control + "/nothing", headers=auth).json() == {"error": "not found"}
    r = httpx.delete(control + "/runs", headers=auth)
    assert (r.status_code, r.json()) == (405, {"error": "method not allowed"})


def test_a_body_over_the_cap_is_refused_declared_or_chunked(control: str) -> None:
    auth = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
    big = b'{"x": "' + b"a" * MAX_BODY + b'"}'
    declared = httpx.post(control + "/runs", headers=auth, content=big)

    def chunks():
        for i in range(0, len(big), 4096):
            yield big[i : i + 4096]

    chunked = httpx.post(control + "/runs", headers=auth, content=chunks())
    for r in (declared, chunked):
        assert r.status_code == 400
        assert r.json()["message"] == f"body over {MAX_BODY} bytes"
    not_json = httpx.post(control + "/runs", headers=auth, content=b"[1, 2]")
    assert (not_json.status_code, not_json.json()["message"]) == (400, "body must be a JSON object")


def test_metrics_are_gzipped_for_a_scraper_that_asks() -> None:
    exporter = Exporter()
    exporter.ensure_ledger("billing")  # enough series for a body worth compressing
    server = MetricsServer("127.0.0.1", 0, exporter, cast(Any, None))
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        with httpx.Client() as client:
            plain = client.get(url, headers={"accept-encoding": "identity"})
            raw = client.send(
                client.build_request("GET", url, headers={"accept-encoding": "gzip"}), stream=True
            )
            zipped = b"".join(raw.iter_raw())
        assert plain.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert 'offscope_runs_total{ledger="billing"} 0.0' in plain.text
        assert raw.headers["content-encoding"] == "gzip"
        assert gzip.decompress(zipped).decode() == plain.text
        om = httpx.get(url, headers={"accept": "application/openmetrics-text; version=1.0.0"})
        assert om.headers["content-type"].startswith("application/openmetrics-text")
        assert om.text.endswith("# EOF\n")
        assert httpx.get(f"http://127.0.0.1:{server.port}/x").json() == {"error": "not found"}
    finally:
        server.stop()
