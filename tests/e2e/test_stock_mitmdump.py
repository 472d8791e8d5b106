"""The addon in a stock mitmproxy (`mitmdump -s "$(offscope addon-path)"`) tags
traffic exactly as the embedded `offscope proxy` does."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.support.sidecar_kit import cli, events, free_port, of_type, tls

pytestmark = pytest.mark.timeout(90)

TRAFFIC = [
    ("GET", "http://crm.acme.test/customers/4411"),
    ("GET", "https://crm.acme.test/customers/9999"),
    ("PATCH", "https://crm.acme.test/customers/9999"),
    ("PATCH", "http://crm.acme.test/customers/4411?dry_run=true"),
    ("POST", "http://other.acme.test/export"),
]


def projection(trace: Path, run: str) -> list[tuple]:
    return [
        (
            c["step"],
            c["call"]["method"],
            c["call"]["url"],
            c["call"]["scope"],
            c["call"]["stage"],
            tuple((t["kind"], t["value"], t["in_scope"]) for t in c["call"]["targets"]),
            c["decision"],
            c["status"],
            c["injected"],
        )
        for c in of_type(events(trace), "tool_call", run)
    ]


def send(proxy_url: str, ca: str) -> list[int]:
    with httpx.Client(proxy=proxy_url, verify=tls(ca), timeout=20) as c:
        return [
            c.request(m, u, json={"x": 1} if m != "GET" else None).status_code for m, u in TRAFFIC
        ]


async def test_stock_mitmdump_tags_like_the_embedded_proxy(
    embedded, ledger_file, upstream, confdir, ca, tmp_path
):
    addon = cli("addon-path").stdout.strip()
    assert Path(addon).is_file()
    port = free_port()
    stock_trace = tmp_path / "stock.jsonl"
    log = (tmp_path / "mitmdump.log").open("wb")
    proc = subprocess.Popen(
        [
            "mitmdump",
            "-q",
            "-s",
            addon,
            "-p",
            str(port),
            "--listen-host",
            "127.0.0.1",
            "--set",
            "connection_strategy=lazy",
            "--set",
            f"confdir={confdir}",
            "--set",
            f"offscope_ledger={ledger_file}",
            "--set",
            "offscope_policy=enforce",
            "--set",
            f"offscope_trace={stock_trace}",
            "--set",
            f"offscope_routes={upstream.routes()}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (tmp_path / "mitmdump.log").read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "mitmdump did not start"
                time.sleep(0.1)
        stock_status = await asyncio.to_thread(send, f"http://stock-1:x@127.0.0.1:{port}", ca)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        log.close()

    async with embedded(policy="enforce") as e:
        embedded_status = await asyncio.to_thread(send, e.url("stock-1"), ca)

    assert stock_status == embedded_status == [200, 200, 403, 200, 403]
    stock, ours = projection(stock_trace, "stock-1"), projection(e.trace, "stock-1")
    assert len(stock) == len(TRAFFIC) and stock == ours
    assert [(s[3], s[4], s[6]) for s in stock] == [
        ("in", "investigate", "allow"),
        ("out", "investigate", "allow"),
        ("out", "act", "block"),
        ("in", "prepare", "allow"),
        ("out", "act", "block"),
    ]
    # The run id came from the proxy credentials in both.
    assert {ev["run"] for ev in events(stock_trace)} == {"stock-1"}
