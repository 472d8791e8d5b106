"""A private PostgreSQL server for a test: Debian's `postgresql` binaries, a fresh
cluster in a temporary directory, listening on one loopback port.

Each server is the test's own, so a test may stop it mid-run (the store-unreachable
tests) without disturbing any other. `.ci/run` installs the package; where it is
absent the tests that need it are skipped, saying so.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.sidecar_kit import free_ports


def _bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def skip_reason() -> str | None:
    if _bindir() is None:
        return "PostgreSQL is not installed (apt-get install postgresql; .ci/run does)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install -e '.[test]')"
    return None


class PostgresServer:
    """initdb + pg_ctl, run as the `postgres` user when we are root (initdb refuses root)."""

    def __init__(self) -> None:
        bindir = _bindir()
        assert bindir is not None, skip_reason()
        self.bindir = bindir
        self.dir = Path(tempfile.mkdtemp(prefix="offscope-pg-"))
        self.data = self.dir / "data"
        (self.port,) = free_ports(1)
        self.user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "offscope", "--no-sync")
        self.url = f"postgresql://offscope@127.0.0.1:{self.port}/postgres"
        self.start()

    def _run(self, tool: str, *args: str) -> None:
        cmd = [str(self.bindir / tool), *args]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir} "
            "-c fsync=off -c max_connections=200"
        )
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.dir / "log"),
            "-w",
            "start",
        )

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def wait_ready(self, timeout: float = 30) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                psycopg.connect(self.url, connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def close(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):  # stopped by the test
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def postgres():
    """A private PostgreSQL server for one test (skipped, with the reason, where absent)."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    server = PostgresServer()
    try:
        yield server
    finally:
        server.close()
