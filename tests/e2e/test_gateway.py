"""Gateway (reverse-proxy) mode: a client that takes only a URL, through a real proxy
to a real loopback upstream; assertions on what the upstream received and the trace."""

from __future__ import annotations

import httpx
import pytest

from offscope.errors import InputError
from offscope.proxy.gateway import parse_gateways, route
from tests.support.sidecar_kit import events, of_type

pytestmark = pytest.mark.timeout(60)


async def test_a_named_upstream_is_served_tagged_and_enforced(embedded, upstream):
    gateways = "crm=https://crm.acme.test,ops=http://ops.acme.test"
    async with embedded(policy="enforce", gateways=gateways) as e:
        base = f"http://127.0.0.1:{e.p.gateway_port}"
        run = {"x-offscope-run": "gw-1"}
        async with httpx.AsyncClient(timeout=30, trust_env=False) as c:
            ok = await c.get(f"{base}/crm/customers/4411?fields=plan", headers=run)
            blocked = await c.patch(
                f"{base}/crm/customers/9999", json={"tier": "gold"}, headers=run
            )
            unknown = await c.get(f"{base}/billing/invoices", headers=run)
        calls = of_type(events(e.trace), "tool_call")

    assert ok.status_code == 200 and blocked.status_code == 403
    assert unknown.status_code == 404 and "/crm/" in unknown.json()["message"]
    # What the upstream received: the upstream's own path and Host, nothing blocked.
    assert len(upstream.seen) == 1, upstream.seen
    (seen,) = upstream.seen
    assert seen["path"] == "/customers/4411?fields=plan"
    assert seen["host"] == "crm.acme.test" and seen["method"] == "GET"
    assert [(c["run"], c["call"]["url"], c["decision"]) for c in calls] == [
        ("gw-1", "https://crm.acme.test/customers/4411?fields=plan", "allow"),
        ("gw-1", "https://crm.acme.test/customers/9999", "block"),
    ]


def test_gateway_paths_map_to_the_upstream_url() -> None:
    gateways = parse_gateways("t=https://mcp.example:8443/base/,git=http://git.example")
    assert gateways["t"].host_header == "mcp.example:8443"
    assert route(gateways, "/t/mcp?x=1") == (gateways["t"], "/base/mcp?x=1", None)
    assert route(gateways, "/t") == (gateways["t"], "/base", None)
    assert route(gateways, "/git?x=1") == (gateways["git"], "/?x=1", None)
    assert route(gateways, "/GIT/a") == (gateways["git"], "/a", None)
    assert route(gateways, "/other/a") is None and route(gateways, "*") is None
    # A run credential in the URL, for clients that can be given nothing else.
    assert route(gateways, "/@run-1:abc%2D/t/mcp") == (gateways["t"], "/base/mcp", "run-1:abc-")
    assert route(gateways, "/@run-1:abc/other/mcp") is None


async def test_a_run_credential_in_the_gateway_url_opens_its_registered_run(embedded, upstream):
    async with embedded(policy="enforce", gateways="crm=https://crm.acme.test") as e:
        async with httpx.AsyncClient(timeout=30, trust_env=False) as c:
            started = await c.post(
                e.control_url("/runs"),
                json={"labels": {"ticket": "T-7"}, "targets": {"records": ["customer:9999"]}},
                headers=e.control_headers,
            )
            run, credential = started.json()["run"], started.json()["credential"]
            base = f"http://127.0.0.1:{e.p.gateway_port}"
            # The run's own target is in scope for it alone: the URL carries the run.
            own = await c.patch(f"{base}/@{run}:{credential}/crm/customers/9999", json={})
            forged = await c.patch(f"{base}/@{run}:forged/crm/customers/9999", json={})
            anonymous = await c.patch(f"{base}/crm/customers/9999", json={})
        calls = of_type(events(e.trace), "tool_call")

    assert started.status_code == 201
    assert own.status_code == 200
    assert forged.status_code != 200 and anonymous.status_code == 403
    # The upstream received the call once, without the credential in its path or headers.
    (seen,) = [s for s in upstream.seen if s["method"] == "PATCH"]
    assert seen["path"] == "/customers/9999"
    assert credential not in str(seen)
    assert calls[0]["run"] == run and calls[0]["call"]["scope"] == "in"


@pytest.mark.parametrize(
    "spec", ["t=ftp://x", "t=https://", "=https://x", "a b=https://x", "t=https://x,t=https://y"]
)
def test_a_bad_gateway_is_an_input_error(spec: str) -> None:
    with pytest.raises(InputError):
        parse_gateways(spec)
