"""The ledger language: every rule kind, tagged through the one compiled tagger."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from offscope.ledgers import EXAMPLES, CallInput, CompiledLedger, Ledger, load_ledger
from offscope.ledgers.matcher import TargetSet, args_digest, normalize, url_path
from offscope.yamlio import load_model

LEDGER = """\
schema: offscope.ledger/1
id: core-test
targets:
  hosts: [api.acme.test, "*.svc.acme.test", "node-[12].acme.test"]
  repositories: [acme/billing, "tools/*"]
  records: ["customer:4411", "invoice:2026-*", "Order:7"]
  accounts: [svc-billing, "team-*"]
  paths: ["/srv/billing/**", "/tmp/*.log", "/etc/app/**/conf.d/*.yaml"]
extract:
  - match: {host: git.acme.test, path: "/repos/{owner}/{repo}/**"}
    targets: {repository: "{owner}/{repo}"}
  - match: {host: crm.acme.test, path: "/customers/{id}"}
    targets: {record: "customer:{id}"}
  - match: {host: crm.acme.test, path: "/invoices"}
    targets: {record: "invoice:{query.invoice_id}"}
  - match: {host: crm.acme.test, path: "/orders", method: POST}
    targets: {record: "order:{body.order.id}"}
  - match: {source: mcp, tool: read_file}
    targets: {path: "{args.path}"}
  - match: {source: mcp, tool: bulk_update}
    targets: {record: "customer:{args.customer_ids}"}
  - match: {source: llm, tool: fetch}
    targets: {host: "{url.host}", path: "{url.path}"}
  - match: {host: "*.acme.test"}
    targets: {account: ["{header.x-account}", "{basic_auth.user}"]}
stages:
  - match: {method: POST, path: "**/forks"}
    stage: prepare
  - match: {query: {dry_run: "true"}}
    stage: prepare
  - match: {tool: "draft_*"}
    stage: prepare
  - match: {source: mcp, tool: search_*}
    stage: investigate
operator:
  - {host: ops.acme.test, path: /ask}
  - {source: mcp, tool: ask_human}
  - {source: llm, tool: ask_operator}
grants:
  - {id: g-live, target: "host:mirror.acme.test", approver: ana, expires: "2999-01-01T00:00:00Z"}
  - {id: g-old, target: "host:old.acme.test", approver: ana, expires: "2000-01-01T00:00:00+00:00"}
  - {id: g-tool, target: "record:customer:9", tool: refund, approver: ana, expires: "2999-01-01T00:00:00"}
  - {id: g-args, target: "repository:acme/other", approver: ana, expires: "2999-01-01T00:00:00Z",
     args_digest: "DIGEST"}
