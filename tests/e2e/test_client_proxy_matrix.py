"""Every common client goes through the proxy with the environment offscope prints.

The environment is taken from the real `offscope ca --proxy HOST:PORT --run RUN`
output (parsed as a shell would), then each client runs as its own process: curl,
Python requests, httpx, Node's fetch (with undici's EnvHttpProxyAgent, Node 20's way
to read the proxy variables), and the Python and TypeScript MCP SDKs. The fixture
hosts exist only behind the proxy, so a client that went around it fails; each test
asserts on what the upstream received and on the run the proxy's trace recorded.
docs/clients.md is the page these tests keep true.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp.server.fastmcp import FastMCP
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import ToolAnnotations

from tests.support.sidecar_kit import (
    LEDGER_YAML,
    AsgiServer,
    EchoUpstream,
    ProxyProcess,
    events,
    of_type,
)

REPO = Path(__file__).resolve().parents[2]
NODE_DIR = REPO / "tests" / "node"  # package.json; .ci/run installs it with `npm ci`
URL = "crm.acme.test/customers/4411"


def _client_env(proxy: ProxyProcess, run: str) -> dict[str, str]:
    """The variables `offscope ca --proxy` prints, read the way `eval` would."""
    out = subprocess.run(
        ["offscope", "ca", "--confdir", proxy.confdir, "--proxy", f"127.0.0.1:{proxy.port}"]
        + ["--run", run],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    printed: dict[str, str] = {}
    for line in out.splitlines():
        words = shlex.split(line)
        assert words[0] == "export", line
        name, _, value = words[1].partition("=")
        printed[name] = value
    # Start from an environment with an inherited exclusion, as on many machines:
    # the printed empty NO_PROXY must win over it.
    base = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    return {**base, "NO_PROXY": "localhost,127.0.0.1,.acme.test", **printed}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("clients")
    ledger = tmp / "ledger.yaml"
    ledger.write_text(LEDGER_YAML)
    echo = EchoUpstream().start()
    mcp = AsgiServer(_mcp_app(), "mcp-clients").start()
    routes = f"crm.acme.test=127.0.0.1:{echo.port},tools.acme.test=127.0.0.1:{mcp.port}"
    proxy = ProxyProcess(
        tmp, ledger=str(ledger), policy="enforce", routes=routes, confdir=str(tmp / "ca")
    )
    try:
        with proxy:
            yield {"proxy": proxy, "echo": echo, "tmp": tmp}
    finally:
        mcp.stop()
        echo.stop()


def _mcp_app() -> Any:
    server = FastMCP(
        "crm-tools",
        stateless_http=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def get_customer(customer_id: str) -> str:
        """Read a customer record."""
        return f"customer {customer_id}: plan=pro"

    return server.streamable_http_app()


def _run(argv: list[str], env: dict[str, str], cwd: Path | None = None) -> str:
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, f"{argv[0]} failed ({done.returncode}):\n{done.stderr[-2000:]}"
    return done.stdout


def _received(world: dict[str, Any], run: str) -> list[dict[str, Any]]:
    """The upstream's record of the requests the proxy forwarded for `run`."""
    return [
        seen
        for seen in world["echo"].seen
        if seen["path"] == "/customers/4411" and seen["headers"].get("x-client-run") == run
    ]


def _traced(world: dict[str, Any], run: str, expect: int = 1) -> list[dict[str, Any]]:
    """The run's calls as the trace recorded them (waiting, boundedly, for the writer)."""
    deadline = time.monotonic() + 15
    while True:
        calls = [e["call"] for e in of_type(events(world["proxy"].trace), "tool_call", run)]
        if len(calls) >= expect or time.monotonic() > deadline:
            return calls
        time.sleep(0.1)


CLIENTS: dict[str, Any] = {
    "curl": lambda url, run: ["curl", "-sf", "-H", f"x-client-run: {run}", url],
    "requests": lambda url, run: [
        sys.executable,
        "-c",
        "import requests, sys; r = requests.get(sys.argv[1], headers={'x-client-run': "
        "sys.argv[2]}, timeout=30); r.raise_for_status(); print(r.text)",
        url,
        run,
    ],
    "httpx": lambda url, run: [
        sys.executable,
        "-c",
        "import httpx, sys; r = httpx.get(sys.argv[1], headers={'x-client-run': sys.argv[2]}, "
        "timeout=30); r.raise_for_status(); print(r.text)",
        url,
        run,
    ],
}


@pytest.mark.parametrize("scheme", ["http", "https"])
@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_client_goes_through_the_proxy(world: dict[str, Any], client: str, scheme: str) -> None:
    if client == "curl" and not shutil.which("curl"):
        pytest.skip("curl not installed")
    run = f"run-{client}-{scheme}"
    _run(CLIENTS[client](f"{scheme}://{URL}", run), _client_env(world["proxy"], run))
    assert len(_received(world, run)) == 1
    assert [call["method"] for call in _traced(world, run)] == ["GET"]


def _node_ready() -> str | None:
    if not shutil.which("node"):
        return "node not installed"
    if not (NODE_DIR / "node_modules" / "undici").is_dir():
        return f"node peers not installed (npm ci --prefix {NODE_DIR.relative_to(REPO)})"
    return None


