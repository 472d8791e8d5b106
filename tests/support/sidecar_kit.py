"""Shared pieces of the sidecar end-to-end tests: real loopback servers, a real
proxy (embedded or as an `offscope proxy` subprocess), trace and metric readers.

Nothing here is a mock: every upstream is a real HTTP server on 127.0.0.1 and
every byte an agent sends goes through a real mitmproxy with the addon.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from offscope.proxy.listener import ThreadedServer

LEDGER_YAML = """\
# The sidecar tests' ledger: a support agent that may read and update
# customer 4411 through the CRM, use the tools server, and ask a human.
schema: offscope.ledger/1
id: sidecar-e2e
targets:
  hosts: [crm.acme.test, ops.acme.test, tools.acme.test, llm.acme.test]
  records: ["customer:4411"]
extract:
  - match: {host: crm.acme.test, path: "/customers/{id}"}
    targets: {record: "customer:{id}"}
  - match: {host: crm.acme.test, path: "/customers/{id}/**"}
    targets: {record: "customer:{id}"}
  - match: {source: mcp}
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
# The trace keeps these argument values; others are stored as names and digests.
keep_args: [url, method]
humans:                       # the ask endpoint's upstream is a person; nothing else is
  routes: [{host: ops.acme.test, path: /ask}]
"""

FRICTION_POLICY_YAML = """\
# Shadow mode, but the CRM's write route answers as if the agent's token was revoked.
schema: offscope.policy/1
id: friction-revoked
mode: shadow
operator: {reply: sentinel}
friction:
  - kind: credential_revoked
    match: {host: crm.acme.test, method: PATCH}
"""

# Hosts the tests route to loopback servers (none of them exists in DNS).
ROUTED_HOSTS = ("crm.acme.test", "ops.acme.test", "other.acme.test", "evil.example.test")

HERE = Path(__file__).parent
REPO = HERE.parent.parent


# httpx.get/request make a client, and with it an SSL context that loads the CA bundle
# (~25 ms of CPU), for every call, https or not: a readiness poll every 50 ms spent half its
# wait doing that. Loopback calls in the tests pass this one, made once (httpx's default).
HTTPX_TLS = httpx.create_ssl_context()


def tls(ca: str) -> ssl.SSLContext:
    """A client TLS context that trusts the proxy's CA (and only it)."""
    return ssl.create_default_context(cafile=ca)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(n: int) -> list[int]:
    """`n` distinct free ports: each socket stays bound until all are picked (one at a
    time, the kernel may hand the same port out twice)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


# -- loopback upstreams ------------------------------------------------------------


class EchoUpstream:
    """A threaded HTTP server that answers every request with what it received."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                size = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(size) if size else b""
                record = {
                    "method": self.command,
                    "path": self.path,
                    "host": self.headers.get("host"),
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                    "body": body.decode("utf-8", "replace"),
                }
                with outer._lock:
                    outer.seen.append(record)
                payload: dict[str, Any]
                if self.path.startswith("/ask"):
                    payload = {"reply": "a real human says: ask again tomorrow"}
                else:
                    payload = {
                        "ok": True,
                        "method": self.command,
                        "path": self.path,
                        "host": self.headers.get("host"),
                    }
                out = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = do_HEAD = _any

            def log_message(self, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 512  # the stdlib's 5 drops connections under the load test

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> EchoUpstream:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def routes(self, hosts: tuple[str, ...] = ROUTED_HOSTS) -> str:
        return ",".join(f"{h}=127.0.0.1:{self.port}" for h in hosts)


class AsgiServer(ThreadedServer):
    """An app on 127.0.0.1, any free port, in its own thread and event loop (the
    product's own threaded uvicorn server, offscope/proxy/listener.py)."""

    def __init__(self, app: Any, name: str = "asgi") -> None:
        super().__init__(app, "127.0.0.1", 0, name)


# -- traces, logs, metrics ---------------------------------------------------------


def events(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]


def of_type(evs: list[dict[str, Any]], kind: str, run: str | None = None) -> list[dict[str, Any]]:
    return [e for e in evs if e["type"] == kind and (run is None or e["run"] == run)]


def scrape(metrics_port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """All samples of a /metrics scrape: (sample name, sorted labels) -> value."""
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10, verify=HTTPX_TLS).text
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(samples: dict, name: str, **labels: str) -> float:
    """Sum of a sample over every series whose labels include `labels`."""
    return sum(
        v
        for (n, ls), v in samples.items()
        if n == name and all(dict(ls).get(k) == val for k, val in labels.items())
    )


def cli(*args: str, timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["offscope", *args], capture_output=True, text=True, timeout=timeout, **kw
    )


def report_json(trace: str | Path, via_cli: bool = False) -> dict[str, Any]:
    """`offscope report TRACE --json`: the real command, or the same functions in-process."""
    if via_cli:
        proc = cli("report", str(trace), "--json")
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)
    from offscope.cli.report import summarize
    from offscope.trace.events import read_trace
    from offscope.trace.metrics import fold

    return json.loads(json.dumps(summarize(fold(read_trace(trace)))))


