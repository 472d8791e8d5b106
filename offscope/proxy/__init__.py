"""The sidecar: mitmproxy addon, extraction, engine, sinks, exporter."""

import os
from pathlib import Path

# One state root for everything the proxy keeps between runs: its CA, the
# control token, the trace. The user's state directory (XDG), never the working
# directory. Here rather than in server.py so that CLI start-up need not import
# mitmproxy.
STATE_DIR = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "offscope"
DEFAULT_TRACE = STATE_DIR / "trace.jsonl"
# The scope-expansion request log the proxy writes beside its default trace.
DEFAULT_REQUESTS = STATE_DIR / "trace.requests.jsonl"
DEFAULT_CONTROL_TOKEN = STATE_DIR / "control-token"
# Where the proxy keeps its CA (mitmproxy's certificate store). A CA created by an
# older version in ~/.offscope/ca is kept in use: clients already trust it.
_LEGACY_CONFDIR = Path.home() / ".offscope" / "ca"
DEFAULT_CONFDIR = (
    _LEGACY_CONFDIR
    if (_LEGACY_CONFDIR / "mitmproxy-ca.pem").exists() and not (STATE_DIR / "ca").exists()
    else STATE_DIR / "ca"
)
