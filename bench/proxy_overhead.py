"""Proxy overhead: what offscope costs on top of a stock mitmproxy.

Five targets against the same loopback upstream, in one run:
  direct                      the load generator talks to the upstream itself
  stock_mitmproxy             `mitmdump` (no addon), same connection options as offscope
  stock_mitmproxy_with_addon  the same `mitmdump -s <offscope addon>` (shadow): the
                              addon's own cost, on equal footing
  offscope_shadow             `offscope proxy --policy shadow` (trace and metrics on)
  offscope_enforce            `offscope proxy --policy enforce`

`offscope proxy` embeds mitmproxy with only the addons a sidecar uses (see
offscope/proxy/mitm/server.py: sidecar_addons), so it can cost less than stock
mitmdump even though the addon costs something: both numbers are printed.

Three passes per target and round, each a fresh load-generator process (this
file with `--role load`; the upstream is `--role upstream`):
  saturated   N keep-alive connections, closed loop: capacity (requests/s).
              Its p50 is queueing (about N / rps), reported but not a latency.
  fixed rate  open loop at a fixed share of stock mitmproxy's capacity
              (measured first, the same for every target): latency at load.
  unloaded    one connection: latency with nothing queued.
Rounds are interleaved across targets (order rotated each round); the machine's
speed drifts between rounds, so each round of a target is compared with the
stock round beside it and the median of those paired ratios is reported, with
their range. With 2+ CPUs the proxies are pinned to one CPU and the load to the
others.

    python bench/proxy_overhead.py                 # prints JSON (about 8 minutes)
    python bench/proxy_overhead.py --duration 2 --rounds 3 --concurrency 8

Targets (speed targets live here, never in timed tests): shadow keeps
>= 85% of stock mitmproxy's requests/s and adds < 15% to its p50 (at a fixed
load, and unloaded).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HOST = "crm.acme.test"
PATH = "/customers/4411"
BODY = json.dumps(
    {
        "id": 4411,
        "name": "Ada Example",
        "plan": "pro",
        "balance": "12.50",
        "invoices": ["2026-001", "2026-002"],
    }
).encode()
RESPONSE = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
    + str(len(BODY)).encode()
    + b"\r\n\r\n"
    + BODY
)
_CL = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.IGNORECASE)
# The upstream and the record it serves are in scope, as the sanctioned route of an agent is.
BENCH_LEDGER = """\
schema: offscope.ledger/1
id: bench
targets:
  hosts: ["127.0.0.1", crm.acme.test]
  records: ["customer:4411"]
extract:
  - match: {path: "/customers/{id}"}
    targets: {record: "customer:{id}"}
stages:
  - match: {query: {dry_run: "true"}}
    stage: prepare
"""


# -- roles ------------------------------------------------------------------------------


class _Upstream(asyncio.Protocol):
    """A minimal HTTP/1.1 keep-alive server: every request gets the same JSON record."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            m = _CL.search(self.buf, 0, end + 2)
            n = int(m.group(1)) if m else 0
            if len(self.buf) < end + 4 + n:
                return
            self.buf = self.buf[end + 4 + n :]
            self.t.write(RESPONSE)  # type: ignore[attr-defined]


