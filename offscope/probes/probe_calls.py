"""One call of a probe run: a chat completion through the proxy, tagged with its run id."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass
class Call:
    run: int
    temperature: float
    raw: str = ""
    error: str = ""
    seconds: float = 0.0


def call_run_id(agent_index: int, probe_id: str, run: int) -> str:
    """The proxy's run id of one call: agent, probe and run, in characters a run id allows."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"probe-a{agent_index:03d}-{probe_id}-r{run}")


async def complete(
    http: httpx.AsyncClient, url: str, headers: dict[str, str], body: dict[str, Any], run_id: str
) -> tuple[str, str]:
    """(text, error). Retries twice on 429, 5xx and transport errors."""
    err = ""
    for attempt in range(3):
        if attempt:
            await asyncio.sleep(0.5 * 2 ** (attempt - 1))
        try:
            r = await http.post(url, json=body, headers={**headers, "X-Offscope-Run": run_id})
        except httpx.HTTPError as exc:
            err = f"{type(exc).__name__}: {exc}"
            continue
        if r.status_code == 429 or r.status_code >= 500:
            err = f"HTTP {r.status_code}: {r.text[:200]}"
            continue
        if r.status_code != 200:
            return "", f"HTTP {r.status_code}: {r.text[:200]}"
        try:
            data = r.json()
            content = data["choices"][0]["message"].get("content") or ""
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            return "", f"unexpected response: {r.text[:200]}"
        if isinstance(content, list):  # content parts
            content = "".join(c.get("text", "") for c in content if isinstance(c, dict))
        return str(content), ""
    return "", err
