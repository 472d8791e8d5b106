"""Ledger coverage (offscope/ledgers/coverage.py): which declared entries the
tagger's results use, for exact targets, globs, extract rules and grants."""

from __future__ import annotations

from datetime import UTC, datetime

from offscope.ledgers import CallInput, CompiledLedger, Ledger
from offscope.ledgers.coverage import Coverage

LEDGER = Ledger.model_validate(
    {
        "id": "cov",
        "targets": {
            "hosts": ["crm.acme.test", "*.files.acme.test", "unused.acme.test"],
            "records": ["customer:4411", "invoice:2026-*", "customer:7"],
            "paths": ["/srv/app/**"],
        },
        "extract": [
            {
                "match": {"host": "crm.acme.test", "path": "/customers/{id}"},
                "targets": {"record": "customer:{id}"},
            },
            {
                "match": {"host": "crm.acme.test", "path": "/invoices"},
                "targets": {"record": "invoice:{query.id}"},
            },
            {"match": {"source": "mcp"}, "targets": {"path": "{args.path}"}},
            {
                "match": {"host": "git.acme.test", "path": "/repos/{o}/{r}"},
                "targets": {"repository": "{o}/{r}"},
            },
        ],
        "grants": [
            {
                "id": "g-1",
                "target": "record:customer:9",
                "approver": "ops",
                "expires": "2099-01-01T00:00:00Z",
            },
            {
                "id": "g-2",
                "target": "record:customer:10",
                "approver": "ops",
                "expires": "2099-01-01T00:00:00Z",
            },
        ],
    }
)


def _observe(cov: Coverage, ledger: CompiledLedger, call: CallInput) -> bool:
    return cov.observe(ledger.tag(call, datetime(2030, 1, 1, tzinfo=UTC)))


def test_used_and_unused_entries_by_kind():
    ledger = CompiledLedger(LEDGER)
    cov = Coverage(ledger)
    assert cov.declared_counts() == {
        "host": 3,
        "repository": 0,
        "record": 3,
        "account": 0,
        "path": 1,
        "extract": 4,
        "grant": 2,
    }
    assert _observe(
        cov, ledger, CallInput("http", method="GET", host="CRM.acme.test", path="/customers/4411")
    )
    # the same values again use nothing new
    assert not _observe(
        cov, ledger, CallInput("http", method="GET", host="crm.acme.test", path="/customers/4411")
    )
    # a glob host, an invoice glob, a grant, an out-of-scope record (uses nothing)
    _observe(cov, ledger, CallInput("http", method="GET", host="a.files.acme.test", path="/x"))
    _observe(
        cov,
        ledger,
        CallInput(
            "http", method="GET", host="crm.acme.test", path="/invoices", query={"id": ["2026-3"]}
        ),
    )
    _observe(
        cov, ledger, CallInput("http", method="GET", host="crm.acme.test", path="/customers/9")
    )
    _observe(
        cov, ledger, CallInput("http", method="GET", host="crm.acme.test", path="/customers/555")
    )
    # an MCP call whose rule yields a path inside the glob
    _observe(
        cov,
        ledger,
        CallInput(
            "mcp", tool="read", host="crm.acme.test", path="/mcp", args={"path": "/srv/app/a.txt"}
        ),
    )
    assert cov.used_counts() == {
        "host": 2,
        "repository": 0,
        "record": 2,
        "account": 0,
        "path": 1,
        "extract": 3,
        "grant": 1,
    }
    assert [e.where for e in cov.unused()] == [
        "targets.hosts[2]",
        "targets.records[2]",
        "extract[3]",
        "grants[1]",
    ]
    assert cov.summary() == "host 2/3, record 2/3, path 1/1, extract 3/4, grant 1/2"


def test_a_rule_that_matches_but_yields_nothing_is_unused():
    ledger = CompiledLedger(LEDGER)
    cov = Coverage(ledger)
    _observe(
        cov, ledger, CallInput("http", method="GET", host="crm.acme.test", path="/invoices")
    )  # no ?id=
    assert 1 not in cov.used["extract"]
