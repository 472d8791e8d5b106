"""The run lifecycle in the engine itself (offscope/proxy/lifecycle.py), driven
with transport-neutral requests: registration and credentials, per-agent
history, ttl expiry, the per-run ledger following a reload. The same paths
through a real proxy: tests/e2e/test_runs.py."""

from __future__ import annotations

import pytest

from offscope.ledgers.matcher import CompiledLedger
from offscope.ledgers.model import Ledger
from offscope.policies.decide import CompiledPolicy
from offscope.policies.model import Policy
from offscope.proxy.engine import Engine
from offscope.proxy.extract.http import HttpRequest
from offscope.proxy.runs import Registry, header_credentials, proxy_credentials


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def engine(
    history: str = "run", require: bool = False, mode: str = "enforce"
) -> tuple[Engine, Clock]:
    ledger = Ledger.model_validate(
        {
            "id": "life",
            "targets": {"hosts": ["crm.acme.test"], "records": ["customer:4411"]},
            "extract": [
                {
                    "match": {"host": "crm.acme.test", "path": "/customers/{id}"},
                    "targets": {"record": "customer:{id}"},
                }
            ],
            "runs": {"history": history, "require_registered": require},
        }
    )
    policy = Policy.model_validate(
        {
            "id": "life",
            "mode": mode,
            "block_at": "never",  # only the history rule blocks
            "history": [
                {
                    "name": "read-then-exfiltrate",
                    "after_kind": "record",
                    "after": {"method": "GET"},
                    "then": {"method": ["POST", "PATCH"]},
                }
            ],
        }
    )
    clock = Clock()
    return Engine(CompiledLedger(ledger), CompiledPolicy(policy), clock=clock), clock


def call(e: Engine, run: str, method: str, host: str, path: str) -> int | None:
    ex, _ = e.begin(HttpRequest(method=method, host=host, path=path), run)
    return ex.synthetic.status if ex.synthetic else None


def test_agent_history_is_shared_across_its_runs_and_run_history_is_not():
    for history, blocked in (("agent", 403), ("run", None)):
        e, _ = engine(history)
        first = e.register_run({"agent": "billing-bot"})["run"]
        second = e.register_run({"agent": "billing-bot"})["run"]
        assert call(e, first, "GET", "crm.acme.test", "/customers/4411") is None  # arms the rule
        e.close_run(first)
        assert call(e, second, "POST", "paste.evil.test", "/upload") == blocked, history


def test_credentials_are_checked_by_digest_and_expire():
    e, clock = engine(require=True)
    started = e.register_run({"ttl": 60, "labels": {"ticket": "T-1"}})
    run, cred = started["run"], started["credential"]
    assert e.lifecycle.registry.get(run).digest != cred.encode()  # only a digest is kept
    assert e.admit("anything", run, cred).run == run
    assert e.admit(run, run, cred[:-1] + "x").status == 407
    assert e.admit(run, run, None).body["cause"] == "missing"
    clock.now += 61
    refused = e.admit(run, run, cred)
    assert refused.status == 407 and refused.body["cause"] == "expired"
    assert e.lifecycle.expire_registrations() == 1 and e.runs.get(run) is None


def test_labels_and_targets_are_validated():
    e, _ = engine()
    for body, word in (
        ({"ttl": 0}, "ttl"),
        ({"labels": {"auth": "x"}}, "auth"),
        ({"targets": {"records": ["no-type"]}}, "records"),
        ({"nope": 1}, "nope"),
    ):
        with pytest.raises(ValueError, match=word):
            e.register_run(body)


def test_a_run_ledger_follows_a_reload_of_the_base_ledger():
    e, _ = engine()
    run = e.register_run({"targets": {"records": ["customer:5555"]}})["run"]
    other = e.register_run({})["run"]
    scope = lambda r, rec: e.lifecycle.ledger_of(e.runs.get(r)).contains("record", rec)  # noqa: E731
    assert (
        scope(run, "customer:5555"),
        scope(run, "customer:7777"),
        scope(other, "customer:5555"),
    ) == (True, False, False)
    reloaded = e.ledger.ledger.model_copy(
        update={
            "targets": e.ledger.ledger.targets.model_copy(
                update={"records": ["customer:4411", "customer:7777"]}
            )
        }
    )
    e.ledger = CompiledLedger(reloaded)
    assert (
        scope(run, "customer:5555"),
        scope(run, "customer:7777"),
        scope(run, "customer:4411"),
    ) == (True, True, True)


def test_registry_is_bounded():
    reg = Registry(max_runs=3)
    runs = [reg.register(0.0, 10.0, {}, None, None, False)[0].run for _ in range(5)]
    assert len(reg) == 3 and reg.get(runs[0]) is None and reg.get(runs[-1]) is not None


def test_credential_parsers():
    import base64

    basic = "Basic " + base64.b64encode(b"run-1:s3cret:with:colons").decode()
    assert proxy_credentials(basic) == ("run-1", "s3cret:with:colons")
    assert proxy_credentials("Basic !!") == (None, None)
    assert header_credentials("run-1:abc") == ("run-1", "abc")
    assert header_credentials("run-1") == (None, None)
