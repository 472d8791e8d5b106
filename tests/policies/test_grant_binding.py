"""What a grant binds, without sockets: a grant written by `offscope requests
approve` admits the call it names (method, host, canonical path, query string,
body) and none of its neighbours; grant files from older versions, which lack
`host` and `query_digest`, are never read more widely than their call."""

from __future__ import annotations

import json
from pathlib import Path

from offscope.ledgers import load_ledger
from offscope.ledgers.matcher import CallInput, CompiledLedger, call_digest, query_digest
from offscope.policies import requests as reqs
from offscope.proxy.extract.http import HttpRequest, extract_http

LEDGER = """\
schema: offscope.ledger/1
id: billing
targets:
  hosts: [crm-a.acme.test, crm-b.acme.test]
  records: ["customer:4411"]
extract:
  - match: {path: "/customers/{id}"}
    targets: {record: "customer:{id}"}
"""


def _call(
    url_path: str,
    host: str = "crm-a.acme.test",
    method: str = "GET",
    body: bytes = b"",
    content_type: str = "",
) -> CallInput:
    headers = {"content-type": content_type} if content_type else {}
    req = HttpRequest(method, host, url_path, port=80, headers=headers, body=body)
    return extract_http(req)[0]


def _granted(ledger: CompiledLedger, call: CallInput) -> bool:
    return any(t.grant for t in ledger.tag(call).targets)


def _approved(tmp_path: Path, call: CallInput) -> CompiledLedger:
    """The ledger after a human approved the request the proxy filed for `call`
    (the same fields the engine writes to the request log)."""
    (tmp_path / "ledger.yaml").write_text(LEDGER, encoding="utf-8")
    request = {
        "schema": "offscope.request/1",
        "id": "req-1",
        "run": "r",
        "ledger": "billing",
        "tool": call.tool,
        "method": call.method,
        "host": call.host,
        "path": call.path,
        "query_digest": query_digest(call.query),
        "args_digest": call_digest(call),
        "targets": ["record:customer:9999"],
        "step": 1,
    }
    (tmp_path / "requests.jsonl").write_text(json.dumps(request) + "\n", encoding="utf-8")
    reqs.approve(tmp_path / "requests.jsonl", "req-1", tmp_path / "ledger.yaml", "ana", "1h")
    return load_ledger(tmp_path / "ledger.yaml").for_run("r")


def test_a_grant_admits_its_call_and_none_of_its_neighbours(tmp_path: Path) -> None:
    ledger = _approved(tmp_path, _call("/customers/9999?a=1"))
    assert _granted(ledger, _call("/customers/9999?a=1"))
    # the same endpoint in other spellings servers route to it (the record is found in each)
    assert _granted(ledger, _call("//customers/9999?a=1"))
    assert _granted(ledger, _call("/customers/./9999?a=1"))
    for neighbour in (
        _call("/customers/9999?a=2"),
        _call("/customers/9999?a=1&a=2"),
        _call("/customers/9999?a=1&b=1"),
        _call("/customers/9999"),
        _call("/customers/9999?a=1", host="crm-b.acme.test"),
        _call("/customers/9999?a=1", method="DELETE"),
        _call(
            "/customers/9999?a=1",
            body=b"email=evil%40x.test",
            content_type="application/x-www-form-urlencoded",
        ),
        _call("/customers/9999?a=1", body=b"plain text"),
        _call("/customers/9999?a=1", body=b'{"email": "x"}', content_type="application/json"),
    ):
        assert not _granted(ledger, neighbour), neighbour


def test_a_json_body_is_bound_by_its_value_and_a_raw_body_by_its_bytes() -> None:
    spaced = _call("/c", method="PUT", body=b'{"a": 1, "b": 2}', content_type="application/json")
    tight = _call("/c", method="PUT", body=b'{"b":2,"a":1}', content_type="application/json")
    assert call_digest(spaced) == call_digest(tight)  # the same JSON, as servers read it
    form1 = _call("/c", method="PUT", body=b"a=1", content_type="application/x-www-form-urlencoded")
    form2 = _call("/c", method="PUT", body=b"a=2", content_type="application/x-www-form-urlencoded")
    bodyless = _call("/c", method="PUT")
    assert len({call_digest(form1), call_digest(form2), call_digest(bodyless)}) == 3
    # an unreadable JSON body is bound by its bytes too, not by the lenient reading
    bad1 = _call("/c", method="PUT", body=b'{"a": "\xff"}', content_type="application/json")
    bad2 = _call("/c", method="PUT", body=b'{"a": "\xfe"}', content_type="application/json")
    assert call_digest(bad1) != call_digest(bad2)


OLD_GRANTS = """\
schema: offscope.grants/1
ledger: billing
grants:
  - {id: g-old-call, target: "record:customer:9999", tool: http, method: GET,
     path: /customers/9999, args_digest: DIGEST, approver: ana,
     expires: "2999-01-01T00:00:00Z", scope: ledger}
  - {id: g-old-host, target: "record:customer:7777", tool: http, method: GET,
     path: /customers/7777, host: crm-a.acme.test, approver: ana,
     expires: "2999-01-01T00:00:00Z", scope: ledger}
  - {id: g-hand, target: "record:customer:5555", approver: ana,
     expires: "2999-01-01T00:00:00Z", scope: ledger}
"""


def test_grant_files_from_older_versions_load_and_never_widen(tmp_path: Path) -> None:
    (tmp_path / "ledger.yaml").write_text(LEDGER, encoding="utf-8")
    digest = call_digest(_call("/customers/9999"))
    (tmp_path / "ledger.grants.yaml").write_text(OLD_GRANTS.replace("DIGEST", digest))
    ledger = load_ledger(tmp_path / "ledger.yaml")
    # a call-bound grant without a host applies to no call, on any host
    assert not _granted(ledger, _call("/customers/9999"))
    assert not _granted(ledger, _call("/customers/9999", host="crm-b.acme.test"))
    # with a host but no query_digest: the empty query only
    assert _granted(ledger, _call("/customers/7777"))
    assert not _granted(ledger, _call("/customers/7777?a=1"))
    assert not _granted(ledger, _call("/customers/7777", host="crm-b.acme.test"))
    # a target grant written by hand binds only what it names
    assert _granted(ledger, _call("/customers/5555?any=thing", host="crm-b.acme.test"))
