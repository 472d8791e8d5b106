"""Memory over traffic: the resident size of an `offscope proxy` as flows and
runs go through it, at several checkpoints. It should rise while the first
runs fill the proxy's tables and caches, then stay flat: nothing a flow or a
finished run leaves behind may accumulate.

The proxy is a real subprocess (shadow policy, trace and metrics on); the
upstream and the load generator share this process (a minimal keep-alive
HTTP/1.1 server and raw proxy-form requests, so that the load is cheap).
Runs follow one another: run k makes flows k*F .. (k+1)*F-1 (F = flows per
run), spread over the connections, and ends as idle after `--idle-timeout`
seconds without flows. Each flow reads a different customer record (mostly
out of scope), so every run folds a new set of targets.

    python bench/memory.py                                # ~2-4 minutes: 100k flows, 10k runs
    python bench/memory.py --flows 1000000 --runs 100000 --checkpoints 10  # ~27 min

Measured (2 shared CPUs, 16 connections, ~630 flows/s): the default went
90.5 MiB at start, 94.3 after 20k flows, 94.8 from 60k to 100k flows and
10k runs. 1,000,000 flows and 100,000 runs: 89.6 MiB at start, 94.7 after
100k flows, 95.0 from 200k flows to 1M flows (10 checkpoints) and after the
last runs ended; VmHWM (the peak) 95.0.

Prints JSON: for each checkpoint, flows and runs so far, VmRSS and VmHWM (the
peak) in MiB, and `growth_after_warmup_mib`, the VmRSS added from the second
checkpoint to the last (flat: a few MiB, allocator noise).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The same loopback upstream as the overhead bench (this folder is on sys.path when run).
from proxy_overhead import _CL, _Upstream, free_port

LEDGER = """\
schema: offscope.ledger/1
id: memory-bench
targets:
  hosts: [crm.acme.test]
  records: ["customer:4411"]
extract:
  - match: {host: crm.acme.test, path: "/customers/{id}"}
    targets: {record: "customer:{id}"}
"""


def memory_mib(pid: int) -> dict[str, float]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = round(int(value.split()[0]) / 1024, 1)
    return out


class Load:
    """`concurrency` keep-alive connections through the proxy, each sending the
    next flow as soon as the last is answered, until `flows` have been sent."""

    def __init__(self, port: int, flows: int, per_run: int, concurrency: int) -> None:
        self.port, self.flows, self.per_run, self.concurrency = port, flows, per_run, concurrency
        self.sent = 0
        self.done = 0
        self.errors = 0

    def request(self, n: int) -> bytes:
        run = n // self.per_run
        auth = base64.b64encode(f"run-{run}:x".encode()).decode()
        return (
            f"GET http://crm.acme.test/customers/{n % 50_000} HTTP/1.1\r\nhost: crm.acme.test\r\n"
            f"proxy-authorization: Basic {auth}\r\n\r\n"
        ).encode()

    async def worker(self, until: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            while self.sent < until:
                n = self.sent
                self.sent += 1
                writer.write(self.request(n))
                head = await reader.readuntil(b"\r\n\r\n")
                m = _CL.search(head)
                await reader.readexactly(int(m.group(1)) if m else 0)
                self.done += 1
        except (OSError, asyncio.IncompleteReadError) as exc:
            self.errors += 1
            print(f"load: {exc}", file=sys.stderr)
        finally:
            writer.close()

    async def until(self, flows: int) -> None:
        await asyncio.gather(*(self.worker(flows) for _ in range(self.concurrency)))


async def bench(args: argparse.Namespace) -> dict:
    upstream_port = free_port()
    server = await asyncio.get_running_loop().create_server(
        _Upstream, "127.0.0.1", upstream_port, backlog=1024
    )
    tmp = Path(tempfile.mkdtemp(prefix="offscope-memory-"))
    (tmp / "ledger.yaml").write_text(LEDGER)
    port, metrics = free_port(), free_port()
    proxy = subprocess.Popen(
        [
            "offscope",
            "proxy",
            "--ledger",
            str(tmp / "ledger.yaml"),
            "--policy",
            "shadow",
            "--listen",
            f"127.0.0.1:{port}",
            "--metrics",
            f"127.0.0.1:{metrics}",
            "--control-listen",
            "",
            "--trace",
            str(tmp / "trace.jsonl"),
            "--confdir",
            str(tmp / "ca"),
            "--route",
            f"crm.acme.test=127.0.0.1:{upstream_port}",
            "--idle-timeout",
            str(args.idle_timeout),
            "--log-level",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await _wait_port(port, proxy)
        start = memory_mib(proxy.pid)
        load = Load(port, args.flows, max(1, args.flows // args.runs), args.concurrency)
        checkpoints = []
        t0 = time.monotonic()
        for i in range(1, args.checkpoints + 1):
            await load.until(args.flows * i // args.checkpoints)
            checkpoints.append(
                {
                    "flows": load.done,
                    "runs": -(-load.done // load.per_run),
                    "seconds": round(time.monotonic() - t0, 1),
                    **memory_mib(proxy.pid),
                }
            )
            print(
                json.dumps(checkpoints[-1]), file=sys.stderr, flush=True
            )  # progress, for long runs
        await asyncio.sleep(args.idle_timeout + 2)  # the last runs end as idle
        final = memory_mib(proxy.pid)
    finally:
        proxy.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proxy.wait(30)
        server.close()
    trace = tmp / "trace.jsonl"
    return {
        "flows": load.done,
        "runs": -(-load.done // load.per_run),
        "flows_per_run": load.per_run,
        "errors": load.errors,
        "concurrency": args.concurrency,
        "idle_timeout": args.idle_timeout,
        "rps": round(load.done / max(1e-9, checkpoints[-1]["seconds"]), 1),
        "start_mib": start,
        "checkpoints": checkpoints,
        "after_runs_ended_mib": final,
        "growth_after_warmup_mib": round(
            checkpoints[-1]["VmRSS"] - checkpoints[min(1, len(checkpoints) - 1)]["VmRSS"], 1
        ),
        "trace_mib": round(trace.stat().st_size / 2**20, 1) if trace.exists() else 0,
        "proxy_exit": proxy.returncode,
    }


async def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"offscope proxy exited {proc.returncode}")
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"offscope proxy not listening after {timeout}s")


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--flows", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--checkpoints", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument(
        "--idle-timeout",
        type=float,
        default=5.0,
        help="the proxy's --idle-timeout: how soon a finished run ends (s)",
    )
    args = ap.parse_args()
    if args.checkpoints < 2 or args.runs < 1 or args.flows < args.checkpoints:
        ap.error("need --checkpoints >= 2, --runs >= 1 and --flows >= --checkpoints")
    print(json.dumps(asyncio.run(bench(args)), indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
