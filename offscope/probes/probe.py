"""Boundary probes (the boundary-probe study, runtime half): put questions to agent definitions
through the real proxy and score the answers.

Each agent file's system prompt goes into a fresh conversation with one probe
question (agent-evals' template, which asks for `CONFIDENCE: 0-100`), once at
temperature 0 and K times at 0.7. Questions come from agent-evals' bank (by its
domain rules, RULES.md) and offscope's bank (answer keys, so calibration can be
checked for correctness). Every call goes through an embedded offscope proxy,
so the live behavioural histograms fire and the calls are recorded in the
trace format; the default model is the simulated one (labelled simulated).

Scores are the rule set's (`score_agent`, the same code `offscope rescore`
runs), with intervals: clustered rates (Wilson hull with a probe-level
bootstrap) for boundary respect, refusal health and accuracy; a probe-level
(cluster) percentile bootstrap for the means. Plus the study's open question:
does incoherence predict wrong answers (AUROC of 1 - coherence, point-biserial
correlation)?

The run is here; its parts: `probe_config` (the options), `probe_plan` (which
probes each agent gets), `probe_calls` (one call), `probe_stats` (scores with
intervals, the coherence signal), `live_histograms` (the proxy's /metrics
against the report) and `probe_output` (the report and transcript written).
"""

from __future__ import annotations

import json
import os
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from offscope.behavior.rules import load_rules
from offscope.errors import InputError
from offscope.probes.census import load_agents
from offscope.probes.live_histograms import histograms_agree, parse_histograms, report_histograms
from offscope.probes.probe_bank import load_agent_evals_bank
from offscope.probes.probe_calls import Call, call_run_id, complete
from offscope.probes.probe_config import LEDGER_ID, STOCHASTIC_T, ProbeConfig
from offscope.probes.probe_output import build_report, write_transcript
from offscope.probes.probe_plan import apply_budget, plan_probes
from offscope.probes.probe_report import ProbeReport


@dataclass
class ProbeResult:
    report: dict[str, Any]
    out: Path
    calls: int
    dropped: int
    wall_seconds: float


ProgressFn = Callable[[int, int], None]


async def run_probe(
    cfg: ProbeConfig,
    progress: ProgressFn | None = None,
    before_stop: Callable[[Any], Awaitable[None]] | None = None,
) -> ProbeResult:
    """Plan, call every probe through an embedded proxy, score, write the report.
    `before_stop(proxy)` runs after the last call, while the proxy still serves
    /metrics (tests scrape it there)."""
    if cfg.confdir is not None:
        return await _run_probe(cfg, cfg.confdir, progress, before_stop)
    # A throwaway CA: its private key lives and dies with the run, never in --out.
    import tempfile

    with tempfile.TemporaryDirectory(prefix="offscope-probe-ca-") as confdir:
        return await _run_probe(cfg, Path(confdir), progress, before_stop)


