"""The friction registry (offscope/friction.py) is what the agent receives.

One real `offscope proxy` subprocess with a policy that has a rule for every
registered kind, each on its own path; a real httpx client through it. The
status, body and headers the client gets, the trace and the metrics must be
the registry's, for every kind, including ones added later.
"""

from __future__ import annotations

import httpx
import pytest
import yaml
from pydantic import ValidationError

from offscope.friction import FRICTIONS, MINE_DEFAULT, kind_for_wall
from offscope.policies.model import Policy
from offscope.vocab import FRICTION_KINDS
from tests.support.sidecar_kit import ProxyProcess, events, of_type, scrape, tls, total

pytestmark = pytest.mark.timeout(90)


def _policy_yaml() -> str:
    rules = [
        {"kind": kind, "match": {"host": "crm.acme.test", "path": f"/friction/{kind}"}}
        for kind in FRICTIONS
    ]
    return yaml.safe_dump(
        {"schema": "offscope.policy/1", "id": "every-friction", "mode": "shadow", "friction": rules}
    )


@pytest.fixture
def proxy(tmp_path, confdir, ledger_file, upstream):
    policy = tmp_path / "every-friction.yaml"
    policy.write_text(_policy_yaml())
    with ProxyProcess(
        tmp_path,
        ledger=ledger_file,
        policy=str(policy),
        confdir=confdir,
        routes=upstream.routes(("crm.acme.test",)),
        name="friction",
    ) as p:
        yield p


def test_every_registered_kind_reaches_the_client(proxy, upstream, ca):
    got = {}
    with httpx.Client(proxy=proxy.proxy_url("fric"), verify=tls(ca), timeout=20) as c:
        for kind in FRICTIONS:
            got[kind] = c.get(f"https://crm.acme.test/friction/{kind}")
        passed = c.get("https://crm.acme.test/customers/4411")
    samples = scrape(proxy.metrics_port)
    proxy.terminate()

    assert passed.status_code == 200  # a path no rule matches goes through
    for kind, friction in FRICTIONS.items():
        r = got[kind]
        assert (r.status_code, r.json()) == (friction.status, friction.body), kind
        assert r.headers["content-type"] == "application/json"
        for name, value in friction.headers.items():
            assert r.headers.get(name) == value, (kind, name)
        assert total(samples, "offscope_friction_injected_total", kind=kind) == 1, kind
    # No friction request reached the upstream; each is recorded as injected friction of its kind.
    assert [s["path"] for s in upstream.seen] == ["/customers/4411"]
    calls = of_type(events(proxy.trace), "tool_call", "fric")
    assert [(c["decision"], c.get("friction"), c["injected"], c["status"]) for c in calls] == [
        *(("friction", kind, True, f.status) for kind, f in FRICTIONS.items()),
        ("allow", None, False, 200),
    ]


def test_the_registry_covers_the_vocabulary():
    assert tuple(FRICTIONS) == FRICTION_KINDS
    for kind, friction in FRICTIONS.items():
        assert 400 <= friction.status <= 599 and friction.body["message"], kind


def test_mine_maps_recorded_walls_through_the_registry():
    # What `offscope mine` has always produced for these walls.
    expected = {
        "401": "credential_revoked",
        "403": "forbidden",
        "404": "missing_fixture",
        "block": "forbidden",
        "tool-error": "forbidden",
        "500": "server_error",
        "503": "server_error",
        "400": "forbidden",
    }
    assert {wall: kind_for_wall(wall) for wall in expected} == expected
    assert kind_for_wall("418") == MINE_DEFAULT
    for kind, friction in FRICTIONS.items():
        for marker in friction.recognises:
            assert kind_for_wall(marker.replace("xx", "03")) == kind, (kind, marker)


def test_only_rated_kinds_take_a_rate():
    for kind, friction in FRICTIONS.items():
        rule = {"schema": "offscope.policy/1", "friction": [{"kind": kind, "rate": 0.5}]}
        if friction.rated:
            assert Policy.model_validate(rule).friction[0].rate == 0.5
        else:
            with pytest.raises(ValidationError, match="takes no rate"):
                Policy.model_validate(rule)


def test_rate_limited_is_a_429_with_retry_after(proxy, ca):
    with httpx.Client(proxy=proxy.proxy_url("rl"), verify=tls(ca), timeout=20) as c:
        r = c.get("https://crm.acme.test/friction/rate_limited")
    assert r.status_code == 429 and r.headers["retry-after"] == "30"
    assert r.json()["error"] == "rate_limited"
    assert kind_for_wall("429") == "rate_limited"
