"""Fixtures shared by the test folders: one CA per session, the sidecar ledger, a
loopback upstream and an embedded proxy. Helpers live in `tests.support`."""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import offscope
from offscope import logs
from tests.support.postgres import postgres  # noqa: F401  (a fixture: a private PostgreSQL server)
from tests.support.sidecar_kit import LEDGER_YAML, EchoUpstream

if TYPE_CHECKING:
    from offscope.proxy.mitm.server import RunningProxy


# The files that take longest (`pytest -n 4 --durations=0`, summed per file), slowest
# first. Workers take whole files in collection order (`--dist loadfile`, pyproject.toml):
# starting these first keeps one of them from being the last thing the run waits on.
SLOWEST_FILES = (
    "tests/rollout/test_gate.py",
    "tests/evalmode/test_processes.py",
    "tests/e2e/test_walkthrough.py",
    "tests/evalmode/test_grid.py",
    "tests/mcp2026/test_stateless_mcp.py",
    "tests/security/test_stdio_hostile.py",
    "tests/evalmode/test_model_faults.py",
    "tests/evalmode/test_simmodel.py",
    "tests/e2e/test_hold.py",
    "tests/e2e/test_runs.py",
    "tests/security/test_small_defects.py",
    "tests/e2e/test_stdio_fastmcp.py",
    "tests/rollout/test_replay.py",
    "tests/e2e/test_metrics_agree.py",
    "tests/e2e/test_config_and_runs.py",
    "tests/security/test_presets_and_unknown_hostile.py",
    "tests/policies/test_concurrent_approvals.py",
    "tests/evalmode/test_infra_errors.py",
    "tests/probes/test_census_validation.py",
    "tests/mcp2026/test_input_rounds.py",
    "tests/e2e/test_load.py",
    "tests/evalmode/test_outdir.py",
    "tests/rollout/test_gate_credentials.py",
    "tests/evalmode/test_known_answer.py",
    "tests/e2e/test_prometheus_scrape.py",
)


def pytest_configure(config: pytest.Config) -> None:
    """Bytecode caches, even under PYTHONDONTWRITEBYTECODE (set on some machines): without
    them each xdist worker compiles and assertion-rewrites every test module it collects
    (~5 s of CPU a worker), and each offscope process the tests start (over a hundred
    `offscope proxy` alone, `report`, a grid's workers...) compiles the offscope modules
    it imports. The caches are in __pycache__ (git ignores it), as Python writes them by
    default."""
    sys.dont_write_bytecode = False  # this process: the test modules, offscope's imports
    if not hasattr(config, "workerinput"):  # once, before the workers start
        import compileall

        compileall.compile_dir(Path(offscope.__file__).parent, quiet=1)  # the subprocesses'


def pytest_collection_finish(session: pytest.Session) -> None:
    """What is alive once the tests are collected (the modules they import: offscope's,
    mitmproxy's, scipy's...) stays alive all session: frozen, it is out of the cyclic
    collector's way, as `offscope.heap` does for a sidecar, and each full collection walks
    only what the tests made since. Walking it took ~15% of a worker's CPU. The full
    collection first leaves nothing unreachable among the frozen objects."""
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        # mitmproxy 11.0's own pyOpenSSL use, not ours.
        item.add_marker(pytest.mark.filterwarnings("ignore::DeprecationWarning:mitmproxy.*"))
    rank = {path: i for i, path in enumerate(SLOWEST_FILES)}
    # A stable sort: the other files, and the tests inside every file, keep their order.
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))


@pytest.fixture(scope="session", autouse=True)
def _quiet_logs() -> None:
    logs.quiet()


@pytest.fixture(scope="session")
def confdir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One CA for the whole session (key generation is the slow part)."""
    from offscope.proxy.mitm.ca import ensure_ca

    d = tmp_path_factory.mktemp("ca")
    ensure_ca(d)
    return str(d)


@pytest.fixture(scope="session")
def ca(confdir: str) -> str:
    return str(Path(confdir) / "mitmproxy-ca-cert.pem")


@pytest.fixture
def ledger_file(tmp_path: Path) -> str:
    p = tmp_path / "ledger.yaml"
    p.write_text(LEDGER_YAML, encoding="utf-8")
    return str(p)


@pytest.fixture
def upstream() -> Iterator[EchoUpstream]:
    up = EchoUpstream().start()
    yield up
    up.stop()


@dataclass
class Embedded:
    p: RunningProxy
    trace: Path
    requests: Path

    @property
    def port(self) -> int:
        return self.p.port

    @property
    def metrics_port(self) -> int:
        assert self.p.metrics_port
        return self.p.metrics_port

    @property
    def control_port(self) -> int:
        assert self.p.control_port
        return self.p.control_port

    @property
    def control_headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.p.control_token}"}

    def control_url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.control_port}{path}"

    def url(self, run: str) -> str:
        return self.p.proxy_url(run)


@pytest.fixture
def embedded(tmp_path: Path, confdir: str, ledger_file: str, upstream: EchoUpstream):
    """`async with embedded(policy=..., routes=...) as e:` a real proxy in this loop."""
    from offscope.proxy.mitm.server import ProxyConfig, running_proxy

    @contextlib.asynccontextmanager
    async def start(policy: str = "shadow", routes: str = "", **kw) -> AsyncIterator[Embedded]:
        trace, requests = tmp_path / "trace.jsonl", tmp_path / "requests.jsonl"
        all_routes = ",".join(filter(None, [upstream.routes(), routes]))
        token = tmp_path / "control-token"
        token.write_text("embedded-test-token\n", encoding="utf-8")
        cfg = ProxyConfig(
            ledger=kw.pop("ledger", ledger_file),
            policy=policy,
            listen_port=0,
            metrics="127.0.0.1:0",
            control="127.0.0.1:0",
            control_token_file=str(token),
            trace=str(trace),
            requests=str(requests),
            confdir=confdir,
            routes=all_routes,
            **kw,
        )
        async with running_proxy(cfg) as p:
            yield Embedded(p, trace, requests)

    return start
