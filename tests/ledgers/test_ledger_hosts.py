"""Host targets: one spelling on both sides (IDNA punycode, lower case, no port,
no trailing dot), so a ledger written in Unicode matches what clients send."""

from __future__ import annotations

import httpx
import pytest

from offscope.ledgers import CallInput, CompiledLedger, Ledger
from offscope.ledgers.hostnames import ascii_host, split_port

LEDGER = CompiledLedger(
    Ledger.model_validate(
        {
            "schema": "offscope.ledger/1",
            "id": "idn",
            "targets": {"hosts": ["bücher.test", "*.MÜNCHEN.test", "api.acme.test"]},
            "extract": [
                {"match": {"source": "llm", "tool": "fetch"}, "targets": {"host": "{url.host}"}},
                {
                    "match": {"host": "straße.test", "path": "/customers/{id}"},
                    "targets": {"record": "c:{id}"},
                },
            ],
        }
    )
)


def test_ledger_hosts_are_stored_as_punycode() -> None:
    assert LEDGER.ledger.targets.hosts == [
        "xn--bcher-kva.test",
        "*.xn--mnchen-3ya.test",
        "api.acme.test",
    ]


@pytest.mark.parametrize(
    ("host", "inside"),
    [
        ("xn--bcher-kva.test", True),  # what clients put on the wire
        (httpx.URL("http://bücher.test/").raw_host.decode(), True),  # a real client's own encoding
        ("bücher.test", True),
        ("BÜCHER.TEST.", True),
        ("bücher.test:8443", True),
        ("a.xn--mnchen-3ya.test", True),
        ("a.b.münchen.test", True),
        ("xn--mnchen-3ya.test", False),  # *.x matches subdomains, not x itself
        ("bucher.test", False),
        ("xn--bcher-kva.test.evil", False),
    ],
)
def test_unicode_and_punycode_hosts_match(host: str, inside: bool) -> None:
    assert LEDGER.contains("host", host) is inside


def test_unicode_url_in_a_tool_argument_is_normalised() -> None:
    from offscope.ledgers.matcher import split_url

    host, path, _ = split_url("https://Bücher.test/a")  # how the LLM extractor reads a URL argument
    result = LEDGER.tag(CallInput("llm", tool="fetch", host=host, path=path))
    assert [(t.kind, t.value, t.in_scope) for t in result.targets] == [
        ("host", "xn--bcher-kva.test", True)
    ]


def test_unicode_host_in_a_rule_matches_punycode_calls() -> None:
    got = LEDGER.tag(
        CallInput("http", method="GET", host="xn--strae-oqa.test", path="/customers/7")
    )
    assert ("record", "c:7") in [(t.kind, t.value) for t in got.targets]


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("API.Acme.Test.", "api.acme.test"),
        ("api.acme.test:8080", "api.acme.test"),
        ("[::1]:8080", "[::1]"),
        ("::1", "::1"),
        ("ＡＰＩ.acme.test", "api.acme.test"),
        ("*.bücher.test", "*.xn--bcher-kva.test"),
        (
            "x_\u00e9.test",
            "x_\u00e9.test",
        ),  # not encodable: kept as is (matches nothing spelled correctly)
    ],
)
def test_ascii_host(raw: str, canonical: str) -> None:
    assert ascii_host(raw) == canonical


def test_split_port() -> None:
    assert split_port("a.test:80") == ("a.test", "80")
    assert split_port("[::1]:80") == ("[::1]", "80")
    assert split_port("[::1]") == ("[::1]", None)
    assert split_port("a.test") == ("a.test", None)
