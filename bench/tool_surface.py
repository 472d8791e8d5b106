"""What recording the four changes costs per flow (offscope/proxy/surface.py).

Prints JSON: microseconds per operation, on this machine, for
- hashing an MCP `tools/list` result of N tools (done once per tools/list);
- hashing an LLM request's `tools` array of N tools (once per LLM request);
- a credential fingerprint lookup on a request whose credential the process
  has seen (every request; the HMAC itself runs once per distinct credential);
- the scope-clause hash of a 4 kB system prompt.

    python3 bench/tool_surface.py [--tools 50] [--repeat 2000]
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable

from offscope.proxy.extract.llm import dialect
from offscope.proxy.surface import Drift, Salt, llm_tools_surface, mcp_surface, scope_clause_hash


def _per_op(fn: Callable[[], object], repeat: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t0) / repeat * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tools", type=int, default=50)
    p.add_argument("--repeat", type=int, default=2000)
    args = p.parse_args()
    schema = {
        "type": "object",
        "properties": {
            f"f{i}": {"type": "string", "description": "a field " * 5} for i in range(6)
        },
        "required": ["f0"],
    }
    tools = [
        {
            "name": f"tool_{i}",
            "description": "Does a thing to a record. " * 8,
            "inputSchema": schema,
            "annotations": {"readOnlyHint": i % 2 == 0},
        }
        for i in range(args.tools)
    ]
    listing = {"jsonrpc": "2.0", "id": 1, "result": {"tools": tools}}
    llm = {
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": t["name"],
                    "description": t["description"],
                    "parameters": schema,
                },
            }
            for t in tools
        ]
    }
    chat = dialect("openai-chat")  # where the request keeps its tools
    drift = Drift(salt=Salt(b"bench", True))
    headers = {"authorization": "Bearer sk-bench-0123456789abcdef"}
    counter = iter(range(10**9))
    prompt = ("You are a support agent. " * 150) + "<scope>Only customer 4411.</scope>"
    marker = re.compile(r"(?s)<scope>(?P<clause>.*?)</scope>")
    out = {
        "tools": args.tools,
        "mcp_tools_list_hash_us": round(
            _per_op(lambda: mcp_surface(listing), args.repeat // 10 or 1), 1
        ),
        "llm_tools_hash_us": round(
            _per_op(lambda: llm_tools_surface(chat.tools(llm, limit=None)), args.repeat // 10 or 1),
            1,
        ),
        "credential_per_request_us": round(
            _per_op(
                lambda: drift.credential(f"run-{next(counter) % 100}", "http", "crm:443", headers),
                args.repeat,
            ),
            2,
        ),
        "scope_clause_hash_4kb_us": round(
            _per_op(lambda: scope_clause_hash(prompt, marker), args.repeat), 2
        ),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
