"""Ledger loading as a running `offscope proxy` sees it: malformed edits on hot
reload are rejected and counted, and Unicode ledger hosts match what a real
client puts on the wire (punycode)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest

from offscope.proxy.mitm.ca import ensure_ca
from tests.support.sidecar_kit import (
    LEDGER_YAML,
    ProxyProcess,
    echo_upstream,
    events,
    of_type,
    scrape,
    total,
)

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def confdir(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("ca")
    ensure_ca(d)
    return str(d)


def write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def wait_for(predicate, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


# Each used to escape the reload handler as re.error, RecursionError or
# UnicodeDecodeError: not counted, so the reload-failure alert stayed silent.
BAD_EDITS = [
    LEDGER_YAML.replace(
        'records: ["customer:4411"]', 'records: ["customer:4411"]\n  paths: ["/srv/[z-a]"]'
    ).encode(),
    LEDGER_YAML.replace(
        "id: sidecar-e2e", "id: sidecar-e2e\ndescription: " + "[" * 10_000 + "]" * 10_000
    ).encode(),
    LEDGER_YAML.replace("id: sidecar-e2e", "id: sidecar-e2e\ndescription: caf\xe9").encode(
        "latin-1"
    ),
]


def test_malformed_reloads_are_counted_and_the_old_ledger_stays(
    tmp_path: Path, confdir: str
) -> None:
    ledger = tmp_path / "ledger.yaml"
    ledger.write_text(LEDGER_YAML, encoding="utf-8")
    with (
        echo_upstream() as up,
        ProxyProcess(
            tmp_path, ledger=str(ledger), routes=up.routes(), confdir=confdir, name="reload"
        ) as proxy,
    ):
        before = proxy.control("GET", "/readyz").json()
        for n, data in enumerate(BAD_EDITS, start=1):
            write_atomically(ledger, data)
            assert wait_for(
                lambda n=n: (
                    total(
                        scrape(proxy.metrics_port), "offscope_reload_failures_total", file="ledger"
                    )
                    == n
                )
            ), proxy.stderr()
            assert proxy.control("GET", "/readyz").json() == before
        with httpx.Client(proxy=proxy.proxy_url("after-bad-edits"), timeout=10) as client:
            assert client.get("http://crm.acme.test/customers/4411").status_code == 200
        log = proxy.stderr()
    assert log.count("reload_rejected") == len(BAD_EDITS)
    assert (
        "bad character range z-a" in log
        and "nesting deeper than 100 levels" in log
        and "not UTF-8" in log
    )
    assert "Traceback" not in log
    calls = of_type(events(proxy.trace), "tool_call", run="after-bad-edits")
    assert [c["ledger"] for c in calls] == ["sidecar-e2e"] and calls[0]["call"]["scope"] == "in"


IDN_LEDGER = """\
schema: offscope.ledger/1
id: idn
targets:
  hosts: ["bücher.test", "*.münchen.test"]
"""


def test_unicode_ledger_hosts_match_a_real_clients_punycode(tmp_path: Path, confdir: str) -> None:
    # httpx sends `GET http://xn--bcher-kva.test/a` with `Host: xn--bcher-kva.test`;
    # mitmproxy hands the addon the IDNA-decoded name; both spellings must match.
    ledger = tmp_path / "idn.yaml"
    ledger.write_text(IDN_LEDGER, encoding="utf-8")
    hosts = ("xn--bcher-kva.test", "shop.xn--mnchen-3ya.test", "xn--mnchen-3ya.test")
    with (
        echo_upstream() as up,
        ProxyProcess(
            tmp_path, ledger=str(ledger), routes=up.routes(hosts), confdir=confdir, name="idn"
        ) as proxy,
    ):
        with httpx.Client(proxy=proxy.proxy_url("idn"), timeout=10) as client:
            for url in (
                "http://bücher.test/a",
                "http://shop.münchen.test/b",
                "http://münchen.test/c",
            ):
                assert client.get(url).status_code == 200
        assert len(up.seen) == 3
    calls = of_type(events(proxy.trace), "tool_call", run="idn")
    assert [c["call"]["scope"] for c in calls] == [
        "in",
        "in",
        "out",
    ]  # *.x covers subdomains, not x
