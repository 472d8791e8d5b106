"""Amazon Bedrock Converse through a real proxy: its stream is AWS's binary event stream,
decoded by the dialect as the bytes pass (never held back), and its tool uses tagged."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.test_gemini import wait_trace
from tests.support.core_wire import aws_event
from tests.support.sidecar_kit import ProxyProcess

pytestmark = pytest.mark.timeout(120)

MODEL = "anthropic.claude-3-5-sonnet-20240620-v1:0"
LEDGER = """\
schema: offscope.ledger/1
id: bedrock-e2e
targets:
  hosts: [crm.acme.test]
llm:
  hosts: ["127.0.0.1:{port}"]
keep_args: [url]
"""
TOOLS = {"tools": [{"toolSpec": {"name": "http_request", "inputSchema": {"json": {}}}}]}
USES = [
    ("tu_1", {"url": "https://crm.acme.test/customers/4411"}),
    ("tu_2", {"url": "https://evil.test/customers/9999"}),
]


def frames() -> list[bytes]:
    out = [aws_event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "On it."}})]
    for i, (use_id, args) in enumerate(USES, start=1):
        start = {"toolUse": {"toolUseId": use_id, "name": "http_request"}}
        text = json.dumps(args)
        out += [
            aws_event("contentBlockStart", {"contentBlockIndex": i, "start": start}),
            aws_event(
                "contentBlockDelta",
                {"contentBlockIndex": i, "delta": {"toolUse": {"input": text[:9]}}},
            ),
            aws_event(
                "contentBlockDelta",
                {"contentBlockIndex": i, "delta": {"toolUse": {"input": text[9:]}}},
            ),
        ]
    return out + [aws_event("messageStop", {"stopReason": "tool_use"})]


class FakeBedrock(ThreadingHTTPServer):
    """Sends the first frame, then waits until the client has read it."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.first_read = threading.Event()
        self.waited: list[bool] = []


class _Handler(BaseHTTPRequestHandler):
    server: FakeBedrock
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        self.rfile.read(int(self.headers["content-length"]))
        self.send_response(200)
        self.send_header("content-type", "application/vnd.amazon.eventstream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        for i, frame in enumerate(frames()):
            self.wfile.write(f"{len(frame):x}\r\n".encode() + frame + b"\r\n")
            self.wfile.flush()
            if i == 0:
                self.server.waited.append(self.server.first_read.wait(20))
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass


@pytest.fixture
def bedrock() -> Iterator[FakeBedrock]:
    srv = FakeBedrock()
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_converse_stream_is_decoded_as_it_passes_and_its_tool_uses_tagged(
    tmp_path: Path, confdir: str, bedrock: FakeBedrock
) -> None:
    port = bedrock.server_address[1]
    ledger = tmp_path / "ledger.yaml"
    ledger.write_text(LEDGER.format(port=port))
    proxy = ProxyProcess(tmp_path, ledger=str(ledger), policy="shadow", confdir=confdir)
    try:
        proxy.wait_ready()
        body = {
            "messages": [{"role": "user", "content": [{"text": "Refund 4411."}]}],
            "toolConfig": TOOLS,
        }
        first = len(frames()[0])
        got = b""
        target = f"http://127.0.0.1:{port}/model/{MODEL}/converse-stream"
        with httpx.Client(proxy=proxy.proxy_url("br-1"), timeout=30) as client:
            with client.stream("POST", target, json=body) as resp:
                assert resp.status_code == 200
                for data in resp.iter_bytes():
                    got += data
                    if len(got) >= first:
                        bedrock.first_read.set()
        assert got == b"".join(frames())  # the agent received the stream intact
        assert bedrock.waited == [True]  # its first frame arrived while the rest was held upstream
        (llm,) = wait_trace(proxy, "llm", 1)
        assert (llm["api"], llm["model"], llm["stream"]) == ("bedrock-converse", MODEL, True)
        assert llm["text"] == "On it." and llm["first_user"] == "Refund 4411."
        urls = {t["args"]["url"]: t["scope"] for t in llm["tool_calls"]}
        assert urls == {USES[0][1]["url"]: "in", USES[1][1]["url"]: "out"}
    finally:
        proxy.proc.terminate()
        proxy.proc.wait(20)


def test_filter_tools_edits_the_list_bedrock_keeps_its_tools_in() -> None:
    """`toolConfig.tools[].toolSpec`: a never-in-scope tool is removed there, and an
    emptied list takes its toolConfig with it (Converse rejects an empty one)."""
    from offscope.ledgers import CompiledLedger, Ledger
    from offscope.proxy.extract.llm import dialect
    from offscope.proxy.toolfilter import filter_request_tools

    ledger = CompiledLedger(
        Ledger.model_validate(
            {
                "schema": "offscope.ledger/1",
                "id": "br",
                "targets": {"hosts": ["crm.acme.test"]},
                "denied_tools": ["wire_money"],
            }
        )
    )
    spec: dict[str, Any] = {"inputSchema": {"json": {}}}
    body: dict[str, Any] = {
        "toolConfig": {
            "tools": [
                {"toolSpec": {"name": "http_request", **spec}},
                {"toolSpec": {"name": "wire_money", **spec}},
            ],
            "toolChoice": {"tool": {"name": "wire_money"}},  # the API rejects an undeclared one
        }
    }
    removed, offered = filter_request_tools(body, ledger, dialect("bedrock-converse"))
    assert [name for name, _ in removed] == ["wire_money"] and offered == 2
    assert [t["toolSpec"]["name"] for t in body["toolConfig"]["tools"]] == ["http_request"]
    assert "toolChoice" not in body["toolConfig"]
    only: dict[str, Any] = {"toolConfig": {"tools": [{"toolSpec": {"name": "wire_money"}}]}}
    filter_request_tools(only, ledger, dialect("bedrock-converse"))
    assert "toolConfig" not in only
