"""`offscope mcp` overhead: the wrapper's added latency per tools/call.

The same FastMCP stdio server (this file with `--role server`), driven by the
official `mcp` SDK stdio client, three ways in one run:
  direct             the client starts the server itself
  offscope_shadow    `offscope mcp --policy shadow -- server` (trace on)
  offscope_enforce   `offscope mcp --policy enforce -- server` (trace on)
Each session lists the tools, warms up, then makes N sequential in-scope
`tools/call`s, timing each one from the client. Rounds are interleaved (order
rotated each round) so that the machine's drift hits every target alike; the
ratios are of the pooled samples against `direct` from the same run.

    python bench/stdio_mcp_overhead.py                 # prints JSON (about a minute)
    python bench/stdio_mcp_overhead.py --calls 100 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LEDGER = """\
schema: offscope.ledger/1
id: bench-stdio
targets:
  paths: ["/srv/app/**"]
extract:
  - match: {source: mcp}
    targets: {path: "{args.path}"}
"""
PAYLOAD = "x" * 200  # a small, realistic result


def run_server() -> None:
    from mcp.server.fastmcp import FastMCP
    from mcp.types import ToolAnnotations

    server = FastMCP("bench")

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def read_file(path: str) -> str:
        """Read a file (returns a fixed payload)."""
        return PAYLOAD

    server.run("stdio")


async def session_latencies(command: list[str], calls: int, warmup: int) -> list[float]:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    params = StdioServerParameters(command=command[0], args=command[1:], env=env)
    out: list[float] = []
    with open(os.devnull, "w") as err:
        async with (
            stdio_client(params, errlog=err) as (read, write),
            ClientSession(read, write) as s,
        ):
            await s.initialize()
            await s.list_tools()
            for i in range(warmup + calls):
                t0 = time.perf_counter()
                result = await s.call_tool("read_file", {"path": f"/srv/app/{i}.txt"})
                elapsed = time.perf_counter() - t0
                if result.isError:
                    raise RuntimeError(f"bench call failed: {result.content}")
                if i >= warmup:
                    out.append(elapsed)
    return out


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "n": len(samples),
        "p50_us": round(statistics.median(ordered) * 1e6, 1),
        "mean_us": round(statistics.fmean(ordered) * 1e6, 1),
        "p95_us": round(ordered[int(0.95 * (len(ordered) - 1))] * 1e6, 1),
    }


async def main(args: argparse.Namespace) -> dict:
    server = [sys.executable, str(Path(__file__).resolve()), "--role", "server"]
    work = Path(tempfile.mkdtemp(prefix="offscope-stdio-bench-"))
    ledger = work / "ledger.yaml"
    ledger.write_text(LEDGER)

    def wrapped(policy: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "offscope.cli",
            "mcp",
            "--ledger",
            str(ledger),
            "--policy",
            policy,
            "--trace",
            str(work / f"trace-{policy}.jsonl"),
            "--log-level",
            "warning",
            "--",
            *server,
        ]

    targets = {
        "direct": server,
        "offscope_shadow": wrapped("shadow"),
        "offscope_enforce": wrapped("enforce"),
    }
    samples: dict[str, list[float]] = {name: [] for name in targets}
    rounds: list[dict[str, float]] = []  # each round's p50 per target, for paired ratios
    names = list(targets)
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        this: dict[str, float] = {}
        for name in order:
            got = await session_latencies(targets[name], args.calls, args.warmup)
            samples[name] += got
            this[name] = statistics.median(got)
        rounds.append(this)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    direct = summary(samples["direct"])
    report: dict = {
        "bench": "stdio_mcp_overhead",
        "calls_per_round": args.calls,
        "rounds": args.rounds,
        "direct": direct,
    }
    for name in names[1:]:
        s = summary(samples[name])
        report[name] = {
            **s,
            "p50_ratio": round(s["p50_us"] / direct["p50_us"], 3),
            "mean_ratio": round(s["mean_us"] / direct["mean_us"], 3),
            "added_p50_us": round(s["p50_us"] - direct["p50_us"], 1),
            # the machine drifts between rounds: each round against its own direct one
            "round_p50_ratios": [round(r[name] / r["direct"], 3) for r in rounds],
        }
        traced = sum(
            1
            for line in (work / f"trace-{name.split('_')[1]}.jsonl").read_text().splitlines()
            if '"type":"tool_call"' in line.replace(" ", "")
        )
        report[name]["tool_calls_in_trace"] = traced  # every timed and warm-up call recorded
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--role", choices=["bench", "server"], default="bench")
    parser.add_argument(
        "--calls", type=int, default=200, help="timed calls per session (default 200)"
    )
    parser.add_argument("--warmup", type=int, default=20, help="untimed calls first (default 20)")
    parser.add_argument(
        "--rounds", type=int, default=5, help="sessions per target, interleaved (default 5)"
    )
    parsed = parser.parse_args()
    if parsed.role == "server":
        run_server()
    else:
        print(json.dumps(asyncio.run(main(parsed)), indent=2))