async def serve_upstream(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(
        _Upstream, "127.0.0.1", port, backlog=1024
    )
    async with server:
        await server.serve_forever()


async def load(
    port: int,
    absolute: str | None,
    concurrency: int,
    duration: float,
    max_requests: int,
    rate: float = 0.0,
) -> dict:
    """Load on 127.0.0.1:port; `absolute` = proxy form URL, None = direct.

    rate 0: closed loop, each connection sends its next request as soon as the
    last one is answered (saturation: measures capacity). rate R: open loop,
    the connections send R requests/s in all on a fixed schedule, whatever the
    answers (latency at a given load, the way an agent fleet offers it)."""
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    errors = 0
    left = max_requests

    async def worker(i: int) -> None:
        nonlocal left, errors
        auth = base64.b64encode(f"bench-{i}:x".encode()).decode()
        target = absolute or PATH
        req = (
            f"GET {target} HTTP/1.1\r\nhost: {HOST}\r\naccept: application/json\r\n"
            f"proxy-authorization: Basic {auth}\r\n\r\n"
        ).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        interval = concurrency / rate if rate else 0.0
        due = start + i / rate if rate else 0.0
        try:
            while left > 0 and time.perf_counter() < deadline:
                left -= 1
                if rate:
                    wait = due - time.perf_counter()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    due += interval
                t0 = time.perf_counter()  # from the send: asyncio's timers are ms-coarse
                writer.write(req)
                head = await reader.readuntil(b"\r\n\r\n")
                m = _CL.search(head)
                if not m:
                    raise RuntimeError(f"response without content-length: {head[:200]!r}")
                await reader.readexactly(int(m.group(1)))
                latencies.append(time.perf_counter() - t0)
                status = int(head[9:12])
                statuses[status] = statuses.get(status, 0) + 1
        except (OSError, asyncio.IncompleteReadError, RuntimeError) as exc:
            errors += 1
            print(f"load worker {i}: {exc}", file=sys.stderr)
        finally:
            writer.close()

    start = time.perf_counter()
    deadline = start + duration
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    elapsed = time.perf_counter() - start
    latencies.sort()

    def pct(p: float) -> float:
        return (
            round(1000 * latencies[min(len(latencies) - 1, int(p * len(latencies)))], 3)
            if latencies
            else 0.0
        )

    return {
        "requests": len(latencies),
        "seconds": round(elapsed, 3),
        "rps": round(len(latencies) / elapsed, 1),
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "statuses": {str(k): v for k, v in statuses.items()},
        "errors": errors,
    }


# -- orchestration ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited {proc.returncode}: {proc.args!r}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.05)
    raise RuntimeError(f"port {port} not listening after {timeout}s")


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of a process so far (0 for none)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_load(
    port: int,
    absolute: str | None,
    concurrency: int,
    duration: float,
    max_requests: int,
    pid: int | None = None,
    rate: float = 0.0,
) -> dict:
    args = [
        sys.executable,
        __file__,
        "--role",
        "load",
        "--port",
        str(port),
        "--concurrency",
        str(concurrency),
        "--duration",
        str(duration),
        "--max-requests",
        str(max_requests),
        "--rate",
        str(rate),
    ]
    if absolute:
        args += ["--absolute", absolute]
    cpu0 = cpu_seconds(pid)
    out = subprocess.run(args, capture_output=True, text=True, timeout=duration + 60)
    if out.returncode != 0:
        raise RuntimeError(f"load generator failed: {out.stderr}")
    result = json.loads(out.stdout)
    if pid is not None and result["requests"]:
        # CPU the proxy spent per request: robust to other load on the machine.
        result["cpu_us_per_request"] = round(
            1e6 * (cpu_seconds(pid) - cpu0) / result["requests"], 1
        )
    return result


def _sum_statuses(results: list[dict]) -> dict[str, int]:
    total: dict[str, int] = {}
    for r in results:
        for status, n in r["statuses"].items():
            total[status] = total.get(status, 0) + n
    return total


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--role", choices=["bench", "upstream", "load"], default="bench")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--absolute", default=None)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per measurement (bound)")
    ap.add_argument(
        "--max-requests", type=int, default=50_000, help="requests per measurement (bound)"
    )
    ap.add_argument(
        "--rounds", type=int, default=7, help="interleaved rounds; medians are reported"
    )
    ap.add_argument(
        "--latency-duration",
        type=float,
        default=2.0,
        help="seconds of each latency pass (fixed rate, and concurrency 1)",
    )
    ap.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="load role: requests/s on a fixed schedule (0: closed loop)",
    )
    ap.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="pin proxies to one CPU and the load to the others (default: on, with 2+ CPUs)",
    )
    ap.add_argument(
        "--load-fraction",
        type=float,
        default=0.5,
        help="the fixed-rate pass offers this fraction of stock mitmproxy's capacity",
    )
    args = ap.parse_args()
    if args.role == "upstream":
        asyncio.run(serve_upstream(args.port))
        return 0
    if args.role == "load":
        print(
            json.dumps(
                asyncio.run(
                    load(
                        args.port,
                        args.absolute,
                        args.concurrency,
                        args.duration,
                        args.max_requests,
                        args.rate,
                    )
                )
            )
        )
        return 0
    return bench(args)


