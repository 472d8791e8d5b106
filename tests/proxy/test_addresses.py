"""Every spelling of this machine is recognised; other hosts are not."""

import pytest

from offscope.proxy.addresses import is_local


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "127.1",
        "127.0.0.2",
        "0x7f000001",
        "2130706433",
        "0",
        "0.0.0.0",
        "LOCALHOST",
        "localhost.",
        "[::1]",
        "::1",
        "[::ffff:127.0.0.1]",
        "[::]",
    ],
)
def test_loopback_spellings(host: str) -> None:
    assert is_local(host)


@pytest.mark.parametrize(
    "host", ["8.8.8.8", "198.51.100.9", "192.0.2.7", "[2001:db8::1]"]
)  # literals: no lookup
def test_other_hosts(host: str) -> None:
    assert not is_local(host)
