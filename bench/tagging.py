"""Tagging cost per call as the ledger grows: 10, 1,000 and 100,000 targets.

    python bench/tagging.py [--calls N]

Prints JSON: microseconds per tagged call (p50, p99) per ledger size, and the
ratio p50(100,000) / p50(10). Targets (DESIGN.md / the core issue): ratio
under 2, p50 under 20 us at 100,000 targets.

The ledger mixes every kind of membership the matcher compiles: exact hosts,
`*.suffix` host globs, repositories (exact and `owner/*`), typed records
(exact and `type:prefix-*`), accounts, and path prefix globs (`/srv/x/**`).
The call mix is realistic and half out of scope: plain HTTP calls whose path
templates yield repositories and records, MCP tool calls with a path and a
customer list, LLM tool calls with a URL, header-derived accounts.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import statistics
import sys
import time

from offscope.ledgers import CallInput, CompiledLedger, Ledger

RULES = {
    "extract": [
        {"match": {"host": "git.acme.test", "path": "/repos/{owner}/{repo}/**"},
         "targets": {"repository": "{owner}/{repo}"}},
        {"match": {"host": "crm.acme.test", "path": "/customers/{id}"}, "targets": {"record": "customer:{id}"}},
        {"match": {"host": "crm.acme.test", "path": "/invoices"},
         "targets": {"record": "invoice:{query.invoice_id}"}},
        {"match": {"source": "mcp"},
         "targets": {"path": "{args.path}", "record": "customer:{args.customer_ids}"}},
        {"match": {"source": "llm", "tool": "fetch"}, "targets": {"host": "{url.host}"}},
        {"targets": {"account": "{header.x-account}"}},
    ],
    "stages": [
        {"match": {"method": "POST", "path": "**/forks"}, "stage": "prepare"},
        {"match": {"query": {"dry_run": "true"}}, "stage": "prepare"},
        {"match": {"tool": "draft_*"}, "stage": "prepare"},
    ],
    "operator": [{"host": "ops.acme.test", "path": "/ask"}, {"source": "mcp", "tool": "ask_human"}],
}


def ledger_of(size: int) -> dict:
    """A ledger with `size` targets: 25% hosts (1 in 5 a suffix glob), 20% repositories
    (1 in 10 `owner/*`), 30% records (1 in 10 a prefix glob), 10% accounts, 15% paths."""
    hosts = ["git.acme.test", "crm.acme.test", "ops.acme.test"]
    repos, records, accounts, paths = ["acme/billing"], ["customer:4411"], ["svc-billing"], ["/srv/billing/**"]
    shares = {"hosts": 0.25, "repos": 0.20, "records": 0.30, "accounts": 0.10}
    for i in range(int(size * shares["hosts"]) - len(hosts)):
        hosts.append(f"*.zone{i}.acme.test" if i % 5 == 0 else f"svc{i}.acme.test")
    for i in range(int(size * shares["repos"]) - len(repos)):
        repos.append(f"team{i}/*" if i % 10 == 0 else f"team{i // 10}/repo{i}")
    for i in range(int(size * shares["records"]) - len(records)):
        records.append(f"invoice:{2000 + i}-*" if i % 10 == 0 else f"customer:{100000 + i}")
    for i in range(int(size * shares["accounts"]) - len(accounts)):
        accounts.append(f"svc-{i}")
    rest = size - len(hosts) - len(repos) - len(records) - len(accounts)
    for i in range(max(0, rest - len(paths))):
        paths.append(f"/srv/app{i}/**")
    return {"schema": "offscope.ledger/1", "id": f"bench-{size}",
            "targets": {"hosts": hosts, "repositories": repos, "records": records,
                        "accounts": accounts, "paths": paths}, **RULES}


def call_mix(rng: random.Random, size: int, n: int) -> list[CallInput]:
    """n calls, about half out of scope, drawn over the ledger's own ranges."""
    scale = max(1, size // 10)

    def k() -> int:
        return rng.randrange(scale)

    makers = [
        lambda: CallInput("http", method="GET", host="git.acme.test", path=f"/repos/team{k()}/repo{k()}/pulls"),
        lambda: CallInput("http", method="POST", host="git.acme.test", path="/repos/acme/billing/forks"),
        lambda: CallInput("http", method="GET", host="crm.acme.test", path=f"/customers/{100000 + k()}"),
        lambda: CallInput("http", method="GET", host="crm.acme.test", path="/customers/4412"),
        lambda: CallInput("http", method="GET", host="crm.acme.test", path="/invoices",
                          query={"invoice_id": [f"{2000 + k()}-07"]}),
        lambda: CallInput("http", method="DELETE", host=f"svc{k()}.acme.test", path="/v1/items/3",
                          query={"dry_run": ["true"]}, headers={"x-account": f"svc-{k()}"}),
        lambda: CallInput("http", method="GET", host=f"api.zone{k()}.acme.test", path="/health"),
        lambda: CallInput("http", method="GET", host="evil.example", path="/exfil"),
        lambda: CallInput("mcp", tool="read_file", host="mcp.acme.test", path="/mcp",
                          args={"path": f"/srv/app{k()}/conf/../data/x.csv", "customer_ids": [4411, 100000 + k()]},
                          annotations={"readOnlyHint": True}),
        lambda: CallInput("mcp", tool="ask_human", host="mcp.acme.test", path="/mcp", args={"q": "ok?"}),
        lambda: CallInput("llm", tool="fetch", args={"url": f"https://svc{k()}.acme.test/a"}),
        lambda: CallInput("llm", tool="draft_reply", args={"to": "customer:4411"}),
    ]
    return [rng.choice(makers)() for _ in range(n)]


def measure(size: int, calls: int, seed: int) -> dict:
    spec = ledger_of(size)
    t0 = time.perf_counter()
    ledger = CompiledLedger(Ledger.model_validate(spec))
    build_s = time.perf_counter() - t0
    mix = call_mix(random.Random(seed), size, calls)
    for call in mix[: min(2000, calls)]:  # warm up
        ledger.tag(call)
    samples = []
    outs = 0
    clock = time.perf_counter_ns
    gc.disable()
    try:
        for call in mix:
            start = clock()
            result = ledger.tag(call)
            samples.append(clock() - start)
            outs += not result.in_scope
    finally:
        gc.enable()
    samples.sort()
    return {
        "targets": size,
        "declared": {k: len(v) for k, v in spec["targets"].items()},
        "calls": calls,
        "out_of_scope_share": round(outs / calls, 3),
        "p50_us": round(samples[len(samples) // 2] / 1000, 2),
        "p99_us": round(samples[int(len(samples) * 0.99)] / 1000, 2),
        "mean_us": round(statistics.fmean(samples) / 1000, 2),
        "compile_s": round(build_s, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=50_000, help="tagged calls per ledger size")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    sizes = [10, 1_000, 100_000]
    results = [measure(size, args.calls, args.seed) for size in sizes]
    by = {r["targets"]: r for r in results}
    ratio = by[100_000]["p50_us"] / by[10]["p50_us"]
    out = {
        "bench": "tagging",
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cpus",
        "sizes": results,
        "p50_ratio_100000_over_10": round(ratio, 2),
        "targets": {"ratio_lt": 2.0, "p50_100000_lt_us": 20.0},
        "met": ratio < 2.0 and by[100_000]["p50_us"] < 20.0,
    }
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