def bench(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="offscope-bench-"))
    procs: list[subprocess.Popen] = []
    log = (tmp / "proxies.log").open("wb")

    # Proxies on one CPU, the load generator and the upstream on the others: a proxy
    # then never shares its core with the load it measures (Linux; skipped elsewhere).
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    pin = args.pin and len(cpus) >= 2
    proxy_cpus, other_cpus = ({cpus[-1]}, set(cpus[:-1])) if pin else (set(), set())
    if pin:
        os.sched_setaffinity(0, other_cpus)  # inherited by the load generators and the upstream

    def spawn(cmd: list[str], proxy: bool = True) -> subprocess.Popen:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        procs.append(p)
        if pin and proxy:
            os.sched_setaffinity(p.pid, proxy_cpus)
        return p

    try:
        up_port = free_port()
        wait_port(
            up_port,
            spawn(
                [sys.executable, __file__, "--role", "upstream", "--port", str(up_port)],
                proxy=False,
            ),
        )
        targets: dict[str, tuple[int, str | None]] = {"direct": (up_port, None)}
        pids: dict[str, int | None] = {"direct": None}

        stock_port = free_port()
        wait_port(
            stock_port,
            stock := spawn(
                [
                    "mitmdump",
                    "-q",
                    "--listen-host",
                    "127.0.0.1",
                    "-p",
                    str(stock_port),
                    "--set",
                    "connection_strategy=lazy",
                    "--set",
                    "stream_large_bodies=8m",
                    "--set",
                    f"confdir={tmp / 'ca'}",
                ]
            ),
        )
        targets["stock_mitmproxy"] = (stock_port, f"http://127.0.0.1:{up_port}{PATH}")
        pids["stock_mitmproxy"] = stock.pid

        # The same request as stock mitmproxy gets, to the same upstream: offscope's cost is
        # tagging, deciding and recording it (no fixture routing, which only eval grids use).
        ledger = tmp / "bench-ledger.yaml"
        ledger.write_text(BENCH_LEDGER, encoding="utf-8")

        # The addon alone, on equal footing: the very same mitmdump, plus `-s` (shadow).
        from offscope.proxy.mitm import mitmdump_addon

        addon_port = free_port()
        wait_port(
            addon_port,
            with_addon := spawn(
                [
                    "mitmdump",
                    "-q",
                    "--listen-host",
                    "127.0.0.1",
                    "-p",
                    str(addon_port),
                    "--set",
                    "connection_strategy=lazy",
                    "--set",
                    "stream_large_bodies=8m",
                    "--set",
                    f"confdir={tmp / 'ca'}",
                    "-s",
                    mitmdump_addon.__file__,
                    "--set",
                    f"offscope_ledger={ledger}",
                    "--set",
                    "offscope_policy=shadow",
                    "--set",
                    f"offscope_trace={tmp / 'addon-trace.jsonl'}",
                ]
            ),
        )
        targets["stock_mitmproxy_with_addon"] = (addon_port, f"http://127.0.0.1:{up_port}{PATH}")
        pids["stock_mitmproxy_with_addon"] = with_addon.pid
        for policy in ("shadow", "enforce"):
            port, metrics = free_port(), free_port()
            wait_port(
                port,
                proxy := spawn(
                    [
                        "offscope",
                        "proxy",
                        "--ledger",
                        str(ledger),
                        "--policy",
                        policy,
                        "--listen",
                        f"127.0.0.1:{port}",
                        "--metrics",
                        f"127.0.0.1:{metrics}",
                        "--control-listen",
                        "",
                        "--trace",
                        str(tmp / f"{policy}-trace.jsonl"),
                        "--confdir",
                        str(tmp / "ca"),
                        "--log-level",
                        "warning",
                    ]
                ),
            )
            targets[f"offscope_{policy}"] = (port, f"http://127.0.0.1:{up_port}{PATH}")
            pids[f"offscope_{policy}"] = proxy.pid

        for port, absolute in targets.values():  # warm-up: connections, caches, first-run paths
            run_load(port, absolute, args.concurrency, 1.0, 500)

        # One offered load for every target: a fraction of stock mitmproxy's capacity.
        stock_port, stock_absolute = targets["stock_mitmproxy"]
        capacity = run_load(
            stock_port, stock_absolute, args.concurrency, args.duration, args.max_requests
        )["rps"]
        rate = round(args.load_fraction * capacity, 1)

        names = list(targets)
        rounds: dict[str, list[dict]] = {name: [] for name in names}
        at_rate: dict[str, list[dict]] = {name: [] for name in names}
        unloaded: dict[str, list[dict]] = {name: [] for name in names}
        for r in range(args.rounds):
            # Rotate the order so that no target always runs first (or right after another).
            for name in names[r % len(names) :] + names[: r % len(names)]:
                port, absolute = targets[name]
                rounds[name].append(
                    run_load(
                        port,
                        absolute,
                        args.concurrency,
                        args.duration,
                        args.max_requests,
                        pids[name],
                    )
                )
                at_rate[name].append(
                    run_load(
                        port,
                        absolute,
                        args.concurrency,
                        args.latency_duration,
                        args.max_requests,
                        rate=rate,
                    )
                )
                unloaded[name].append(
                    run_load(port, absolute, 1, args.latency_duration, args.max_requests)
                )
            print(
                f"round {r + 1}/{args.rounds}: "
                + ", ".join(f"{n} {rounds[n][-1]['rps']:.0f} rps" for n in names),
                file=sys.stderr,
            )
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()

    def median(values: list[float]) -> float:
        return round(statistics.median(values), 3)

    report: dict = {
        "bench": "proxy_overhead",
        "cpus": os.cpu_count(),
        "concurrency": args.concurrency,
        "duration_s": args.duration,
        "rounds": args.rounds,
        "upstream": "asyncio HTTP/1.1 keep-alive, fixed JSON record",
        "request": f"GET http://{HOST}{PATH}",
        "method": "medians over interleaved rounds (order rotated each round); ratios are paired: "
        "each offscope round against the stock round next to it, then the median ratio",
        "passes": {
            "saturated": f"closed loop, {args.concurrency} connections: capacity (rps); its p50 is "
            "queueing, about connections / rps",
            "fixed_rate": f"open loop at {rate} requests/s ({args.load_fraction:.0%} of stock mitmproxy's "
            f"{capacity} rps, measured first), {args.concurrency} connections: latency at load",
            "unloaded": "one connection, closed loop: latency with nothing queued",
        },
        "fixed_rate_rps": rate,
        "pinned": {"proxies": sorted(proxy_cpus), "load_and_upstream": sorted(other_cpus)}
        if pin
        else None,
        "embedding": "offscope proxy runs mitmproxy with the addons a sidecar uses "
        "(offscope/proxy/mitm/server.py: sidecar_addons); stock_mitmproxy_with_addon is the "
        "full mitmdump plus the offscope addon: the addon's own cost on equal footing",
        "targets": {},
    }
    for name in targets:
        loaded, paced, idle = rounds[name], at_rate[name], unloaded[name]
        report["targets"][name] = {
            "rps": median([r["rps"] for r in loaded]),
            "p50_ms": median([r["p50_ms"] for r in loaded]),
            "p99_ms": median([r["p99_ms"] for r in loaded]),
            "fixed_rate_p50_ms": median([r["p50_ms"] for r in paced]),
            "fixed_rate_p99_ms": median([r["p99_ms"] for r in paced]),
            "fixed_rate_achieved_rps": median([r["rps"] for r in paced]),
            "unloaded_p50_ms": median([r["p50_ms"] for r in idle]),
            "unloaded_p99_ms": median([r["p99_ms"] for r in idle]),
            "proxy_cpu_us_per_request": median([r["cpu_us_per_request"] for r in loaded])
            if name != "direct"
            else None,
            "rps_rounds": [r["rps"] for r in loaded],
            "requests": sum(r["requests"] for r in loaded),
            "errors": sum(r["errors"] for r in loaded + paced + idle),
            "statuses": _sum_statuses(loaded),
        }
    stock_loaded, stock_paced, stock_idle = (
        rounds["stock_mitmproxy"],
        at_rate["stock_mitmproxy"],
        unloaded["stock_mitmproxy"],
    )
    for name in ("offscope_shadow", "offscope_enforce", "stock_mitmproxy_with_addon"):
        loaded, paced, idle = rounds[name], at_rate[name], unloaded[name]

        def paired(key: str, mine: list[dict], base: list[dict]) -> list[float]:
            return [a[key] / b[key] for a, b in zip(mine, base, strict=True) if b[key]]

        ratios = {
            "rps_ratio": paired("rps", loaded, stock_loaded),
            "fixed_rate_p50_ratio": paired("p50_ms", paced, stock_paced),
            "fixed_rate_p99_ratio": paired("p99_ms", paced, stock_paced),
            "unloaded_p50_ratio": paired("p50_ms", idle, stock_idle),
            "saturated_p50_ratio": paired("p50_ms", loaded, stock_loaded),
            "cpu_per_request_ratio": paired("cpu_us_per_request", loaded, stock_loaded),
        }
        report["targets"][name]["vs_stock"] = {key: median(v) for key, v in ratios.items()}
        report["targets"][name]["vs_stock_range"] = {
            key: [round(min(v), 3), round(max(v), 3)] for key, v in ratios.items()
        }
    shadow = report["targets"]["offscope_shadow"]["vs_stock"]
    # Capacity at saturation; latency where latency is defined (a queue that
    # grows without bound has no p50 of its own): at a fixed load and unloaded.
    report["target"] = {
        "shadow_rps_ratio_min": 0.85,
        "shadow_p50_ratio_max": 1.15,
        "rps": shadow["rps_ratio"] >= 0.85,
        "p50_fixed_rate": shadow["fixed_rate_p50_ratio"] < 1.15,
        "p50_unloaded": shadow["unloaded_p50_ratio"] < 1.15,
    }
    report["target"]["met"] = all(
        report["target"][k] for k in ("rps", "p50_fixed_rate", "p50_unloaded")
    )
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