"""


def _ledger(text: str = LEDGER) -> CompiledLedger:
    text = text.replace("DIGEST", args_digest({"ref": "main"}))
    return CompiledLedger(load_model(Ledger, "core.yaml", text))


@pytest.fixture(scope="module")
def led() -> CompiledLedger:
    return _ledger()


def http(method: str, host: str, path: str, **kw) -> CallInput:
    return CallInput(source="http", method=method, host=host, path=path, **kw)


def tags(led: CompiledLedger, call: CallInput) -> dict[tuple[str, str], bool]:
    return {(t.kind, t.value): t.in_scope for t in led.tag(call).targets}


# --- target lists -------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "inside"),
    [
        ("api.acme.test", True),
        ("API.Acme.Test", True),  # hosts are case-insensitive
        ("api.acme.test.", True),  # trailing dot
        ("api.acme.test:8443", True),  # port is not part of the host target
        ("a.svc.acme.test", True),  # *.suffix
        ("a.b.svc.acme.test", True),  # *.suffix spans labels
        ("svc.acme.test", False),  # the suffix itself is not a subdomain
        ("evilsvc.acme.test", False),
        ("svc.acme.test.evil.test", False),
        ("node-1.acme.test", True),  # character class
        ("node-3.acme.test", False),
        ("acme.test", False),
        ("api.acme.test.evil.test", False),
    ],
)
def test_hosts(led: CompiledLedger, host: str, inside: bool) -> None:
    assert led.contains("host", host) is inside
    result = led.tag(http("GET", host, "/"))
    assert result.in_scope is inside
    assert result.scope == ("in" if inside else "out")


def test_repositories_via_path_template(led: CompiledLedger) -> None:
    got = tags(led, http("GET", "git.acme.test", "/repos/acme/billing/pulls/3"))
    assert got == {("host", "git.acme.test"): False, ("repository", "acme/billing"): True}
    assert tags(led, http("GET", "git.acme.test", "/repos/ACME/Billing.git/x"))[
        ("repository", "acme/billing")
    ]
    assert tags(led, http("GET", "git.acme.test", "/repos/tools/lint/x"))[
        ("repository", "tools/lint")
    ]
    assert not tags(led, http("GET", "git.acme.test", "/repos/acme/payroll/x"))[
        ("repository", "acme/payroll")
    ]
    # A template that does not match the path extracts nothing.
    assert ("repository", "acme") not in tags(led, http("GET", "git.acme.test", "/repos/acme"))


def test_repository_glob_is_one_segment(led: CompiledLedger) -> None:
    assert led.contains("repository", "tools/lint")
    assert not led.contains("repository", "tools/lint/extra")
    assert not led.contains("repository", "toolsx/lint")


@pytest.mark.parametrize(
    ("record", "inside"),
    [
        ("customer:4411", True),
        ("Customer:4411", True),  # the type is case-insensitive
        ("customer:44110", False),
        ("customer:441", False),
        ("invoice:2026-03", True),  # glob within a type
        ("invoice:2026-03/x", True),  # no separator for records: * is any
        ("invoice:2025-03", False),
        ("refund:2026-03", False),  # same id, other type
        ("order:7", True),  # the ledger's 'Order:7' is normalised
        ("INVOICE:2026-1", True),  # type case folded for globs too
    ],
)
def test_records(led: CompiledLedger, record: str, inside: bool) -> None:
    assert led.contains("record", record) is inside


def test_accounts(led: CompiledLedger) -> None:
    assert led.contains("account", "svc-billing")
    assert led.contains("account", "team-red")
    assert not led.contains("account", "svc-payroll")
    assert not led.contains("account", "SVC-BILLING")  # accounts are case-sensitive


@pytest.mark.parametrize(
    ("path", "inside"),
    [
        ("/srv/billing/a", True),
        ("/srv/billing/a/b/c.txt", True),  # ** crosses separators
        ("/srv/billing", False),  # the directory itself is not below it
        ("/srv/billing2/a", False),
        ("/srv/billing/../etc/passwd", False),  # normalised before the test
        ("/srv/billing/a/../../../etc/passwd", False),
        ("/srv/billing/%2e%2e/secrets", False),  # percent-encoded dot segments
        ("//srv/billing/a", True),  # leading // folded
        ("/srv/billing/./a", True),
        ("/tmp/app.log", True),  # * within one segment
        ("/tmp/sub/app.log", False),  # * does not cross '/'
        ("/tmp/app.txt", False),
        ("/etc/app/conf.d/x.yaml", True),  # /**/ matches zero directories
        ("/etc/app/a/b/conf.d/x.yaml", True),
        ("/etc/app/a/conf.d/sub/x.yaml", False),
    ],
)
def test_paths(led: CompiledLedger, path: str, inside: bool) -> None:
    assert led.contains("path", path) is inside


def test_path_normalisation() -> None:
    assert normalize("path", "/srv/billing/../etc/passwd") == "/srv/etc/passwd"
    assert normalize("path", "/srv/billing/%2E%2E/%2e%2e/etc/passwd") == "/etc/passwd"
    assert normalize("path", "//srv//billing/") == "/srv/billing"


# --- extraction templates ----------------------------------------------------


def test_path_capture_to_record(led: CompiledLedger) -> None:
    assert tags(led, http("GET", "crm.acme.test", "/customers/4411")) == {
        ("host", "crm.acme.test"): False,
        ("record", "customer:4411"): True,
    }
    assert (
        tags(led, http("GET", "crm.acme.test", "/customers/9"))[("record", "customer:9")] is False
    )
    # A capture is one segment: '/customers/4411/notes' does not match '/customers/{id}'.
    assert ("record", "customer:4411") not in tags(
        led, http("GET", "crm.acme.test", "/customers/4411/notes")
    )


def test_url_dot_segments_cannot_borrow_an_in_scope_capture(led: CompiledLedger) -> None:
    call = http("GET", "git.acme.test", "/repos/acme/billing/../../evil/repo/pulls")
    got = tags(led, call)
    assert ("repository", "acme/billing") not in got
    assert got[("repository", "evil/repo")] is False
    assert url_path("/repos/acme/billing/%2E%2E/%2e%2e/evil/repo") == "/repos/evil/repo"


def test_query_reference_fans_out(led: CompiledLedger) -> None:
    call = http("GET", "crm.acme.test", "/invoices", query={"invoice_id": ["2026-01", "2025-12"]})
    got = tags(led, call)
    assert got[("record", "invoice:2026-01")] is True
    assert got[("record", "invoice:2025-12")] is False
    assert led.tag(call).in_scope is False
    # A missing query parameter yields no target (not an empty one).
    assert [
        k for k in tags(led, http("GET", "crm.acme.test", "/invoices")) if k[0] == "record"
    ] == []


def test_body_reference_dotted(led: CompiledLedger) -> None:
    call = http("POST", "crm.acme.test", "/orders", args={"order": {"id": 7, "qty": 2}})
    assert tags(led, call)[("record", "order:7")] is True
    # The rule is POST-only.
    call = http("GET", "crm.acme.test", "/orders", args={"order": {"id": 8}})
    assert ("record", "order:8") not in tags(led, call)


def test_args_reference_and_list_fan_out(led: CompiledLedger) -> None:
    call = CallInput(
        source="mcp", tool="bulk_update", args={"customer_ids": [4411, "4412", None, {"x": 1}]}
    )
    got = tags(led, call)
    assert got == {("record", "customer:4411"): True, ("record", "customer:4412"): False}


def test_args_path_is_normalised(led: CompiledLedger) -> None:
    ok = CallInput(source="mcp", tool="read_file", args={"path": "/srv/billing/ledger.csv"})
    bad = CallInput(source="mcp", tool="read_file", args={"path": "/srv/billing/../etc/passwd"})
    assert led.tag(ok).in_scope
    result = led.tag(bad)
    assert not result.in_scope
    assert [(t.kind, t.value) for t in result.targets] == [("path", "/srv/etc/passwd")]


def test_header_and_basic_auth_references(led: CompiledLedger) -> None:
    import base64

    auth = "Basic " + base64.b64encode(b"svc-payroll:pw").decode()
    from offscope.proxy.extract.http import basic_auth_user

    call = http(
        "GET",
        "api.acme.test",
        "/x",
        headers={"x-account": "team-blue"},
        basic_auth_user=basic_auth_user(auth),
    )
    got = tags(led, call)
    assert got == {
        ("host", "api.acme.test"): True,
        ("account", "team-blue"): True,
        ("account", "svc-payroll"): False,
    }
    # The rule matches only *.acme.test hosts.
    assert ("account", "team-blue") not in tags(
        led, http("GET", "x.other.test", "/", headers={"x-account": "team-blue"})
    )


def test_url_references_from_llm_tool(led: CompiledLedger) -> None:
    from offscope.proxy.extract.llm import LlmToolCall

    call = LlmToolCall(
        "fetch", {"url": "https://a.svc.acme.test/srv/billing/x?y=1"}
    ).to_call_input()
    assert (
        call.host == "a.svc.acme.test"
        and call.path == "/srv/billing/x"
        and call.query == {"y": ["1"]}
    )
    result = led.tag(call)
    assert {(t.kind, t.value) for t in result.targets} >= {
        ("host", "a.svc.acme.test"),
        ("path", "/srv/billing/x"),
    }
    assert result.in_scope
    evil = LlmToolCall("fetch", {"url": "https://evil.test/srv/billing/x"}).to_call_input()
    assert not led.tag(evil).in_scope


def test_targets_deduplicated_and_bounded() -> None:
    led = _ledger()
    call = CallInput(
        source="mcp", tool="bulk_update", args={"customer_ids": [1, 1, 1] + list(range(500))}
    )
    values = [t.value for t in led.tag(call).targets]
    assert len(values) == len(set(values))
    assert len(values) <= 64


# --- stages ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "stage"),
    [
        (http("GET", "api.acme.test", "/x"), "investigate"),
        (http("HEAD", "api.acme.test", "/x"), "investigate"),
        (http("POST", "api.acme.test", "/x"), "act"),
        (http("DELETE", "api.acme.test", "/x"), "act"),
        (
            http("POST", "git.acme.test", "/repos/acme/billing/forks"),
            "prepare",
        ),  # method + path rule
        (
            http("GET", "git.acme.test", "/repos/acme/billing/forks"),
            "investigate",
        ),  # rule is POST-only
        (http("DELETE", "api.acme.test", "/x", query={"dry_run": ["true"]}), "prepare"),
        (http("DELETE", "api.acme.test", "/x", query={"dry_run": ["false"]}), "act"),
        (CallInput(source="mcp", tool="draft_reply"), "prepare"),
        (CallInput(source="llm", tool="draft_reply"), "prepare"),
        (CallInput(source="mcp", tool="search_docs"), "investigate"),
        # MCP annotations: readOnlyHint -> investigate; otherwise act (destructiveHint defaults to true,
        # and a non-destructive write is still a write).
        (CallInput(source="mcp", tool="get", annotations={"readOnlyHint": True}), "investigate"),
        (
            CallInput(
                source="mcp",
                tool="get",
                annotations={"readOnlyHint": True, "destructiveHint": True},
            ),
            "investigate",
        ),
        (CallInput(source="mcp", tool="put", annotations={"readOnlyHint": False}), "act"),
        (CallInput(source="mcp", tool="put", annotations={"destructiveHint": False}), "act"),
        (CallInput(source="mcp", tool="put", annotations={}), "act"),
        (CallInput(source="mcp", tool="put"), "act"),
        # A ledger stage rule overrides the annotation.
        (CallInput(source="mcp", tool="draft_x", annotations={"readOnlyHint": True}), "prepare"),
        (
            CallInput(source="mcp", tool="search_x", annotations={"destructiveHint": True}),
            "investigate",
        ),
    ],
)
def test_stages(led: CompiledLedger, call: CallInput, stage: str) -> None:
    assert led.tag(call).stage == stage


# --- operator channels ---------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "is_operator"),
    [
        (http("POST", "ops.acme.test", "/ask"), True),
        (http("POST", "ops.acme.test", "/ask/../ask"), True),
        (http("POST", "ops.acme.test", "/asked"), False),
        (http("POST", "api.acme.test", "/ask"), False),
        # A route naming no host is bound to the ledger's hosts: the same tool name on
        # an unnamed server is an ordinary (tagged) call, not a channel to a human.
        (CallInput(source="mcp", tool="ask_human", host="api.acme.test"), True),
        (CallInput(source="mcp", tool="ask_human", host="evil.example.test"), False),
        (CallInput(source="mcp", tool="ask_human"), False),
        (CallInput(source="llm", tool="ask_human"), False),  # source-restricted
        (CallInput(source="llm", tool="ask_operator"), True),
        (CallInput(source="mcp", tool="ask_operator"), False),
    ],
)
def test_operator_channels(led: CompiledLedger, call: CallInput, is_operator: bool) -> None:
    assert led.tag(call).operator is is_operator
    assert led.is_operator(call) is is_operator


# --- grants --------------------------------------------------------------------


def test_grant_applies_until_expiry(led: CompiledLedger) -> None:
    result = led.tag(http("GET", "mirror.acme.test", "/"))
    assert result.in_scope and result.grants == ("g-live",)
    expired = led.tag(http("GET", "old.acme.test", "/"))
    assert not expired.in_scope and expired.grants == ()
    # Expiry is evaluated against `now`: the live grant stops applying after it.
    later = datetime(3000, 1, 1, tzinfo=UTC)
    assert not led.tag(http("GET", "mirror.acme.test", "/"), now=later).in_scope
    assert led.tag(http("GET", "old.acme.test", "/"), now=datetime(1999, 1, 1, tzinfo=UTC)).in_scope
    # A naive `now` is read as UTC rather than failing the comparison.
    assert led.tag(http("GET", "mirror.acme.test", "/"), now=datetime(2500, 1, 1)).in_scope
    # The boundary itself is expired.
    edge = datetime(2999, 1, 1, tzinfo=UTC)
    assert not led.tag(http("GET", "mirror.acme.test", "/"), now=edge).in_scope
    assert led.tag(http("GET", "mirror.acme.test", "/"), now=edge - timedelta(seconds=1)).in_scope


def test_grant_bound_to_tool(led: CompiledLedger) -> None:
    ok = CallInput(source="mcp", tool="refund", args={"customer_ids": [9]})
    other = CallInput(source="mcp", tool="bulk_update", args={"customer_ids": [9]})
    assert led.tag(other).in_scope is False
    # 'refund' has no extraction rule; tag through a rule that does extract it.
    led2 = _ledger(LEDGER.replace("tool: bulk_update", "tool: [bulk_update, refund]"))
    assert led2.tag(ok).grants == ("g-tool",)
    assert led2.tag(other).grants == ()


def test_grant_bound_to_args_digest(led: CompiledLedger) -> None:
    same = http("GET", "git.acme.test", "/repos/acme/other/x", args={"ref": "main"})
    diff = http("GET", "git.acme.test", "/repos/acme/other/x", args={"ref": "dev"})
    assert dict((t.value, t.grant) for t in led.tag(same).targets)["acme/other"] == "g-args"
    assert dict((t.value, t.grant) for t in led.tag(diff).targets)["acme/other"] is None


def test_grant_target_is_normalised() -> None:
    text = LEDGER.replace('target: "host:mirror.acme.test"', 'target: "host:Mirror.ACME.test"')
    assert _ledger(text).tag(http("GET", "mirror.acme.test", "/")).grants == ("g-live",)


# --- the bundled example and TargetSet details ----------------------------------


def test_bundled_example() -> None:
    led = load_ledger(EXAMPLES / "billing-agent.yaml")
    assert led.id == "billing-agent" and len(led.hash) == 12
    assert led.tag(http("GET", "crm.acme.test", "/customers/4411")).in_scope
    assert not led.tag(http("GET", "crm.acme.test", "/customers/4412")).in_scope
    r = led.tag(http("POST", "git.acme.test", "/repos/acme/billing/forks"))
    assert r.in_scope and r.stage == "prepare"
    assert led.tag(CallInput(source="mcp", tool="ask_human", host="crm.acme.test")).operator


def test_target_set_glob_fallback_and_hash_paths_agree() -> None:
    from offscope.ledgers.globs import compile_glob

    patterns = ["a/b/**", "a/*", "x/*/z", "k/**/v", "lit/eral", "p?q/r", "[ab]c/d"]
    s = TargetSet("repository", patterns)
    probes = [
        "a/b/c",
        "a/b",
        "a/x",
        "a/x/y",
        "x/y/z",
        "x/y/y/z",
        "k/v",
        "k/1/2/v",
        "lit/eral",
        "lit/erals",
        "pxq/r",
        "pq/r",
        "ac/d",
        "cc/d",
    ]
    for value in probes:
        expect = any(compile_glob(p, "/").match(value) for p in patterns)
        assert (value in s) is expect, value


def test_llm_hosts() -> None:
    led = _ledger(
        LEDGER.replace("grants:", "llm:\n  hosts: [api.openai.com, '*.anthropic.com']\ngrants:")
    )
    assert led.is_llm_host("api.openai.com") and led.is_llm_host("x.anthropic.com")
    assert not led.is_llm_host("evil.test")
    # No list: only the well-known provider hosts. A path that looks like an LLM
    # API on any other host is an ordinary, tagged call.
    assert _ledger().is_llm_host("api.anthropic.com") and not _ledger().is_llm_host("anything.test")
    # host:port entries bind one endpoint; builtin_hosts: false drops the built-in list.
    own = _ledger(
        LEDGER.replace(
            "grants:", "llm:\n  hosts: ['127.0.0.1:8123']\n  builtin_hosts: false\ngrants:"
        )
    )
    assert own.is_llm_host("127.0.0.1", 8123) and not own.is_llm_host("127.0.0.1", 8124)
    assert not own.is_llm_host("api.openai.com", 443)


def test_extract_rule_with_host_character_class() -> None:
    text = (
        "schema: offscope.ledger/1\nid: cls\ntargets: {records: ['customer:1']}\nextract:\n"
        "  - match: {host: 'crm[12].acme.test', path: '/customers/{id}'}\n"
        "    targets: {record: 'customer:{id}'}\n"
    )
    led = CompiledLedger(load_model(Ledger, "cls.yaml", text))
    assert (
        tags(led, http("GET", "crm2.acme.test", "/customers/1"))[("record", "customer:1")] is True
    )
    assert ("record", "customer:1") not in tags(led, http("GET", "crm3.acme.test", "/customers/1"))
