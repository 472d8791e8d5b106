"""One state root: the CA, the control token and the default trace live together."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def _ca_path(home: Path, state: Path | None) -> Path:
    env = {k: v for k, v in os.environ.items() if k != "XDG_STATE_HOME"} | {"HOME": str(home)}
    if state is not None:
        env["XDG_STATE_HOME"] = str(state)
    out = subprocess.run(
        ["offscope", "ca", "--path"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return Path(out.stdout.strip())


def test_ca_token_and_trace_share_the_state_directory(tmp_path: Path) -> None:
    state = tmp_path / "state"
    cert = _ca_path(tmp_path / "home", state)
    assert cert == state / "offscope" / "ca" / "mitmproxy-ca-cert.pem" and cert.exists()
    help_text = subprocess.run(
        ["offscope", "proxy", "--help"],
        env=os.environ | {"XDG_STATE_HOME": str(state), "COLUMNS": "300"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert str(state / "offscope") in help_text  # the token and the trace's default


def test_a_ca_made_by_an_older_version_stays_in_use(tmp_path: Path) -> None:
    home = tmp_path / "home"
    legacy = home / ".offscope" / "ca"
    first = _ca_path(home, tmp_path / "unused")  # makes a CA in the new place
    legacy.mkdir(parents=True)
    for f in first.parent.iterdir():  # as if an older version had made it here
        (legacy / f.name).write_bytes(f.read_bytes())
    assert _ca_path(home, tmp_path / "fresh") == legacy / "mitmproxy-ca-cert.pem"
