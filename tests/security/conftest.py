"""The hostile-agent suite: a real `offscope proxy` process and loopback upstreams
that record what they received; the assertions are on those records."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The sidecar kit (real servers, proxy subprocess, trace readers) lives beside the proxy tests.
sys.path.insert(0, str(Path(__file__).parent.parent / "proxy"))

from offscope.proxy.ca import ensure_ca  # noqa: E402


@pytest.fixture(scope="session")
def confdir(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("ca")
    ensure_ca(d)
    return str(d)
