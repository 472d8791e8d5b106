"""Replay throughput: events per second of `offscope replay` over a generated
trace, and the same trace through plain `offscope report`, measured in the
same run.

    python bench/replay_throughput.py [--events 1000000] [--keep DIR]

Prints JSON: events, seconds and events per second of each, and the ratio
replay seconds / report seconds (what re-tagging and re-deciding every call
costs on top of reading and folding the trace). Both run in this process
through the commands' own functions (`fold` + `summarize` for report,
`replay(...).as_dict()` for replay), so process start-up is not measured.

The trace is offscope.trace/2 as the proxy writes it: runs of ten events (a
run_start, eight tool calls, a run_end). Calls mix CRM record reads and
writes, invoice lookups by query parameter, repository reads on the git host
and MCP tool calls; a quarter touch a customer the candidate ledger drops, so
replay has scope and decision changes to count. The candidate ledger narrows
the recording one (one customer fewer, one unused host) and the candidate
policy is the enforce preset.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

from offscope.cli.report import summarize
from offscope.ledgers import compile_ledger
from offscope.ledgers.model import Ledger
from offscope.policies import load_policy
from offscope.rollout.replay import replay
from offscope.trace.events import read_trace
from offscope.trace.metrics import fold

EXTRACT = [
    {
        "match": {"host": "crm.acme.test", "path": "/customers/{id}"},
        "targets": {"record": "customer:{id}"},
    },
    {
        "match": {"host": "crm.acme.test", "path": "/customers/{id}/**"},
        "targets": {"record": "customer:{id}"},
    },
    {
        "match": {"host": "crm.acme.test", "path": "/invoices"},
        "targets": {"record": "invoice:{query.invoice_id}"},
    },
    {
        "match": {"host": "git.acme.test", "path": "/repos/{owner}/{repo}/**"},
        "targets": {"repository": "{owner}/{repo}"},
    },
    {"match": {"source": "mcp"}, "targets": {"record": "customer:{args.customer_id}"}},
]
CANDIDATE = {
    "id": "bench",
    "extract": EXTRACT,
    "targets": {
        "hosts": ["crm.acme.test", "git.acme.test", "tools.acme.test", "old.acme.test"],
        "records": ["customer:4411", "invoice:2026-*"],
        "repositories": ["acme/billing"],
    },
}


def _call(rng: random.Random) -> dict:
    """One recorded call: the proxy's `call` object (every call was in scope when recorded)."""
    r = rng.random()
    customer = "5500" if rng.random() < 0.25 else "4411"
    if r < 0.4:
        method = "GET" if rng.random() < 0.7 else "PATCH"
        path = f"/customers/{customer}"
        return {
            "source": "http",
            "tool": "http",
            "method": method,
            "url": f"https://crm.acme.test{path}",
            "targets": [
                {"kind": "host", "value": "crm.acme.test", "in_scope": True},
                {"kind": "record", "value": f"customer:{customer}", "in_scope": True},
            ],
            "stage": "investigate" if method == "GET" else "act",
            "scope": "in",
            "input": {"host": "crm.acme.test", "port": 443, "path": path},
        }
    if r < 0.6:
        inv = f"2026-{rng.randrange(1000)}"
        return {
            "source": "http",
            "tool": "http",
            "method": "GET",
            "url": f"https://crm.acme.test/invoices?invoice_id={inv}",
            "targets": [
                {"kind": "host", "value": "crm.acme.test", "in_scope": True},
                {"kind": "record", "value": f"invoice:{inv}", "in_scope": True},
            ],
            "stage": "investigate",
            "scope": "in",
            "input": {
                "host": "crm.acme.test",
                "port": 443,
                "path": "/invoices",
                "query": {"invoice_id": [inv]},
            },
        }
    if r < 0.8:
        path = f"/repos/acme/billing/issues/{rng.randrange(500)}"
        return {
            "source": "http",
            "tool": "http",
            "method": "GET",
            "url": f"https://git.acme.test{path}",
            "targets": [
                {"kind": "host", "value": "git.acme.test", "in_scope": True},
                {"kind": "repository", "value": "acme/billing", "in_scope": True},
            ],
            "stage": "investigate",
            "scope": "in",
            "input": {"host": "git.acme.test", "port": 443, "path": path},
        }
    return {
        "source": "mcp",
        "tool": "update_customer",
        "url": "https://tools.acme.test/mcp",
        "args": {"customer_id": customer, "note": "sha256:0123456789abcdef"},
        "targets": [
            {"kind": "host", "value": "tools.acme.test", "in_scope": True},
            {"kind": "record", "value": f"customer:{customer}", "in_scope": True},
        ],
        "stage": "act",
        "scope": "in",
        "input": {"host": "tools.acme.test", "port": 443, "path": "/mcp", "kept": ["customer_id"]},
    }


def generate(path: Path, events: int, seed: int = 7) -> int:
    rng = random.Random(seed)
    written, run = 0, 0
    ts = 1_790_000_000.0
    with path.open("w", encoding="utf-8") as out:
        while written < events:
            run += 1
            rid = f"run-{run}"
            base = {"schema": "offscope.trace/2", "run": rid, "ledger": "bench"}
            out.write(
                json.dumps({**base, "type": "run_start", "ts": ts, "policy": "shadow"}) + "\n"
            )
            written += 1
            for step in range(1, 9):
                if written >= events - 1:
                    break
                call = _call(rng)
                ts += 0.01
                out.write(
                    json.dumps(
                        {
                            **base,
                            "type": "tool_call",
                            "ts": ts,
                            "step": step,
                            "call": call,
                            "decision": "allow",
                            "status": 200,
                        }
                    )
                    + "\n"
                )
                written += 1
            out.write(json.dumps({**base, "type": "run_end", "ts": ts, "reason": "end"}) + "\n")
            written += 1
    return written


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument(
        "--keep", help="write the generated trace here (default: a temporary directory)"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(args.keep or tmp) / "replay-bench-trace.jsonl"
        trace.parent.mkdir(parents=True, exist_ok=True)
        n = generate(trace, args.events)
        size = trace.stat().st_size
        ledger = compile_ledger(Ledger.model_validate(CANDIDATE), "bench")
        policy = load_policy("enforce")

        t0 = time.perf_counter()
        summarize(fold(read_trace(trace)))
        report_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        result = replay([trace], ledger, policy).as_dict()
        replay_s = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "bench": "replay_throughput",
                "events": n,
                "trace_bytes_per_event": round(size / n),
                "report": {"seconds": round(report_s, 2), "events_per_second": round(n / report_s)},
                "replay": {
                    "seconds": round(replay_s, 2),
                    "events_per_second": round(n / replay_s),
                    "calls": result["calls"],
                    "scope_changed": result["counts"]["scope_changed"],
                    "newly_blocked": result["counts"]["newly_blocked"],
                },
                "ratio_replay_to_report": round(replay_s / report_s, 2),
                "python": sys.version.split()[0],
                "machine": platform.machine(),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
