from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The sidecar tests' kit (real loopback upstreams, `offscope proxy` as a subprocess)
# and the hand-made trace builders.
_TESTS = Path(__file__).resolve().parent.parent
for _d in (_TESTS / "proxy", _TESTS / "core"):
    if str(_d) not in sys.path:
        sys.path.insert(0, str(_d))

from offscope.proxy.ca import ensure_ca  # noqa: E402


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            # mitmproxy 11.0's own pyOpenSSL use, not ours.
            item.add_marker(pytest.mark.filterwarnings("ignore::DeprecationWarning:mitmproxy.*"))


@pytest.fixture(scope="session")
def confdir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One CA for the whole session (key generation is the slow part)."""
    d = tmp_path_factory.mktemp("ca")
    ensure_ca(d)
    return str(d)
