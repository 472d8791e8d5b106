"""The sidecar imports only the mitmproxy addons it loads (offscope/proxy/mitm/__init__.py
keeps `mitmproxy.addons`' own `__init__`, which imports all ~35, from running at start),
and a program that asks the package for anything else still gets the real one."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_sidecar_imports_only_the_addons_it_loads() -> None:
    out = _run(
        """
        import sys
        from offscope.proxy.mitm.server import sidecar_addons
        sidecar_addons()
        print(sorted(m for m in sys.modules if m.startswith("mitmproxy.addons.")))
        """
    )
    assert "mitmproxy.addons.core" in out and "mitmproxy.addons.tlsconfig" in out
    # onboarding (Flask) and proxyauth (ldap3, passlib) are what the package's __init__ pulls in
    assert "onboarding" not in out and "proxyauth" not in out


def test_the_rest_of_the_package_is_there_when_asked_for() -> None:
    out = _run(
        """
        import offscope.proxy.mitm.server  # the bare package first
        from mitmproxy.addons import default_addons  # then what mitmdump asks of it
        import mitmproxy.addons
        print(len(default_addons()), mitmproxy.addons.default_addons is default_addons)
        """
    )
    count, same = out.split()
    assert int(count) > 30 and same == "True"