NODE_FETCH = """
const { EnvHttpProxyAgent, setGlobalDispatcher } = require("undici");
// Node 20 fetch reads no proxy variable; undici (its HTTP client) is the switch.
setGlobalDispatcher(new EnvHttpProxyAgent());
const [url, run] = process.argv.slice(1);
fetch(url, { headers: { "x-client-run": run } }).then(async (r) => {
  if (!r.ok) { console.error(r.status); process.exit(1); }
  console.log(await r.text());
}, (e) => { console.error(e); process.exit(1); });
"""


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_node_fetch_goes_through_the_proxy(world: dict[str, Any], scheme: str) -> None:
    if reason := _node_ready():
        pytest.skip(reason)
    run = f"run-node-{scheme}"
    _run(
        ["node", "-e", NODE_FETCH, f"{scheme}://{URL}", run],
        _client_env(world["proxy"], run),
        cwd=NODE_DIR,
    )
    assert len(_received(world, run)) == 1
    assert [call["method"] for call in _traced(world, run)] == ["GET"]


def test_curl_ignores_upper_case_http_proxy(world: dict[str, Any]) -> None:
    """Why both spellings are printed: with only HTTP_PROXY, curl goes direct for http://."""
    if not shutil.which("curl"):
        pytest.skip("curl not installed")
    run = "run-curl-upper-only"
    env = _client_env(world["proxy"], run)
    for name in ("http_proxy", "https_proxy"):
        env.pop(name)
    done = subprocess.run(
        CLIENTS["curl"](f"http://{URL}", run), env=env, capture_output=True, timeout=60
    )
    assert done.returncode != 0  # crm.acme.test does not resolve: curl did not use the proxy
    assert _received(world, run) == [] and _traced(world, run, expect=0) == []


PY_MCP = """
import asyncio, sys
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

async def main():
    async with streamablehttp_client(sys.argv[1]) as (read, write, _):
        async with ClientSession(read, write) as session:
            await session.initialize()
            result = await session.call_tool("get_customer", {"customer_id": "4411"})
            print(result.content[0].text)

asyncio.run(main())
"""

TS_MCP = """
const { EnvHttpProxyAgent, setGlobalDispatcher } = require("undici");
setGlobalDispatcher(new EnvHttpProxyAgent());
(async () => {
  const { Client } = await import("@modelcontextprotocol/sdk/client/index.js");
  const { StreamableHTTPClientTransport } =
    await import("@modelcontextprotocol/sdk/client/streamableHttp.js");
  const client = new Client({ name: "matrix", version: "1.0.0" });
  await client.connect(new StreamableHTTPClientTransport(new URL(process.argv[1])));
  const result = await client.callTool({ name: "get_customer", arguments: { customer_id: "4411" } });
  console.log(result.content[0].text);
  await client.close();
})().catch((e) => { console.error(e); process.exit(1); });
"""


def _mcp_calls(world: dict[str, Any], run: str) -> list[str]:
    return [call.get("tool", "") for call in _traced(world, run) if call.get("source") == "mcp"]


def test_python_mcp_sdk_goes_through_the_proxy(world: dict[str, Any]) -> None:
    run = "run-mcp-python"
    out = _run(
        [sys.executable, "-c", PY_MCP, "http://tools.acme.test/mcp"],
        _client_env(world["proxy"], run),
    )
    assert "plan=pro" in out
    assert _mcp_calls(world, run) == ["get_customer"]


def test_typescript_mcp_sdk_goes_through_the_proxy(world: dict[str, Any]) -> None:
    if reason := _node_ready():
        pytest.skip(reason)
    run = "run-mcp-typescript"
    out = _run(
        ["node", "-e", TS_MCP, "http://tools.acme.test/mcp"],
        _client_env(world["proxy"], run),
        cwd=NODE_DIR,
    )
    assert "plan=pro" in out
    assert _mcp_calls(world, run) == ["get_customer"]


def test_runs_start_env_reaches_curl(world: dict[str, Any]) -> None:
    """`offscope runs start --env` prints what curl needs: a registered run over http://."""
    if not shutil.which("curl"):
        pytest.skip("curl not installed")
    proxy = world["proxy"]
    out = _run(
        ["offscope", "runs", "start", "--control", f"http://127.0.0.1:{proxy.control_port}"]
        + ["--token-file", str(world["tmp"] / "proxy-control-token")]
        + ["--proxy", f"127.0.0.1:{proxy.port}", "--env", "--label", "client=curl"],
        {k: v for k, v in os.environ.items() if "proxy" not in k.lower()},
    )
    script = out + '\ncurl -sf -H "x-client-run: $OFFSCOPE_RUN" http://' + URL + "\n"
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    done = subprocess.run(
        ["bash", "-c", script + 'echo; echo "RUN=$OFFSCOPE_RUN"'],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    run = done.stdout.strip().splitlines()[-1].removeprefix("RUN=")
    assert len(_received(world, run)) == 1
    assert [call["method"] for call in _traced(world, run)] == ["GET"]
