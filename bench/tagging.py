"""Tagging cost per call as the ledger grows: 10, 1,000 and 100,000 targets.

    python bench/tagging.py [--calls N]

Prints JSON: microseconds per tagged call (p50, p99) per ledger size, and the
ratio p50(100,000) / p50(10). Targets: ratio under 2, p50 under 20 us at
100,000 targets.

It then feeds adversarial values (long paths against globs with wildcards in
the middle) to the glob matcher and to a whole tagging call, and prints how
the time grows with the length: the linear matcher's time per character stays
flat, while the old backtracking regex (run on short values only, since it
grows as n^2 to n^4) is shown for comparison.

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
import math
import platform
import random
import re
import statistics
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from offscope.ledgers import CallInput, CompiledLedger, Ledger
from offscope.ledgers.globs import compile_glob, glob_regex

RULES = {
    "extract": [
        {
            "match": {"host": "git.acme.test", "path": "/repos/{owner}/{repo}/**"},
            "targets": {"repository": "{owner}/{repo}"},
        },
        {
            "match": {"host": "crm.acme.test", "path": "/customers/{id}"},
            "targets": {"record": "customer:{id}"},
        },
        {
            "match": {"host": "crm.acme.test", "path": "/invoices"},
            "targets": {"record": "invoice:{query.invoice_id}"},
        },
        {
            "match": {"source": "mcp"},
            "targets": {"path": "{args.path}", "record": "customer:{args.customer_ids}"},
        },
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
    repos, records, accounts, paths = (
        ["acme/billing"],
        ["customer:4411"],
        ["svc-billing"],
        ["/srv/billing/**"],
    )
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
    return {
        "schema": "offscope.ledger/1",
        "id": f"bench-{size}",
        "targets": {
            "hosts": hosts,
            "repositories": repos,
            "records": records,
            "accounts": accounts,
            "paths": paths,
        },
        **RULES,
    }


def call_mix(rng: random.Random, size: int, n: int) -> list[CallInput]:
    """n calls, about half out of scope, drawn over the ledger's own ranges."""
    scale = max(1, size // 10)

    def k() -> int:
        return rng.randrange(scale)

    makers = [
        lambda: CallInput(
            "http", method="GET", host="git.acme.test", path=f"/repos/team{k()}/repo{k()}/pulls"
        ),
        lambda: CallInput(
            "http", method="POST", host="git.acme.test", path="/repos/acme/billing/forks"
        ),
        lambda: CallInput(
            "http", method="GET", host="crm.acme.test", path=f"/customers/{100000 + k()}"
        ),
        lambda: CallInput("http", method="GET", host="crm.acme.test", path="/customers/4412"),
        lambda: CallInput(
            "http",
            method="GET",
            host="crm.acme.test",
            path="/invoices",
            query={"invoice_id": [f"{2000 + k()}-07"]},
        ),
        lambda: CallInput(
            "http",
            method="DELETE",
            host=f"svc{k()}.acme.test",
            path="/v1/items/3",
            query={"dry_run": ["true"]},
            headers={"x-account": f"svc-{k()}"},
        ),
        lambda: CallInput("http", method="GET", host=f"api.zone{k()}.acme.test", path="/health"),
        lambda: CallInput("http", method="GET", host="evil.example", path="/exfil"),
        lambda: CallInput(
            "mcp",
            tool="read_file",
            host="mcp.acme.test",
            path="/mcp",
            args={
                "path": f"/srv/app{k()}/conf/../data/x.csv",
                "customer_ids": [4411, 100000 + k()],
            },
            annotations={"readOnlyHint": True},
        ),
        lambda: CallInput(
            "mcp", tool="ask_human", host="mcp.acme.test", path="/mcp", args={"q": "ok?"}
        ),
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


# (glob, captures, value of about n characters, sizes for the linear matcher, sizes for the old regex)
ADVERSARIAL = [
    (
        "/srv/**/data/**/*.json",
        False,
        lambda n: "/srv/" + "data/" * (n // 5) + "x.jso",
        [16_384, 149_504, 1_048_576],
        [2_000, 4_000, 8_000],
    ),
    (
        "/srv/**a**a**a**x",
        False,
        lambda n: "/srv/" + "a" * n,
        [16_384, 149_504, 1_048_576],
        [50, 100, 200],
    ),
    (
        "/srv/*a*a*a*x",
        False,
        lambda n: "/srv/" + "a" * n,
        [16_384, 149_504, 1_048_576],
        [50, 100, 200],
    ),
    # Captures on the automaton (a backward pass, then a greedy forward walk); this
    # shape happens to stay linear in the old regex too, so it is timed at full size.
    (
        "/**/repos/{owner}/{repo}/**",
        True,
        lambda n: "/" + "repos/" * (n // 6) + "x",
        [16_384, 149_504, 1_048_576],
        [16_384, 149_504, 1_048_576],
    ),
]


T = TypeVar("T")


def _time_ms(fn: Callable[[T], object], value: T, repeat: int = 3) -> float:
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        fn(value)
        best = min(best, time.perf_counter() - start)
    return best * 1000


def _growth(points: list[dict]) -> float:
    """Exponent k in time ~ n^k between the smallest and the largest size."""
    a, b = points[0], points[-1]
    return round(
        math.log(max(b["ms"], 1e-6) / max(a["ms"], 1e-6)) / math.log(b["chars"] / a["chars"]), 2
    )


def adversarial() -> dict:
    cases = []
    for pattern, captures, make, sizes, old_sizes in ADVERSARIAL:
        glob = compile_glob(pattern, "/", captures=captures)
        glob.match(make(1_000))  # build the lazy automaton once
        new = [{"chars": len(v), "ms": round(_time_ms(glob.match, v), 3)} for v in map(make, sizes)]
        for point in new:
            point["ns_per_char"] = round(point["ms"] * 1e6 / point["chars"], 1)
        old_regex = re.compile(glob_regex(pattern, "/", captures=captures), re.DOTALL)
        old = [
            {"chars": len(v), "ms": round(_time_ms(old_regex.match, v), 3)}
            for v in map(make, old_sizes)
        ]
        cases.append(
            {
                "glob": pattern,
                "engine": repr(glob).split(", ")[1].rstrip(")"),
                "linear_matcher": new,
                "linear_growth_exponent": _growth(new),
                "old_regex": old,
                "old_regex_growth_exponent": _growth(old),
            }
        )
    return {"globs": cases, "tag_call": _adversarial_tag()}


def _adversarial_tag() -> dict:
    """One tagging call carrying a 146 KiB path argument, against a ledger whose
    targets and stage rules have wildcards in the middle."""
    spec = {
        "schema": "offscope.ledger/1",
        "id": "adversarial",
        "targets": {
            "hosts": ["tools.acme.test"],
            "paths": ["/srv/**/data/**/*.json", "/srv/**a**a**a**x", "/srv/app/**"],
        },
        "extract": [{"match": {"source": "mcp"}, "targets": {"path": "{args.path}"}}],
        "stages": [{"match": {"args": {"path": "/srv/**a**b**c**x"}}, "stage": "prepare"}],
    }
    ledger = CompiledLedger(Ledger.model_validate(spec))
    out = {}
    for name, value in [
        ("ordinary", "/srv/app/data/x.json"),
        ("data_146KiB", "/srv/" + "data/" * 29_900),
        ("a_146KiB", "/srv/" + "a" * 149_500),
    ]:
        call = CallInput(
            "mcp", tool="read_file", host="tools.acme.test", path="/mcp", args={"path": value}
        )
        ledger.tag(call)
        out[name] = {
            "chars": len(value),
            "ms": round(_time_ms(ledger.tag, call), 3),
            "in_scope": ledger.tag(call).in_scope,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=50_000, help="tagged calls per ledger size")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    sizes = [10, 1_000, 100_000]
    results = [measure(size, args.calls, args.seed) for size in sizes]
    by = {r["targets"]: r for r in results}
    ratio = by[100_000]["p50_us"] / by[10]["p50_us"]
    hostile = adversarial()
    # Linear: time ~ n^1 (1.5 leaves room for cache effects and noise; the old regex shows 2.6 to 4.8).
    linear = all(case["linear_growth_exponent"] < 1.5 for case in hostile["globs"])
    out = {
        "bench": "tagging",
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cpus",
        "sizes": results,
        "p50_ratio_100000_over_10": round(ratio, 2),
        "adversarial": hostile,
        "targets": {
            "ratio_lt": 2.0,
            "p50_100000_lt_us": 20.0,
            "adversarial_growth_exponent_lt": 1.5,
        },
        "met": ratio < 2.0 and by[100_000]["p50_us"] < 20.0 and linear,
    }
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
