"""The official MCP conformance suite, against a reference server directly and through offscope.

Installs (once, into `--npm-dir`) the MCP conformance suite and the reference "everything"
server from the npm registry, at the versions pinned below, starts the server on loopback
(streamable HTTP), and runs the suite's server scenarios twice in the same run: against the
server's own URL, and through `offscope proxy --policy shadow` in gateway mode (the suite's
client takes a URL and no proxy setting, which is what gateway mode is for). Shadow mode
must change nothing a client sees, so every scenario must give the same result both ways.

Prints JSON: per scenario, passed/failed direct and through offscope, and `same_result`
(every scenario equal). The reference server does not implement every scenario the suite
knows; those fail both ways, and they are listed.

    python bench/mcp_conformance.py [--npm-dir ~/.cache/offscope-conformance]

Needs Node 20 and the npm registry. The suite's newest releases need Node 22 (fs.globSync);
0.1.10 is the newest that runs on Node 20.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

CONFORMANCE = "@modelcontextprotocol/conformance@0.1.10"
EVERYTHING = "@modelcontextprotocol/server-everything@2026.8.31"
HOST = "everything.acme.test"  # the name the ledger and the gateway give the server
_RESULT = re.compile(r"^[✓✗] (?P<scenario>\S+): (?P<passed>\d+) passed, (?P<failed>\d+) failed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.2)
    raise SystemExit(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f} s")


def install(npm_dir: Path) -> Path:
    modules = npm_dir / "node_modules" / "@modelcontextprotocol"
    if not (modules / "conformance").exists() or not (modules / "server-everything").exists():
        npm_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--prefix", str(npm_dir), "--no-audit", "--no-fund",
             "--loglevel=error", CONFORMANCE, EVERYTHING],
            check=True,
            timeout=600,
            stdout=sys.stderr,  # stdout is the JSON result
        )  # fmt: skip
    return modules


@contextlib.contextmanager
def process(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[None]:
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            yield
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


def run_suite(modules: Path, url: str) -> dict[str, dict[str, int]]:
    out = subprocess.run(
        ["node", str(modules / "conformance" / "dist" / "index.js"), "server", "--url", url],
        capture_output=True,
        text=True,
        timeout=600,
    )
    results = {}
    for line in out.stdout.splitlines():
        if m := _RESULT.match(line.strip()):
            results[m["scenario"]] = {"passed": int(m["passed"]), "failed": int(m["failed"])}
    if not results:
        raise SystemExit(f"the suite printed no scenario results:\n{out.stdout}\n{out.stderr}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--npm-dir",
        type=Path,
        default=Path.home() / ".cache" / "offscope-conformance",
        help="where the npm packages are installed (kept between runs)",
    )
    args = parser.parse_args()
    modules = install(args.npm_dir)
    with tempfile.TemporaryDirectory(prefix="offscope-conformance-") as tmp_name:
        tmp = Path(tmp_name)
        server_port, proxy_port, gateway_port = free_port(), free_port(), free_port()
        ledger = tmp / "ledger.yaml"
        ledger.write_text(
            f"schema: offscope.ledger/1\nid: conformance\ntargets:\n  hosts: [{HOST}]\n",
            encoding="utf-8",
        )
        server_cmd = ["node", str(modules / "server-everything" / "dist" / "index.js")]
        proxy_cmd = [
            sys.executable, "-m", "offscope.cli", "proxy", "--ledger", str(ledger),
            "--policy", "shadow", "--listen", f"127.0.0.1:{proxy_port}", "--metrics", "",
            "--control-listen", "", "--state", "", "--trace", str(tmp / "trace.jsonl"),
            "--confdir", str(tmp / "ca"), "--route", f"{HOST}=127.0.0.1:{server_port}",
            "--gateway", f"ev=http://{HOST}", "--gateway-listen", f"127.0.0.1:{gateway_port}",
        ]  # fmt: skip
        env = {**os.environ, "PORT": str(server_port)}
        with (
            process([*server_cmd, "streamableHttp"], tmp / "server.log", env),
            process(proxy_cmd, tmp / "proxy.log"),
        ):
            wait_for_port(server_port)
            wait_for_port(gateway_port)
            direct = run_suite(modules, f"http://127.0.0.1:{server_port}/mcp")
            via = run_suite(modules, f"http://127.0.0.1:{gateway_port}/ev/mcp")
        calls = sum(
            1
            for line in (tmp / "trace.jsonl").read_text(encoding="utf-8").splitlines()
            if '"type": "tool_call"' in line or '"type":"tool_call"' in line
        )
    scenarios = sorted(set(direct) | set(via))
    print(
        json.dumps(
            {
                "bench": "mcp_conformance",
                "suite": CONFORMANCE,
                "server": EVERYTHING,
                "scenarios": {s: {"direct": direct.get(s), "via_offscope": via.get(s)} for s in scenarios},
                "passed_direct": sum(r["failed"] == 0 for r in direct.values()),
                "passed_via_offscope": sum(r["failed"] == 0 for r in via.values()),
                "failing_both_ways": [s for s in scenarios if direct.get(s, {}).get("failed") and via.get(s, {}).get("failed")],
                "tool_calls_recorded_via_offscope": calls,
                "same_result": all(direct.get(s) == via.get(s) for s in scenarios),
            },
            indent=2,
        )
    )  # fmt: skip


if __name__ == "__main__":
    main()
