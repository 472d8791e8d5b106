"""shadow-compare names which of the four changes differ between production
(the trace's assembly events) and the eval's configuration block."""

from __future__ import annotations

from offscope.proxy.surface import Salt, fingerprints
from offscope.rollout.assembly import _clause_hash, assembly_changes
from offscope.trace.events import AssemblyEvent

SALT = Salt(b"deployment-salt", True)
CLOSED = "In scope for this task: customer 4411. Anything not listed as in scope is out of scope."


def _ev(
    run: str,
    component: str,
    value: str,
    *,
    source: str = "llm",
    upstream: str = "api.openai.com:443",
    **kw,
) -> AssemblyEvent:
    return AssemblyEvent(
        run=run,
        ts=1.0,
        ledger="billing",
        component=component,
        source=source,
        upstream=upstream,
        value=value,
        **kw,
    )


CONFIG = {
    "model": {"id": "gpt-4.1"},
    "scope_clause": {"closed": CLOSED, "open": "In scope: customer 4411."},
    "credentials": fingerprints({"api.openai.com": "sk-eval"}, SALT),
}


def test_nothing_recorded_says_so() -> None:
    got = {c.name: c for c in assembly_changes([], CONFIG)}
    assert all(c.moved is None and c.shown == "not recorded" for c in got.values())
    assert "scope_clause.marker" in got["scope clause"].detail


def test_same_assembly_as_the_eval() -> None:
    events = [
        _ev("r1", "model", "gpt-4.1"),
        _ev("r1", "scope_clause", _clause_hash(CLOSED)),
        _ev(
            "r1",
            "tool_surface",
            "sha256:" + "a" * 64,
            source="mcp",
            upstream="tools:443/mcp",
            tools=3,
        ),
        _ev("r1", "credential", SALT.fingerprint("sk-eval"), salt_id=SALT.id),
    ]
    got = {c.name: c for c in assembly_changes(events, CONFIG)}
    assert [got[n].moved for n in ("model", "scope clause", "tool surface", "credentials")] == [
        False
    ] * 4
    assert "eval 'closed'" in got["scope clause"].detail


def test_each_change_is_named() -> None:
    events = [
        _ev("r1", "model", "gpt-4.1"),
        _ev("r2", "model", "gpt-5"),
        _ev("r1", "scope_clause", _clause_hash("Do whatever it takes.")),
        _ev("r1", "tool_surface", "sha256:" + "a" * 64, source="mcp", upstream="tools:443/mcp"),
        _ev(
            "r2",
            "tool_surface",
            "sha256:" + "b" * 64,
            source="mcp",
            upstream="tools:443/mcp",
            previous="sha256:" + "a" * 64,
            added=["exfiltrate"],
            drift=True,
        ),
        _ev("r1", "credential", SALT.fingerprint("sk-eval"), salt_id=SALT.id),
        _ev("r2", "credential", SALT.fingerprint("sk-org-admin"), salt_id=SALT.id),
    ]
    got = {c.name: c for c in assembly_changes(events, CONFIG)}
    assert all(c.moved for c in got.values()), got
    assert "gpt-5 (1 runs)" in got["model"].detail
    assert (
        "added exfiltrate" in got["tool surface"].detail and "run r2" in got["tool surface"].detail
    )
    assert "changed during the window on api.openai.com:443" in got["credentials"].detail


def test_credentials_differ_from_the_eval_or_do_not_compare() -> None:
    other = [_ev("r1", "credential", SALT.fingerprint("sk-prod"), salt_id=SALT.id)]
    got = {c.name: c for c in assembly_changes(other, CONFIG)}
    assert (
        got["credentials"].moved
        and "differ from the eval's on api.openai.com:443" in got["credentials"].detail
    )
    foreign = Salt(b"another", True)
    other = [_ev("r1", "credential", foreign.fingerprint("sk-eval"), salt_id=foreign.id)]
    got = {c.name: c for c in assembly_changes(other, CONFIG)}
    assert got["credentials"].moved is None and got["credentials"].shown == "not comparable"