async def _run_probe(
    cfg: ProbeConfig,
    confdir: Path,
    progress: ProgressFn | None,
    before_stop: Callable[[Any], Awaitable[None]] | None,
) -> ProbeResult:
    from offscope.evalmode.harness import LoopbackServer, bounded, harness, trusted_ca
    from offscope.evalmode.sim.simmodel import app as sim_app
    from offscope.probes.simprobe import answer, load_probe_disposition, probe_model
    from offscope.proxy.mitm.server import ProxyConfig

    cfg.check()
    rules = load_rules(cfg.rules)
    agents, files = load_agents(cfg.paths, rules)
    if cfg.agents_only:
        agents = [a for a in agents if a.kind == "agent"]
    if not agents:
        raise InputError(
            "no agent definition files found",
            hint="give .md/.txt agent files or folders (at least 20 bytes each)",
        )
    plans = plan_probes(agents, rules, cfg.bank)
    dropped = apply_budget(plans, cfg.runs, cfg.budget)
    total_calls = sum(len(p.probes) for p in plans) * (1 + cfg.runs)

    out = cfg.out
    out.mkdir(parents=True, exist_ok=True)
    trace = out / "trace.jsonl"
    if trace.exists():
        trace.unlink()  # one run per out dir: the trace matches the report
    profile = load_probe_disposition(cfg.disposition) if cfg.simulated else None
    ca = trusted_ca(confdir)

    t0 = time.perf_counter()
    model = probe_model(profile, cfg.seed) if profile is not None else None
    apps = {"simprobe": sim_app(model, answer)} if model is not None else {}
    model_name = model.model_id if model is not None else str(cfg.model)

    def chat_url(servers: dict[str, LoopbackServer]) -> str:
        base_url = (
            f"{servers['simprobe'].url}/v1" if model is not None else str(cfg.model_url).rstrip("/")
        )
        return base_url + "/chat/completions"

    def proxy_config(servers: dict[str, LoopbackServer]) -> ProxyConfig:
        host = httpx.URL(chat_url(servers)).host
        ledger = out / "ledger.yaml"
        ledger.write_text(
            "# Written by `offscope probe`: the model host is the one in-scope target.\n"
            f"schema: offscope.ledger/1\nid: {LEDGER_ID}\n"
            "description: boundary probes; the model API is the only target\n"
            f"targets:\n  hosts: [{json.dumps(host)}]\nllm:\n  hosts: [{json.dumps(host)}]\n",
            encoding="utf-8",
        )
        return ProxyConfig(
            ledger=str(ledger),
            listen_port=0,
            metrics="127.0.0.1:0",
            trace=str(trace),
            confdir=str(confdir),
            idle_timeout=max(600.0, cfg.timeout * 4),
        )

    headers = {"content-type": "application/json"}
    if cfg.api_key_env:
        headers["authorization"] = f"Bearer {os.environ[cfg.api_key_env]}"

    calls: dict[tuple[int, int], list[Call]] = {}
    done = 0
    scraped: dict[str, dict[str, float]] | None = None
    async with harness(apps, proxy_config) as h:
        engine, url = h.engine, chat_url(h.servers)
        template = load_agent_evals_bank().template

        verify = ssl.create_default_context(cafile=str(ca))  # the proxy's CA (HTTPS models)
        async with httpx.AsyncClient(proxy=h.proxy.url, verify=verify, timeout=cfg.timeout) as http:

            async def one(ai: int, pi: int) -> None:
                nonlocal done
                plan = plans[ai]
                probe = plan.probes[pi]
                prompt = template.replace("%s", probe.question, 1)
                results: list[Call] = []
                for run in range(cfg.runs + 1):
                    temp = 0.0 if run == 0 else STOCHASTIC_T
                    body = {
                        "model": model_name,
                        "temperature": temp,
                        "seed": cfg.seed + run,
                        "messages": [
                            {"role": "system", "content": plan.agent.system_prompt},
                            {"role": "user", "content": prompt},
                        ],
                    }
                    run_id = call_run_id(ai, probe.id, run)
                    engine.start_run(
                        run_id,
                        {
                            "kind": "probe",
                            "agent": plan.agent.id,
                            "probe": probe.id,
                            "probe_type": probe.probe_type,
                            "run": str(run),
                            "temperature": str(temp),
                        },
                    )
                    c0 = time.perf_counter()
                    text, err = await complete(http, url, headers, body, run_id)
                    engine.end_run(run_id, "end" if not err else "exit", detail=err or None)
                    results.append(Call(run, temp, text, err, time.perf_counter() - c0))
                    done += 1
                    if progress:
                        progress(done, total_calls)
                calls[(ai, pi)] = results

            await bounded(
                [
                    partial(one, ai, pi)
                    for ai, plan in enumerate(plans)
                    for pi in range(len(plan.probes))
                ],
                cfg.workers,
            )
        if h.proxy.metrics_port:
            async with httpx.AsyncClient(timeout=10) as direct:
                r = await direct.get(f"http://127.0.0.1:{h.proxy.metrics_port}/metrics")
                scraped = parse_histograms(r.text)
        if before_stop is not None:
            await before_stop(h.proxy)
    wall = time.perf_counter() - t0

    report = build_report(
        cfg, rules, plans, calls, files, len(agents), model_name, profile, dropped, wall
    )
    if scraped is not None:
        recomputed = report_histograms(report, load_rules("offscope"))
        report["live_metrics"] = {
            "source": "the embedded proxy's /metrics (ledger offscope-probe), scraped after the last call",
            "rules": "offscope (the proxy's rule set)",
            "proxy": scraped,
            "from_report": recomputed,
            "agree": histograms_agree(scraped, recomputed),
        }
    ProbeReport.model_validate(report)
    (out / "probe-report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (out / "transcript.md").write_text(write_transcript(report), encoding="utf-8")
    return ProbeResult(report, out, sum(len(v) for v in calls.values()), dropped, wall)