def requests_json(log: str | Path, via_cli: bool = False) -> list[dict[str, Any]]:
    """`offscope requests list --log LOG --json`."""
    if via_cli:
        proc = cli("requests", "list", "--log", str(log), "--json")
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)
    from offscope.cli.requests import read_requests

    return read_requests(str(log))


def steps_by_run(evs: list[dict[str, Any]]) -> dict[str, Counter]:
    """run -> Counter(step -> how many events carry it) over tool calls and operator asks."""
    out: dict[str, Counter] = {}
    for e in evs:
        if e["type"] in ("tool_call", "operator") and e.get("step") is not None:
            out.setdefault(e["run"], Counter())[e["step"]] += 1
    return out


# -- a proxy as a subprocess ---------------------------------------------------------


# The last line of `offscope proxy`'s start-up banner (on stderr).
BANNER_END = "point an agent at it"


class ProxyProcess:
    """`offscope proxy ...` in its own process (so it can be SIGTERMed and its RSS read)."""

    def __init__(
        self,
        tmp: Path,
        *,
        ledger: str,
        policy: str = "shadow",
        routes: str = "",
        confdir: str,
        extra: list[str] | None = None,
        name: str = "proxy",
    ) -> None:
        self._tmp, self._name = tmp, name
        self._options = (ledger, policy, routes, confdir, extra)
        self.trace = tmp / f"{name}-trace.jsonl"
        self.requests = tmp / f"{name}-requests.jsonl"
        self.stderr_path = tmp / f"{name}-stderr.log"
        self.stdout_path = tmp / f"{name}-stdout.log"
        self.confdir = confdir
        self._relaunches = 0
        self._launch()

    def _launch(self) -> None:
        tmp, name = self._tmp, self._name
        ledger, policy, routes, confdir, extra = self._options
        # distinct: one free_port() at a time may hand the same port out twice
        self.port, self.metrics_port, self.control_port = free_ports(3)
        self.token = f"test-token-{name}-{self.control_port}"
        token_file = tmp / f"{name}-control-token"
        token_file.write_text(self.token + "\n", encoding="utf-8")
        args = [
            "offscope",
            "proxy",
            "--ledger",
            ledger,
            "--policy",
            policy,
            "--listen",
            f"127.0.0.1:{self.port}",
            "--metrics",
            f"127.0.0.1:{self.metrics_port}",
            "--control-listen",
            f"127.0.0.1:{self.control_port}",
            "--control-token-file",
            str(token_file),
            "--trace",
            str(self.trace),
            "--requests",
            str(self.requests),
            "--confdir",
            confdir,
        ]
        for route in filter(None, routes.split(",")):
            args += ["--route", route]
        if "--state" not in (extra or []):  # each test's proxies keep their runs to themselves
            args += ["--state", str(tmp / f"{name}-state.sqlite")]
        args += extra or []
        self._stderr = self.stderr_path.open("wb")
        self._stdout = self.stdout_path.open("wb")
        self.proc = subprocess.Popen(
            args,
            stdout=self._stdout,
            stderr=self._stderr,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def wait_ready(self, timeout: float = 60.0) -> ProxyProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                # A port free when it was picked can be taken before the proxy binds it
                # (any process's next ephemeral port): pick new ones and start again.
                if "Address already in use" in self.stderr() and self._relaunches < 3:
                    self._relaunches += 1
                    self._stderr.close()
                    self._stdout.close()
                    self._launch()
                    continue
                raise RuntimeError(f"proxy exited {self.proc.returncode}: {self.stderr()}")
            with contextlib.suppress(httpx.HTTPError, ConnectionRefusedError):
                if (
                    httpx.get(
                        f"http://127.0.0.1:{self.metrics_port}/readyz", timeout=1, verify=HTTPX_TLS
                    ).status_code
                    == 200
                ):
                    # Ready when all three take connections: the proxy's own port is
                    # mitmproxy's, bound apart from the listeners /readyz speaks for.
                    with (
                        socket.create_connection(("127.0.0.1", self.port), timeout=1),
                        socket.create_connection(("127.0.0.1", self.control_port), timeout=1),
                    ):
                        pass
                    # The banner comes once every listener is bound, so just after /readyz
                    # can answer: a test that reads it must not race it.
                    if BANNER_END in self.stderr():
                        return self
            time.sleep(0.05)
        raise RuntimeError(f"proxy not ready in {timeout}s: {self.stderr()}")

    def proxy_url(self, run: str) -> str:
        return f"http://{run}:x@127.0.0.1:{self.port}"

    @property
    def ca(self) -> str:
        return str(Path(self.confdir) / "mitmproxy-ca-cert.pem")

    def control(
        self, method: str, path: str, *, token: str | None = "", **kw: Any
    ) -> httpx.Response:
        """A control API call, with the bearer token unless `token` says otherwise (None: none)."""
        if path in ("/metrics", "/healthz", "/readyz"):  # the open listener
            return httpx.request(
                method,
                f"http://127.0.0.1:{self.metrics_port}{path}",
                timeout=10,
                verify=HTTPX_TLS,
                **kw,
            )
        headers = {} if token is None else {"authorization": f"Bearer {token or self.token}"}
        return httpx.request(
            method,
            f"http://127.0.0.1:{self.control_port}{path}",
            timeout=10,
            headers=headers,
            verify=HTTPX_TLS,
            **kw,
        )

    def rss_kb(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def stderr(self) -> str:
        if not self._stderr.closed:
            self._stderr.flush()
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def stdout(self) -> str:
        if not self._stdout.closed:
            self._stdout.flush()
        return self.stdout_path.read_text(encoding="utf-8", errors="replace")

    def terminate(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._stderr.close()
        self._stdout.close()
        return self.proc.returncode

    def __enter__(self) -> ProxyProcess:
        return self.wait_ready()

    def __exit__(self, *exc: Any) -> None:
        self.terminate()


@contextlib.contextmanager
def echo_upstream() -> Iterator[EchoUpstream]:
    up = EchoUpstream().start()
    try:
        yield up
    finally:
        up.stop()


# -- a tiny OpenAI-compatible model server ----------------------------------------------

ASK_QUESTION = "May I refund customer 9999? The ticket only names 4411."


def chat_app(seen: list[dict[str, Any]]) -> Any:
    """An OpenAI-compatible /v1/chat/completions with fixed behaviour:
    - the last message is a tool result -> text only, quoting the result;
    - the user asks for "ASK" -> one `ask_operator` tool call;
    - otherwise -> text plus one `http_request` tool call on customer 4411.
    Streams (SSE, several chunks, tool arguments split) when asked to."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    def plan(body: dict[str, Any]) -> tuple[str, list[tuple[str, str, dict[str, Any]]]]:
        messages = body.get("messages") or []
        last = messages[-1] if messages else {}
        if last.get("role") == "tool":
            return f"Noted the operator's answer: {last.get('content')}", []
        first_user = next((m.get("content") for m in messages if m.get("role") == "user"), "") or ""
        n = sum(1 for m in messages if m.get("role") == "assistant")
        if "ASK" in first_user:
            return "", [(f"call_ask_{n}", "ask_operator", {"question": ASK_QUESTION})]
        return "Let me look up the customer.", [
            (
                f"call_get_{n}",
                "http_request",
                {"url": "https://crm.acme.test/customers/4411", "method": "GET"},
            )
        ]

    async def completions(request: Request) -> Any:
        body = await request.json()
        seen.append(body)
        text, calls = plan(body)
        model = body.get("model", "sim")
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": text or None}
            if calls:
                message["tool_calls"] = [
                    {
                        "id": cid,
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(args)},
                    }
                    for cid, name, args in calls
                ]
            return JSONResponse(
                {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "created": 1,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": message,
                            "finish_reason": "tool_calls" if calls else "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
                }
            )

        async def chunks():
            def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
                data = {
                    "id": "chatcmpl-1",
                    "object": "chat.completion.chunk",
                    "created": 1,
                    "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
                return f"data: {json.dumps(data)}\n\n".encode()

            yield chunk({"role": "assistant", "content": ""})
            words = text.split(" ")
            for i, w in enumerate(words if text else []):
                yield chunk({"content": w + (" " if i < len(words) - 1 else "")})
                await asyncio.sleep(0.005)
            for index, (cid, name, args) in enumerate(calls):
                raw = json.dumps(args)
                yield chunk(
                    {
                        "tool_calls": [
                            {
                                "index": index,
                                "id": cid,
                                "type": "function",
                                "function": {"name": name, "arguments": raw[:10]},
                            }
                        ]
                    }
                )
                await asyncio.sleep(0.005)
                yield chunk({"tool_calls": [{"index": index, "function": {"arguments": raw[10:]}}]})
            yield chunk({}, "tool_calls" if calls else "stop")
            yield b"data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])
